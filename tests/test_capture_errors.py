"""Capture errors in the configuration's words: a model that only works for some
sizes of a declared dim fails with a message naming `dims.<name>`, its declared
range, what torch.export found, and what to change, with torch's text below.

Each test runs the real `capture()` with real torch.export on a small module,
the model table parsed by the real config parser."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hatch_precompile.engine.config import parse_config
from hatch_precompile.engine.errors import ModelBuildError
from hatch_precompile.engine.model_config import ModelConfig
from hatch_precompile.worker.capture import capture

PATH = "tool.hatch.build.hooks.precompile.models.m"


def model(inputs: list[dict[str, Any]], dims: dict[str, Any]) -> ModelConfig:
    """The worker's model dict for a table with these inputs and dims."""
    raw = {"models": {"m": {"factory": "made_up:factory", "inputs": inputs, "dims": dims}}}
    return parse_config(raw).models["m"]


def capture_error(module: nn.Module, inputs: list[dict[str, Any]], dims: dict[str, Any]) -> str:
    with pytest.raises(ModelBuildError) as caught:
        capture(model(inputs, dims), module.eval(), {})
    assert caught.value.step == "capturing with torch.export"
    return caught.value.message


def torch_text(message: str) -> str:
    """What follows the "torch's message:" line, which must be torch's own error."""
    _, marker, theirs = message.partition("\n\ntorch's message:\n")
    assert marker, message
    assert theirs.startswith("UserError: Constraints violated"), theirs
    return theirs


