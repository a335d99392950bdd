"""How close a compiled model's outputs must be to the model's, and how close they were.

Runs in the compile worker, on the example inputs of every artifact (and on the
calls after them, for a model with state). Every floating output is measured by
three figures against its reference, each in float64 over the finite elements:

- relative error: the norm of the difference over the norm of the reference;
- cosine similarity with the reference;
- element error: the largest difference of one element over the reference's
  largest magnitude, which catches a fault in a few elements (one position of a
  cache, one row) that the norms dilute.

Each figure has a bound, per model in its `accuracy` table, else its precision's
default (`DEFAULT_BOUNDS`):

- float32 is compared with eager. Compiled code differs from eager only by
  reassociation and fused math, which grows with depth: a 30-layer LLM's trained
  logits (magnitude 10-20) move by about 1e-4, past any fixed element tolerance,
  while their relative error stays near 1e-6. Scaled to the output, correct code
  measured at most 3.2e-6 in both figures (all-mpnet-base-v2's trained 12 layers;
  a 24-layer encoder and a 30-layer decoder with random weights less), about 5e-6
  on that trained 30-layer LLM;
  a layer skipped or a cache written one position off measured 0.07 and more, a
  trained model's weight matrix scaled by 1.001 2e-4 (docs/studies/float32_bounds).
  The defaults sit 20x above correct code; a fault that moves the outputs by less
  than 1e-4 of their magnitude passes.
- bfloat16 and float16 (`dtype`), and the quantized linear layers of a bfloat16
  module (`quantize = "int8-weight-only"`, `"int4-weight-only"`, `"int8-dynamic"`), are held to
  their own precision: over every call of the build's check (a model with state,
  each from the state the previous ones left), the compiled outputs' relative
  error against eager running the same module, over how far eager in the
  activations' dtype (the module before its weights were quantized) is from
  float32 eager: the error ratio (`max-error-ratio`). Two correct computations in
  bfloat16 that fuse and round differently are about as far apart as either is
  from float32, however deep the model; a fixed bound cannot tell that from a
  wrong build, since bfloat16's own error grows with depth and training (a trained
  30-layer LLM's logits: relative error 0.01-0.06 per call against float32, past
  the 4% once used as bfloat16's bound). On that LLM a weight at twice its scale, a
  transposed weight or a dropped layer in one of its 30 layers measured 7-30x
  bfloat16's rounding (docs/studies/low_precision_bounds); the default, 3x,
  passes correct code (the table there) and fails those. Bounds on the figures
  against float32 (`max-relative-error`, `min-cosine`, `max-element-error`) and on
  the decoder's token agreement with float32 apply where set, per call: they state
  the quality wanted of the precision, not the build's correctness. A module a
  factory makes in bfloat16 itself has no float32 module: it is compared with its
  eager run by fixed bounds (`WITHOUT_FLOAT32_BOUNDS`).
- int8 (`quantize = "int8"`) is compared with the float32 module by the norm
  figures, with looser defaults: int8 rounding moves outputs more than bfloat16's
  (docs/studies/int8), and most on trained weights. With `calibration`, on the
  batches held out of it (like the real inputs), the example inputs held only to
  SANITY_BOUNDS.

Integer and boolean outputs must equal eager's; non-finite elements must be
where the reference has them. Every artifact's figures go into the manifest and
the build's progress lines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..engine.errors import ModelBuildError
from ..engine.model_config import LINEAR_QUANTIZATIONS, AccuracyBounds, ModelConfig
from ..runtime._schema import AccuracyRecord, OutputAccuracy, PrecisionRecord, RoundingRatio, TokenAgreement

if TYPE_CHECKING:
    from .capture import Captured, Run


# float32: about 20x the worst correct code measured, below every structural fault
# (see the docstring). int8: 1.6x what all-MiniLM-L6-v2's trained weights show on
# held-out real sentences (relative error 0.12, cosine 0.9925); a cosine of 0.98 is
# a relative error of about 0.2. The lower precisions: 3x their own rounding (see
# the docstring and docs/studies/low_precision_bounds).
DEFAULT_BOUNDS = {
    "float32": AccuracyBounds(max_relative_error=1e-4, min_cosine=None, max_element_error=1e-4),
    "int8": AccuracyBounds(max_relative_error=0.2, min_cosine=0.98),
    **{precision: AccuracyBounds(max_error_ratio=3.0) for precision in ("bfloat16", "float16", *LINEAR_QUANTIZATIONS)},
}
# A lower-precision module with no float32 one against its own eager run: about 4x
# what correct code measured on 6-layer BERT and 4-layer Llama with random weights
# in bfloat16 (relative error 0.8-0.9%, cosine 0.99995); weight-only int4 as
# sanity bounds that a wrong kernel or packing misses (cosine near 0).
WITHOUT_FLOAT32_BOUNDS = {
    "bfloat16": AccuracyBounds(max_relative_error=0.04, min_cosine=0.999),
    "float16": AccuracyBounds(max_relative_error=0.01, min_cosine=0.9999),
    "int8-weight-only": AccuracyBounds(max_relative_error=0.3, min_cosine=0.98),
    "int8-dynamic": AccuracyBounds(max_relative_error=0.3, min_cosine=0.98),
    "int4-weight-only": AccuracyBounds(max_relative_error=0.8, min_cosine=0.6),
}
# The smallest rounding a lower precision is measured by: its unit roundoff, for an
# output that float32 and the lower precision compute alike (a copy, a constant).
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
# An int8 model with `calibration` is held to its bounds on calibration batches
# (quantize.py holds some out), which are like its real inputs. Its example inputs
# are random values where declared by shape, out of the distribution its scales
# were set on (all-MiniLM-L6-v2's trained weights on random token ids: cosine 0.97,
# against 0.993 or more on real sentences), so there they are held only to bounds
# that a wrong kernel or wrong scales miss (cosine near 0).
SANITY_BOUNDS = AccuracyBounds(max_relative_error=0.5, min_cosine=0.9)
EXAMPLE_INPUTS_BESIDE_CALIBRATION = "on the example inputs (held to the sanity bounds of inputs unlike the calibration batches)"

# Each bound's field, its TOML key and the figure it bounds.
BOUNDS = (("max_relative_error", "max-relative-error", "relative_error"), ("min_cosine", "min-cosine", "cosine"), ("max_element_error", "max-element-error", "element_error"))
# What to try when a model with quantized linear layers misses a bound, by scheme.
LINEARS_ADVICE = {
    "int8-weight-only": 'or build it with dtype = "bfloat16" alone',
    "int8-dynamic": 'or quantize = "int8-weight-only", which keeps the layers\' inputs in bfloat16',
    "int4-weight-only": 'or try a smaller `group-size` (32, the default, is closest to bfloat16), or quantize = "int8-weight-only"',
}


def precision_of(model: ModelConfig) -> str:
    """The precision whose bounds the model takes: a model with quantized linear
    layers is bfloat16 too, and takes the scheme's."""
    return model.quantize or model.dtype or "float32"


