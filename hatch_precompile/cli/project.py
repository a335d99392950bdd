"""Commands on a project's source: init, compile-part, check. No torch imported here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..runtime._layout import PRECOMPILED_DIR
from ._common import FAILED, OK, CommandError, print_json, table

# The build backends that run the precompile build, and the distribution each needs.
BACKENDS = {"hatchling.build": "hatchling", "hatch_precompile.setuptools_backend": "setuptools"}


def init(args: argparse.Namespace) -> int:
    """Write the loader into PACKAGE_DIR/_precompiled/, as every build does.

    Builds (editable installs included) write it themselves; run this only to
    import the package from a plain checkout that was never built or installed,
    where `load_compiled` then falls back per the model's `fallback`.
    """
    from ..engine.project import write_source_loader

    if not (args.package_dir / "__init__.py").is_file():
        raise CommandError(f"{args.package_dir} is not a package folder (no __init__.py)")
    write_source_loader(args.package_dir)
    print(f"wrote {args.package_dir / PRECOMPILED_DIR}/ (generated: keep `_precompiled/` in .gitignore); {args.package_dir / '__init__.py'} imports it with `from ._precompiled import load_compiled`")
    return OK


def compile_part_command(args: argparse.Namespace) -> int:
    """Compile some models and CPU targets of PROJECT_DIR into a new part folder.

    On each machine that can build a part (an AVX-512 machine for avx512, a
    manylinux container for an old glibc), then give the folders to the wheel
    build: HATCH_PRECOMPILE_PARTS=part1:part2 python -m build --wheel. The part
    must be made with the same hatch-precompile, torch and Python as the wheel
    build, from the same configuration; the build refuses it otherwise.

    exit status: 0 the part is written; 1 a model failed to build;
    2 the arguments or the configuration are wrong.
    """
    from ..engine.config import ConfigError
    from ..engine.errors import ModelBuildError
    from ..engine.pipeline import compile_part

    def listed(value: str | None) -> list[str] | None:
        return [item.strip() for item in value.split(",") if item.strip()] if value else None

    try:
        compile_part(
            args.project_dir,
            args.out,
            models=listed(args.models),
            cpu_targets=listed(args.cpu_targets),
            jobs=args.jobs,
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except ConfigError as error:
        raise CommandError(str(error).replace("\n", " ")) from None
    except ModelBuildError as error:
        print(error, file=sys.stderr)
        return FAILED
    print(f"wrote part {args.out}/")
    return OK


def check(args: argparse.Namespace) -> int:
    """Validate the precompile configuration in PROJECT_DIR/pyproject.toml, without building.

    Reads [tool.hatch.build.hooks.precompile] and lists every problem at once,
    each with its key path, as the build would, and
    warns when [build-system] would not run the hook or does not pin torch.
    Imports neither torch nor the project: factories and example-input functions
    are imported at build time only.

    exit status: 0 the configuration is valid; 1 it is not (or is missing);
    2 PROJECT_DIR has no pyproject.toml.
    """
    pyproject = args.project_dir / "pyproject.toml"
    if not pyproject.is_file():
        raise CommandError(f"{pyproject}: no such file; PROJECT_DIR must be the project's folder")
    config, problems, warnings = _read_project(pyproject)
    if args.json:
        document = _config_json(config) if config is not None else None
        print_json({"pyproject": str(pyproject), "valid": not problems, "problems": problems, "warnings": warnings, "config": document})
        return FAILED if problems else OK
    if problems:
        print(f"{pyproject}: {len(problems)} problem(s):")
        print("\n".join(f"  - {p}" for p in problems))
    else:
        assert config is not None
        package = config.package or "(the project's single top-level package)"
        print(f"{pyproject}: valid; {len(config.models)} model(s) for package {package}")
        print(table(["model", "factory", "inputs", "dims", "CPU targets", "artifacts", "weights", "fallback"], _model_rows(config)))
    for warning in warnings:
        print(f"warning: {warning}")
    return FAILED if problems else OK


def check_cache(args: argparse.Namespace) -> int:
    """Say where PROJECT_DIR's builds keep and find compiled artifacts, and try the remote store.

    Resolves the build cache settings as a build would (the table, then the
    environment: HATCH_PRECOMPILE_BUILD_CACHE, HATCH_PRECOMPILE_REMOTE_CACHE,
    HATCH_PRECOMPILE_REMOTE_CACHE_MODE), then reaches the remote store, if any,
    and uses it as a build would: in read-write mode it writes a small probe
    object (hatch-precompile/build/probe) and reads it back; read-only, it only
    reads. Passwords are never printed. Run it in CI before the build to fail
    early on a store that a build would only warn about and do without.

    exit status: 0 the store answers (or none is configured); 1 it does not;
    2 the configuration is wrong.
    """
    from ..engine.config import ConfigError, parse_config
    from ..engine.project import read_table
    from ..engine.remote import RemoteUnavailable, check_store
    from ..engine.settings import resolve_settings

    if not (args.project_dir / "pyproject.toml").is_file():
        raise CommandError(f"{args.project_dir / 'pyproject.toml'}: no such file; PROJECT_DIR must be the project's folder")
    try:
        settings = resolve_settings(parse_config(read_table(args.project_dir)))
    except ConfigError as error:
        raise CommandError(str(error).replace("\n", " ")) from None
    print(f"build cache: {settings.cache or 'off'}")
    if settings.remote is None:
        print("remote cache: none (set remote-cache in the table or HATCH_PRECOMPILE_REMOTE_CACHE)")
        return OK
    mode = "read-only" if settings.remote.read_only else "read-write"
    try:
        done = check_store(settings.remote)
    except RemoteUnavailable as error:
        print(f"remote cache: {settings.remote.address} ({mode}): unavailable: {error}")
        return FAILED
    print(f"remote cache: {settings.remote.address} ({mode}): OK, {done}")
    return OK


def _read_project(pyproject: Path) -> tuple[Any, list[str], list[str]]:
    """(the parsed configuration or None, problems, warnings)."""
    from ..engine.config import TABLE, ConfigError, parse_config
    from ..engine.project import precompile_table, read_pyproject

    try:
        document = read_pyproject(pyproject.parent)
    except ConfigError as error:
        return None, error.problems, []
    build_system = document.get("build-system")
    warnings = _build_system_warnings(build_system if isinstance(build_system, dict) else {})
    section = precompile_table(document)
    if section is None:
        return None, [f"no [{TABLE}] table; add it, with one [{TABLE}.models.NAME] table per model"], warnings
    if not isinstance(section, dict):
        return None, [f"{TABLE}: expected a table, found {type(section).__name__}"], warnings
    try:
        return parse_config(section), [], warnings
    except ConfigError as error:
        return None, error.problems, warnings


def _build_system_warnings(build_system: dict[str, Any]) -> list[str]:
    """What would keep the hook from running, or its artifacts from loading: not
    errors, since a build without isolation can find the plugin installed."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    warnings = []
    backend = build_system.get("build-backend")
    if backend not in BACKENDS:
        warnings.append(f"build-system.build-backend is {backend!r}: models are compiled only under {' or '.join(map(repr, BACKENDS))}")
    requirements: dict[str, Requirement] = {}
    listed = build_system.get("requires", [])
    for text in listed if isinstance(listed, list) else []:
        try:
            requirement = Requirement(text)
        except (InvalidRequirement, TypeError) as error:
            warnings.append(f"build-system.requires: {error}")
            continue
        requirements[canonicalize_name(requirement.name)] = requirement
    needed = BACKENDS.get(backend) if isinstance(backend, str) else None
    if needed and needed not in requirements:
        warnings.append(f"build-system.requires lacks {needed!r}, which {backend!r} needs")
    if "hatch-precompile" not in requirements:
        warnings.append("build-system.requires lacks 'hatch-precompile': an isolated build cannot find the precompile hook")
    torch = requirements.get("torch")
    if torch is None or not any(s.operator in ("==", "===") for s in torch.specifier):
        warnings.append('build-system.requires does not pin torch (e.g. "torch==2.13.0"): the build compiles with whatever torch the frontend installs, and the artifacts load only under that torch')
    return warnings