class ReshapeThenProject(nn.Module):
    """Silently assumes the batch: 4 rows of x.numel() / 4 features, into a Linear(4, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x.reshape(4, -1))


def test_a_dim_that_must_be_one_size_is_named_with_its_range_and_a_bucket_to_declare() -> None:
    message = capture_error(ReshapeThenProject(), [{"shape": ["batch", 8]}], {"batch": {"min": 1, "max": 16}})
    assert message.startswith(
        "a declared dim cannot be dynamic over its range:\n"
        f"  - {PATH}.dims.batch = {{ min = 1, max = 16 }}: torch.export found that the model only works when batch == 2.\n"
        "    Declare that size as a bucket: `batch = [2]` (a static artifact), "
        "or fix the model so that it does not depend on the size of batch.\n"
    ), message
    assert "specialized it to be a constant (2)" in torch_text(message)


class GroupsOfFour(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, 4, x.shape[1]).sum(1)


def test_a_dim_that_must_be_a_multiple_is_named_with_the_sizes_to_declare() -> None:
    message = capture_error(GroupsOfFour(), [{"shape": ["batch", 3]}], {"batch": {"min": 8, "max": 32}})
    assert f"{PATH}.dims.batch = {{ min = 8, max = 32 }}: " in message
    found = "torch.export found that the model only works when batch % 4 == 0"
    assert f"{found} (sizes 8, 12, 16, 20, 24, 28, 32 in the declared range)" in message
    assert "Declare the sizes the model supports as buckets, e.g. `batch = [8, 12, 16, 20, 24, 28, 32]`" in message
    assert "or fix the model so that it does not depend on the size of batch." in message
    assert "batch = 4*_batch" in torch_text(message)


class SmallBatchesOnly(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[0] <= 8 else x


def test_a_dim_whose_range_torch_narrows_is_told_the_range_to_declare() -> None:
    message = capture_error(SmallBatchesOnly(), [{"shape": ["batch", 8]}], {"batch": {"min": 1, "max": 16, "buckets": [4]}})
    assert f"{PATH}.dims.batch = {{ min = 1, max = 16, buckets = [4] }}: " in message
    assert "torch.export found that the model only works for batch in [1, 8]." in message
    assert "Narrow the range: `batch = { min = 1, max = 8 }`, declare `buckets` for the sizes the model supports, " in message
    assert "Dim('batch', max=8)" in torch_text(message)


class TwoAssumptions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.project(x.reshape(4, -1)), (y * 2 if y.shape[0] <= 8 else y)


def test_every_violated_dim_is_named_at_once() -> None:
    inputs = [{"shape": ["batch", 8]}, {"shape": ["seq", 8]}]
    message = capture_error(TwoAssumptions(), inputs, {"batch": {"min": 1, "max": 16}, "seq": {"min": 1, "max": 16}})
    assert message.startswith("2 declared dims cannot be dynamic over their ranges:\n"), message
    assert f"{PATH}.dims.batch = {{ min = 1, max = 16 }}: torch.export found that the model only works when batch == 2." in message
    assert f"{PATH}.dims.seq = {{ min = 1, max = 16 }}: torch.export found that the model only works for seq in [1, 8]." in message
    assert "`batch = [2]`" in message and "`seq = { min = 1, max = 8 }`" in message
    assert "Constraints violated (batch, seq)!" in torch_text(message)


class Adds(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


def test_two_dims_that_must_be_equal_are_told_to_be_one() -> None:
    inputs = [{"shape": ["batch", 8]}, {"shape": ["rows", 8]}]
    message = capture_error(Adds(), inputs, {"batch": {"min": 1, "max": 16}, "rows": {"min": 1, "max": 16}})
    assert f"{PATH}.dims.rows = {{ min = 1, max = 16 }}: torch.export found that the model only works when rows == batch." in message
    assert "Use one dim for both (`batch` in place of `rows`)" in message
    assert "must always be equal" in torch_text(message)


def example_inputs() -> tuple[tuple[torch.Tensor], dict[str, Any]]:
    return (torch.randn(2, 8),), {}


def test_models_with_example_inputs_are_told_to_make_the_dim_static_not_to_add_buckets() -> None:
    """Buckets need inputs declared by shape, so they are not offered here."""
    raw = {"factory": "made_up:factory", "example-inputs": f"{__name__}:example_inputs", "dims": {"batch": {"min": 1, "max": 16, "axes": ["0:0"]}}}
    config = parse_config({"models": {"m": raw}}).models["m"]
    with pytest.raises(ModelBuildError) as caught:
        capture(config, ReshapeThenProject().eval(), {})
    message = caught.value.message
    assert f'{PATH}.dims.batch = {{ min = 1, max = 16, axes = ["0:0"] }}: torch.export found that the model only works when batch == 2.' in message
    assert "Make it static by removing `batch` from dims, or fix the model" in message
    assert "bucket" not in message.partition("torch's message:")[0]
    torch_text(message)


class TakesADict(nn.Module):
    """A library module's call: one dict of features in, the same dict out with more."""

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        mask = features["attention_mask"].unsqueeze(-1).float()
        return {**features, "pooled": (features["embeddings"][0] * mask).sum(1) / mask.sum(1)}


def features() -> tuple[tuple[dict[str, Any]], dict[str, Any]]:
    return ({"embeddings": [torch.randn(3, 5, 4)], "attention_mask": torch.ones(3, 5, dtype=torch.int64)},), {}


def dict_model(axes: dict[str, list[str]]) -> ModelConfig:
    dims = {dim: {"min": 1, "max": 16, "axes": where} for dim, where in axes.items()}
    return parse_config({"models": {"m": {"factory": "made_up:factory", "example-inputs": f"{__name__}:features", "dims": dims}}}).models["m"]