def bounds_for(model: ModelConfig, with_float32: bool = True) -> AccuracyBounds:
    """The model's `accuracy` bounds, each missing one taken from its precision's
    defaults (a lower-precision module without a float32 one: `WITHOUT_FLOAT32_BOUNDS`)."""
    precision = precision_of(model)
    default = DEFAULT_BOUNDS[precision] if with_float32 or precision not in WITHOUT_FLOAT32_BOUNDS else WITHOUT_FLOAT32_BOUNDS[precision]
    configured = model.accuracy
    return AccuracyBounds(**{field: default_value if (value := getattr(configured, field)) is None else value for field, default_value in vars(default).items()})


def reference_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The example inputs for the float32 module: floating tensors as float32."""
    from .torch_internals import tree_map

    def widen(value: Any) -> Any:
        return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    return tree_map(widen, args), tree_map(widen, kwargs)


def figures(compiled: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Relative error, cosine similarity and element error of a floating output, in
    float64, over the elements where the reference is finite (`check_accuracy`
    holds the others to equality). Both zero: no error, cosine 1."""
    finite = torch.isfinite(reference)
    c, r = compiled.double()[finite], reference.double()[finite]
    difference, norm = (c - r).norm().item(), r.norm().item()
    relative = difference / norm if norm else (0.0 if difference == 0 else math.inf)
    norms = c.norm().item() * norm
    cosine = (c @ r).item() / norms if norms else (1.0 if difference == 0 else 0.0)
    largest, worst = (r.abs().max().item(), (c - r).abs().max().item()) if r.numel() else (0.0, 0.0)
    element = worst / largest if largest else (0.0 if worst == 0 else math.inf)
    return {"relative_error": relative, "cosine": cosine, "element_error": element}


