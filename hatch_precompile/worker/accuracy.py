"""How close a compiled model's outputs must be to the model's, and how close they were.

Runs in the compile worker, on the example inputs of every artifact:

- A float32 model's outputs must match eager's element by element (rtol 1e-4,
  atol 1e-5): compiled code differs from eager only by reassociation and fused
  math.
- A model compiled in bfloat16 or float16 is compared with the float32 module it
  was converted from, on the same inputs, since that is the model its user
  trained. Per output: the relative error (norm of the difference over the norm
  of the float32 output) and the cosine similarity, within bounds the model's
  `accuracy` table sets or its dtype's defaults. Two correct low-precision
  computations that fuse differently differ element by element by more than any
  useful tolerance, yet both keep these figures near float32's (measured on
  6-layer BERT and 4-layer Llama, random weights: relative error 0.8-0.9%,
  cosine 0.99995 in bfloat16); a wrong kernel or wrong weights do not.
- An int8 model is compared with the float32 module it was quantized from, by
  the same figures; its defaults are looser (relative error 0.1, cosine 0.99, the
  issue's goal): int8 rounding moves outputs by more than bfloat16's, and
  measured BERT-style encoders, MLPs and convolution nets kept a cosine of
  0.99998 or more (docs/studies/int8), while wrong scales or kernels fall far below.
- Integer and boolean outputs must be equal to eager's.

Every artifact's figures go into the manifest and the build's progress lines.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from ..engine.errors import ModelBuildError
from ..engine.model_config import AccuracyBounds, ModelConfig
from ..runtime._schema import AccuracyRecord, OutputAccuracy

if TYPE_CHECKING:
    from .capture import Captured

ELEMENTWISE = {"rtol": 1e-4, "atol": 1e-5}  # float32 against eager


# About 4x the figures measured on real architectures (see the docstring): a
# cosine of 0.999 is a relative error of about 4.5%.
DEFAULT_BOUNDS = {
    "bfloat16": AccuracyBounds(max_relative_error=0.04, min_cosine=0.999),
    "float16": AccuracyBounds(max_relative_error=0.01, min_cosine=0.9999),
    "int8": AccuracyBounds(max_relative_error=0.1, min_cosine=0.99),
}


def bounds_for(model: ModelConfig) -> AccuracyBounds | None:
    """The model's `accuracy` bounds, each missing one taken from its dtype's (or
    int8's) defaults; None for a float32 model without an `accuracy` table."""
    default = DEFAULT_BOUNDS.get(model.quantize or model.dtype or "float32", AccuracyBounds())
    configured = model.accuracy
    bounds = AccuracyBounds(
        default.max_relative_error if configured.max_relative_error is None else configured.max_relative_error,
        default.min_cosine if configured.min_cosine is None else configured.min_cosine,
    )
    return None if bounds == AccuracyBounds() else bounds


def reference_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The example inputs for the float32 module: floating tensors as float32."""
    from .torch_internals import tree_map

    def widen(value: Any) -> Any:
        return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    return tree_map(widen, args), tree_map(widen, kwargs)


def figures(compiled: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Relative error and cosine similarity of a floating output, in float64.
    Both zero: no error, cosine 1."""
    c, r = compiled.double().flatten(), reference.double().flatten()
    difference, norm = (c - r).norm().item(), r.norm().item()
    relative = difference / norm if norm else (0.0 if difference == 0 else math.inf)
    norms = c.norm().item() * norm
    cosine = (c @ r).item() / norms if norms else (1.0 if difference == 0 else 0.0)
    return {"relative_error": relative, "cosine": cosine}


def check_accuracy(model: ModelConfig, compiled: list[Any], eager: list[Any], reference: list[Any] | None, where: str = "on the example inputs") -> AccuracyRecord:
    """Check a compiled artifact's outputs (see the module docstring); returns the
    manifest's record of them, or raises ModelBuildError saying which output
    missed which bound, and by how much. `reference` is the float32 module's
    outputs for a model of lower precision, else None (eager is the reference)."""
    name, step = model.name, "checking against eager"
    if len(compiled) != len(eager):
        raise ModelBuildError(name, step, f"{len(compiled)} compiled outputs, {len(eager)} eager ones {where}")
    against = "float32 eager" if reference is not None else "eager"
    bounds = bounds_for(model)
    records: list[OutputAccuracy] = []
    for index, (c, e, r) in enumerate(zip(compiled, eager, reference or eager)):
        if not c.is_floating_point():
            if not torch.equal(c, e):
                raise ModelBuildError(name, step, f"output {index} ({c.dtype}) differs from eager's {where}, which it must equal")
            records.append({"equal": True})
            continue
        if reference is None and not torch.allclose(c, e, **ELEMENTWISE, equal_nan=True):
            worst = (c.double() - e.double()).abs().max().item()
            raise ModelBuildError(
                name,
                step,
                f"output {index} differs from the eager module by up to {worst:.3g} (tolerance rtol={ELEMENTWISE['rtol']}, atol={ELEMENTWISE['atol']}) {where}",
            )
        measured = figures(c, r)
        if bounds is not None:
            _check_bounds(model, index, measured, bounds, against, where)
        records.append({"relative_error": float(f"{measured['relative_error']:.3g}"), "cosine": float(f"{measured['cosine']:.6g}")})
    return {"against": against, "outputs": records}


def _check_bounds(model: ModelConfig, index: int, measured: dict[str, float], bounds: AccuracyBounds, against: str, where: str) -> None:
    missed = []
    error, cosine = measured["relative_error"], measured["cosine"]
    if bounds.max_relative_error is not None and not error <= bounds.max_relative_error:  # NaN misses too
        missed.append(f"relative error {error:.3g} > max-relative-error {bounds.max_relative_error}")
    if bounds.min_cosine is not None and not cosine >= bounds.min_cosine:
        missed.append(f"cosine similarity {cosine:.6g} < min-cosine {bounds.min_cosine}")
    if missed:
        raise ModelBuildError(
            model.name,
            "checking accuracy",
            f"output {index} against {against} {where}: {'; '.join(missed)}. If this precision "
            "is acceptable for the model, loosen `accuracy` in its table; otherwise build it in float32"
            + (", or calibrate it on batches like its real inputs (`calibration`)" if model.quantize else ""),
        )


def check_steps(model: ModelConfig, captured: Captured, steps: list[list[Any]], state: list[torch.Tensor]) -> None:
    """A model with state: each call after the example inputs, and the state after
    the last, against eager's from the same initial state. A lower-precision model
    is held to its bounds against eager in its own dtype here, since the float32
    module's state would differ from its own."""
    eager_calls, eager_state = captured.eager_run
    by_figures = bounds_for(model) is not None  # else element by element
    for index, (compiled, eager) in enumerate(zip(steps, eager_calls[1:]), start=1):
        where = f"on call {index + 1} of the build's check (after the example inputs)"
        check_accuracy(model, compiled, eager, eager if by_figures else None, where)
    where = f"after the {len(captured.calls)} calls of the build's check"
    for name, compiled_state, eager_value in zip(captured.state, state, eager_state):
        try:
            check_accuracy(model, [compiled_state], [eager_value], [eager_value] if by_figures else None, where)
        except ModelBuildError as error:
            message = error.message.replace("output 0", f"the state {name!r}", 1)
            raise ModelBuildError(model.name, "checking the state against eager", message) from None


def summary(record: AccuracyRecord) -> str:
    """The worst figures of an accuracy record, for the build's progress line."""
    floating = [o for o in record["outputs"] if "cosine" in o]
    if not floating:
        return f"checked against {record['against']}: equal"
    error = max(o["relative_error"] for o in floating)
    cosine = min(o["cosine"] for o in floating)
    return f"checked against {record['against']}: relative error {error:.3g}, cosine {cosine:.6g}"
