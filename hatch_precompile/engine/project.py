"""The project being built: its configuration table and the package that receives the models.

Shared by the hatch hook and the command line; no torch.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from ..runtime._layout import PRECOMPILED_DIR
from .assemble import RUNTIME_DIR, RUNTIME_FILES
from .config import TABLE, ConfigError

_NOT_PACKAGES = {"tests", "test", "docs", "examples", "benchmarks", "scripts"}


def read_pyproject(root: Path) -> dict[str, Any]:
    """`root`/pyproject.toml, parsed; ConfigError when it is missing or not TOML."""
    pyproject = root / "pyproject.toml"
    try:
        return tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError([f"{pyproject}: not found; run this in the project's folder or name it"]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError([f"{pyproject}: not valid TOML: {error}"]) from None


def precompile_table(document: dict[str, Any]) -> Any:
    """The `[tool.hatch.build.hooks.precompile]` value of a parsed pyproject.toml, or None."""
    table: Any = document
    for key in TABLE.split("."):
        table = table.get(key) if isinstance(table, dict) else None
    return table


def read_table(root: Path, document: dict[str, Any] | None = None) -> dict[str, Any]:
    """The raw `[tool.hatch.build.hooks.precompile]` table of `root`/pyproject.toml
    (`document`, where the caller has already parsed it)."""
    table: dict[str, Any] | None = precompile_table(read_pyproject(root) if document is None else document)
    if table is None:
        raise ConfigError([f"{root / 'pyproject.toml'}: no [{TABLE}] table; declare the models there (see the README)"])
    return table


def find_package(root: Path, configured: str | None) -> tuple[str, Path]:
    """The import package that receives the models: `package` if configured, else
    the single top-level package under src/ or the project's root."""
    bases = [root / "src", root]
    if configured is not None:
        for base in bases:
            if (base / configured / "__init__.py").is_file():
                return configured, base / configured
        raise ConfigError([f"{TABLE}.package: no package {configured!r} at src/{configured}/ or {configured}/"])
    found = sorted({p.parent for base in bases for p in base.glob("*/__init__.py") if p.parent.name not in _NOT_PACKAGES})
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise ConfigError([f"{TABLE}.package: missing; set it to the import package that receives the models (found: {names})"])
    return found[0].name, found[0]


def import_paths(root: Path, package_dir: Path) -> list[str]:
    """Where the workers import the project's code from: the package's parent, then the root."""
    return list(dict.fromkeys([str(package_dir.parent), str(root)]))


def write_source_loader(package_dir: Path) -> list[str]:
    """Bring `<package>/_precompiled/` in step with this plugin's loader; returns
    the names of the files it wrote.

    The source tree's loader is generated, as hatch-vcs generates a version file:
    written by every build, editable installs included, so that the package's
    `from ._precompiled import load_compiled` works in the build's own capture
    step and in checkouts; never maintained by hand, and ignored by git (the
    README's `.gitignore` line). Wheels get the loader at assembly."""
    target = package_dir / PRECOMPILED_DIR
    target.mkdir(exist_ok=True)
    written = []
    for name in RUNTIME_FILES:
        current = (RUNTIME_DIR / name).read_bytes()
        path = target / name
        if not path.is_file() or path.read_bytes() != current:
            path.write_bytes(current)
            written.append(name)
    return written