def check_accuracy(
    model: ModelConfig,
    compiled: list[Any],
    eager: list[Any],
    reference: list[Any] | None,
    where: str = "on the example inputs",
    bounds: AccuracyBounds | None = None,
) -> AccuracyRecord:
    """Check a compiled artifact's outputs (see the module docstring); returns the
    manifest's record of them, or raises ModelBuildError saying which output
    missed which bound, by how much, and the key that sets it. `reference` is the
    float32 module's outputs for a model of lower precision, else None (eager is
    the reference). `bounds` replaces the model's (SANITY_BOUNDS)."""
    name, step = model.name, "checking against eager"
    if len(compiled) != len(eager):
        raise ModelBuildError(name, step, f"{len(compiled)} compiled outputs, {len(eager)} eager ones {where}")
    against = "float32 eager" if reference is not None else "eager"
    bounds = bounds or bounds_for(model)
    records: list[OutputAccuracy] = []
    for index, (c, e, r) in enumerate(zip(compiled, eager, reference or eager)):
        if not c.is_floating_point():
            if not torch.equal(c, e):
                raise ModelBuildError(name, step, f"output {index} ({c.dtype}) differs from eager's {where}, which it must equal")
            records.append({"equal": True})
            continue
        nonfinite = ~torch.isfinite(r)
        if not torch.equal(c[nonfinite].double().nan_to_num(), r[nonfinite].double().nan_to_num()) or not torch.isfinite(c[~nonfinite]).all():
            raise ModelBuildError(name, step, f"output {index} has NaN or infinite elements where {against} has {'others' if nonfinite.any() else 'none'} {where}")
        measured = figures(c, r)
        _check_bounds(model, index, measured, bounds, against, where)
        records.append({"relative_error": _rounded(measured["relative_error"]), "cosine": float(f"{measured['cosine']:.6g}"), "element_error": _rounded(measured["element_error"])})
    return {"against": against, "outputs": records}


def _check_bounds(model: ModelConfig, index: int, measured: dict[str, float], bounds: AccuracyBounds, against: str, where: str) -> None:
    missed = [
        f"cosine similarity {measured[figure]:.6g} < {key} {bound}" if field == "min_cosine" else f"{figure.replace('_', ' ')} {measured[figure]:.3g} > {key} {bound}"
        for field, key, figure in BOUNDS
        if (bound := getattr(bounds, field)) is not None and not _within(field, measured[figure], bound)
    ]
    if missed:
        raise ModelBuildError(model.name, "checking accuracy", f"output {index} against {against} {where}: {'; '.join(missed)}. {_advice(model, measured, bounds)}")


def _advice(model: ModelConfig, measured: dict[str, float], bounds: AccuracyBounds) -> str:
    """What to try after a miss, for the model's precision and what it already sets."""
    table = f"[tool.hatch.build.hooks.precompile.models.{model.name}]"
    if bounds == SANITY_BOUNDS:
        return "Only a wrong int8 kernel or wrong scales are that far from float32, even on inputs unlike the calibration batches: build it in float32 and report the model"
    if model.quantize or model.dtype in ("bfloat16", "float16"):
        advice = f"If this precision is acceptable for the model, loosen `accuracy` in {table}; otherwise build it in float32"
        if model.quantize == "int8" and model.calibration is None:
            advice += ", or calibrate it on batches like its real inputs (`calibration`)"
        return advice + (f", {LINEARS_ADVICE[str(model.quantize)]}" if model.quantizes_linears else "")
    return (
        f"Correct float32 code differs from eager by reassociated sums alone, about 1e-6 of the output even 30 layers deep: "
        f"a figure far past its bound points to a wrong kernel, weights or state. If you have checked the compiled model "
        f"on real inputs, set the bound in {table}, e.g. `accuracy = {{ {_loosened(measured, bounds)} }}`"
    )


def _loosened(measured: dict[str, float], bounds: AccuracyBounds) -> str:
    """The float32 bounds that the measured figures would pass, with room: twice
    each missed figure, rounded up to one significant digit."""
    return ", ".join(
        f"{key} = {float(f'{2 * measured[figure]:.0e}')}"
        for field, key, figure in BOUNDS
        if field != "min_cosine" and (bound := getattr(bounds, field)) is not None and math.isfinite(measured[figure]) and not measured[figure] <= bound
    )


