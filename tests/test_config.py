"""The configuration schema: what it accepts, and the message for each mistake."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import pytest

from hatch_precompile.engine import config as config_module
from hatch_precompile.engine.cache import plugin_fingerprint
from hatch_precompile.engine.config import TABLE_KEYS, ConfigError, model_keys, parse_config, reference_tables
from hatch_precompile.engine.model_config import CHOICES, AccuracyBounds, Dim, ModelConfig, OutputForm, TensorInput, setting
from hatch_precompile.engine.parts import PART_FILE, PART_FORMAT, read_parts
from hatch_precompile.runtime import OUTPUT_FORMS

T = "tool.hatch.build.hooks.precompile"


def model(**overrides: Any) -> dict[str, Any]:
    table: dict[str, Any] = {
        "factory": "pkg.model:build",
        "inputs": [{"shape": ["batch", 64], "dtype": "int64", "range": [0, 1000]}],
        "dims": {"batch": {"min": 1, "max": 64}},
    }
    table.update(overrides)
    return {key: value for key, value in table.items() if value is not None}


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    return caught.value.problems


def test_the_readme_example_parses_with_defaults_filled_in() -> None:
    config = parse_config({"package": "pkg", "fallback": "error", "models": {"encoder": model(weights="embed", options={"max_autotune": False})}})
    encoder = config.models["encoder"]
    assert config.package == "pkg" and config.fallback == "error"
    assert encoder.fallback == "error" and encoder.weights == "embed"
    assert encoder.args == (TensorInput(shape=("batch", 64), dtype="int64", value_range=(0, 1000)),)
    assert encoder.dims == {"batch": Dim(name="batch", min=1, max=64)}
    assert encoder.options == {"max_autotune": False}


def test_hatchlings_own_hook_keys_are_accepted() -> None:
    raw = {
        "enable-by-default": True,
        "dependencies": ["x"],
        "require-runtime-dependencies": True,
        "require-runtime-features": ["y"],
        "models": {"m": model()},
    }
    assert parse_config(raw).package is None


def test_every_model_builds_the_cpp_form_unless_it_or_the_table_says_false() -> None:
    """The C++ form is the default (it alone serves NumPy arrays without torch);
    the table's `cpp-form` sets every model's default, a model's own wins."""
    assert parse_config({"models": {"m": model()}}).models["m"].cpp_form is True
    models = parse_config({"cpp-form": False, "models": {"off": model(), "on": model(**{"cpp-form": True})}}).models
    assert (models["off"].cpp_form, models["on"].cpp_form) == (False, True)
    assert parse_config({"models": {"m": model(**{"cpp-form": False})}}).models["m"].cpp_form is False


def test_keyword_inputs_and_per_model_fallback() -> None:
    config = parse_config(
        {
            "models": {
                "m": model(
                    kwargs={"attention_mask": {"shape": ["batch", 64], "dtype": "bool"}},
                    fallback="error",
                )
            }
        }
    )
    assert config.fallback == "eager"
    assert config.models["m"].fallback == "error"
    assert config.models["m"].kwargs["attention_mask"] == TensorInput(shape=("batch", 64), dtype="bool")


def test_non_tensor_arguments_are_declared_as_constant_values() -> None:
    config = parse_config({"models": {"m": model(kwargs={"flip": {"value": True}, "scale": {"value": 0.5}})}})
    assert config.models["m"].kwargs == {"flip": TensorInput(constant=True), "scale": TensorInput(constant=0.5)}
    found = problems({"models": {"m": model(kwargs={"flip": {"value": [1]}, "n": {"value": 1, "dtype": "int64"}})}})
    assert found == [
        f"{T}.models.m.kwargs.flip.value: expected a boolean, number or string, found an array [1]",
        f"{T}.models.m.kwargs.n.dtype: unknown key; expected one of: value",
    ]


def test_cpu_targets_default_to_avx2_and_can_be_set_per_model() -> None:
    config = parse_config({"cpu-targets": ["avx2", "avx512"], "models": {"a": model(), "b": model(**{"cpu-targets": ["avx512"]})}})
    assert config.cpu_targets == ("avx2", "avx512")
    assert config.models["a"].cpu_targets == ("avx2", "avx512") and config.models["b"].cpu_targets == ("avx512",)
    assert parse_config({"models": {"m": model()}}).models["m"].cpu_targets == ("avx2",)


