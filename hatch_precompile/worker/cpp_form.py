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
from pathlib import Path
from typing import Any, TypedDict

from ..engine.errors import ModelBuildError
from ..engine.model_config import ModelConfig
from ..engine.native import UnprovidedLibraryError, read_needs, system_needs, torch_libraries
from ..runtime._layout import KERNELS_DIR, cpp_library_file, cpp_ops_file, kernel_file
from ..runtime._schema import SHIM_PROVIDER, CppRecord, InputLeaf, has_cpp_form, is_torch_free
from ..shim.build import OPENMP_SONAME, openmp_runtime
from .form import COMPILER_MODULES, Pending, Step, Variant

CHECK_MODULE = "hatch_precompile.worker.cpp_form"


class _LibraryCheck(TypedDict):
    library: str
    record: CppRecord
    order: list[str]
    leaves: list[InputLeaf]
    data: str
    outputs: str  # where the interpreter saves the outputs of each call


NAME, TITLE = "cpp", "C++ form"
TIMED = True  # AOTInductor compiles the graph's wrapper and kernels again: seconds


def wanted(model: ModelConfig) -> bool:
    return model.cpp_form


def produce(variant: Variant) -> CppRecord:
    """Compile the variant's library into its folder, or say why not. What it
    needs of the system counts in the variant's once it passed its check. A
    torch-free model's library is compiled without libtorch first; where the
    wheel's shim cannot give what it calls, the usual library is compiled, and
    the record says why (`torch_free_refused`), for the fallback policy to judge
    (`engine/pipeline.py`, which sees variants from the build cache too)."""
    from .weights import lifted_weights

    reason = _refusal(variant)
    if reason:
        return {"refused": reason, "torch_free_refused": reason} if variant.model.torch_free else {"refused": reason}
    order = list(lifted_weights(variant.captured))
    torch_free = _torch_free_refusal(variant.model)
    if variant.model.torch_free and not torch_free:
        record = compile_library(variant.captured.exported, variant.options, variant.entry["file"], variant.out_dir, order, torch_free=True)
        if "file" in record:
            return record
        torch_free = record["refused"]
    record = compile_library(variant.captured.exported, variant.options, variant.entry["file"], variant.out_dir, order)
    if torch_free:
        record["torch_free_refused"] = torch_free
    return record


def compile_library(exported: Any, options: dict[str, Any], artifact: str, out_dir: Path, order: list[str], torch_free: bool = False) -> CppRecord:
    """The library of the export whose artifact is `artifact`, compiled into
    `out_dir` with inductor `options`, binding the weights named `order`; or why
    there is none (no file of it is left then). `torch_free`: linked against no
    torch library, for the wheel's own shim, which must give all it calls."""
    from ..shim.build import referenced, unprovided
    from .capture import _torch_error
    from .torch_internals import TORCH_FREE_CONFIG, compile_container, container_constants, returned_inputs

    try:
        library, ops, original = compile_container(exported, {**options, **TORCH_FREE_CONFIG} if torch_free else options)
    except Exception as error:  # the build goes on in the lean form, saying why
        return {"refused": f"AOTInductor could not compile it: {_torch_error(error)}"}
    path = out_dir / cpp_library_file(artifact)
    path.write_bytes(library)
    ops_path = out_dir / cpp_ops_file(path.name)
    if ops is not None:
        ops_path.write_bytes(ops)
    references = sorted(referenced(path)) if torch_free else []
    missing = unprovided(references)
    if torch_free and (missing or ops is not None):
        path.unlink()
        ops_path.unlink(missing_ok=True)
        calls = f"its graph calls {', '.join(missing)}, which the wheel's shim does not provide" if missing else "its graph calls ops through AOTInductor's proxy executor"
        return {"refused": f"no torch-free form: {calls}"}
    constants = container_constants(path, exported, original if torch_free else None)
    unknown = sorted(set(constants.values()) - set(order))
    if unknown:
        path.unlink()
        ops_path.unlink(missing_ok=True)
        return {"refused": f"the library holds constants that are not the graph's weights: {', '.join(unknown)}"}
    record: CppRecord = {"file": path.name, "constants": constants}
    if torch_free:
        record["provider"], record["references"] = SHIM_PROVIDER, references
    returned = returned_inputs(exported)
    if returned:
        record["returned_inputs"] = [[output, given] for output, given in sorted(returned.items())]
    if ops is not None:
        record["ops"] = {"file": ops_path.name, "size": len(ops), "sha256": hashlib.sha256(ops).hexdigest()}
    return record


def _torch_free_refusal(model: ModelConfig) -> str:
    """Why a torch-free model can have no torch-free form, before compiling one; or ""."""
    if model.torch_free and (model.dtype == "bfloat16" or model.quantize):
        precision = f"quantize = {model.quantize!r}" if model.quantize else 'dtype = "bfloat16"'
        return f"no torch-free form: the wheel's shim computes its operators in float32, and this model has {precision}"
    return ""


def _refusal(variant: Variant) -> str:
    """Why this variant can have no C++ form, before compiling one; or ""."""
    from .torch_internals import aliased_output

    if variant.frozen is not None:
        return "an int8 graph is compiled with its weights frozen in as oneDNN's packed constants, which the container cannot bind"
    if variant.op_libraries:
        return f"its graph calls Python custom ops ({', '.join(sorted(variant.op_libraries))}), which a C++ container cannot call"
    return aliased_output(variant.captured.exported)