def _within(field: str, value: float, bound: float) -> bool:
    """NaN is never within a bound."""
    return value >= bound if field == "min_cosine" else value <= bound


def _rounded(value: float) -> float:
    return float(f"{value:.3g}")


@dataclass(frozen=True)
class Yardstick:
    """What a variant's calls are checked against, computed once per capture and
    passed to every form's check: torch's run of the module compiled (`eager`),
    and, for a lower-precision model with a float32 module, the float32 run and
    how far its precision's rounding moves eager from it (`rounding`)."""

    call_names: list[str]  # each call, in the build's messages
    state_names: list[str]  # the model's state buffers, in the state's order
    eager: Run
    float32: Run | None  # None for a float32 model, int8, or a module without a float32 one
    rounding: Rounding | None  # set exactly where the error ratio applies
    precision: str  # bfloat16, int4-weight-only..., for messages


@dataclass(frozen=True)
class Rounding:
    """The lower precision's own error: eager in the activations' dtype (before any
    weight quantization) against float32 eager, over every call, per floating
    output and per state buffer (None for an integer one). int8-dynamic rounds its
    layers' inputs at each call, so a bfloat16 difference before a rounding can
    move its result by a whole int8 step: its own error is eager against the same
    quantized layers with float32 between them."""

    dtype: torch.dtype
    outputs: list[float | None]
    state: list[float | None]


def yardstick(model: ModelConfig, captured: Captured) -> Yardstick:
    """The yardstick of a capture (see Yardstick)."""
    names = [captured.call_name(index) for index in range(len(captured.calls))]
    if captured.reference is None or precision_of(model) not in WITHOUT_FLOAT32_BOUNDS:
        float32 = captured.reference_run if captured.reference is not None else None
        return Yardstick(names, captured.state, captured.eager_run, float32, None, precision_of(model))
    if captured.float32_quantized is not None:
        return lower_precision_yardstick(model, names, captured.state, captured.eager_run, captured.eager_run, captured.reference_run, captured.float32_quantized_run)
    return lower_precision_yardstick(model, names, captured.state, captured.eager_run, captured.precision_run, captured.reference_run)


def lower_precision_yardstick(model: ModelConfig, call_names: list[str], state_names: list[str], eager: Run, lower: Run, float32: Run, rounding_reference: Run | None = None) -> Yardstick:
    """A lower-precision model's yardstick from torch's runs of the module it
    compiles (`eager`), of that module before its weights were quantized (`lower`,
    `eager` where they were not) and of the float32 module, on the same calls; the
    precision's rounding is `lower` against `rounding_reference` (int8-dynamic: the
    float32 module with the same quantized layers), or against `float32`."""
    dtype = torch.float16 if model.dtype == "float16" else torch.bfloat16
    against = float32 if rounding_reference is None else rounding_reference
    outputs = [_over_calls([(call[i], reference[i]) for call, reference in zip(lower[0], against[0])], dtype) for i in range(len(float32[0][0]))]
    state = [_over_calls([(mine, reference)], dtype) for mine, reference in zip(lower[1], against[1])]
    return Yardstick(call_names, state_names, eager, float32, Rounding(dtype, outputs, state), precision_of(model))


def _over_calls(pairs: list[tuple[Any, Any]], dtype: torch.dtype | None = None) -> float | None:
    """The relative error of the first of each pair against the second, over all
    the pairs' finite elements together; None for integer tensors. With `dtype`, at
    least its unit roundoff (the floor of a rounding)."""
    if not all(isinstance(a, torch.Tensor) and a.is_floating_point() for pair in pairs for a in pair):
        return None
    difference = norm = 0.0
    for value, reference in pairs:
        finite = torch.isfinite(reference) & torch.isfinite(value)
        difference += (value.double()[finite] - reference.double()[finite]).square().sum().item()
        norm += reference.double()[finite].square().sum().item()
    relative = math.sqrt(difference / norm) if norm else (0.0 if difference == 0 else math.inf)
    return max(relative, UNIT_ROUNDOFF[dtype]) if dtype is not None else relative