def test_dims_can_be_dynamic_bucketed_or_both() -> None:
    config = parse_config(
        {
            "models": {
                "m": model(
                    inputs=[{"shape": ["batch", "length", "width"]}],
                    dims={"batch": [8, 1, 32], "length": {"min": 1, "max": 128, "buckets": [16]}, "width": {"max": 4}},
                    weights="factory",
                    dtype="bfloat16",
                )
            }
        }
    )
    dims = config.models["m"].dims
    assert dims["batch"] == Dim(name="batch", min=1, max=32, buckets=(1, 8, 32), dynamic=False)
    assert dims["batch"].variants() == [1, 8, 32]
    assert dims["length"].variants() == [16, None]
    assert dims["width"].variants() == [None]
    assert config.models["m"].weights == "factory" and config.models["m"].dtype == "bfloat16"


def test_example_inputs_callable_with_dim_axes() -> None:
    raw = model(inputs=None, dims={"batch": {"max": 8, "axes": ["0:0", "attention_mask:0", "0.input_ids:0", "features.pixels.1:2"]}})
    raw["example-inputs"] = "pkg.model:examples"
    config = parse_config({"models": {"m": raw}})
    axes = ((0, 0), ("attention_mask", 0), ("0.input_ids", 0), ("features.pixels.1", 2))
    assert config.models["m"].dims["batch"] == Dim(name="batch", min=1, max=8, axes=axes)
    assert config.models["m"].example_inputs == "pkg.model:examples"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"models": {"m": model()}, "fallbak": "eager"}, f"{T}.fallbak: unknown key; did you mean `fallback`?"),
        ({"models": {"m": model()}, "fallback": "never"}, f"{T}.fallback: expected one of 'eager', 'error', found a string 'never'"),
        ({"models": {}}, f"{T}.models: no models declared"),
        ({"models": {"m": model()}, "jobs": 0}, f"{T}.jobs: expected an integer >= 1, found 0"),
        ({"models": {"m": model()}, "package": "my-pkg"}, f"{T}.package: expected an import package name such as 'my_pkg', found 'my-pkg'"),
        ({"models": {"bad name": model()}}, f"{T}.models.bad name: model names must be Python identifiers"),
        ({"models": {"m": 3}}, f"{T}.models.m: expected a table, found an integer 3"),
        ({"models": {"m": model(factory=None)}}, f"{T}.models.m.factory: missing; expected 'module:callable'"),
        ({"models": {"m": model(factory="pkg.model.build")}}, f"{T}.models.m.factory: expected 'module:callable', found 'pkg.model.build'"),
        ({"models": {"m": model(inputs=None, dims={})}}, f"{T}.models.m: declares no inputs"),
        ({"models": {"m": {**model(), "example-steps": "steps"}}}, f"{T}.models.m.example-steps: expected 'module:callable', found 'steps'"),
        ({"models": {"m": model(inputs={"shape": [1]})}}, f"{T}.models.m.inputs: expected an array, found a table"),
        ({"models": {"m": model(inputs=[{"dtype": "int64"}], dims={})}}, f"{T}.models.m.inputs[0].shape: missing"),
        ({"models": {"m": model(inputs=[{"shape": [0]}], dims={})}}, f"{T}.models.m.inputs[0].shape[0]: expected an integer >= 1, found 0"),
        ({"models": {"m": model(inputs=[{"shape": [2.5]}], dims={})}}, f"{T}.models.m.inputs[0].shape[0]: expected an integer >= 1, found a float 2.5"),
        ({"models": {"m": model(inputs=[{"shape": [2], "dtype": "int"}], dims={})}}, "did you mean 'int8'?"),
        ({"models": {"m": model(inputs=[{"shape": [2], "range": [5, 1]}], dims={})}}, f"{T}.models.m.inputs[0].range: expected low < high, found [5, 1]"),
        ({"models": {"m": model(inputs=[{"shape": [2], "range": [0]}], dims={})}}, "expected [low, high] (two numbers), found an array [0]"),
        ({"models": {"m": model(inputs=[{"shape": [2], "dtype": "bool", "range": [0, 1]}], dims={})}}, "a range makes no sense for dtype 'bool'"),
        ({"models": {"m": model(inputs=[{"shape": [2], "shpe": 1}], dims={})}}, f"{T}.models.m.inputs[0].shpe: unknown key; did you mean `shape`?"),
        ({"models": {"m": model(dims={})}}, f"{T}.models.m.inputs[0].shape: uses dim 'batch', which is not declared in {T}.models.m.dims (declared: none)"),
        ({"models": {"m": model(dims={"batch": {"min": 1, "max": 64}, "seq": {"max": 9}})}}, f"{T}.models.m.dims.seq: declared but used in no input shape"),
        ({"models": {"m": model(dims={"batch": {"min": 1}})}}, f"{T}.models.m.dims.batch.max: missing; a dynamic dim needs an upper bound"),
        ({"models": {"m": model(dims={"batch": {"min": 8, "max": 8}})}}, f"{T}.models.m.dims.batch: expected min < max, found min=8, max=8"),
        ({"models": {"m": model(dims={"batch": {"max": 8, "axes": ["0:0"]}})}}, f"{T}.models.m.dims.batch.axes: unknown key"),
        ({"models": {"m": model(weights="download")}}, f"{T}.models.m.weights: expected one of 'embed', 'factory', found a string 'download'"),
        ({"models": {"m": model(dims={"batch": [1, 0]})}}, f"{T}.models.m.dims.batch[1]: expected an integer >= 1, found 0"),
        ({"models": {"m": model(dims={"batch": []})}}, f"{T}.models.m.dims.batch: expected at least one size, found []"),
        ({"models": {"m": model(dims={"batch": [4, 4]})}}, f"{T}.models.m.dims.batch: lists a size twice: [4, 4]"),
        ({"models": {"m": model(dims={"batch": {"min": 1, "max": 8, "buckets": [4, 16]}})}}, f"{T}.models.m.dims.batch.buckets: sizes [16] lie outside [min, max] = [1, 8]"),
        ({"models": {"m": model(dims={"batch": {"min": 2, "buckets": [4]}})}}, f"{T}.models.m.dims.batch.min: only buckets are given"),
        ({"models": {"m": model(dims={"batch": list(range(1, 34))})}}, f"{T}.models.m.dims: these dims make 33 shape variants"),
        ({"models": {"m": model(dtype="int8")}}, f"{T}.models.m.dtype: expected one of 'float32', 'bfloat16', 'float16', found a string 'int8'"),
        ({"models": {"m": model(**{"cpp-form": "yes"})}}, f"{T}.models.m.cpp-form: expected true or false, found a string 'yes'"),
        ({"models": {"m": model(**{"cpp-form": 1})}}, f"{T}.models.m.cpp-form: expected true or false, found an integer 1"),
        ({"models": {"m": model()}, "cpp-form": "no"}, f"{T}.cpp-form: expected true or false, found a string 'no'"),
        ({"models": {"m": model()}, "cpu-targets": []}, f"{T}.cpu-targets: expected at least one of 'avx2', 'avx512', found []"),
        ({"models": {"m": model()}, "cpu-targets": ["avx2", "avx2"]}, f"{T}.cpu-targets: lists a target twice: ['avx2', 'avx2']"),
        ({"models": {"m": model(**{"cpu-targets": ["avx512f"]})}}, f"{T}.models.m.cpu-targets[0]: expected one of 'avx2', 'avx512', found a string 'avx512f' (did you mean 'avx512'?)"),
        ({"models": {"m": model()}, "cpu-targets": "avx2"}, f"{T}.cpu-targets: expected an array, found a string 'avx2'"),
        ({"models": {"m": model(options=[])}}, f"{T}.models.m.options: expected a table, found an array []"),
        ({"models": {"m": model(accuracy={"min-cosine": 1.5})}}, f"{T}.models.m.accuracy.min-cosine: expected a number in (0, 1]: the cosine similarity with the float32 output, found a float 1.5"),
        ({"models": {"m": model(accuracy={"max-relative-error": 0})}}, f"{T}.models.m.accuracy.max-relative-error: expected a number > 0"),
        ({"models": {"m": model(accuracy={"max-relative-error": "1%"})}}, "found a string '1%'"),
        ({"models": {"m": model(accuracy={"min-cosin": 0.99})}}, f"{T}.models.m.accuracy.min-cosin: unknown key; did you mean `min-cosine`?"),
        ({"models": {"m": model(accuracy={"max-error-ratio": 0})}}, f"{T}.models.m.accuracy.max-error-ratio: expected a number > 0: the compiled outputs' error against eager"),
        (
            {"models": {"m": model(accuracy={"max-error-ratio": 3})}},
            f'{T}.models.m.accuracy.max-error-ratio: bounds a lower precision\'s error against its own rounding, so it needs `dtype = "bfloat16"`',
        ),
        ({"models": {"m": model(accuracy=0.99)}}, f"{T}.models.m.accuracy: expected a table, found a float 0.99"),
        ({"models": {"m": {**model(), "example-inputs": "pkg:f"}}}, f"{T}.models.m.inputs: cannot be combined with `example-inputs`"),
        ({"models": {"m": {**model(inputs=None, dims={"b": {"max": 4}}), "example-inputs": "pkg:f"}}}, f"{T}.models.m.dims.b.axes: missing"),
        ({"models": {"m": {**model(inputs=None, dims={"b": {"max": 4, "axes": ["x"]}}), "example-inputs": "pkg:f"}}}, f"{T}.models.m.dims.b.axes[0]: expected 'input:axis'"),
        ({"models": {"m": {**model(inputs=None, dims={"b": {"max": 4, "axes": ["0..input_ids:1"]}}), "example-inputs": "pkg:f"}}}, "'0.input_ids:1' (positional 0, key input_ids, axis 1)"),
    ],
)
def test_each_mistake_names_its_key_path_and_what_was_expected(raw: dict[str, Any], expected: str) -> None:
    found = problems(raw)
    assert any(expected in p for p in found), found


