"""The accuracy check's figures and bounds, on outputs made here (the builds that
use it are in test_battery.py and test_failing_builds.py)."""

from __future__ import annotations

import pytest
import torch

from hatch_precompile.engine.errors import ModelBuildError
from hatch_precompile.engine.model_config import AccuracyBounds, ModelConfig
from hatch_precompile.worker.accuracy import check_accuracy, figures


def model(dtype: str | None, **accuracy: float) -> ModelConfig:
    return ModelConfig(name="m", factory="pkg:factory", dtype=dtype, accuracy=AccuracyBounds(**accuracy))


def reference() -> torch.Tensor:
    return torch.randn(64, 384, generator=torch.Generator().manual_seed(0))


def test_figures_of_equal_opposite_and_zero_outputs() -> None:
    r = reference()
    assert figures(r, r) == pytest.approx({"relative_error": 0.0, "cosine": 1.0})
    assert figures(-r, r) == pytest.approx({"relative_error": 2.0, "cosine": -1.0})
    assert figures(torch.zeros(3), torch.zeros(3)) == {"relative_error": 0.0, "cosine": 1.0}
    assert figures(torch.ones(3), torch.zeros(3))["relative_error"] == float("inf")


def test_bfloat16_rounding_passes_the_defaults_and_is_recorded() -> None:
    r = reference()
    compiled = r.bfloat16()
    record = check_accuracy(model("bfloat16"), [compiled, torch.arange(3)], [compiled, torch.arange(3)], [r, torch.arange(3)])
    assert record["against"] == "float32 eager"
    assert 0 < record["outputs"][0]["relative_error"] < 0.01 and record["outputs"][0]["cosine"] > 0.9999
    assert record["outputs"][1] == {"equal": True}


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda t: t * 1.1, "relative error 0.1 > max-relative-error 0.04"),  # wrong scale, same direction
        (lambda t: torch.cat([t[:48], torch.zeros_like(t[48:])]), "cosine similarity"),  # a quarter of the rows lost
        (lambda t: t.flip(0), "relative error"),  # rows in the wrong order
        (lambda t: torch.full_like(t, float("nan")), "relative error nan"),
    ],
)
def test_wrong_results_in_low_precision_miss_the_defaults(damage, expected: str) -> None:
    r = reference()
    compiled = damage(r).bfloat16()
    with pytest.raises(ModelBuildError) as caught:
        check_accuracy(model("bfloat16"), [compiled], [r.bfloat16()], [r])
    assert expected in caught.value.message and "output 0 against float32 eager" in caught.value.message


def test_a_bound_the_model_misses_says_by_how_much() -> None:
    r = reference()
    with pytest.raises(ModelBuildError) as caught:
        check_accuracy(model("bfloat16", min_cosine=0.9999999), [r.bfloat16()], [r.bfloat16()], [r])
    assert "< min-cosine 1e-07" not in caught.value.message and "min-cosine 0.9999999" in caught.value.message
    assert "loosen `accuracy`" in caught.value.message


def test_float32_outputs_are_compared_element_by_element() -> None:
    r = reference()
    close = r + 1e-7
    assert check_accuracy(model(None), [close], [r], None)["against"] == "eager"
    one_wrong = r.clone()
    one_wrong[3, 5] += 1  # a relative error of 0.2% overall, but one element far off
    with pytest.raises(ModelBuildError, match="output 0 differs from the eager module by up to 1"):
        check_accuracy(model(None), [one_wrong], [r], None)


def test_integer_outputs_must_be_equal() -> None:
    with pytest.raises(ModelBuildError, match=r"output 0 \(torch.int64\) differs from eager's"):
        check_accuracy(model("bfloat16"), [torch.arange(3) + 1], [torch.arange(3)], [torch.arange(3)])


def test_int8_has_looser_defaults_and_a_missed_bound_suggests_calibration() -> None:
    r = reference()
    int8 = ModelConfig(name="m", factory="pkg:factory", quantize="int8")
    noisy = r + 0.05 * r.std() * torch.randn(r.shape, generator=torch.Generator().manual_seed(1))
    record = check_accuracy(int8, [noisy], [r], [r])  # relative error 0.05: int8's default bound is 0.1
    assert record["against"] == "float32 eager" and 0.04 < record["outputs"][0]["relative_error"] < 0.06
    with pytest.raises(ModelBuildError) as caught:
        check_accuracy(int8, [r * 1.2], [r], [r])
    assert "relative error 0.2 > max-relative-error 0.1" in caught.value.message
    assert caught.value.message.endswith("otherwise build it in float32, or calibrate it on batches like its real inputs (`calibration`)")
