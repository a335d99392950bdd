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
- bfloat16 and float16 (`dtype`) are compared with the float32 module they were
  converted from, on the same inputs, since that is the model its user trained:
  two correct low-precision computations that fuse differently differ element by
  element by more than any useful tolerance, yet keep the norm figures near
  float32's (6-layer BERT and 4-layer Llama, random weights: relative error
  0.8-0.9%, cosine 0.99995 in bfloat16); a wrong kernel or wrong weights do not.
- int8 (`quantize`) is compared with the float32 module by the same figures, with
  looser defaults: int8 rounding moves outputs more than bfloat16's
  (docs/studies/int8), and most on trained weights. With `calibration`, on the
  batches held out of it (like the real inputs), the example inputs held only to
  SANITY_BOUNDS.
- int8 and int4 weights (`quantize = "int8-weight-only"`, `"int4-weight-only"`)
  are compared with the float32 module too, and a model with state on every call
  of the build's check (each from the state the previous ones left): its logits'
  figures, and how often the most likely token is float32's (token agreement).

Integer and boolean outputs must equal eager's; non-finite elements must be
where the reference has them. Every artifact's figures go into the manifest and
the build's progress lines.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from ..engine.errors import ModelBuildError
from ..engine.model_config import AccuracyBounds, ModelConfig
from ..runtime._schema import AccuracyRecord, OutputAccuracy, TokenAgreement

if TYPE_CHECKING:
    from .capture import Captured


# Weight-only: SmolLM2-135M-Instruct's trained 30 layers (benchmarks/real_decoder.py),
# one position per call, against float32: int8 weights worst relative error 0.18,
# cosine 0.986, top-1 agreement 97%; int4 (groups of 64 or 128) worst 0.70-1.02,
# cosine 0.51-0.74, agreement 64-73%, as llama.cpp's Q4_0 (62%). int4's bounds are
# sanity bounds that a wrong kernel or packing misses (cosine near 0, agreement
# near none); its quality is a choice the table in docs/performance.md informs.
# float32: about 20x the worst correct code measured, below every structural fault
# (see the docstring). bfloat16 and float16: about 4x the figures measured on real
# architectures; a cosine of 0.999 is a relative error of about 4.5%. int8: 1.6x
# what all-MiniLM-L6-v2's trained weights show on held-out real sentences (relative
# error 0.12, cosine 0.9925); a cosine of 0.98 is a relative error of about 0.2.
DEFAULT_BOUNDS = {
    "float32": AccuracyBounds(max_relative_error=1e-4, min_cosine=None, max_element_error=1e-4),
    "bfloat16": AccuracyBounds(max_relative_error=0.04, min_cosine=0.999),
    "float16": AccuracyBounds(max_relative_error=0.01, min_cosine=0.9999),
    "int8": AccuracyBounds(max_relative_error=0.2, min_cosine=0.98),
    "int8-weight-only": AccuracyBounds(max_relative_error=0.3, min_cosine=0.98, min_token_agreement=0.85),
    "int4-weight-only": AccuracyBounds(max_relative_error=0.8, min_cosine=0.6, min_token_agreement=0.5),
}
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
# What to try when a weight-only model misses a bound, by scheme.
WEIGHT_ONLY_ADVICE = {
    "int8-weight-only": 'or build it with dtype = "bfloat16" alone',
    "int4-weight-only": 'or try a smaller `group-size` (32 is closest to bfloat16), or quantize = "int8-weight-only"',
}


def bounds_for(model: ModelConfig) -> AccuracyBounds:
    """The model's `accuracy` bounds, each missing one taken from its precision's defaults."""
    default = DEFAULT_BOUNDS[model.quantize or model.dtype or "float32"]  # weight-only models are bfloat16 too: the scheme's
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
        return advice + (f", {WEIGHT_ONLY_ADVICE[str(model.quantize)]}" if model.weight_only else "")
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


def check_steps(model: ModelConfig, captured: Captured, outputs: list[list[Any]], state: list[torch.Tensor]) -> AccuracyRecord | None:
    """Each call after the example inputs (`outputs` holds every call's, the
    example inputs' first: a model with state, its steps; one without, the dims'
    min, a size between and max), and the state after the last, against eager's
    from the same initial state, by the model's bounds. A
    lower-precision model is compared with eager in its own dtype here, since the
    float32 module's state would differ from its own. A weight-only model is also
    compared with the float32 module call by call, and its tokens with float32's;
    returns those figures for the manifest (None for other models)."""
    eager_calls, eager_state = captured.eager_run
    for index, (compiled, eager) in enumerate(zip(outputs[1:], eager_calls[1:]), start=1):
        check_accuracy(model, compiled, eager, None, captured.call_name(index))
    where = f"after the {len(captured.calls)} calls of the build's check"
    for name, compiled_state, eager_value in zip(captured.state, state, eager_state):
        try:
            check_accuracy(model, [compiled_state], [eager_value], None, where)
        except ModelBuildError as error:
            message = error.message.replace("output 0", f"the state {name!r}", 1)
            raise ModelBuildError(model.name, "checking the state against eager", message) from None
    if not (model.weight_only and captured.state):
        return None
    # A module built in bfloat16 by its factory has no float32 one: then its own eager run.
    reference = captured.reference_run if captured.reference is not None else eager_calls
    against = "float32 eager" if captured.reference is not None else "eager"
    calls = [
        check_accuracy(model, compiled, eager, float32 if captured.reference is not None else None, f"on call {index + 1} of the build's check")["outputs"]
        for index, (compiled, eager, float32) in enumerate(zip(outputs[1:], eager_calls[1:], reference[1:]), start=1)
    ]
    agreement = token_agreement(outputs, reference)
    bound = bounds_for(model).min_token_agreement
    share = agreement["agreed"] / agreement["positions"] if agreement["positions"] else 1.0
    if bound is not None and share < bound:
        raise ModelBuildError(
            model.name,
            "checking accuracy",
            f"the most likely token equals {against}'s at {agreement['agreed']} of {agreement['positions']} positions of the build's "
            f"{len(outputs)} calls ({share:.3g} < min-token-agreement {bound}). {_advice(model, {}, bounds_for(model))}",
        )
    return {"against": against, "outputs": [], "calls": calls, "token_agreement": agreement}


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
