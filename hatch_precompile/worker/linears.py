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

Layers that take the same input on every example call (a block's query, key and
value projections; its gate and up projections) are quantized as one layer of
their concatenated weights (`SharedInputLinears`): one product per input instead
of one per layer, and for int8-dynamic one smoothing and one rounding. At batch 1
a call of a small layer costs about as much in dispatch and threading as in
reading its weights (docs/performance.md). The identity of the input is what the
example calls show; at each call the group checks it again, so a module that
feeds its members different inputs still gets each member's own product.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..engine.errors import ModelBuildError
from ..engine.model_config import DEFAULT_INT4_GROUP_SIZE, ModelConfig
from ..runtime._schema import QuantizationRecord
from .quantize import TORCHAO_REQUIREMENT
from .torch_internals import int4_weight_matmul, int8_matmul, int8_weight_matmul, tensor_version

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


class SharedInputLinears(nn.Module):
    """Linear layers of one parent that take the same input, as one quantized
    layer (`fused`) of their weights concatenated by rows. Each member is a
    `SharedInputPart`; the first member called with an input computes every
    part, the others take theirs (the same tensor object, unchanged since)."""

    def __init__(self, fused: nn.Module, members: list[str], widths: list[int]) -> None:
        super().__init__()
        self.fused = fused
        self.members, self.widths = members, widths  # the members' attribute names on the parent, their widths
        self._input: torch.Tensor | None = None
        self._input_version: int | None = None
        self._parts: Sequence[torch.Tensor] = ()
        self._taken = 0

    def install(self, parent: nn.Module, attribute: str) -> None:
        """Put the set on `parent` as `attribute`, and each member's part in its place."""
        parent.add_module(attribute, self)
        for index, member in enumerate(self.members):
            setattr(parent, member, SharedInputPart(self, index))

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        version = tensor_version(x)
        if self._input is not x or self._input_version != version:
            self._input, self._input_version, self._taken = x, version, 0
            self._parts = self.fused(x).split(self.widths, -1)
        part = self._parts[index].contiguous()
        self._taken += 1
        if self._taken == len(self.widths):  # every member served: hold no tensor between calls
            self._input, self._parts = None, ()
        return part


