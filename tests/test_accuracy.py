"""The accuracy check's figures and bounds, on outputs made here (the builds that
use it are in test_battery.py and test_failing_builds.py)."""

from __future__ import annotations

import re

import pytest
import torch

from hatch_precompile.engine.errors import ModelBuildError
from hatch_precompile.engine.model_config import AccuracyBounds, ModelConfig
from hatch_precompile.worker.accuracy import Yardstick, check_accuracy, check_calls, figures, lower_precision_yardstick


def model(dtype: str | None, **accuracy: float) -> ModelConfig:
    return ModelConfig(name="m", factory="pkg:factory", dtype=dtype, accuracy=AccuracyBounds(**accuracy))


def reference() -> torch.Tensor:
    return torch.randn(64, 384, generator=torch.Generator().manual_seed(0))


def test_figures_of_equal_opposite_and_zero_outputs() -> None:
    r = reference()
    assert figures(r, r) == pytest.approx({"relative_error": 0.0, "cosine": 1.0, "element_error": 0.0})
    assert figures(-r, r) == pytest.approx({"relative_error": 2.0, "cosine": -1.0, "element_error": 2.0})
    assert figures(torch.zeros(3), torch.zeros(3)) == {"relative_error": 0.0, "cosine": 1.0, "element_error": 0.0}
    assert figures(torch.ones(3), torch.zeros(3))["relative_error"] == float("inf")
    one_off = r.clone()
    one_off[0, 0] += r.abs().max()  # one element off by the output's largest magnitude
    assert figures(one_off, r)["element_error"] == pytest.approx(1.0) and figures(one_off, r)["relative_error"] < 0.05


def bfloat16_ruler(r: torch.Tensor, *others: torch.Tensor) -> Yardstick:
    """A bfloat16 model's yardstick where eager is `r` rounded to bfloat16 (beside `others`)."""
    eager = ([[r.bfloat16(), *others]], [])
    return lower_precision_yardstick(model("bfloat16"), ["on the example inputs"], [], eager, eager, ([[r, *others]], []))


def test_bfloat16_rounding_passes_the_defaults_and_is_recorded() -> None:
    r = reference()
    compiled = (r + 0.002 * r.std() * torch.randn(r.shape, generator=torch.Generator().manual_seed(1))).bfloat16()  # rounds otherwise
    record = check_calls(model("bfloat16"), bfloat16_ruler(r, torch.arange(3)), [[compiled, torch.arange(3)]], None)
    assert record["against"] == "float32 eager"
    assert 0 < record["outputs"][0]["relative_error"] < 0.01 and record["outputs"][0]["cosine"] > 0.9999
    assert record["outputs"][1] == {"equal": True} and record["precision"]["outputs"][1] is None
    assert 0.5 < record["precision"]["outputs"][0]["ratio"] < 3, record["precision"]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda t: t * 1.1, "differs from eager bfloat16 by a relative error of 0.1,"),  # wrong scale, same direction
        (lambda t: torch.cat([t[:48], torch.zeros_like(t[48:])]), "> max-error-ratio 3.0"),  # a quarter of the rows lost
        (lambda t: t.flip(0), "> max-error-ratio 3.0"),  # rows in the wrong order
        (lambda t: torch.full_like(t, float("nan")), "output 0 has NaN or infinite elements where float32 eager has none"),
    ],
)
def test_wrong_results_in_low_precision_miss_the_defaults(damage, expected: str) -> None:
    r = reference()
    with pytest.raises(ModelBuildError) as caught:
        check_calls(model("bfloat16"), bfloat16_ruler(r), [[damage(r).bfloat16()]], None)
    assert expected in caught.value.message and "float32" in caught.value.message


def test_a_bound_the_model_misses_says_by_how_much() -> None:
    r = reference()
    with pytest.raises(ModelBuildError) as caught:
        check_accuracy(model("bfloat16", min_cosine=0.9999999), [r.bfloat16()], [r.bfloat16()], [r])
    assert "< min-cosine 1e-07" not in caught.value.message and "min-cosine 0.9999999" in caught.value.message
    assert "loosen `accuracy` in [tool.hatch.build.hooks.precompile.models.m]" in caught.value.message


def test_float32_bounds_scale_with_the_output() -> None:
    """Logits of magnitude 20 moved by 1e-4, as 30 reassociated layers move them,
    pass (an element tolerance of atol 1e-5, rtol 1e-4 refused them); one element
    off by 1% of the largest output, or every output by 1e-3, does not."""
    logits = 20 * reference()
    reassociated = logits + 1e-4 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(1)).clamp(-1, 1)
    record = check_accuracy(model(None), [reassociated], [logits], None)
    assert record["against"] == "eager" and record["outputs"][0]["element_error"] < 2e-6
    one_wrong = logits.clone()
    one_wrong[3, 5] += 0.01 * logits.abs().max()  # a relative error of 0.03% overall
    with pytest.raises(ModelBuildError) as caught:
        check_accuracy(model(None), [one_wrong], [logits], None)
    message = caught.value.message
    assert message.startswith("output 0 against eager on the example inputs: relative error 0.000276 > max-relative-error 0.0001; element error 0.01 > max-element-error 0.0001.")
    assert message.endswith("[tool.hatch.build.hooks.precompile.models.m], e.g. `accuracy = { max-relative-error = 0.0006, max-element-error = 0.02 }`")
    with pytest.raises(ModelBuildError, match=re.escape("relative error 0.001 > max-relative-error 0.0001")):
        check_accuracy(model(None), [logits * 1.001], [logits], None)
    assert check_accuracy(model(None, max_element_error=0.02, max_relative_error=0.0006), [one_wrong], [logits], None)["outputs"][0]["element_error"] == 0.01


def test_non_finite_elements_must_be_where_eager_has_them() -> None:
    r = reference()
    r[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    assert check_accuracy(model(None), [r.clone()], [r], None)["outputs"][0]["relative_error"] == 0
    moved = r.clone()
    moved[1, 0] = float("nan")
    with pytest.raises(ModelBuildError, match="output 0 has NaN or infinite elements where eager has others"):
        check_accuracy(model(None), [moved], [r], None)


def test_integer_outputs_must_be_equal() -> None:
    with pytest.raises(ModelBuildError, match=r"output 0 \(torch.int64\) differs from eager's"):
        check_accuracy(model("bfloat16"), [torch.arange(3) + 1], [torch.arange(3)], [torch.arange(3)])


def test_int8_has_looser_defaults_and_a_missed_bound_suggests_calibration() -> None:
    r = reference()
    int8 = ModelConfig(name="m", factory="pkg:factory", quantize="int8")
    noisy = r + 0.05 * r.std() * torch.randn(r.shape, generator=torch.Generator().manual_seed(1))
    record = check_accuracy(int8, [noisy], [r], [r])  # relative error 0.05: int8's default bound is 0.2
    assert record["against"] == "float32 eager" and 0.04 < record["outputs"][0]["relative_error"] < 0.06
    with pytest.raises(ModelBuildError) as caught:
        check_accuracy(int8, [r * 1.3], [r], [r])
    assert "relative error 0.3 > max-relative-error 0.2" in caught.value.message
    assert caught.value.message.endswith("otherwise build it in float32, or calibrate it on batches like its real inputs (`calibration`)")
    calibrated = ModelConfig(name="m", factory="pkg:factory", quantize="int8", calibration="pkg:batches")
    with pytest.raises(ModelBuildError) as caught:
        check_accuracy(calibrated, [r * 1.3], [r], [r])
    assert caught.value.message.endswith("otherwise build it in float32")  # its calibration is already set
