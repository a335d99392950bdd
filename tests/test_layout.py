"""The rules the package's layout stands for, checked.

Three processes run this code, and the folder a module lies in says which:
the build backend's (`backend/`, `engine/`, `cli/`), which never imports torch, so
that configuration errors, planning and wheel assembly cost no torch import and a
worker failure cannot take the backend with it; the compile worker's (`worker/`),
one per model, which does everything with torch; and the loader in users' wheels
(`runtime/`), which imports only torch and the standard library. The worker may
use the build's typed config and the loader's code; the build never imports the
worker (it starts it as a process). A new module outside these folders fails here.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

from conftest import REPO, run

PACKAGE = REPO / "hatch_precompile"

# The top level holds only the package itself and the doors users name: the CLI's
# `python -m hatch_precompile`, hatchling's plugin registration and the setuptools backend.
DOORS = {"__init__", "__main__", "hooks", "setuptools_backend"}
BACKEND_SIDE = ("backend", "engine", "cli", "shim")  # the build backend's process: no torch
FOLDERS = {*BACKEND_SIDE, "worker", "runtime"}
# What each folder may import of the package's other folders.
MAY_IMPORT = {
    "backend": {"engine", "runtime"},
    "engine": {"runtime", "shim"},
    "cli": {"backend", "engine", "runtime"},
    "worker": {"engine", "runtime", "shim"},
    "runtime": set(),
    "shim": set(),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path) -> set[str]:
    """Every module of this package that `path` imports, at any depth, as an absolute name."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join([*base, *([node.module] if node.module else [])])
            else:
                stem = node.module or ""
            found |= {stem} | {f"{stem}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name.startswith("hatch_precompile.")}


def test_every_module_lies_in_a_process_folder_or_is_a_door() -> None:
    top = {path.stem for path in PACKAGE.glob("*.py")}
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert top == DOORS
    assert folders == FOLDERS
    assert all((PACKAGE / folder / "__init__.py").read_text().startswith('"""') for folder in FOLDERS), "each folder's docstring states its rules"


def test_each_folder_imports_only_the_folders_it_may() -> None:
    crossings = {}
    for folder, allowed in MAY_IMPORT.items():
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            for name in _imported_modules(path):
                other = name.split(".")[1]
                if other in FOLDERS and other != folder and other not in allowed:
                    crossings.setdefault(_module_name(path), []).append(name)
    assert crossings == {}


def test_the_build_backends_side_imports_no_torch() -> None:
    code = "import importlib, json, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\nprint(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))\n"
    modules = [_module_name(path) for folder in BACKEND_SIDE for path in sorted((PACKAGE / folder).rglob("*.py"))]
    modules += ["hatch_precompile", "hatch_precompile.hooks", "hatch_precompile.setuptools_backend", "hatch_precompile.worker"]
    result = run([sys.executable, "-c", code, *modules], cwd=REPO)
    assert json.loads(result.stdout) == []


def test_the_shipped_loader_imports_only_itself_torch_numpy_and_the_standard_library() -> None:
    """torch on the torch path, NumPy on the NumPy path (and ml_dtypes, where
    installed, for its bfloat16 dtype): nothing the wheel would have to require."""
    allowed = {*sys.stdlib_module_names, "torch", "numpy", "ml_dtypes"}
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


def _string_literals(path: Path) -> set[str]:
    """The strings a module's code compares or indexes with (docstrings left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings}


def test_each_loader_form_is_one_module_and_no_other_module_names_a_form() -> None:
    """A form of the loader (`runtime/_choice.py`'s FORMS) is one module with the
    interface `runtime/_graph.py`'s Form states (mypy checks its types); no other
    loader module names a form or reads its manifest record, but the registry's one
    line and the manifest's types. So a fourth form is a new module and that line."""
    from hatch_precompile.runtime import _choice, _graph

    interface = {name for name in dir(_graph.Form) if not name.startswith("_")} | set(_graph.Form.__annotations__)
    modules = {}
    for name, form in _choice.FORMS.items():
        assert name == form.NAME
        assert interface <= set(vars(form)), f"{form.__name__} lacks {sorted(interface - set(vars(form)))}"
        modules[Path(form.__file__).name] = name
    named = {}
    for path in sorted((PACKAGE / "runtime").glob("*.py")):
        if path.name not in {*modules, "_schema.py"}:
            found = _string_literals(path) & set(_choice.FORMS)
            if found:
                named[path.name] = sorted(found)
    assert named == {}


def test_each_build_form_is_one_module_and_only_the_registry_names_one() -> None:
    """A form at build time (`worker/compile.py`'s FORMS) is one module with the
    interface `worker/form.py`'s BuildForm states (mypy checks its types), named
    as the loader's form of it; no other worker module imports a form's modules
    or names a form, but the registry (the module that compiles the artifact
    every form is made from). The build log reads what a variant ships through
    the loader's forms. So a new form is a module here, one line in FORMS, and
    the loader's module and line."""
    from hatch_precompile.runtime import _choice
    from hatch_precompile.worker import compile, form

    interface = {name for name in dir(form.BuildForm) if not name.startswith("_")} | set(form.BuildForm.__annotations__)
    own = {"lean": {"lean", "lean_check"}, "cpp": {"cpp_form"}}  # each form's modules: its own and its check's interpreter
    for build_form in compile.FORMS:
        assert interface <= set(vars(build_form)), f"{build_form.__name__} lacks {sorted(interface - set(vars(build_form)))}"
        assert (build_form.NAME, build_form.TITLE) == (_choice.FORMS[build_form.NAME].NAME, _choice.FORMS[build_form.NAME].TITLE)
        assert Path(build_form.__file__).stem in own[build_form.NAME]
    assert {f.NAME for f in compile.FORMS} == set(own)
    named = {}
    for path in sorted((PACKAGE / "worker").rglob("*.py")):
        mine = {name for name, modules in own.items() if path.stem in modules}
        if path.name == "compile.py":
            continue
        others = set(own) - mine
        imported = {name.rpartition(".")[2] for name in _imported_modules(path) if name.startswith("hatch_precompile.worker.")}
        found = (_string_literals(path) & others) | {module for name in others for module in own[name] if module in imported}
        if found:
            named[path.name] = sorted(found)
    assert named == {}
