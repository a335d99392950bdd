"""The rules the package's layout stands for, checked.

Three processes run this code: the build backend (hatchling's hook or the
setuptools backend, and the command line), which never imports torch, so that
configuration errors, planning and wheel assembly cost no torch import and a
worker failure cannot take the backend with it; the compile worker, one per
model, which does everything with torch; and the loader in users' wheels
(`runtime/`), which imports only torch and the standard library. Every module
must be on one side of that line: a new module fails here until it is placed.
"""

from __future__ import annotations

import ast
import json
import sys

from conftest import REPO, run

PACKAGE = REPO / "hatch_precompile"

# Imported by the build backend and the command line: no torch.
BACKEND_SIDE = {
    "__init__", "__main__", "hooks", "plugin", "setuptools_backend", "distfiles", "build", "config", "options",
    "project", "settings", "jobs", "cache", "parts", "assemble", "native", "targets", "errors",
    "cli", "cli._common", "cli.project", "cli.wheel",
}  # fmt: skip
# Imported only in the compile worker's process (and by tests): torch.
WORKER_SIDE = {"worker", "capture", "compile", "key", "accuracy", "weights", "lean", "lean_check", "torch_internals"}


def _modules() -> set[str]:
    names = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).with_suffix("")
        if relative.parts[0] != "runtime":
            names.add(".".join(relative.parts[:-1] if relative.name == "__init__" and len(relative.parts) > 1 else relative.parts))
    return names


def test_every_module_is_placed_on_one_side_of_the_torch_line() -> None:
    assert _modules() == BACKEND_SIDE | WORKER_SIDE
    assert not BACKEND_SIDE & WORKER_SIDE


def test_the_build_backends_side_imports_no_torch() -> None:
    code = (
        "import importlib, json, sys\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))\n"
    )
    modules = ["hatch_precompile" if name == "__init__" else f"hatch_precompile.{name}" for name in sorted(BACKEND_SIDE - {"__main__"})]
    result = run([sys.executable, "-c", code, *modules], cwd=REPO)
    assert json.loads(result.stdout) == []


def test_the_shipped_loader_imports_only_itself_torch_and_the_standard_library() -> None:
    allowed = {*sys.stdlib_module_names, "torch"}
    found = {}
    for path in sorted((PACKAGE / "runtime").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                outside = node.level > 1 or (node.level == 0 and (node.module or "").split(".")[0] not in allowed)
                names = [f"{'.' * node.level}{node.module or ''}"] if outside else []
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.split(".")[0] not in allowed]
            else:
                continue
            if names:
                found.setdefault(path.name, []).extend(names)
    assert found == {}