def test_accuracy_bounds_are_typed_and_reach_the_worker() -> None:
    config = parse_config({"models": {"m": model(dtype="bfloat16", accuracy={"min-cosine": 0.99})}})
    assert config.models["m"].accuracy == AccuracyBounds(min_cosine=0.99)
    assert config.models["m"].to_json()["accuracy"] == {"min_cosine": 0.99}  # the other bound: the dtype's default


def test_every_problem_is_reported_in_one_error() -> None:
    raw = {
        "fallbak": "eager",
        "models": {
            "a": model(inputs=[{"shape": ["batch", "seq"], "dtype": "float33"}], dims={"batch": {"max": "64"}}),
            "b": model(factory=7),
        },
    }
    found = problems(raw)
    assert [p.split(":")[0] for p in found] == [
        f"{T}.fallbak",
        f"{T}.models.a.inputs[0].dtype",
        f"{T}.models.a.dims.batch.max",
        f"{T}.models.a.inputs[0].shape",
        f"{T}.models.b.factory",
    ]
    assert "invalid configuration (5 problem(s))" in str(ConfigError(found))


def test_supported_inductor_options_are_accepted_with_nested_tables_flattened() -> None:
    options = {"max_autotune": True, "epilogue_fusion": False, "aggressive_fusion": True, "coordinate_descent_tuning": True, "max_autotune_gemm": False}
    assert parse_config({"models": {"m": model(options=options)}}).models["m"].options == options


