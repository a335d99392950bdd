"""The loader's private cache folder, where loading may write: the artifact
form's inductor cache (`inductor/`) and the weights' verification stamps
(`verified/`, see `_integrity.py`)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ._errors import PrecompiledModelError

CACHE_DIR_VARIABLE = "HATCH_PRECOMPILE_CACHE_DIR"  # where loading may write (default ~/.cache/hatch-precompile)


@contextlib.contextmanager
def inductor_cache_in(folder: Path) -> Iterator[None]:
    """While active, inductor's cache folder is `folder` (inductor reads
    TORCHINDUCTOR_CACHE_DIR at each use); the variable is restored after."""
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def user_cache_root() -> Path:
    """$XDG_CACHE_HOME/hatch-precompile, ~/.cache/hatch-precompile by default: under
    it the loader's private cache, and the build cache's `build/`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hatch-precompile"


@functools.cache
def private_cache_dir() -> Path:
    """$HATCH_PRECOMPILE_CACHE_DIR, else ~/.cache/hatch-precompile (XDG_CACHE_HOME
    honoured), created 0700; if that cannot be created (a read-only home), a
    private temporary directory for this process, removed at exit. A directory
    that others can write to, or that another user owns, is refused."""
    configured = os.environ.get(CACHE_DIR_VARIABLE)
    directory = Path(configured) if configured else user_cache_root()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        if configured:
            raise
        temporary = tempfile.mkdtemp(prefix="hatch-precompile-")
        atexit.register(shutil.rmtree, temporary, ignore_errors=True)
        return Path(temporary)
    info = directory.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PrecompiledModelError(
            f"refusing cache directory {directory}: it must be owned by you and private (mode 0700), "
            f"found owner uid {info.st_uid} and mode {oct(info.st_mode & 0o777)}; "
            f"fix it or set {CACHE_DIR_VARIABLE} to another directory"
        )
    return directory