def check_calls(model: ModelConfig, ruler: Yardstick, outputs: list[list[Any]], state: list[torch.Tensor] | None, form: str = "", first: AccuracyBounds | None = None) -> AccuracyRecord:
    """Check a variant's outputs for every call (`outputs`, the example inputs'
    first) and, where given, its state after the last, against the yardstick (see
    the module docstring); returns the manifest's record: the first call's figures
    against the reference, and for a lower-precision model every call's against
    float32 and the error ratios. Raises ModelBuildError naming the output, the
    call, the bound and its key. `form` names the form checked in messages (" (the
    C++ form)"); `first` replaces the model's bounds on the first call (an int8
    model's example inputs beside its calibration batches: SANITY_BOUNDS)."""
    names = [name + form for name in ruler.call_names]
    if first is not None:
        names[0] = EXAMPLE_INPUTS_BESIDE_CALIBRATION + form
    (eager, eager_state), float32 = ruler.eager, ruler.float32
    if len(outputs) != len(eager):
        raise ModelBuildError(model.name, "checking against eager", f"{len(outputs)} calls{form} ran, of the {len(eager)} the build checks")
    if ruler.rounding is None:
        bounds = bounds_for(model, with_float32=ruler.float32 is not None)
        record = check_accuracy(model, outputs[0], eager[0], float32[0][0] if float32 else None, names[0], first or bounds)
        for index in range(1, len(outputs)):
            check_accuracy(model, outputs[index], eager[index], None, names[index], bounds)
    else:
        assert float32 is not None  # a rounding is measured against it
        bounds = bounds_for(model)
        against_float32 = [check_accuracy(model, c, e, r, name, bounds) for c, e, r, name in zip(outputs, eager, float32[0], names)]
        record = against_float32[0]
        if len(outputs) > 1:
            record["calls"] = [call["outputs"] for call in against_float32[1:]]
        record["precision"] = _check_error_ratio(model, ruler, outputs, state, form, bounds)
    if state is not None:
        _check_state(model, ruler, state, eager_state, form, bounds)
    if (model.quantizes_linears and ruler.state_names) or (ruler.rounding is not None and model.accuracy.min_token_agreement is not None):
        record["token_agreement"] = _check_token_agreement(model, ruler, outputs, bounds)
    return record


def _check_error_ratio(model: ModelConfig, ruler: Yardstick, outputs: list[list[Any]], state: list[torch.Tensor] | None, form: str, bounds: AccuracyBounds) -> PrecisionRecord:
    """Each floating output's drift from eager over all the calls, over its
    precision's rounding (`Rounding`), against `max-error-ratio`."""
    assert ruler.rounding is not None
    eager, eager_state = ruler.eager
    ratios: list[RoundingRatio | None] = []
    for index, rounding in enumerate(ruler.rounding.outputs):
        drift = _over_calls([(call[index], reference[index]) for call, reference in zip(outputs, eager)])
        ratios.append(None if drift is None or rounding is None else _ratio(model, ruler, drift, rounding, f"output {index}", form, bounds))
    record: PrecisionRecord = {"calls": len(outputs), "outputs": ratios}
    if state is not None:
        record["state"] = {
            name: None if rounding is None else _ratio(model, ruler, _over_calls([(mine, theirs)]) or 0.0, rounding, f"the state {name!r}", form, bounds)
            for name, mine, theirs, rounding in zip(ruler.state_names, state, eager_state, ruler.rounding.state)
        }
    return record


def _ratio(model: ModelConfig, ruler: Yardstick, drift: float, rounding: float, what: str, form: str, bounds: AccuracyBounds) -> RoundingRatio:
    assert ruler.rounding is not None
    ratio = drift / rounding
    bound = bounds.max_error_ratio
    if bound is not None and not ratio <= bound:
        activations = str(ruler.rounding.dtype).removeprefix("torch.")
        same = f"eager {ruler.precision}" + (f" (the same quantized weights, {activations} activations)" if model.quantizes_linears else "")
        dynamic = model.quantize == "int8-dynamic"
        from_what = "the same int8 layers with float32 between them" if dynamic else "float32"
        calls = f"the build's {len(ruler.call_names)} calls" if len(ruler.call_names) > 1 else "the example inputs"
        raise ModelBuildError(
            model.name,
            "checking accuracy",
            f"{what}{form} over {calls} differs from {same} by a relative error of {drift:.3g}, {ratio:.3g}x what {activations} "
            f"rounding alone moves eager from {from_what} ({rounding:.3g}) > max-error-ratio {bound}. Correct compiled code differs from eager "
            f"by how it rounds, about as much as eager differs from float32; a ratio this far past it points to a wrong kernel, wrong "
            f"weights or scales, or a layer left out. If you have checked the compiled model on real inputs, set "
            f"`accuracy = {{ max-error-ratio = {math.ceil(2 * ratio)} }}` in [tool.hatch.build.hooks.precompile.models.{model.name}]",
        )
    return {"drift": _rounded(drift), "rounding": _rounded(rounding), "ratio": _rounded(ratio)}