def test_every_unsupported_option_is_refused_with_the_reason_and_what_to_do() -> None:
    options = {"freezing": True, "cpp_wrapper": True, "cpp": {"simdlen": 256}, "max_autotun": True, "triton": {"cudagraphs": True}, "max_autotune": "yes"}
    found = problems({"models": {"m": model(options=options)}})
    path = f"{T}.models.m.options"
    assert len(found) == 6
    assert found[0].startswith(f"{path}.freezing: not supported: the graph takes its weights as inputs, so inductor's freezing would freeze nothing")
    assert "a frozen graph cannot be saved as an AOT artifact on torch 2.13-2.15" in found[0] and found[0].endswith("; remove it")
    assert found[1].startswith(f"{path}.cpp_wrapper: not supported: it compiles the graph's wrapper as C++")
    assert found[2] == f"{path}.cpp.simdlen: not supported: the vector width comes from each CPU target; choose them with `cpu-targets` (avx2, avx512)"
    supported = "supported: max_autotune, max_autotune_gemm, epilogue_fusion, aggressive_fusion, coordinate_descent_tuning"
    assert found[3] == f"{path}.max_autotun: not an inductor option hatch-precompile supports; did you mean 'max_autotune'? {supported}"
    assert found[4] == f"{path}.triton.cudagraphs: not an inductor option hatch-precompile supports; {supported}"
    assert found[5] == f"{path}.max_autotune: expected true or false, found 'yes'"