def check(pending: list[Pending], scratch: Path, step: Step) -> None:
    """Run each library compiled here in a new interpreter (one per model), as the
    loader would, and compare its outputs with eager's; a library that fails is
    removed, and its variant ships without a C++ form, the reason in the manifest.
    (One from the build cache or a part passed this check when compiled.)"""
    models: dict[str, list[Pending]] = {}
    for variant in pending:
        if variant.compiled_here and has_cpp_form(variant.entry):
            models.setdefault(variant.model.name, []).append(variant)
    for model, variants in models.items():
        folder = scratch / f"cpp-{model}"
        folder.mkdir(parents=True, exist_ok=True)
        where = "in a venv without torch" if all(is_torch_free(v.entry) for v in variants) else "in a fresh process"
        with step(model, f"ran the C++ form of {len(variants)} variant(s) {where} and compared with eager"):
            _check_in_fresh_process(variants, folder)


def _library(variant: Pending) -> Path:
    return variant.out_dir / variant.entry["cpp"]["file"]


def _check_in_fresh_process(pending: list[Pending], scratch: Path) -> None:
    from .accuracy import check_calls
    from .torch_free import run_without_torch

    ran = _run_on_torch([v for v in pending if not is_torch_free(v.entry)], scratch)
    free = [v for v in pending if is_torch_free(v.entry)]
    if free:
        ran.update(zip(map(id, free), run_without_torch([_torch_free_check(v) for v in free], scratch)))
    for variant in pending:
        outputs_or_reason = ran[id(variant)]
        reason = outputs_or_reason if isinstance(outputs_or_reason, str) else ""
        if not reason:
            try:
                check_calls(variant.model, variant.yardstick, [list(outputs) for outputs in outputs_or_reason], None, " (the C++ form)")
            except ModelBuildError as error:
                reason = error.message
        if not reason:
            reason = _count_native_needs(variant)
        if reason:
            library = _library(variant)
            library.unlink()
            (library.parent / cpp_ops_file(library.name)).unlink(missing_ok=True)
            if is_torch_free(variant.entry):
                reason = f"its torch-free form failed its check: {reason}"
                variant.entry["cpp"] = {"refused": reason, "torch_free_refused": reason}
            else:
                variant.entry["cpp"] = {"refused": reason}


def _run_on_torch(pending: list[Pending], scratch: Path) -> dict[int, list[list[Any]] | str]:
    """Each library's outputs for each call (by the variant's id), run through
    torch's runner in one new interpreter; or why it could not run."""
    import torch

    checks: list[_LibraryCheck] = []
    for index, variant in enumerate(pending):
        record, data = variant.entry["cpp"], str(variant.data_path)
        checks.append({"library": str(_library(variant)), "record": record, "order": variant.order, "leaves": variant.leaves, "data": data, "outputs": str(scratch / f"cpp-{index}.pt")})
    if not checks:
        return {}
    request = scratch / "cpp-check.json"
    request.write_text(json.dumps(checks), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", CHECK_MODULE, str(request)], capture_output=True, text=True)
    ran: dict[int, list[list[Any]] | str] = {}
    for check, variant in zip(checks, pending):
        if done.returncode:
            ran[id(variant)] = f"the check process exited with {done.returncode}: {done.stderr.strip()[-1500:]}"
        else:
            saved = torch.load(check["outputs"], weights_only=True)
            ran[id(variant)] = saved["failed"] or saved["outputs"]
    return ran


def _torch_free_check(variant: Pending) -> dict[str, Any]:
    """What the torch-free check reads of a variant (`torch_free.run_without_torch`)."""
    outputs = [str(output.dtype).removeprefix("torch.") for output in variant.yardstick.eager[0][0]]
    return {"library": str(_library(variant)), "record": variant.entry["cpp"], "order": variant.order, "leaves": variant.leaves, "outputs": outputs, "data": str(variant.data_path)}


def _count_native_needs(variant: Pending) -> str:
    """Add what the library needs of the system (a C++ runtime with threads: the
    build machine's glibc and libstdc++ symbol versions) to its variant's needs,
    which decide the wheel's tag; or say why it cannot ship."""
    kernels = variant.out_dir / KERNELS_DIR
    needs = [read_needs(kernels / kernel_file(key)) for key in variant.entry["kernels"]]
    provided = torch_libraries()
    if is_torch_free(variant.entry):  # the wheel carries the OpenMP runtime it links, whose own needs count
        needs.append(read_needs(openmp_runtime()))
        provided = {*provided, OPENMP_SONAME}
    try:
        variant.entry["native"] = system_needs([*needs, read_needs(_library(variant))], provided).manifest()
    except UnprovidedLibraryError as error:
        return str(error)
    return ""


def _run(check: _LibraryCheck) -> dict[str, Any]:
    """Run one library on each call from the initial state, through the loader's code."""
    import torch

    from ..runtime._cpp import ContainerGraph

    data = torch.load(check["data"], weights_only=True)  # compile.CheckedSequence
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
