"""The compile worker's process: `python -m hatch_precompile.worker REQUEST.json ...`.

The hook runs compile workers so that torch, the project's code and inductor's
state never enter the build backend's process. One worker builds the models of
its requests in turn: torch, torch.export and inductor are imported once, not
once per model, and the forms of every model it compiled are checked at the end,
form by form (`compile.FORMS`), each in fresh processes. It stops at the first model that
fails. What it reads, prints and writes is `engine.protocol`'s: a `WorkerRequest`
per model, progress lines, and per model a `BuiltModel` or a `WorkerFailure`.
"""

from __future__ import annotations

import copy
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine.protocol import BuiltModel, Progress, WorkerFailure, WorkerRequest, write_result
from ..engine.remote import Traffic, remote_cache
from ..runtime._choice import FORMS as LOADED_FORMS  # what a variant ships, read as the loader reads it
from ..runtime._schema import QuantizationRecord, WeightsEntry

if TYPE_CHECKING:
    from .capture import Captured
    from .compile import ProducedArtifact


@contextmanager
def _step(model: str, description: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    _report(model, description, time.perf_counter() - start)


def _report(model: str, description: str, seconds: float | None = None, *, once: bool = False) -> None:
    print(Progress(model, description, None if seconds is None else round(seconds, 2), once).line(), flush=True)


def _report_remote(request: WorkerRequest) -> None:
    """What the remote store has to say (down, a damaged entry): once per build, whichever worker says it."""
    if request.sources.remote is not None:
        for notice in remote_cache(request.sources.remote).take_notices():
            _report(request.model.name, notice, once=True)


@dataclass
class _Compiled:
    """A model whose variants are compiled (or fetched), their forms not yet checked."""

    request: WorkerRequest
    captured: Captured  # the first variant's capture: its signature describes the model
    weights: WeightsEntry
    op_libraries: dict[str, str]  # custom op -> the module defining it, imported before running the graph
    produced: list[ProducedArtifact]
    seconds: float
    quantization: QuantizationRecord | None  # a model's quantized linear layers


def run(requests: list[WorkerRequest]) -> None:
    """Build every request's model, writing each one's result; the first failure
    is written as that model's result and raised (ModelBuildError), leaving later
    models without one."""
    from ..engine.errors import ModelBuildError

    sys.path[:0] = requests[0].import_paths  # one build: the same paths and compiler outputs for every model
    with _step(requests[0].model.name, "imported torch"):
        import torch  # noqa: F401  (timed on its own: seconds on a cold disk)

        from . import torch_internals
    with torch_internals.compiler_outputs_in(requests[0].compiler_outputs):
        compiled = []
        for request in requests:
            try:
                compiled.append(_produce_variants(request))
            except ModelBuildError as error:
                write_result(request.out_dir, WorkerFailure(error.step, error.message))
                raise
            except Exception:
                write_result(request.out_dir, WorkerFailure("building", traceback.format_exc()))
                raise
        try:
            _check_forms(compiled)
        except ModelBuildError as error:  # an int8 model's only form failed its check
            failed = next(m.request for m in compiled if m.request.model.name == error.model)
            write_result(failed.out_dir, WorkerFailure(error.step, error.message))
            raise
        for model in compiled:
            write_result(model.request.out_dir, _finish(model))


def _produce_variants(request: WorkerRequest) -> _Compiled:
    """Build the module, capture and compile (or fetch) each variant."""
    from ..engine.errors import ModelBuildError
    from . import torch_internals
    from .accuracy import summary as accuracy_summary
    from .capture import build_module, capture, example_calls
    from .compile import cpu_targets, produce_artifact
    from .linears import quantize_weights, with_float32_between
    from .quantize import quantize
    from .weights import lifted_weights, save_weights

    model, out_dir, started = request.model, request.out_dir, time.perf_counter()
    torch_internals.start_model()
    with _step(model.name, "built the module"):
        module, reference = build_module(model)
    quantization = unquantized = float32_quantized = None
    dynamic = model.quantize == "int8-dynamic"
    if model.quantizes_linears:
        if reference is not None and not dynamic:  # its bfloat16 rounding is the yardstick of the compiled model's (worker/accuracy.py)
            unquantized = copy.deepcopy(module)
        with _step(model.name, f"quantized its linear layers' weights with torchao ({model.quantize})"):
            quantization = quantize_weights(model, module, example_calls(model))
        if reference is not None and dynamic:
            float32_quantized = with_float32_between(module, reference)
        left = f"; left in bfloat16: {quantization['left']}" if quantization["left"] else ""
        int8 = quantization.get("int8", {})
        kept = f" ({', '.join(int8)} in int8: {next(iter(int8.values()))})" if int8 else ""
        smoothed = f", their inputs smoothed as measured on {quantization['smoothed_on']} example call(s) and rounded to int8 at each call" if "smoothed_on" in quantization else ""
        shared = f"; {len(quantization['shared_input'])} sets of layers taking one input quantized as one" if "shared_input" in quantization else ""
        _report(model.name, f"{len(quantization['layers'])} linear layers hold {quantization['scheme'].split('-')[0]} weights{smoothed}{kept}{left}{shared}")
    produced: list[ProducedArtifact] = []
    first: tuple[Captured, WeightsEntry] | None = None
    op_libraries: dict[str, str] = {}
    for fixed in model.shape_variants():
        shape = ", ".join(f"{dim}={size}" for dim, size in fixed.items()) or "dynamic dims"
        with _step(model.name, f"captured with torch.export ({shape})"):
            captured = capture(model, module, fixed, reference, unquantized, float32_quantized)
        if captured.strict_because:
            _report(model.name, f"captured strictly (torch.export's strict=True, through dynamo): {captured.strict_because}")
        if captured.state:
            _report(model.name, f"state updated in place: {', '.join(captured.state)}; checked on {len(captured.calls)} calls")
        if captured.state and model.quantize == "int8":
            frozen = "int8 graphs are compiled with their buffers frozen in; build it in float32 or bfloat16"
            raise ModelBuildError(model.name, "quantizing to int8", f"the model updates buffers ({', '.join(captured.state)}), and {frozen}")
        if first is None:
            first = captured, save_weights(model, captured, out_dir)
            op_libraries = torch_internals.python_op_libraries(captured.exported)
        elif list(lifted_weights(captured)) != first[1]["order"]:
            raise ModelBuildError(model.name, f"capturing ({shape})", "the weights the graph takes differ between shape variants")
        quantized = None
        if model.quantize == "int8":
            with _step(model.name, f"quantized to int8 with torchao's PT2E ({shape})"):
                quantized = quantize(model, captured)
        for target in cpu_targets(model):
            variant_started = time.perf_counter()
            artifact = produce_artifact(model, captured, fixed, target, out_dir, request.sources, op_libraries, quantized)
            produced.append(artifact)
            _report_remote(request)
            checked = accuracy_summary(artifact.entry["accuracy"]) if artifact.checked_here else f"not run here: this CPU lacks {target.name} (checked where the part was built)"
            source = "compiled" if artifact.origin == "compiled" else f"{artifact.origin}: {artifact.entry['file']}"
            if artifact.form_times:
                source += f" ({', '.join(artifact.form_times)})"
            _report(model.name, f"{target.name} ({shape}): {source}, {checked}", time.perf_counter() - variant_started)
    assert first is not None  # shape_variants() gives at least one
    captured, weights = first
    return _Compiled(request, captured, weights, op_libraries, produced, time.perf_counter() - started, quantization)


def _finish(model: _Compiled) -> BuiltModel:
    """Keep each artifact in the build cache (or part) and describe the model for the manifest."""
    from .compile import CHECK_DIR, model_entry

    request = model.request
    shutil.rmtree(request.out_dir / CHECK_DIR, ignore_errors=True)
    refused: dict[tuple[str, str], list[str]] = {}  # (form, reason) -> the variants it holds for: said once
    for artifact in model.produced:
        request.sources.store(artifact.key, request.out_dir, artifact.entry, artifact.origin)
        shipped = [f"{form.TITLE} ({form.file(artifact.entry)})" for form in LOADED_FORMS.values() if form.shipped(artifact.entry)]
        _report(request.model.name, f"{artifact.entry['file']}: {', '.join(shipped)}")
        for form in LOADED_FORMS.values():
            if reason := form.refused(artifact.entry):
                refused.setdefault((form.TITLE, reason), []).append(artifact.entry["file"])
    for (title, reason), files in refused.items():
        _report(request.model.name, f"no {title} for {', '.join(files)} (the forms above load instead): {reason}")
    _report_remote(request)
    return BuiltModel(
        model_entry(request.model, model.captured, model.weights, model.op_libraries, [a.entry for a in model.produced], model.quantization),
        {a.entry["file"]: a.key for a in model.produced},
        {a.entry["file"]: a.origin for a in model.produced},
        round(model.seconds, 2),
        remote_cache(request.sources.remote).take_traffic() if request.sources.remote else Traffic(),
    )


def _check_forms(models: list[_Compiled]) -> None:
    """Each form checks what it produced of every model's variants (`form.BuildForm.check`)."""
    from .compile import CHECK_DIR, FORMS

    pending = [artifact.pending for model in models for artifact in model.produced if artifact.pending is not None]
    for form in FORMS:
        form.check(pending, models[0].request.out_dir / CHECK_DIR / form.NAME, _step)


def main(request_paths: list[str]) -> int:
    """Exit status 0 only when every model was built."""
    try:
        run([WorkerRequest.read(Path(path)) for path in request_paths])
    except Exception:  # already written as the failing model's result
        return 1
    return 0
