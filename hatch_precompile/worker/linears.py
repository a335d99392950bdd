"""Linear layers with 8- or 4-bit weights: weight-only int8 and int4, and int8-dynamic.

Runs in the compile worker, for models with `quantize = "int8-weight-only"`,
`"int4-weight-only"` or `"int8-dynamic"`, on the bfloat16 module before capture.
Decoding at batch 1 reads every weight once per token, so fewer bytes per weight
is what makes a step faster; the CPU kernels for 8- and 4-bit weights are fast only
with bfloat16 activations (docs/configuration.md#weight-only-int8-and-int4).

torchao computes the quantized weights: `Int8Tensor` (symmetric, one scale per
output channel) and `Int4OpaqueTensor` (asymmetric, a scale and a zero point per
group of `group-size` inputs, packed for the CPU kernel). Each `nn.Linear`, and
transformers' `Conv1D` (GPT-2's, a transposed linear), becomes a module that
holds those tensors as buffers and calls the core-torch kernel that torchao's own
tensors dispatch to: `aten._weight_int8pack_mm` and
`aten._weight_int4pack_mm_for_cpu`. So the capture holds plain tensors and core
ops, and the rest of the build is that of any bfloat16 model: the wheel ships
the int8 or packed int4 weights and their scales (no float copy), in the artifact
and lean forms, and the loader needs neither torchao nor a compiler. The
attribute names read from torchao's tensors are its documented tensor data
(`qdata`, `scale`, `scale_and_zero`); tests/test_torch_assumptions.py checks that
these modules compute what torchao's own linear does.

int8-dynamic multiplies in int8 both ways (`torch._int_mm`, oneDNN's s8s8 product,
on VNNI's dot products): each call rounds a layer's input rows to int8, one scale
per row (what torchao's `Int8DynamicActivationInt8WeightConfig` does). Rounding a
whole row to one scale loses the small channels beside a few large ones, which a
trained LLM's activations have (SmolLM2-135M: perplexity 42.4 against float32's
40.9); so each input channel is first divided by a smoothing factor measured on
the build's example calls and the weight's column multiplied by it (SmoothQuant,
Xiao et al. 2023, alpha 0.5), which brings it to 41.3 at no cost per call (the
division joins the rounding's kernel). The weight is stored smoothed, so the wheel
ships one int8 copy, as the weights file maps it: no prepacking at load.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..engine.errors import ModelBuildError
from ..engine.model_config import DEFAULT_INT4_GROUP_SIZE, ModelConfig
from ..runtime._schema import QuantizationRecord
from .quantize import TORCHAO_REQUIREMENT
from .torch_internals import int4_weight_matmul, int8_matmul, int8_weight_matmul

if TYPE_CHECKING:
    from .capture import Call

# llama.cpp's quantize tool keeps the output matrix (or the tied embedding serving
# as one) of a Q4_0 model at Q6_K, or Q8_0 where its width is no multiple of 256:
# on SmolLM2-135M, 28 of its 135 million weights, and the layer whose rounding moves
# the logits most directly (docs/performance.md).
OUTPUT_IN_INT8 = "the output layer (the logits), kept in int8 as llama.cpp's quantize tool keeps it at 6 or 8 bits"


class Int8WeightOnlyLinear(nn.Module):
    """y = x W^T + b with W stored as int8, one bfloat16 scale per output channel."""

    weight_int8: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, weight_int8: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = int8_weight_matmul(x.reshape(-1, self.in_features), self.weight_int8, self.scales)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


# SmoothQuant's migration strength: how much of an input channel's range moves into
# the weight's column (0: none, 1: all); 0.5 measured best of 0.3, 0.5 and 0.7 on
# SmolLM2-135M (docs/configuration.md#int8-dynamic).
SMOOTHING_ALPHA = 0.5
# No smoothing factor, scale or range below this: an input channel the example
# calls never reached, a weight column of zeros.
TINY = 1e-5


class Int8DynamicLinear(nn.Module):
    """y = x W^T + b with x rounded to int8 at each call (one scale per row, after
    each input channel is divided by its smoothing factor) and W stored int8 with
    its columns multiplied by the smoothing and one float32 scale per output
    channel; the product exact in int32."""

    weight_int8: torch.Tensor
    scales: torch.Tensor
    unsmoothing: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, weight_int8: torch.Tensor, scales: torch.Tensor, unsmoothing: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scales", scales)
        self.register_buffer("unsmoothing", unsmoothing)  # 1 / each input channel's smoothing factor
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float() * self.unsmoothing
        step = rows.abs().amax(1, keepdim=True).clamp(min=TINY) / 127
        # Clamped: compiled, the division may round a row's largest value past 127.
        rounded = torch.round(rows / step).clamp(-127, 127).to(torch.int8)
        y = int8_matmul(rounded, self.weight_int8.t()).float() * step * self.scales
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class Int4WeightOnlyLinear(nn.Module):
    """y = x W^T + b with W stored as 4-bit values packed for the CPU kernel, a
    bfloat16 scale and zero point per group of `group_size` inputs."""

    weight_int4: torch.Tensor
    scales_and_zeros: torch.Tensor
    group_size: torch.Tensor  # 0-dim int64: a buffer, so the compiled graph holds no constant (torch_internals.low_bit)
    bias: torch.Tensor | None

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, out_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = out_features, packed.shape[1] * 2
        self.register_buffer("weight_int4", packed)
        self.register_buffer("group_size", torch.tensor(group_size, dtype=torch.int64))
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = int4_weight_matmul(x.reshape(-1, self.in_features).contiguous(), self.weight_int4, self.group_size, self.scales_and_zeros)
        y = y[:, : self.out_features].reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


@dataclass
class _Layer:
    """A layer to quantize: itself, where it sits, its weight as (out, in) and its bias."""

    module: nn.Module
    parent: nn.Module
    attribute: str
    weight: torch.Tensor
    bias: torch.Tensor | None


def quantize_weights(model: ModelConfig, module: nn.Module, calls: Sequence[Call] = ()) -> QuantizationRecord:
    """Replace, in place, each linear layer of the bfloat16 `module` by its
    quantized form; returns what was quantized and what was left in bfloat16
    (with why), for the manifest. int8-dynamic measures its smoothing on `calls`
    (the build's example calls, in order: run on a copy, whose state they change)."""
    step = f"quantizing the weights ({model.quantize})"
    bits = 4 if model.quantize == "int4-weight-only" else 8
    dynamic = model.quantize == "int8-dynamic"
    group_size = model.group_size or DEFAULT_INT4_GROUP_SIZE
    int8_tensor, int4_tensor, per_row = _torchao(model)
    record: QuantizationRecord = {"scheme": str(model.quantize), "layers": [], "left": {}}
    if bits == 4:
        record["group_size"] = group_size
        record["int8"] = {}
    ranges = _input_ranges(model, module, calls) if dynamic else {}
    if dynamic:
        record["smoothed_on"] = len(calls)
    output_layers = _output_layers(module)
    replaced: dict[int, nn.Module] = {}  # a layer reached under two names (shared) is quantized once
    for name, layer in _linear_layers(module):
        if id(layer.module) in replaced:
            setattr(layer.parent, layer.attribute, replaced[id(layer.module)])
            continue
        out_features, in_features = layer.weight.shape
        if isinstance(layer.parent, nn.MultiheadAttention):
            record["left"][name] = "nn.MultiheadAttention reads this layer's weight itself instead of calling it"
            continue
        as_int8 = bits == 4 and id(layer.module) in output_layers and not _kernel_refuses(8, group_size, out_features, in_features)
        if not as_int8 and not dynamic and (reason := _kernel_refuses(bits, group_size, out_features, in_features)):
            record["left"][name] = reason
            continue
        # Conv1D's is a transposed view; the kernels take rows. int8-dynamic smooths it in float32 first.
        weight = layer.weight.detach().to(torch.float32 if dynamic else torch.bfloat16).contiguous()
        bias = None if layer.bias is None else layer.bias.detach().to(torch.bfloat16)
        try:
            if as_int8:
                record["int8"][name] = OUTPUT_IN_INT8
            if dynamic:
                replacement: nn.Module = _int8_dynamic(int8_tensor, per_row(), weight, bias, ranges.get(id(layer.module)))
            elif bits == 8 or as_int8:
                quantized = int8_tensor.from_hp(weight, per_row())
                replacement = Int8WeightOnlyLinear(quantized.qdata, quantized.scale.reshape(-1).to(torch.bfloat16), bias)
            else:
                quantized = int4_tensor.from_hp(weight, [1, group_size])
                replacement = Int4WeightOnlyLinear(quantized.qdata, quantized.scale_and_zero, group_size, out_features, bias)
        except Exception as error:
            raise ModelBuildError(model.name, step, f"torchao failed on layer {name} ({out_features}x{in_features}): {type(error).__name__}: {error}") from None
        setattr(layer.parent, layer.attribute, replacement)
        replaced[id(layer.module)] = replacement
        record["layers"].append(name)
    if not record["layers"]:
        found = f"; left in bfloat16: {record['left']}" if record["left"] else ""
        raise ModelBuildError(model.name, step, f"the module has no linear layer (nn.Linear, or transformers' Conv1D) to quantize{found}; remove `quantize`")
    return record


def with_float32_between(quantized: nn.Module, float32: nn.Module) -> nn.Module:
    """A copy of the float32 module with each int8-dynamic layer of `quantized`
    (the same model in bfloat16) in place of its own, the int8 weights shared and
    the bias in float32: the same int8 computation with float32 between the int8
    products (worker/accuracy.py measures bfloat16's rounding against it)."""
    twin = copy.deepcopy(float32)
    for name, layer in _linear_layers(twin):
        ours = quantized.get_submodule(name)
        if isinstance(ours, Int8DynamicLinear):
            bias = None if ours.bias is None else ours.bias.float()
            setattr(layer.parent, layer.attribute, Int8DynamicLinear(ours.weight_int8, ours.scales, ours.unsmoothing, bias))
    return twin


def _int8_dynamic(int8_tensor: Any, per_row: Any, weight: torch.Tensor, bias: torch.Tensor | None, input_range: torch.Tensor | None) -> Int8DynamicLinear:
    """A layer of float32 `weight` (out, in) as an Int8DynamicLinear, smoothed by
    the largest magnitude of each input channel over the example calls (not where
    they never reached it)."""
    smoothing = torch.ones(weight.shape[1])
    if input_range is not None:
        reach = weight.abs().amax(0).clamp(min=TINY)
        smoothing = (input_range.clamp(min=TINY) ** SMOOTHING_ALPHA / reach ** (1 - SMOOTHING_ALPHA)).clamp(min=TINY)
    quantized = int8_tensor.from_hp((weight * smoothing).contiguous(), per_row)
    return Int8DynamicLinear(quantized.qdata, quantized.scale.reshape(-1).float(), 1 / smoothing, bias)


def _input_ranges(model: ModelConfig, module: nn.Module, calls: Sequence[Call]) -> dict[int, torch.Tensor]:
    """Each linear layer's (by id in `module`) largest input magnitude per channel
    over `calls`, run in order on a copy of `module`."""
    twin = copy.deepcopy(module)
    originals = {id(twin_layer.module): id(layer.module) for (_, twin_layer), (_, layer) in zip(_linear_layers(twin), _linear_layers(module))}
    ranges: dict[int, torch.Tensor] = {}

    def record(layer: nn.Module, inputs: tuple[Any, ...]) -> None:
        x = inputs[0].detach().float()
        seen = x.reshape(-1, x.shape[-1]).abs().amax(0)
        key = originals[id(layer)]
        ranges[key] = torch.maximum(ranges[key], seen) if key in ranges else seen

    hooks = [twin_layer.module.register_forward_pre_hook(record) for _, twin_layer in _linear_layers(twin)]
    try:
        with torch.no_grad():
            for index, (args, kwargs) in enumerate(calls):
                try:
                    twin(*args, **kwargs)
                except Exception as error:
                    raise ModelBuildError(model.name, "measuring the linear layers' inputs (int8-dynamic)", f"call {index + 1} of the example calls failed: {type(error).__name__}: {error}") from None
    finally:
        for hook in hooks:
            hook.remove()
    return ranges


def _output_layers(module: nn.Module) -> set[int]:
    """The ids of the layers that make a language model's logits: what a
    transformers model's `get_output_embeddings()` returns, and any linear layer
    whose weight is an embedding's (tied)."""
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    found = {id(m) for m in module.modules() if isinstance(m, nn.Linear) and id(m.weight) in embeddings}
    for child in module.modules():
        get = getattr(child, "get_output_embeddings", None)
        head = get() if callable(get) else None
        if isinstance(head, nn.Linear):
            found.add(id(head))
    return found


def _kernel_refuses(bits: int, group_size: int, out_features: int, in_features: int) -> str:
    """Why the CPU kernel cannot take a layer of this shape, or "". torch 2.13's
    int8 kernel crashed (AVX512 path) on inputs not a multiple of 16; its int4
    packing refuses outputs not a multiple of 16."""
    if bits == 8 and in_features % 16:
        return f"its {in_features} inputs are not a multiple of 16, which the int8 kernel needs"
    if bits == 4 and in_features % group_size:
        return f"its {in_features} inputs are not a multiple of group-size {group_size}"
    if bits == 4 and out_features % 16:
        return f"its {out_features} outputs are not a multiple of 16, which the int4 kernel needs"
    return ""


def _linear_layers(module: nn.Module) -> list[tuple[str, _Layer]]:
    """Each nn.Linear and transformers Conv1D (weight stored (in, out)) under
    `module`, by its qualified name: a layer shared by two parents under each."""
    layers = []
    for name, child in module.named_modules(remove_duplicate=False):
        parent_name, _, attribute = name.rpartition(".")
        if isinstance(child, nn.Linear):
            weight = child.weight
        elif type(child).__name__ == "Conv1D" and isinstance(getattr(child, "weight", None), torch.Tensor) and child.weight.dim() == 2:
            weight = child.weight.t()
        else:
            continue
        layers.append((name, _Layer(child, module.get_submodule(parent_name), attribute, weight, child.bias)))
    return layers


def _torchao(model: ModelConfig) -> tuple[Any, Any, Any]:
    """torchao's Int8Tensor, Int4OpaqueTensor and PerRow."""
    try:
        from torchao.prototype.quantization.int4.int4_opaque_tensor import Int4OpaqueTensor
        from torchao.quantization.granularity import PerRow
        from torchao.quantization.quantize_.workflows.int8.int8_tensor import Int8Tensor
    except ImportError as error:
        raise ModelBuildError(
            model.name,
            f"quantizing the weights ({model.quantize})",
            f'quantize = "{model.quantize}" needs torchao in the build environment ({error}); add "hatch-precompile[int8]" (or "{TORCHAO_REQUIREMENT}") to [build-system] requires',
        ) from None
    return Int8Tensor, Int4OpaqueTensor, PerRow