def test_dims_inside_a_dict_and_a_list_are_dynamic_and_named_in_the_inputs_contract() -> None:
    config = dict_model({"batch": ["0.embeddings.0:0", "0.attention_mask:0"], "sequence": ["0.embeddings.0:1", "0.attention_mask:1"]})
    captured = capture(config, TakesADict().eval(), {})
    shapes = {leaf["name"]: leaf["shape"] for leaf in captured.input_leaves}
    assert shapes == {"features['attention_mask']": ["batch", "sequence"], "features['embeddings'][0]": ["batch", "sequence", 4]}
    bigger = {"embeddings": [torch.randn(7, 11, 4)], "attention_mask": torch.ones(7, 11, dtype=torch.int64)}
    assert captured.exported.module()(bigger)["pooled"].shape == (7, 4)  # one graph for every size


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("0.attention_mak:0", "'0.attention_mak:0': 0 has no key 'attention_mak'; its keys are ['attention_mask', 'embeddings']; did you mean 'attention_mask'?"),
        ("0.embeddings.2:0", "'0.embeddings.2:0': 0.embeddings is a list of 1 items, so '2' names none of them"),
        ("0.attention_mask.x:0", "'0.attention_mask.x:0': 0.attention_mask is a Tensor, which has no 'x' in it"),
        ("1.attention_mask:0", "'1.attention_mask:0': there is no positional input 1; the example inputs have 1"),
        ("features.attention_mask:0", "'features.attention_mask:0': there is no keyword input 'features'; the example inputs have none"),
        ("0.embeddings:0", "'0.embeddings:0' expects a tensor with an axis 0, found a list"),
    ],
)
def test_a_nested_path_that_is_not_in_the_example_inputs_names_what_is(where: str, expected: str) -> None:
    config = dict_model({"batch": [where]})
    with pytest.raises(ModelBuildError) as caught:
        capture(config, TakesADict().eval(), {})
    assert caught.value.message == f"{PATH}.dims.batch.axes: {expected}"


