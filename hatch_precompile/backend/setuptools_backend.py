"""A PEP 517 backend for setuptools projects: setuptools' own, with the precompile build around it.

A setuptools project names it in pyproject.toml, and declares its models in the
same `[tool.hatch.build.hooks.precompile]` table as a hatch project:

    [build-system]
    requires = ["setuptools>=77", "hatch-precompile", "torch==2.13.0"]
    build-backend = "hatch_precompile.setuptools_backend"

Every hook is setuptools.build_meta's, with these additions:

- `get_requires_for_build_wheel` (and `..._editable`): also what the table asks
  of hatchling, `dependencies`, `require-runtime-dependencies` and
  `require-runtime-features`, so that a model's factory finds its libraries.
- `build_wheel`: writes the loader into the package (`ready_source`), lets
  setuptools build its wheel into a private temporary folder, compiles the models
  (`precompile`, the same build the hatch hook runs), then rewrites setuptools'
  wheel: the package's `_precompiled/` becomes exactly the staged files, WHEEL
  gets `Root-Is-Purelib: false` and the computed tag, METADATA the torch
  pin, RECORD is regenerated, and the file is renamed for the tag.
- `prepare_metadata_for_build_wheel` (and `..._editable`): the same pins in the
  METADATA it prepares, so that pip's prepared metadata matches the wheel.
- `build_sdist`: the same pins in the sdist's PKG-INFO (and in the copy and
  requires.txt of setuptools' `.egg-info` inside it); no compiled files, and no
  generated loader, as under hatch.
- `build_editable`: writes the loader, then setuptools' editable wheel with the
  pins; no compile (`load_compiled` falls back per `fallback`, as under hatch).

Each hook ends an expected failure with its message alone (engine/errors.py).
The rewriting itself is `distfiles.py`.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..engine.assemble import runtime_requirements
from ..engine.config import TABLE, ConfigError, PrecompileConfig, parse_config
from ..engine.errors import said_plainly
from ..engine.pipeline import EDITABLE_MESSAGE, Reporter, check_sdist_pins, precompile, ready_source
from ..engine.project import find_package, read_pyproject, read_table
from ..runtime._layout import PRECOMPILED_DIR
from .distfiles import rewrite_sdist, rewrite_wheel, with_requirements

try:
    from setuptools import build_meta as _setuptools
except ImportError as error:  # pragma: no cover - a misconfigured [build-system]
    raise ImportError('hatch_precompile.setuptools_backend builds with setuptools: add "setuptools>=77" to [build-system] requires') from error

# setuptools' hook that needs nothing more, re-exported as it is.
get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


_REPORT = Reporter(info=_say, success=_say, warning=_say)


# --- the PEP 517 hooks ---------------------------------------------------------


@said_plainly
def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    """setuptools' build requirements, plus those the table asks for as it would of
    hatchling: `dependencies`, and with `require-runtime-dependencies` /
    `require-runtime-features` the project's own (which a model's factory may import)."""
    return [*_setuptools.get_requires_for_build_wheel(config_settings), *_table_build_requirements(Path.cwd())]


@said_plainly
def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    return [*_setuptools.get_requires_for_build_editable(config_settings), *_table_build_requirements(Path.cwd())]


@said_plainly
def build_wheel(wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None) -> str:
    root = Path.cwd()  # PEP 517: hooks run in the source tree
    config, requirements = _project(root)
    check_sdist_pins(root, requirements)
    package, package_dir = ready_source(root, config, _REPORT)  # before setuptools collects the package's files
    with _scratch() as scratch:
        built = scratch / "setuptools"
        name = _setuptools.build_wheel(str(built), config_settings, metadata_directory)
        staging = scratch / "staging"
        staging.mkdir()
        precompiled = precompile(root, config, package, package_dir, staging, _REPORT)
        return rewrite_wheel(
            built / name,
            Path(wheel_directory),
            [*requirements, *precompiled.extra_requirements],
            replace=f"{package}/{PRECOMPILED_DIR}/",
            files=precompiled.files,
            tag=precompiled.tag,
        )


@said_plainly
def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    root = Path.cwd()
    _, requirements = _project(root)
    check_sdist_pins(root, requirements)
    name: str = _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
    metadata = Path(metadata_directory) / name / "METADATA"
    metadata.write_bytes(with_requirements(metadata.read_bytes(), requirements))
    return name


@said_plainly
def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    root = Path.cwd()
    config, requirements = _project(root)  # a configuration mistake fails here already, as under hatch
    _, package_dir = find_package(root, config.package)
    with _scratch() as scratch:
        name: str = _setuptools.build_sdist(str(scratch), config_settings)
        rewrite_sdist(scratch / name, Path(sdist_directory), requirements, (package_dir / PRECOMPILED_DIR).relative_to(root).as_posix())
    return name


@said_plainly
def build_editable(wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None) -> str:
    root = Path.cwd()
    config, requirements = _project(root)
    check_sdist_pins(root, requirements)
    ready_source(root, config, _REPORT)
    _REPORT.info(EDITABLE_MESSAGE)
    with _scratch() as scratch:
        name = _setuptools.build_editable(str(scratch), config_settings, metadata_directory)
        return rewrite_wheel(scratch / name, Path(wheel_directory), requirements)


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


# --- shared steps ----------------------------------------------------------------


def _project(root: Path) -> tuple[PrecompileConfig, list[str]]:
    """The validated table, and the pins the wheel requires (torch==X, or NumPy where every model is torch-free)."""
    config = parse_config(read_table(root))
    return config, runtime_requirements(config.torch_free)


def _table_build_requirements(root: Path) -> list[str]:
    """hatchling's hook keys for extra build requirements, read from pyproject.toml
    (static `[project]` fields only: nothing is built to resolve dynamic ones)."""
    document = read_pyproject(root)
    table = read_table(root, document)
    project = document.get("project", {})
    requirements: list[Any] = list(table.get("dependencies", []))
    problems = []
    if table.get("require-runtime-dependencies") is True:
        if "dependencies" in project.get("dynamic", []):
            problems.append(f"{TABLE}.require-runtime-dependencies: [project] dependencies are dynamic; list what the build needs in [build-system] requires instead")
        requirements += project.get("dependencies", [])
    for feature in table.get("require-runtime-features", []):
        extras = project.get("optional-dependencies", {})
        if feature not in extras:
            problems.append(f"{TABLE}.require-runtime-features: no [project.optional-dependencies] {feature!r}")
        requirements += extras.get(feature, [])
    if not all(isinstance(r, str) for r in requirements):
        problems.append(f"{TABLE}.dependencies: expected an array of requirement strings")
    if problems:
        raise ConfigError(problems)
    return requirements


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A private temporary folder (mode 0700), removed on success, failure and Ctrl-C."""
    folder = Path(tempfile.mkdtemp(prefix="hatch-precompile-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