def test_the_configuration_reference_in_the_docs_is_the_one_the_schema_generates() -> None:
    """docs/configuration.md's key tables come from TABLE_KEYS and ModelConfig's fields, the
    keys the parser accepts; HATCH_PRECOMPILE_UPDATE_DOCS=1 rewrites them."""
    path = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
    text = path.read_text(encoding="utf-8")
    begin = text.index("-->\n", text.index("<!-- generated from TABLE_KEYS")) + len("-->\n")
    end = text.index("<!-- end of the generated reference -->")
    if os.environ.get("HATCH_PRECOMPILE_UPDATE_DOCS"):
        path.write_text(text[:begin] + reference_tables() + text[end:], encoding="utf-8")
    assert text[begin:end] == reference_tables(), "docs/configuration.md's reference drifted: rerun with HATCH_PRECOMPILE_UPDATE_DOCS=1"


def test_the_parser_accepts_exactly_the_documented_keys() -> None:
    undocumented = {"factory": "m:f", "inputs": [{"shape": [1]}], "compile-mode": "max"}
    with pytest.raises(ConfigError, match=r"models\.m\.compile-mode: unknown key"):
        parse_config({"models": {"m": undocumented}})


def test_int8_quantization_parses_and_its_conflicts_are_named() -> None:
    """`quantize = "int8"` with a `calibration` callable reaches the worker; a
    calibration without quantize or another dtype is refused with the key and
    the reason. The factory's weights are allowed: the graph has its weights
    compiled in, so only the eager fallback calls the factory."""
    config = parse_config({"models": {"m": model(quantize="int8", calibration="mypkg.data:batches")}})
    assert config.models["m"].quantize == "int8" and config.models["m"].calibration == "mypkg.data:batches"
    assert parse_config({"models": {"m": model(quantize="int8")}}).models["m"].calibration is None
    path = f"{T}.models.m"
    assert problems({"models": {"m": model(quantize="int4")}}) == [
        f"{path}.quantize: expected one of 'int8', 'int8-weight-only', 'int4-weight-only', 'int8-dynamic', found a string 'int4' (did you mean 'int8'?)"
    ]
    assert problems({"models": {"m": model(calibration="mypkg.data:batches")}}) == [f'{path}.calibration: sets the int8 activation scales, so it needs `quantize = "int8"`; add that or remove it']
    assert problems({"models": {"m": model(quantize="int8", calibration="batches")}}) == [f"{path}.calibration: expected 'module:callable', found 'batches'"]
    assert problems({"models": {"m": model(quantize="int8", dtype="bfloat16")}}) == [f"{path}.dtype: is 'bfloat16', but `quantize = \"int8\"` quantizes the float32 module; remove one of the two"]
    assert parse_config({"models": {"m": model(quantize="int8", weights="factory")}}).models["m"].weights == "factory"