class NoSuchMethod(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.no_such_method()


def test_other_capture_errors_keep_torchs_message_alone() -> None:
    message = capture_error(NoSuchMethod(), [{"shape": [2, 8]}], {})
    assert message.startswith("AttributeError: ") and "no_such_method" in message
    assert "torch's message:" not in message


def test_a_model_that_fails_eagerly_at_the_example_size_says_so_with_real_sizes() -> None:
    message = capture_error(NoSuchMethod(), [{"shape": ["batch", 8]}], {"batch": {"min": 1, "max": 16}})
    assert message.startswith("the model fails on the build's example inputs (batch = 2) even without torch.export: AttributeError: ") and "no_such_method" in message
    assert message.endswith(
        "If it supports only some sizes, narrow the dims' ranges to them or declare them as buckets "
        "(the build makes its examples at the smallest size in each range other than 1, or at a bucket's size)."
    )


class FixedPositions(nn.Module):
    """Checks its input against a fixed size, as vision transformers do with the image size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != 32:
            raise ValueError(f"Input size ({x.shape[1]}) doesn't match model (32).")
        return x * 2


def test_a_size_check_in_the_models_code_is_reported_with_the_example_size_not_torchs_symbols() -> None:
    message = capture_error(FixedPositions(), [{"shape": [2, "length"]}], {"length": {"min": 16, "max": 64}})
    assert message.startswith("the model fails on the build's example inputs (length = 16) even without torch.export: ValueError: Input size (16) doesn't match model (32).\n")


class FormatsItsLength(nn.Module):
    """Formats a size as an integer, which a symbolic size cannot do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tag = f"{x.shape[1]:04d}"
        return x * len(tag)


FORMAT_LINE = FormatsItsLength.forward.__code__.co_firstlineno + 1


def test_a_dim_the_code_needs_fixed_is_named_when_making_it_static_captures() -> None:
    message = capture_error(FormatsItsLength(), [{"shape": ["batch", "length"]}], {"batch": {"min": 1, "max": 8}, "length": {"min": 2, "max": 64}})
    assert message.startswith(
        "the model's code needs a fixed size for 1 declared dim: torch.export captures it with length static, not dynamic:\n"
        f"  - {PATH}.dims.length = {{ min = 2, max = 64 }}\n"
        "    Declare the sizes the model supports as buckets, e.g. `length = [2]` (a static artifact each), "
        "or fix the model so that it does not need a fixed length.\n\ntorch's message:\n"
        "TypeError: unsupported format string passed to SymInt.__format__"
    ), message
    assert message.endswith(f'(raised in {__file__}, line {FORMAT_LINE}, in forward: tag = f"{{x.shape[1]:04d}}")'), message


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1 if x.sum() > 0 else x - 1


def test_a_model_torch_cannot_capture_at_any_size_is_told_that_dims_will_not_help() -> None:
    message = capture_error(DataDependent(), [{"shape": ["batch", 8]}], {"batch": {"min": 1, "max": 16}})
    assert message.startswith("torch.export cannot capture the model even with every declared dim static, so no `dims` setting helps: the model's code must change\n\ntorch's message:\n"), message


class FormatsBothSizes(nn.Module):
    """Formats two sizes: static alone, either one still fails."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tag = f"{x.shape[0]:d}x{x.shape[1]:d}"
        return x * len(tag)


def test_dims_the_code_needs_fixed_together_are_named_together() -> None:
    message = capture_error(FormatsBothSizes(), [{"shape": ["batch", "length"]}], {"batch": {"min": 1, "max": 8}, "length": {"min": 2, "max": 64}})
    assert message.startswith(
        f"the model's code needs fixed sizes for the declared dims batch and length together: torch.export captures it only with all of them static:\n  - {PATH}.dims.batch = {{ min = 1, max = 8 }}\n"
    ), message
    assert f"  - {PATH}.dims.length = {{ min = 2, max = 64 }}\n" in message


class Holder:
    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class ReturnsAnObject(nn.Module):
    def forward(self, x: torch.Tensor) -> Holder:
        return Holder(x * 2)


def test_an_output_torch_cannot_flatten_gets_advice_on_what_to_return() -> None:
    message = capture_error(ReturnsAnObject(), [{"shape": ["batch", 8]}], {"batch": {"min": 1, "max": 16}})
    assert message.startswith(
        "the model takes or returns an object torch.export cannot flatten into tensors; return tensors, tuples, lists, "
        "dicts or library output classes (for a transformers decoder, set `use_cache=False` in its config, "
        "so that it returns no cache object)\n\ntorch's message:\n"
    ), message
    assert "which is not a known type" in message


# --- Models with state ------------------------------------------------------------


class Counts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(4))
        self.table = nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.seen.add_(1)
        return self.table(ids).sum(1) + self.seen


def stateful(steps: str | None) -> ModelConfig:
    table: dict[str, Any] = {"factory": "made_up:factory", "inputs": [{"shape": ["batch", 3], "dtype": "int64", "range": [0, 10]}], "dims": {"batch": {"min": 1, "max": 4}}}
    if steps is not None:
        table["example-steps"] = steps
    return parse_config({"models": {"m": table}}).models["m"]


def steps_that_raise() -> list:
    raise RuntimeError("no tokenizer here")


def steps_of_the_wrong_kind() -> list:
    return [(torch.zeros(2, 3, dtype=torch.long),)]


def test_a_model_with_state_is_captured_with_its_state_and_the_bounds_of_its_indices() -> None:
    module = Counts().eval()
    captured = capture(stateful(None), module, {})
    assert captured.state == ["seen"] and torch.equal(captured.initial_state["seen"], torch.zeros(4))
    assert len(captured.calls) == 3  # the example inputs, then twice more by default
    outputs, state = captured.eager_run
    assert len(outputs) == 3 and torch.equal(state[0], torch.full((4,), 3.0))
    assert torch.equal(module.seen, torch.zeros(4)), "the build's eager run must leave the module's own state alone"
    assert captured.input_leaves[0]["below"] == 10  # the ids index an embedding table of 10 rows


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ("test_capture_errors:steps_that_raise", "RuntimeError: no tokenizer here"),
        ("test_capture_errors:steps_of_the_wrong_kind", "expected an iterable of (args, kwargs) calls, each a tuple of a tuple and a dict; call 0 is a tuple"),
        ("test_capture_errors:no_such_steps", "'test_capture_errors' has no attribute 'no_such_steps'"),
    ],
)
def test_example_steps_that_cannot_be_used_name_the_key_and_why(steps: str, expected: str) -> None:
    with pytest.raises(ModelBuildError) as caught:
        capture(stateful(steps), Counts().eval(), {})
    assert "example-steps" in caught.value.step and steps in caught.value.step
    assert expected in caught.value.message
