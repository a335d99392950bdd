"""The artifact form: the AOTCompiledArtifact, unpickled by torch._inductor, with
the shipped kernels answering inductor's requests to compile them.

Used where the build refused the lean form, or when HATCH_PRECOMPILE_FORM=artifact.
It imports the compiler (about 2 s) and writes the artifact's Python wrapper into
a private cache directory, which inductor then imports.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import _torch_private
from ._arrays import ArrayKind
from ._cache import inductor_cache_in, private_cache_dir
from ._errors import PrecompiledIntegrityError
from ._graph import PositionalGraph, torch_only
from ._integrity import verified_bytes, verified_kernels
from ._manifest import HERE, release, same_torch_release
from ._schema import ArtifactEntry, ModelEntry, TorchAndPython, is_lean_only

NAME, TITLE = "artifact", "artifact form"


def shipped(artifact: ArtifactEntry) -> bool:
    return not is_lean_only(artifact)


def refused(artifact: ArtifactEntry) -> str:
    return "an int8 variant is compiled with its weights frozen in, into no artifact" if is_lean_only(artifact) else ""


def file(artifact: ArtifactEntry) -> str:
    return artifact["file"]


def problems(artifact: ArtifactEntry, here: TorchAndPython) -> list[str]:
    """It unpickles inductor's objects: exactly the torch build and Python it was made with."""
    built = artifact["built_with"]
    if not here["torch"]:
        return same_torch_release(built, here)
    found = []
    if built["torch"] != here["torch"]:
        found.append("torch differs" + (": it needs that exact build" if release(built["torch"]) == release(here["torch"]) else ""))
    if built["torch_git"] != here["torch_git"]:
        found.append("torch_git differs")
    if built["python"] != here["python"]:
        found.append("python differs: it needs that exact Python")
    return found


def serves(model: ModelEntry, artifact: ArtifactEntry, arrays: str) -> str:
    return torch_only(arrays)


def load(name: str, model: ModelEntry, artifact: ArtifactEntry, kind: ArrayKind) -> PositionalGraph:
    """Verify an artifact and its kernels, then unpickle it with the shipped kernels;
    returns its graph, which takes the weights, then the user inputs."""
    data = verified_bytes(artifact)
    kernels = verified_kernels(model, artifact)
    try:
        key, payload = _torch_private.split_artifact(data)
    except _torch_private.ArtifactFormatError as error:
        raise PrecompiledIntegrityError(f"{HERE / artifact['file']}: {error}") from None
    if key.hex() != artifact["built_with"]["torch_key"]:
        raise PrecompiledIntegrityError(
            f"{HERE / artifact['file']} was written by another torch build than the manifest says (torch key {key.hex()[:16]}..., manifest {artifact['built_with']['torch_key'][:16]}...)"
        )
    try:
        with _private_inductor_cache(), _torch_private.shipped_kernels(kernels):
            compiled = _torch_private.deserialize_artifact(payload)
    except _torch_private.MissingKernelError as error:
        raise PrecompiledIntegrityError(f"model {name!r}, {artifact['file']}: {error}") from None
    return PositionalGraph(lambda flat: compiled(*flat))


@contextlib.contextmanager
def _private_inductor_cache() -> Iterator[None]:
    """Point inductor at this user's private cache while loading: it writes the
    artifact's Python wrapper there and imports it, so a shared, world-writable
    directory (inductor's default is under /tmp) would let others plant code."""
    with inductor_cache_in(private_cache_dir() / "inductor"):
        yield
