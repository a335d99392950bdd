"""The artifact form: the AOTCompiledArtifact, unpickled by torch._inductor, with
the shipped kernels answering inductor's requests to compile them.

Used where the build refused the lean form, or when HATCH_PRECOMPILE_FORM=artifact.
It imports the compiler (about 2 s) and writes the artifact's Python wrapper into
a private cache directory, which inductor then imports.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from . import _torch_private
from ._errors import PrecompiledIntegrityError, PrecompiledModelError
from ._manifest import HERE, verified_bytes, verified_kernels

CACHE_DIR_VARIABLE = "HATCH_PRECOMPILE_CACHE_DIR"  # where loading may write (default ~/.cache/hatch-precompile)


def load(name: str, model: dict[str, Any], artifact: dict[str, Any]) -> Callable[[list[Any]], Any]:
    """Verify an artifact and its kernels, then unpickle it with the shipped kernels;
    returns a function of the graph's flat inputs (weights, then user inputs)."""
    data = verified_bytes(artifact)
    kernels = verified_kernels(model, artifact)
    try:
        key, payload = _torch_private.split_artifact(data)
    except _torch_private.ArtifactFormatError as error:
        raise PrecompiledIntegrityError(f"{HERE / artifact['file']}: {error}") from None
    if key.hex() != artifact["built_with"]["torch_key"]:
        raise PrecompiledIntegrityError(
            f"{HERE / artifact['file']} was written by another torch build than the manifest says "
            f"(torch key {key.hex()[:16]}..., manifest {artifact['built_with']['torch_key'][:16]}...)"
        )
    try:
        with _private_inductor_cache(), _torch_private.shipped_kernels(kernels):
            compiled = _torch_private.deserialize_artifact(payload)
    except _torch_private.MissingKernelError as error:
        raise PrecompiledIntegrityError(f"model {name!r}, {artifact['file']}: {error}") from None
    return lambda flat: compiled(*flat)


@contextlib.contextmanager
def _private_inductor_cache() -> Iterator[None]:
    """Point inductor at this user's private cache while loading: it writes the
    artifact's Python wrapper there and imports it, so a shared, world-writable
    directory (inductor's default is under /tmp) would let others plant code."""
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(private_cache_dir() / "inductor")
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


@functools.cache
def private_cache_dir() -> Path:
    """$HATCH_PRECOMPILE_CACHE_DIR, else ~/.cache/hatch-precompile (XDG_CACHE_HOME
    honoured), created 0700; if that cannot be created (a read-only home), a
    private temporary directory for this process, removed at exit. A directory
    that others can write to, or that another user owns, is refused."""
    configured = os.environ.get(CACHE_DIR_VARIABLE)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = Path(configured) if configured else base / "hatch-precompile"
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
