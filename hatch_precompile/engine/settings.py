"""The build's settings, resolved in one place and in one order.

Each setting comes from the first of these that sets it, later ones overriding
earlier ones: the table in pyproject.toml, then the environment, then the
command line (`hatch-precompile compile-part`); what none sets comes from the
machine or the user's cache folder.

| setting | table | environment | command line | otherwise |
|---|---|---|---|---|
| workers | `jobs` | `HATCH_PRECOMPILE_JOBS` | `--jobs` | by cores and memory (`jobs.default_jobs`) |
| build cache | | `HATCH_PRECOMPILE_BUILD_CACHE` (a folder, or `off`) | | `$XDG_CACHE_HOME/hatch-precompile/build` |
| remote build cache | `remote-cache` | `HATCH_PRECOMPILE_REMOTE_CACHE` (a URL, or `off`) | | none |
| its mode | `remote-cache-mode` | `HATCH_PRECOMPILE_REMOTE_CACHE_MODE` | | `read-write` |
| parts | | `HATCH_PRECOMPILE_PARTS` (folders, `os.pathsep`-separated) | | none |
| CPU targets | `cpu-targets` (table, then model) | | `--cpu-targets` (`parts.choose`) | `avx2` |

No torch here: the backend resolves settings before any worker starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..runtime._cache import user_cache_root
from .config import REMOTE_CACHE_MODES, ConfigError, PrecompileConfig
from .remote import RemoteSettings, url_problem

JOBS_VARIABLE = "HATCH_PRECOMPILE_JOBS"
CACHE_VARIABLE = "HATCH_PRECOMPILE_BUILD_CACHE"  # a folder, or "off"
PARTS_VARIABLE = "HATCH_PRECOMPILE_PARTS"
REMOTE_VARIABLE = "HATCH_PRECOMPILE_REMOTE_CACHE"  # a redis://, rediss:// or s3:// URL, or "off"
REMOTE_MODE_VARIABLE = "HATCH_PRECOMPILE_REMOTE_CACHE_MODE"  # "read-write" or "read-only"


@dataclass(frozen=True)
class BuildSettings:
    jobs: int | None  # workers at once; None: by the machine, for the number of models built
    cache: Path | None  # the build cache's folder; None: off
    parts: tuple[Path, ...]  # part folders whose artifacts stand in for compiles
    remote: RemoteSettings | None = None  # the shared store behind the build cache; None: none


def resolve_settings(config: PrecompileConfig, *, jobs: int | None = None, environ: Mapping[str, str] = os.environ) -> BuildSettings:
    """The settings for a build of `config`, with `jobs` from the command line (or None)."""
    return BuildSettings(jobs=jobs or _jobs(config, environ), cache=_cache(environ), parts=_parts(environ), remote=_remote(config, environ))


def _jobs(config: PrecompileConfig, environ: Mapping[str, str]) -> int | None:
    value = environ.get(JOBS_VARIABLE)
    if value is None:
        return config.jobs
    if not value.isdigit() or int(value) < 1:
        raise ConfigError([f"{JOBS_VARIABLE}: expected a whole number of workers, 1 or more, found {value!r}"])
    return int(value)


def _cache(environ: Mapping[str, str]) -> Path | None:
    configured = environ.get(CACHE_VARIABLE)
    if configured is not None:
        return None if configured.strip().lower() == "off" else Path(configured).expanduser()
    return user_cache_root() / "build"


def _parts(environ: Mapping[str, str]) -> tuple[Path, ...]:
    value = environ.get(PARTS_VARIABLE, "")
    return tuple(Path(folder).expanduser() for folder in value.split(os.pathsep) if folder.strip())


def _remote(config: PrecompileConfig, environ: Mapping[str, str]) -> RemoteSettings | None:
    url = environ.get(REMOTE_VARIABLE, config.remote_cache or "").strip()
    if not url or url.lower() == "off":
        return None
    if problem := url_problem(url, from_table=False):
        raise ConfigError([f"{REMOTE_VARIABLE}: {problem}"])
    mode = environ.get(REMOTE_MODE_VARIABLE, config.remote_cache_mode).strip().lower()
    if mode not in REMOTE_CACHE_MODES:
        raise ConfigError([f"{REMOTE_MODE_VARIABLE}: expected one of {', '.join(map(repr, REMOTE_CACHE_MODES))}, found {mode!r}"])
    return RemoteSettings(url, read_only=mode == "read-only")
