"""int8: quantize a captured model with PT2E and compile it frozen.

Runs in the compile worker, for models with `quantize = "int8"`. torchao's
`X86InductorQuantizer` annotates the float32 export (before inductor's
decompositions), `prepare_pt2e` adds observers, the calibration batches set the
scales, `convert_pt2e` makes the quantize/dequantize graph, and inductor,
with `freezing`, compiles that into oneDNN int8 GEMMs and convolutions
(`torch_internals.compile_frozen`). A frozen graph cannot be saved as an AOT
artifact, and its packed weights cannot be saved at all, so the wheel ships the
lean form alone, with the constants the module binds (`frozen_tensors.py`).

torchao is a build dependency only of projects that ask for int8
(`hatch-precompile[int8]`); the loader never imports it: the compiled graph
calls oneDNN ops that torch itself registers.
"""

from __future__ import annotations

import itertools
import re
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..engine.errors import ModelBuildError
from ..engine.model_config import ModelConfig
from ..runtime._arrays import array_kind
from ..runtime._contract import check_inputs, flatten_call
from ..runtime._schema import DimRecord
from . import torch_internals
from .capture import Call, Captured, _torch_error, import_callable

TORCHAO_REQUIREMENT = "torchao>=0.18,<0.19"  # as the int8 extra in pyproject.toml
# The op calls that show the compiled graph runs int8 kernels, not float32 ones
# that simulate the quantization (torch 2.14+ compiles those, 4x slower, when
# torchao's passes are not registered).
INT8_KERNEL_OPS = ("torch.ops.onednn.qlinear_pointwise", "torch.ops.onednn.qconv_pointwise")
# Matrix products X86InductorQuantizer does not quantize (it quantizes aten.linear and aten.conv*).
MATRIX_PRODUCT_OPS = ("aten.addmm", "aten.mm", "aten.bmm", "aten.matmul", "aten.baddbmm", "aten.einsum")


# With this many calibration batches or more, every HOLD_OUT-th is held out of the
# calibration for the accuracy check; with fewer, all calibrate and all are checked.
HOLD_OUT = 4


@dataclass
class Quantized:
    """An int8 model's converted module, and the calibration batches its accuracy
    is also checked on: batches like the model's real inputs, which the example
    inputs (random values where declared by shape) are not."""

    module: torch.fx.GraphModule
    checks: list[tuple[str, Call]]  # (which batch, in the build's words; the batch)


def quantize(model: ModelConfig, captured: Captured) -> Quantized:
    """The converted (int8) module of a captured model, calibrated on the model's
    `calibration` batches (less every HOLD_OUT-th, held out for the accuracy
    check, when there are HOLD_OUT or more) or, without one, on its example inputs."""
    step = "quantizing to int8"
    quantizer_module, convert_pt2e, prepare_pt2e = _torchao(model)
    quantizer = quantizer_module.X86InductorQuantizer()
    quantizer.set_global(quantizer_module.get_default_x86_inductor_quantization_config())
    assert captured.undecomposed is not None  # capture keeps it for quantize models
    try:
        prepared = prepare_pt2e(captured.undecomposed.module(), quantizer)
    except Exception as error:
        raise ModelBuildError(model.name, step, torchao_failure("prepare_pt2e", error)) from None
    calibrating = f"calibrating with calibration = {model.calibration!r}" if model.calibration else "calibrating on the example inputs"
    batches = list(calibration_batches(model, captured))
    held_out = set(range(HOLD_OUT - 1, len(batches), HOLD_OUT)) if model.calibration is not None and len(batches) >= HOLD_OUT else set()
    checks = [(f"calibration batch {i} (held out of calibration)", batches[i]) for i in sorted(held_out)]
    if model.calibration is not None and not held_out:
        checks = [(f"calibration batch {i} (calibrated on: fewer than {HOLD_OUT} batches, none held out)", batch) for i, batch in enumerate(batches)]
    with torch.no_grad():
        for index, (args, kwargs) in enumerate(batches):
            if index in held_out:
                continue
            try:
                prepared(*args, **kwargs)
            except Exception as error:
                raise ModelBuildError(model.name, calibrating, f"batch {index}: the prepared module failed: {_torch_error(error)}") from None
    try:
        converted: torch.fx.GraphModule = convert_pt2e(prepared)
    except Exception as error:
        raise ModelBuildError(model.name, step, torchao_failure("convert_pt2e", error)) from None
    if not any(_is_quantized_layer(node) for node in converted.graph.nodes):
        raise ModelBuildError(
            model.name,
            step,
            f'quantize = "int8", but X86InductorQuantizer found no layer to quantize: it quantizes linear layers and convolutions{_unquantized_products(converted)}; remove `quantize` for this model',
        )
    return Quantized(converted, checks)


def check_int8_kernels(model: ModelConfig, source: str) -> None:
    """Fail where the compiled graph runs no int8 kernel (see INT8_KERNEL_OPS)."""
    if not any(op in source for op in INT8_KERNEL_OPS):
        raise ModelBuildError(
            model.name,
            "compiling the int8 graph",
            f"the compiled graph calls no oneDNN int8 kernel (torch {torch.__version__}, torchao "
            f"{_torchao_version()}): it would run float32 arithmetic that only simulates int8. Use a torchao whose "
            f"x86 inductor passes support this torch ({TORCHAO_REQUIREMENT}: 0.18.0 was tested with torch 2.13-2.15)",
        )


