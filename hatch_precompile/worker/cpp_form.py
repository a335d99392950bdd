"""The C++ form of a variant: produce its library, check it in a fresh process.

Produced from the same captured export as the artifact (`compile.py`), with the
same inductor options and CPU target, by AOTInductor into one model container
library holding no weights (`torch_internals.aoti`). It ships beside the lean
form, which stays the fallback: a variant this form cannot compile, or whose
library fails its check, ships without it, and the manifest says why
(`cpp["refused"]`). The check runs the library as the loader does
(`runtime/_cpp.py`) in a new interpreter, on every call of the build's check from
the initial state, and compares each call's outputs with eager's, with the
model's accuracy bounds (its kernels are not the artifact's, so not bit for bit).

`python -m hatch_precompile.worker.cpp_form REQUEST.json` is that interpreter:
it writes, per library, its outputs or the reason it could not run them.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from ..engine.errors import ModelBuildError
from ..engine.model_config import ModelConfig
from ..engine.native import UnprovidedLibraryError, read_needs, system_needs, torch_libraries
from ..runtime._layout import KERNELS_DIR, cpp_library_file, cpp_ops_file, kernel_file
from ..runtime._schema import ArtifactEntry, CppRecord, InputLeaf
from .lean_check import COMPILER_MODULES

CHECK_MODULE = "hatch_precompile.worker.cpp_form"


@dataclass
class CppCandidate:
    """A library waiting for its check, and what eager gave on the same calls."""

    artifact: ArtifactEntry  # its manifest entry: `cpp` is replaced by a refusal if the check fails
    library: Path
    data_path: Path  # torch.save of compile._CheckedSequence: the initial weights and state, the calls
    order: list[str]  # the weights' names, in the graph's order
    leaves: list[InputLeaf]
    eager: list[list[Any]]  # eager's flat outputs for each call
    call_names: list[str]  # each call, in the build's messages (`Captured.call_name`)
    reference: list[Any] | None  # a lower-precision model's float32 outputs on the first call


class _LibraryCheck(TypedDict):
    library: str
    record: CppRecord
    order: list[str]
    leaves: list[InputLeaf]
    data: str
    outputs: str  # where the interpreter saves the outputs of each call


def refusal(model: ModelConfig, op_libraries: dict[str, str], aliased: str) -> str:
    """Why this model has no C++ form, or ""; `aliased` is why an output is not a
    tensor of its own or an input as it is (`torch_internals.aliased_output`'s words), or ""."""
    if model.quantize == "int8":
        return "an int8 graph is compiled with its weights frozen in as oneDNN's packed constants, which the container cannot bind"
    if op_libraries:
        return f"its graph calls Python custom ops ({', '.join(sorted(op_libraries))}), which a C++ container cannot call"
    if aliased:
        return aliased
    return ""


def produce(exported: Any, config: dict[str, Any], entry: ArtifactEntry, out_dir: Path, order: list[str]) -> CppRecord:
    """Compile the variant's library into `out_dir`, or say why not. What it needs
    of the system counts in the variant's once it passed its check."""
    from .capture import _torch_error
    from .torch_internals import compile_container, container_constants, returned_inputs

    try:
        library, ops = compile_container(exported, config)
    except Exception as error:  # the build goes on in the lean form, saying why
        return {"refused": f"AOTInductor could not compile it: {_torch_error(error)}"}
    path = out_dir / cpp_library_file(entry["file"])
    path.write_bytes(library)
    ops_path = out_dir / cpp_ops_file(path.name)
    if ops is not None:
        ops_path.write_bytes(ops)
    constants = container_constants(path, exported)
    unknown = sorted(set(constants.values()) - set(order))
    if unknown:
        path.unlink()
        ops_path.unlink(missing_ok=True)
        return {"refused": f"the library holds constants that are not the graph's weights: {', '.join(unknown)}"}
    record: CppRecord = {"file": path.name, "constants": constants}
    returned = returned_inputs(exported)
    if returned:
        record["returned_inputs"] = [[output, given] for output, given in sorted(returned.items())]
    if ops is not None:
        record["ops"] = {"file": ops_path.name, "size": len(ops), "sha256": hashlib.sha256(ops).hexdigest()}
    return record


def check_in_fresh_process(model: ModelConfig, candidates: list[CppCandidate], scratch: Path) -> None:
    """Run each library in a new interpreter, as the loader would, and compare its
    outputs with eager's; a library that fails is removed, and its variant ships
    without a C++ form, the reason in the manifest."""
    import torch

    from .accuracy import check_accuracy

    checks: list[_LibraryCheck] = []
    for index, candidate in enumerate(candidates):
        library, record, data = str(candidate.library), candidate.artifact["cpp"], str(candidate.data_path)
        checks.append({"library": library, "record": record, "order": candidate.order, "leaves": candidate.leaves, "data": data, "outputs": str(scratch / f"cpp-{index}.pt")})
    request = scratch / "cpp-check.json"
    request.write_text(json.dumps(checks), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", CHECK_MODULE, str(request)], capture_output=True, text=True)
    for check, candidate in zip(checks, candidates):
        reason = f"the check process exited with {done.returncode}: {done.stderr.strip()[-1500:]}" if done.returncode else ""
        if not reason:
            ran = torch.load(check["outputs"], weights_only=True)
            reason = ran["failed"]
        if not reason:
            try:
                for call, (outputs, eager) in enumerate(zip(ran["outputs"], candidate.eager, strict=True), start=1):
                    check_accuracy(model, outputs, eager, candidate.reference if call == 1 else None, f"{candidate.call_names[call - 1]} (the C++ form)")
            except ModelBuildError as error:
                reason = error.message
        if not reason:
            reason = _count_native_needs(candidate)
        if reason:
            candidate.library.unlink()
            (candidate.library.parent / cpp_ops_file(candidate.library.name)).unlink(missing_ok=True)
            candidate.artifact["cpp"] = {"refused": reason}


def _count_native_needs(candidate: CppCandidate) -> str:
    """Add what the library needs of the system (a C++ runtime with threads: the
    build machine's glibc and libstdc++ symbol versions) to its variant's needs,
    which decide the wheel's tag; or say why it cannot ship."""
    kernels = candidate.library.parent / KERNELS_DIR
    needs = [read_needs(kernels / kernel_file(key)) for key in candidate.artifact["kernels"]]
    try:
        candidate.artifact["native"] = system_needs([*needs, read_needs(candidate.library)], torch_libraries()).manifest()
    except UnprovidedLibraryError as error:
        return str(error)
    return ""


def _run(check: _LibraryCheck) -> dict[str, Any]:
    """Run one library on each call from the initial state, through the loader's code."""
    import torch

    from ..runtime._cpp import ContainerGraph

    data = torch.load(check["data"], weights_only=True)  # compile._CheckedSequence
    graph = ContainerGraph(Path(check["library"]), check["record"], check["order"], check["leaves"])
    run = graph.bind(data["initial"])  # the state in it is updated in place by each call
    outputs = []
    for inputs in data["calls"]:
        with torch.no_grad():
            outputs.append(list(run(list(inputs))))
    return {"failed": "", "outputs": outputs}


def main(request_path: str) -> int:
    import torch

    checks: list[_LibraryCheck] = json.loads(Path(request_path).read_text(encoding="utf-8"))  # written just now by check_in_fresh_process
    for check in checks:
        try:
            ran = _run(check)
        except Exception as error:  # reported per library; the variant ships without the C++ form
            ran = {"failed": f"running it failed: {type(error).__name__}: {error}"}
        imported = [name for name in COMPILER_MODULES if name in sys.modules]
        if imported and not ran["failed"]:
            ran = {"failed": f"running it imported {', '.join(imported)}"}
        torch.save(ran, check["outputs"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