def _model_rows(config: Any) -> list[list[str]]:
    rows = []
    for model in config.models.values():
        variants = len(model.shape_variants())  # per CPU target
        rows.append(
            [
                model.name,
                model.factory,
                f"from {model.example_inputs}" if model.example_inputs else _inputs_text(model),
                ", ".join(_dim_text(d) for d in model.dims.values()) or "none",
                ", ".join(model.cpu_targets),
                str(variants * len(model.cpu_targets)),
                model.weights,
                model.fallback,
            ]
        )
    return rows


def _inputs_text(model: Any) -> str:
    def one(spec: Any) -> str:
        if spec.constant is not None:
            return repr(spec.constant)
        return f"{spec.dtype}[{', '.join(map(str, spec.shape))}]"

    return ", ".join([*map(one, model.args), *(f"{k}={one(v)}" for k, v in model.kwargs.items())])


def _dim_text(dim: Any) -> str:
    parts = [f"{dim.min}-{dim.max}"] if dim.dynamic else []
    if dim.buckets:
        parts.append(f"{list(dim.buckets)}")
    return f"{dim.name} {' + '.join(parts)}"


def _config_json(config: Any) -> dict[str, Any]:
    return {
        "package": config.package,
        "fallback": config.fallback,
        "cpu_targets": list(config.cpu_targets),
        "models": {name: model.to_json() for name, model in config.models.items()},
    }
