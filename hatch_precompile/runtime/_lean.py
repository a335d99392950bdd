"""The lean form: run inductor's output module directly, with its kernels.

What a compiled CPU graph runs is one generated Python module (`call(args)`)
that calls compiled C++ kernels and a few torch ops. The build ships that module,
rewritten so that each kernel is `shipped_kernel("<key>")` and nothing is imported
from the compiler, and checked it in a fresh process against eager and the
artifact. Loading it costs an `exec` of its source and one `dlopen` per kernel:
neither `torch._inductor` nor `torch._dynamo` is imported. An int8 variant
ships only this form, with the constants its module binds (`_frozen_tensors.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _torch_private
from ._arrays import ArrayKind
from ._errors import PrecompiledIntegrityError
from ._frozen_tensors import rebuild_constants
from ._graph import PositionalGraph, torch_only
from ._integrity import verified_bytes, verified_kernels
from ._manifest import HERE, same_torch_release, version_numbers
from ._schema import ArtifactEntry, ModelEntry, TorchAndPython, has_lean_form, is_lean_only

NAME, TITLE = "lean", "lean form"


shipped = has_lean_form  # the build reads the manifest by the same rule


def refused(artifact: ArtifactEntry) -> str:
    return artifact["lean"].get("refused", "")


def file(artifact: ArtifactEntry) -> str:
    return artifact["lean"]["file"]


def problems(artifact: ArtifactEntry, here: TorchAndPython) -> list[str]:
    """Inductor's output module (Python source) runs with kernels that are
    stable-ABI extensions of the Python they were built with: the same torch
    release (its op signatures, the module's helpers) and that Python or a later one."""
    built = artifact["built_with"]
    found = same_torch_release(built, here)
    if version_numbers(here["python"]) < version_numbers(built["python"]):
        found.append(f"python differs: its kernels need CPython {built['python']} or later")
    return found


def serves(model: ModelEntry, artifact: ArtifactEntry, arrays: str) -> str:
    return torch_only(arrays)


def load(name: str, model: ModelEntry, artifact: ArtifactEntry, kind: ArrayKind) -> PositionalGraph:
    """Verify the lean module, its kernels and an int8 variant's constants, then
    run its source; returns its graph, which takes the weights, then the user
    inputs (an int8 graph takes no weights)."""
    lean = artifact["lean"]
    source = verified_bytes(lean).decode("utf-8")
    kernels = verified_kernels(model, artifact)
    constants = {}
    if is_lean_only(artifact):
        constants = rebuild_constants(verified_bytes(artifact), HERE / artifact["file"], artifact["constants"])
    try:
        return PositionalGraph(make_runner(source, str(HERE / lean["file"]), kernels, lean["extern_kernels"], lean["inputs_to_check"], constants))
    except KeyError as error:
        raise PrecompiledIntegrityError(f"model {name!r}, {lean['file']}: kernel {error} is not shipped with it") from None


def make_runner(
    source: str,
    filename: str,
    kernels: dict[str, Path],
    extern_kernels: list[str],
    inputs_to_check: list[int],
    constants: dict[str, Any],
) -> Callable[[list[Any]], Any]:
    """Run a lean module's source with its kernels and constants bound; returns
    its `call`, preceded by the alignment copies inductor's own wrapper makes."""
    call = _torch_private.run_lean_module(source, filename, extern_kernels, lambda key: _torch_private.load_kernel(kernels[key], key), constants)

    def run(flat: list[Any]) -> Any:
        for index in inputs_to_check:
            if _torch_private.misaligned(flat[index]):
                flat[index] = flat[index].clone()
        return call(flat)

    return run