def calibration_batches(model: ModelConfig, captured: Captured) -> Iterable[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Each calibration batch as (args, kwargs), checked against the captured
    inputs as the loader checks a call; the example inputs where the model has
    no `calibration`."""
    if model.calibration is None:
        yield captured.args, captured.kwargs
        return
    step = f"calibrating with calibration = {model.calibration!r}"
    make = import_callable(model.name, "calibration", model.calibration)
    dims: dict[str, DimRecord] = {name: {"min": spec.min, "max": spec.max, "buckets": [], "dynamic": True} for name, spec in model.dims.items()}
    count = 0
    try:
        for count, batch in enumerate(make(), start=1):
            if not (isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], (tuple, list)) and isinstance(batch[1], dict)):
                raise ModelBuildError(model.name, step, f"batch {count - 1}: expected (args, kwargs), a tuple of a tuple and a dict, got {type(batch).__name__}")
            args, kwargs = tuple(batch[0]), dict(batch[1])
            try:
                check_inputs(model.name, captured.input_leaves, dims, flatten_call(model.name, captured.input_tree, args, kwargs), array_kind("torch"))
            except (ValueError, TypeError, IndexError) as error:  # IndexError: values past an index bound
                raise ModelBuildError(model.name, step, f"batch {count - 1} does not fit the declared inputs: {error}") from None
            yield args, kwargs
    except ModelBuildError:
        raise
    except Exception:
        raise ModelBuildError(model.name, step, traceback.format_exc()) from None
    if count == 0:
        raise ModelBuildError(model.name, step, "it yielded no batch; yield at least one (args, kwargs) batch")


def torchao_failure(call: str, error: BaseException) -> str:
    """What the build says when torchao's `call` raised `error`: torchao's
    message, the model's layer it was working on (where torchao's frames hold
    one of the graph's nodes) and what the user can do about it."""
    layer = failing_layer(error)
    where = f" at layer {layer}" if layer else ""
    return (
        f"torchao's {call} failed{where}: {_torch_error(error)}\n"
        "What to try: leave that layer out of the module the factory returns where the model can do without it "
        '(for instance `model.pooler = None`), build this model without `quantize` (float32, or dtype = "bfloat16"), '
        f"or report it to torchao with torch {torch.__version__} and torchao {_torchao_version()}"
    )


def failing_layer(error: BaseException) -> str:
    """The model's layer behind the innermost graph node in the frames `error`
    was raised through, as `path (class), at file:line: code`, or "" where no
    frame holds a node that came from a module. Nodes keep the module path and
    source line torch.export recorded for them (`nn_module_stack`, `stack_trace`)."""
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, torch.fx.Node) and value.meta.get("nn_module_stack"):
                path, kind = list(value.meta["nn_module_stack"].values())[-1]
                return f"{path or '(the model itself)'} ({str(kind).rpartition('.')[2]}){_source_line(value)}"
    return ""


def _source_line(node: torch.fx.Node) -> str:
    """The innermost line of the model's (or its library's) code that made `node`, outside torch."""
    torch_dir = str(Path(torch.__file__).parent)
    lines = str(node.meta.get("stack_trace") or "").strip().splitlines()
    for header, code in reversed(list(itertools.pairwise(lines))):
        found = re.match(r'\s*File "(.+)", line (\d+), in', header)
        if found and not found[1].startswith(torch_dir):
            return f", at {Path(found[1]).name}:{found[2]}: {code.strip()}"
    return ""


def _is_quantized_layer(node: torch.fx.Node) -> bool:
    """A linear layer or convolution whose weight the quantizer made int8 (it
    reaches the layer through a dequantize). The quantizer may also quantize
    the inputs of elementwise ops, which alone make no int8 kernel."""
    if node.op != "call_function" or not str(node.target).startswith(("aten.linear", "aten.conv")) or len(node.args) < 2:
        return False
    weight = node.args[1]
    return isinstance(weight, torch.fx.Node) and "dequantize" in str(weight.target)


def _unquantized_products(graph_module: torch.fx.GraphModule) -> str:
    """What the message adds where the model multiplies matrices in ops the quantizer leaves in float32."""
    products = sorted({str(node.target) for node in graph_module.graph.nodes if str(node.target).startswith(MATRIX_PRODUCT_OPS)})
    if not products:
        return ""
    return (
        f", and this model's matrix products are {', '.join(products)}, which it leaves in float32 (transformers' "
        "Conv1D, as in GPT-2, is an addmm: make each an nn.Linear in the factory, see docs/configuration.md#int8)"
    )


def _torchao(model: ModelConfig) -> tuple[Any, Any, Any]:
    """torchao's x86 inductor quantizer module (importing it registers the
    passes that make inductor's int8 kernels on torch 2.14+), and convert_pt2e,
    prepare_pt2e; inductor's global pre-grad pass left as it was."""
    try:
        # the import sets that pass for the whole process: `int8_inductor_config` sets it for int8 compiles only
        with torch_internals.pre_grad_pass_kept():
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
            from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer
    except ImportError as error:
        raise ModelBuildError(
            model.name,
            "quantizing to int8",
            f'quantize = "int8" needs torchao in the build environment ({error}); add "hatch-precompile[int8]" (or "{TORCHAO_REQUIREMENT}") to [build-system] requires',
        ) from None
    return x86_inductor_quantizer, convert_pt2e, prepare_pt2e


def int8_inductor_config() -> dict[str, Any]:
    """What an int8 compile adds to inductor's configuration: torchao's pre-grad
    pass (`quant_lift_up`), which importing its quantizer sets process-wide, where
    a float model compiled next by the same worker would run it too."""
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer

    return {"pre_grad_custom_pass": x86_inductor_quantizer.quant_lift_up}


def _torchao_version() -> str:
    import torchao

    return str(getattr(torchao, "__version__", "unknown"))