def _check_state(model: ModelConfig, ruler: Yardstick, state: list[torch.Tensor], eager_state: list[torch.Tensor], form: str, bounds: AccuracyBounds) -> None:
    """The state after the last call against eager's: by the model's bounds for a
    float32 model; for a lower precision, integer state equal (its floating state
    is in the error ratios)."""
    where = f"after the {len(ruler.call_names)} calls of the build's check{form}"
    for name, compiled_state, eager_value in zip(ruler.state_names, state, eager_state):
        if ruler.rounding is not None and compiled_state.is_floating_point():
            continue
        try:
            check_accuracy(model, [compiled_state], [eager_value], None, where, bounds)
        except ModelBuildError as error:
            message = error.message.replace("output 0", f"the state {name!r}", 1)
            raise ModelBuildError(model.name, "checking the state against eager", message) from None


def _check_token_agreement(model: ModelConfig, ruler: Yardstick, outputs: list[list[Any]], bounds: AccuracyBounds) -> TokenAgreement:
    """How often the compiled decoder's most likely token is float32's (eager's,
    without a float32 module) over every call, beside how often eager's own is,
    against `min-token-agreement` where set."""
    reference, against = (ruler.float32[0], "float32 eager") if ruler.float32 is not None else (ruler.eager[0], "eager")
    agreement = token_agreement(outputs, reference)
    agreement["eager_agreed"] = token_agreement(ruler.eager[0], reference)["agreed"]
    bound = bounds.min_token_agreement
    share = agreement["agreed"] / agreement["positions"] if agreement["positions"] else 1.0
    if bound is not None and share < bound:
        raise ModelBuildError(
            model.name,
            "checking accuracy",
            f"the most likely token equals {against}'s at {agreement['agreed']} of {agreement['positions']} positions of the build's "
            f"{len(outputs)} calls ({share:.3g} < min-token-agreement {bound}; eager {ruler.precision} agrees at {agreement['eager_agreed']}). "
            f"{_advice(model, {}, bounds)}",
        )
    return agreement


def token_agreement(outputs: list[list[Any]], reference: list[list[Any]]) -> TokenAgreement:
    """How many positions of all the calls have the argmax over the last axis of the
    first floating output (a decoder's logits) equal to the reference's."""
    agreed = positions = 0
    for compiled, float32 in zip(outputs, reference):
        logits = next((c, r) for c, r in zip(compiled, float32) if c.is_floating_point())
        chosen, wanted = logits[0].argmax(-1), logits[1].argmax(-1)
        agreed += int((chosen == wanted).sum())
        positions += chosen.numel()
    return {"agreed": agreed, "positions": positions}


def summary(record: AccuracyRecord) -> str:
    """The worst figures of an accuracy record, for the build's progress line."""
    worst = _worst(record["outputs"])
    if "precision" in record:
        ratios = [r for r in record["precision"]["outputs"] if r is not None] + [r for r in record["precision"].get("state", {}).values() if r is not None]
        worst = _worst([*record["outputs"], *(o for call in record.get("calls", []) for o in call)])
        ratio = f"; its error {max(r['ratio'] for r in ratios):.2g}x its precision's own" if ratios else ""
        return f"checked against {record['against']} over {record['precision']['calls']} call(s): {worst}{ratio}"
    if "batches" not in record:
        return f"checked against {record['against']}: {worst}"
    batches = _worst([output for batch in record["batches"] for output in batch["outputs"]])
    return f"checked against {record['against']} on {len(record['batches'])} calibration batch(es): {batches}; on the example inputs: {worst}"


def _worst(outputs: list[OutputAccuracy]) -> str:
    floating = [o for o in outputs if "cosine" in o]
    if not floating:
        return "equal"
    error = max(o["relative_error"] for o in floating)
    cosine = min(o["cosine"] for o in floating)
    return f"relative error {error:.3g}, cosine {cosine:.6g}"