class SharedInputPart(nn.Module):
    """A member of a SharedInputLinears: its part of the group's product."""

    group: SharedInputLinears

    def __init__(self, group: SharedInputLinears, index: int) -> None:
        super().__init__()
        object.__setattr__(self, "group", group)  # not a submodule: the group's weights have one name, on the parent
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.part(self.index, x)


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
    (with why), for the manifest. `calls` (the build's example calls, in order:
    run on a copy, whose state they change) show which layers share an input,
    and int8-dynamic measures its smoothing on them."""
    dynamic = model.quantize == "int8-dynamic"
    scheme = _Scheme(model, *_torchao(model))
    record: QuantizationRecord = {"scheme": str(model.quantize), "layers": [], "left": {}}
    if scheme.bits == 4:
        record["group_size"] = scheme.group_size
        record["int8"] = {}
    observed = _observe(model, module, calls, measure_ranges=dynamic)
    if dynamic:
        record["smoothed_on"] = len(calls)
    output_layers = _output_layers(module)
    layers = _linear_layers(module)
    names_of = Counter(id(layer.module) for _, layer in layers)
    chosen: dict[int, tuple[str, _Layer, bool]] = {}  # by module: its first name, where it sits, whether int8 in an int4 model
    aliases: list[_Layer] = []  # a layer reached under a second name (shared): quantized once, under its first
    for name, layer in layers:
        if id(layer.module) in chosen:
            aliases.append(layer)
            continue
        out_features, in_features = layer.weight.shape
        if isinstance(layer.parent, nn.MultiheadAttention):
            record["left"][name] = "nn.MultiheadAttention reads this layer's weight itself instead of calling it"
            continue
        as_int8 = scheme.bits == 4 and id(layer.module) in output_layers and not _kernel_refuses(8, scheme.group_size, out_features, in_features)
        if not as_int8 and not dynamic and (reason := _kernel_refuses(scheme.bits, scheme.group_size, out_features, in_features)):
            record["left"][name] = reason
            continue
        if as_int8:
            record["int8"][name] = OUTPUT_IN_INT8
        chosen[id(layer.module)] = name, layer, as_int8
        record["layers"].append(name)
    if not record["layers"]:
        found = f"; left in bfloat16: {record['left']}" if record["left"] else ""
        raise ModelBuildError(model.name, f"quantizing the weights ({model.quantize})", f"the module has no linear layer (nn.Linear, or transformers' Conv1D) to quantize{found}; remove `quantize`")
    sets = _sets_sharing_an_input(scheme, {name: layer for name, layer, as_int8 in chosen.values() if not as_int8 and names_of[id(layer.module)] == 1}, observed)
    in_sets = {name for names in sets.values() for name, _ in names}
    replacements = {}
    for name, layer, as_int8 in chosen.values():
        if name not in in_sets:
            replacements[id(layer.module)] = replacement = _quantized(model, scheme, [(name, layer)], observed, as_int8)
            setattr(layer.parent, layer.attribute, replacement)
    for layer in aliases:
        setattr(layer.parent, layer.attribute, replacements[id(layer.module)])
    for set_name, members in sets.items():
        group = SharedInputLinears(_quantized(model, scheme, members, observed), [layer.attribute for _, layer in members], [layer.weight.shape[0] for _, layer in members])
        group.install(members[0][1].parent, set_name.rpartition(".")[2])
    if sets:
        record["shared_input"] = {set_name: [name for name, _ in members] for set_name, members in sets.items()}
    return record


def with_float32_between(quantized: nn.Module, float32: nn.Module) -> nn.Module:
    """A copy of the float32 module with each int8-dynamic layer of `quantized`
    (the same model in bfloat16) in place of its own, the int8 weights shared and
    the bias in float32, and its layers that share an input shared the same way:
    the same int8 computation with float32 between the int8 products
    (worker/accuracy.py measures bfloat16's rounding against it)."""

    def in_float32(layer: Int8DynamicLinear) -> Int8DynamicLinear:
        return Int8DynamicLinear(layer.weight_int8, layer.scales, layer.unsmoothing, None if layer.bias is None else layer.bias.float())

    twin = copy.deepcopy(float32)
    for name, layer in _linear_layers(twin):
        ours = quantized.get_submodule(name)
        if isinstance(ours, Int8DynamicLinear):
            setattr(layer.parent, layer.attribute, in_float32(ours))
    for name, group in quantized.named_modules():
        if isinstance(group, SharedInputLinears) and isinstance(group.fused, Int8DynamicLinear):
            parent_name, _, attribute = name.rpartition(".")
            parent = twin.get_submodule(parent_name)
            SharedInputLinears(in_float32(group.fused), group.members, group.widths).install(parent, attribute)
    return twin


@dataclass
class _Scheme:
    """How one model's linear layers are quantized: torchao's tensors, the bits
    and the int4 group size."""

    model: ModelConfig
    int8_tensor: Any
    int4_tensor: Any
    per_row: Any

    @property
    def bits(self) -> int:
        return 4 if self.model.quantize == "int4-weight-only" else 8

    @property
    def group_size(self) -> int:
        return self.model.group_size or DEFAULT_INT4_GROUP_SIZE

    def layer(self, weight: torch.Tensor, bias: torch.Tensor | None, input_range: torch.Tensor | None, as_int8: bool = False) -> nn.Module:
        """The quantized layer of `weight` (out, in): int8-dynamic's smoothed by
        `input_range` (the largest magnitude of each input channel over the
        example calls; None where they never reached it)."""
        bias = None if bias is None else bias.to(torch.bfloat16)
        if self.model.quantize == "int8-dynamic":  # smoothed in float32
            smoothing = torch.ones(weight.shape[1])
            if input_range is not None:
                reach = weight.abs().amax(0).clamp(min=TINY)
                smoothing = (input_range.clamp(min=TINY) ** SMOOTHING_ALPHA / reach ** (1 - SMOOTHING_ALPHA)).clamp(min=TINY)
            quantized = self.int8_tensor.from_hp((weight * smoothing).contiguous(), self.per_row())
            return Int8DynamicLinear(quantized.qdata, quantized.scale.reshape(-1).float(), 1 / smoothing, bias)
        weight = weight.to(torch.bfloat16)
        if self.bits == 8 or as_int8:
            quantized = self.int8_tensor.from_hp(weight, self.per_row())
            return Int8WeightOnlyLinear(quantized.qdata, quantized.scale.reshape(-1).to(torch.bfloat16), bias)
        quantized = self.int4_tensor.from_hp(weight, [1, self.group_size])
        return Int4WeightOnlyLinear(quantized.qdata, quantized.scale_and_zero, self.group_size, weight.shape[0], bias)


@dataclass
class _Observed:
    """What the example calls showed of each linear layer (by id in the module):
    the identity of its inputs, call by call (`id`s of tensors alive together
    within a call), and where measured the largest magnitude of each of its input
    channels."""

    ranges: dict[int, torch.Tensor]
    inputs: dict[int, tuple[tuple[int, ...], ...]]


def _observe(model: ModelConfig, module: nn.Module, calls: Sequence[Call], measure_ranges: bool) -> _Observed:
    """Run `calls` in order on a copy of `module`, watching which tensors its linear
    layers take and, with `measure_ranges` (int8-dynamic's smoothing), their ranges."""
    observed = _Observed({}, {})
    if not calls:
        return observed
    twin = copy.deepcopy(module)
    originals = {id(twin_layer.module): id(layer.module) for (_, twin_layer), (_, layer) in zip(_linear_layers(twin), _linear_layers(module))}
    seen: dict[int, list[torch.Tensor]] = {key: [] for key in originals.values()}  # held within a call: no id reused

    def record(layer: nn.Module, inputs: tuple[Any, ...]) -> None:
        key = originals[id(layer)]
        seen[key].append(inputs[0])
        if not measure_ranges:
            return
        x = inputs[0].detach().float()
        reached = x.reshape(-1, x.shape[-1]).abs().amax(0)
        observed.ranges[key] = torch.maximum(observed.ranges[key], reached) if key in observed.ranges else reached

    hooks = [twin_layer.module.register_forward_pre_hook(record) for _, twin_layer in _linear_layers(twin)]
    try:
        with torch.no_grad():
            for index, (args, kwargs) in enumerate(calls):
                try:
                    twin(*args, **kwargs)
                except Exception as error:
                    raise ModelBuildError(model.name, "running the example calls on the linear layers", f"call {index + 1} of the example calls failed: {type(error).__name__}: {error}") from None
                for key, tensors in seen.items():
                    observed.inputs[key] = (*observed.inputs.get(key, ()), tuple(id(tensor) for tensor in tensors))
                    tensors.clear()
    finally:
        for hook in hooks:
            hook.remove()
    return observed


def _sets_sharing_an_input(scheme: _Scheme, layers: dict[str, _Layer], observed: _Observed) -> dict[str, list[tuple[str, _Layer]]]:
    """The sets of two or more `layers` of one parent that took the same inputs on
    every example call and that the scheme's kernel takes as one, by the name the
    set's layer gets (its members' attribute names joined by "__" on the parent)."""
    candidates: dict[tuple[int, tuple[tuple[int, ...], ...]], list[tuple[str, _Layer]]] = {}
    for name, layer in layers.items():
        inputs = observed.inputs.get(id(layer.module), ())
        if any(inputs):
            candidates.setdefault((id(layer.parent), inputs), []).append((name, layer))
    sets = {}
    for members in candidates.values():
        out_features = sum(layer.weight.shape[0] for _, layer in members)
        if len(members) > 1 and not _kernel_refuses(scheme.bits, scheme.group_size, out_features, members[0][1].weight.shape[1]):
            prefix = members[0][0].rpartition(".")[0]
            attribute = "__".join(layer.attribute for _, layer in members)
            sets[f"{prefix}.{attribute}" if prefix else attribute] = members
    return sets


def _quantized(model: ModelConfig, scheme: _Scheme, members: list[tuple[str, _Layer]], observed: _Observed, as_int8: bool = False) -> nn.Module:
    """The scheme's layer of the members' weights (one layer, or a set sharing an
    input: their weights and biases concatenated by rows, a zero bias where a
    member has none), as float32 rows (Conv1D's weight is a transposed view)."""
    weight = torch.cat([layer.weight.detach().float() for _, layer in members])
    bias = None
    if any(layer.bias is not None for _, layer in members):
        bias = torch.cat([torch.zeros(layer.weight.shape[0]) if layer.bias is None else layer.bias.detach().float() for _, layer in members])
    try:
        return scheme.layer(weight, bias, observed.ranges.get(id(members[0][1].module)), as_int8)
    except Exception as error:
        which = f"layer {members[0][0]}" if len(members) == 1 else f"layers {', '.join(name for name, _ in members)} as one"
        raise ModelBuildError(model.name, f"quantizing the weights ({model.quantize})", f"torchao failed on {which} ({weight.shape[0]}x{weight.shape[1]}): {type(error).__name__}: {error}") from None


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