def test_weight_only_quantization_parses_and_its_conflicts_are_named() -> None:
    """The weight-only schemes need bfloat16 activations (the reason is said),
    the shipped weights, and no calibration; group-size goes with int4 alone."""
    int4 = parse_config({"models": {"m": model(quantize="int4-weight-only", dtype="bfloat16", **{"group-size": 32})}}).models["m"]
    assert int4.quantizes_linears and int4.group_size == 32
    int8 = parse_config({"models": {"m": model(quantize="int8-weight-only", dtype="bfloat16", accuracy={"min-token-agreement": 0.95})}}).models["m"]
    assert int8.quantizes_linears and int8.group_size is None and int8.accuracy.min_token_agreement == 0.95
    path = f"{T}.models.m"
    (float32,) = problems({"models": {"m": model(quantize="int8-weight-only")}})
    assert float32.startswith(f"{path}.dtype: is unset (float32), but `quantize = 'int8-weight-only'` needs `dtype = \"bfloat16\"`")
    assert "the CPU kernels for 8- and 4-bit weights are fast only with bfloat16 activations" in float32
    assert "1.3-2.9x slower than plain float32" in float32
    dynamic = parse_config({"models": {"m": model(quantize="int8-dynamic", dtype="bfloat16")}}).models["m"]
    assert dynamic.quantizes_linears and dynamic.group_size is None
    (float32,) = problems({"models": {"m": model(quantize="int8-dynamic", dtype="float32")}})
    assert float32 == (
        f"{path}.dtype: is float32, but `quantize = 'int8-dynamic'` needs `dtype = \"bfloat16\"`: the layers between its int8 products "
        "run in bfloat16, and its accuracy is held to bfloat16's own rounding (docs/configuration.md#int8-dynamic)"
    )
    assert problems({"models": {"m": model(quantize="int8-weight-only", dtype="bfloat16", **{"group-size": 32})}}) == [
        f'{path}.group-size: is the int4 weights\' group size, so it needs `quantize = "int4-weight-only"`; add that or remove it'
    ]
    assert problems({"models": {"m": model(quantize="int4-weight-only", dtype="bfloat16", **{"group-size": 48})}}) == [
        f"{path}.group-size: expected one of 32, 64, 128 (the CPU kernel's group sizes), found an integer 48"
    ]
    assert problems({"models": {"m": model(quantize="int4-weight-only", dtype="bfloat16", calibration="mypkg.data:batches")}}) == [
        f'{path}.calibration: sets the int8 activation scales, so it needs `quantize = "int8"`; add that or remove it'
    ]
    assert problems({"models": {"m": model(quantize="int4-weight-only", dtype="bfloat16", weights="factory")}}) == [
        f'{path}.weights: is "factory", but the factory gives float weights and the graph takes the quantized ones the build made; ship them: `weights = "embed"`'
    ]
    assert problems({"models": {"m": model(accuracy={"min-token-agreement": 1.5})}}) == [
        f"{path}.accuracy.min-token-agreement: expected a number in (0, 1]: the share of positions whose most likely token is float32's, found a float 1.5"
    ]


def test_the_documented_keys_are_these() -> None:
    assert {"package", "fallback", "cpp-form", "cpu-targets", "jobs", "remote-cache", "remote-cache-mode", "models.<name>"} == set(TABLE_KEYS)
    assert set(model_keys()) == {
        "factory", "inputs", "kwargs", "example-inputs", "example-steps", "dims", "weights", "dtype",
        "options", "fallback", "cpu-targets", "accuracy", "outputs", "quantize", "group-size", "calibration", "cpp-form", "torch-free",
    }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class WithVectorize(ModelConfig):
    """ModelConfig and one setting more, as a new feature would add it."""

    vectorize: Literal["on", "off"] = field(default="on", metadata=setting("vectorize", CHOICES, '`"on"`', "a new choice", compiled=True, keyed=True))


def test_a_new_model_setting_reaches_the_docs_the_parser_the_worker_the_key_and_the_part_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A field added to ModelConfig, with its Setting, and nothing else written:
    the reference documents it, the parser reads and checks it, it travels to the
    worker and back, the artifact key hashes it and a part made with another
    value is refused."""
    monkeypatch.setattr(config_module, "ModelConfig", WithVectorize)
    assert '| `vectorize` | `"on"` \\| `"off"` | `"on"` | a new choice |' in reference_tables()
    parsed = parse_config({"models": {"m": model(vectorize="off")}}).models["m"]
    assert isinstance(parsed, WithVectorize) and parsed.vectorize == "off"
    assert parse_config({"models": {"m": model()}}).models["m"].vectorize == "on"  # type: ignore[attr-defined]
    assert problems({"models": {"m": model(vectorize="of")}}) == [f"{T}.models.m.vectorize: expected one of 'on', 'off', found a string 'of' (did you mean 'off'?)"]

    sent = json.loads(json.dumps(parsed.to_json()))  # as protocol.py sends it to the worker
    assert WithVectorize.from_json(sent) == parsed
    assert parsed.keyed_json()["vectorize"] == "off"  # worker/key.py hashes keyed_json()

    held = {"m": {"config": sent | {"vectorize": "on"}, "artifacts": {}}}
    (tmp_path / PART_FILE).write_text(json.dumps({"format": PART_FORMAT, "plugin": plugin_fingerprint(), "models": held}))
    with pytest.raises(ConfigError, match=rf"\({T}\.models\.m\.vectorize differ\); rebuild the part"):
        read_parts((tmp_path,), config_module.PrecompileConfig(package=None, fallback="eager", cpu_targets=("avx2",), models={"m": parsed}))


def test_the_choices_are_the_literals_the_loader_checks_too() -> None:
    assert get_args(OutputForm) == OUTPUT_FORMS
