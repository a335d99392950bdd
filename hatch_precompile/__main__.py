"""`python -m hatch_precompile init PACKAGE_DIR`: copy the loader into a source tree.

The wheel always gets the loader from the plugin that built it; the source copy
makes `from ._precompiled import load_compiled` work in a checkout and in an
editable install, where it falls back per the model's `fallback`.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from .assemble import PRECOMPILED_DIR, RUNTIME_DIR, RUNTIME_FILES


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hatch_precompile")
    commands = parser.add_subparsers(dest="command", required=True)
    init = commands.add_parser("init", help="write the loader into PACKAGE_DIR/_precompiled/")
    init.add_argument("package_dir", type=Path, help="the import package's folder, e.g. src/my_pkg")
    args = parser.parse_args(argv)

    if not (args.package_dir / "__init__.py").is_file():
        parser.error(f"{args.package_dir} is not a package folder (no __init__.py)")
    target = args.package_dir / PRECOMPILED_DIR
    target.mkdir(exist_ok=True)
    for name in RUNTIME_FILES:
        shutil.copyfile(RUNTIME_DIR / name, target / name)
    print(f"wrote {target}/; add `from ._precompiled import load_compiled` to {args.package_dir / '__init__.py'}")


if __name__ == "__main__":
    main()
