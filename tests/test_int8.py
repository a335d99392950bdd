"""int8 (`quantize = "int8"`): a convolution net and a transformers BERT encoder,
quantized with torchao's PT2E, compiled frozen with the real hook, loaded in a
fresh environment that has neither torchao nor a compiler; and each bad input
the issue names, with its message."""

from __future__ import annotations

import json
import os
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from hatch_precompile.runtime._manifest import VNNI, cpu_features

from conftest import Venv, build_wheel, deploy, no_compiler_env, run, write_project

pytestmark = [pytest.mark.e2e, pytest.mark.standalone]

MODELS = '''
import torch
from torch import nn


class Net(nn.Module):
    """A small image classifier: convolutions, pooling, linear layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 8 * 8, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def net():
    torch.manual_seed(0)
    return Net()


def images():
    """Calibration: three batches of different sizes."""
    generator = torch.Generator().manual_seed(1)
    for size in (4, 8, 3):
        yield (torch.randn(size, 3, 32, 32, generator=generator),), {}


def encoder():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, max_position_embeddings=32
    )
    return BertModel(config, add_pooling_layer=False).eval()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))


class Elementwise(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2 + 1


def elementwise():
    return Elementwise()


class AddmmLayer(nn.Module):
    """Like transformers' Conv1D (GPT-2): a matrix product by addmm, which the quantizer leaves alone."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))
        self.bias = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        hidden = torch.addmm(self.bias, x, self.weight)
        return hidden * torch.tanh(hidden)


def addmm_layer():
    torch.manual_seed(0)
    return AddmmLayer()


def raising():
    yield (torch.randn(2, 8),), {}
    raise RuntimeError("the calibration data set is not mounted")


def wrong_shapes():
    yield (torch.randn(2, 8),), {}
    yield (torch.randn(2, 9),), {}


def eight_batches():
    generator = torch.Generator().manual_seed(3)
    for size in range(1, 9):
        yield (torch.randn(size, 8, generator=generator),), {}


def two_batches():
    yield (torch.randn(2, 8),), {}
    yield (torch.randn(5, 8),), {}


def lookup():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8))


def ids_past_the_vocabulary():
    yield (torch.randint(0, 10, (2, 8)),), {}
    yield (torch.full((2, 8), 12),), {}


def not_batches():
    return [torch.randn(2, 8)]


def empty():
    return []
'''

PROJECT = """
[tool.hatch.build.hooks.precompile.models.net]
factory = "int8pkg.models:net"
inputs = [{ shape = ["batch", 3, 32, 32] }]
dims = { batch = { min = 1, max = 16 } }
quantize = "int8"
calibration = "int8pkg.models:images"
weights = "factory"  # the graph has its weights compiled in: the wheel ships no float32 copy
cpp-form = true  # refused, with the reason: its weights are compiled in

[tool.hatch.build.hooks.precompile.models.encoder]
factory = "int8pkg.models:encoder"
inputs = [{ shape = ["batch", 16], dtype = "int64", range = [0, 100] }]
kwargs = { attention_mask = { shape = ["batch", 16], dtype = "int64", range = [1, 2] } }
dims = { batch = { min = 1, max = 8 } }
quantize = "int8"
outputs = "plain"
"""


@pytest.fixture(scope="module")
def int8_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(write_project(tmp_path_factory.mktemp("int8"), "int8pkg", MODELS, PROJECT))


# A CPU without VNNI (AMD EPYCs before Zen 4, Intel Xeons before Cascade Lake) multiplies
# uint8 activations by int8 weights in oneDNN with vpmaddubsw, which adds pairs of
# products into 16 bits that saturate: the net's cosine to float32 measured
# 0.9984-0.9991 there against 0.99997 in exact int8 arithmetic (docs/configuration.md).
HAS_VNNI = bool(VNNI & cpu_features())  # as the build records it and the loader reads it
WITHOUT_VNNI_COSINE = 0.995


@pytest.fixture(scope="module")
def int8_venv(tmp_path_factory: pytest.TempPathFactory, int8_wheel: Path) -> Venv:
    """The wheel and what its metadata requires: torch and safetensors, no torchao."""
    env = deploy(int8_wheel, tmp_path_factory.mktemp("int8-deploy") / "venv")
    assert env.script("import importlib.util; print(importlib.util.find_spec('torchao'))").stdout.strip() == "None"
    return env


# On every supported release (the legs): torch 2.14 moved the passes that make
# int8 kernels into torchao, and each release lowers the graph its own way.
@pytest.mark.release
def test_the_wheel_ships_the_lean_form_and_constants_only(int8_wheel: Path) -> None:
    with zipfile.ZipFile(int8_wheel) as archive:
        names = archive.namelist()
        manifest = json.loads(archive.read("int8pkg/_precompiled/manifest.json"))
        module = archive.read("int8pkg/_precompiled/net/cpu_avx2.py").decode()
    assert not [n for n in names if n.endswith(".bin")]
    assert "int8pkg/_precompiled/encoder/weights.safetensors" in names  # for the eager fallback
    assert not [n for n in names if n.startswith("int8pkg/_precompiled/net/weights")]  # weights = "factory"
    for name in ("net", "encoder"):
        model = manifest["models"][name]
        (variant,) = model["artifacts"]
        assert model["quantize"] == "int8" and variant["file"] == f"{name}/cpu_avx2_constants.safetensors"
        assert variant["lean"]["file"] == f"{name}/cpu_avx2.py"
        cosine = 0.999 if HAS_VNNI or name == "encoder" else WITHOUT_VNNI_COSINE  # the build's check ran on this CPU
        assert variant["accuracy"]["against"] == "float32 eager" and variant["accuracy"]["outputs"][0]["cosine"] > cosine
        assert variant["accuracy"]["vnni"] is HAS_VNNI  # what explain() tells a CPU without VNNI (below)
        packed = {spec["prepack"] for spec in variant["constants"].values() if "prepack" in spec}
        assert packed == ({"onednn.qconv_prepack", "onednn.qlinear_prepack"} if name == "net" else {"onednn.qlinear_prepack"})
    # reproducible bytes: the frozen constants' declarations and the size checks' messages carry no address
    assert "_frozen_param" in module and " at 0x" not in module and "= None  #" not in module
    assert "torch.ops.onednn.qconv_pointwise" in module and "torch.ops.onednn.qlinear_pointwise" in module


CALL = """
import json, sys
import torch
from int8pkg import load_compiled
from int8pkg._precompiled import explain

data = torch.load(sys.argv[1], weights_only=True)
report = {"explain": explain()}
net, encoder = load_compiled("net"), load_compiled("encoder")
cosine = lambda got, want: torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
report["net"] = [cosine(net(x), want) for x, want in zip(data["images"], data["net"])]
report["encoder"] = cosine(encoder(data["ids"], attention_mask=data["mask"])["last_hidden_state"], data["encoder"])
report["compiler_modules"] = sorted(m for m in sys.modules if m.startswith(("torch._inductor", "torch._dynamo", "torchao")))
for call in (lambda: net(torch.randn(17, 3, 32, 32)), lambda: load_compiled("net", state_dict={})):
    try:
        call()
    except ValueError as error:
        report.setdefault("refused", []).append(str(error))
print(json.dumps(report))
"""


@pytest.mark.release
def test_it_loads_lean_without_compiler_or_torchao_and_keeps_float32_accuracy(int8_venv: Venv, tmp_path: Path) -> None:
    """At batch 1, 5 and 16 (one graph for the dynamic batch), against the float32 modules run here;
    at the CPU's best and with oneDNN held to AVX2, as on a CPU without VNNI."""
    import torch

    models: dict = {}
    exec(MODELS, models)
    images = [torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch)) for batch in (1, 5, 16)]
    ids = torch.randint(0, 100, (3, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 16, dtype=torch.int64)
    with torch.no_grad():
        net, encoder = models["net"]().eval(), models["encoder"]()
        data = {"images": images, "net": [net(x) for x in images], "ids": ids, "mask": mask}
        data["encoder"] = encoder(ids, attention_mask=mask).last_hidden_state
    torch.save(data, tmp_path / "data.pt")
    call = CALL.replace("sys.argv[1]", repr(str(tmp_path / "data.pt")))
    without_vnni = json.loads(int8_venv.script(call, env=no_compiler_env(tmp_path, ONEDNN_MAX_CPU_ISA="AVX2")).stdout)
    assert min(without_vnni["net"]) > WITHOUT_VNNI_COSINE and without_vnni["encoder"] > 0.999, without_vnni
    report = json.loads(int8_venv.script(call, env=no_compiler_env(tmp_path)).stdout)
    assert (
        "net: would load net/cpu_avx2.py (lean form; the build refused the C++ form: an int8 graph is compiled with its weights "
        "frozen in as oneDNN's packed constants, which the container cannot bind)"
    ) in report["explain"]
    assert min(report["net"]) > (0.999 if HAS_VNNI else WITHOUT_VNNI_COSINE) and report["encoder"] > 0.999, report
    assert report["compiler_modules"] == []
    assert not (tmp_path / "compiler-used").exists()
    range_error, weights_error = report["refused"]
    assert range_error == "model 'net', input x: dim 'batch' (dim 0) must be in [1, 16], got 17"
    assert weights_error.startswith("model 'net' is quantized to int8: its weights were compiled into it at build time")


def test_explain_says_where_a_model_checked_with_vnni_runs_without_it() -> None:
    from hatch_precompile.runtime import int8_without_vnni

    avx2 = frozenset({"avx", "avx2", "fma3"})
    checked_with: dict = {"accuracy": {"against": "float32 eager", "outputs": [], "vnni": True}}
    assert "this CPU has no VNNI, where oneDNN's int8 products can saturate" in int8_without_vnni(checked_with, avx2)
    assert int8_without_vnni(checked_with, avx2 | {"avx512_vnni"}) == int8_without_vnni(checked_with, avx2 | {"avx_vnni"}) == ""
    checked_without: dict = {"accuracy": {**checked_with["accuracy"], "vnni": False}}  # the build saw this path itself
    assert int8_without_vnni(checked_without, avx2) == int8_without_vnni({"accuracy": {}}, avx2) == ""


def test_without_its_lean_form_it_falls_back_and_says_why(int8_venv: Venv, tmp_path: Path) -> None:
    """To the factory's module: `net` ships no weights (weights = "factory")."""
    code = "import warnings, int8pkg; warnings.simplefilter('always'); print(int8pkg.load_compiled('net'))"
    result = int8_venv.script(code, env=no_compiler_env(tmp_path, HATCH_PRECOMPILE_FORM="artifact"))
    assert "<eager fallback Net>" in result.stdout
    said = "the lean form: HATCH_PRECOMPILE_FORM=artifact; the artifact form: the build refused it for net/"
    assert said in result.stderr and "an int8 variant is compiled with its weights frozen in, into no artifact" in result.stderr


def test_inspect_and_verify_read_an_int8_wheel(int8_wheel: Path) -> None:
    command = [str(Path(sys.executable).parent / "hatch-precompile")]
    inspected = run([*command, "inspect", str(int8_wheel)]).stdout
    assert "lean only (int8: its constants instead of an artifact)" in inspected
    assert "OK: every file verifies and every model loads here" in run([*command, "verify", str(int8_wheel)]).stdout


FAILING = """
[tool.hatch.build.hooks.precompile.models.m]
factory = "int8pkg.models:{factory}"
inputs = [{{ shape = ["batch", 8] }}]
dims = {{ batch = {{ min = 1, max = 16 }} }}
quantize = "int8"
"""


def test_a_calibration_that_raises_stops_the_build_with_its_traceback(tmp_path: Path) -> None:
    project = write_project(tmp_path, "int8pkg", MODELS, FAILING.format(factory="mlp") + 'calibration = "int8pkg.models:raising"\n')
    output = _failed_build(project)
    assert "model 'm' failed while calibrating with calibration = 'int8pkg.models:raising'" in output
    assert "RuntimeError: the calibration data set is not mounted" in output


def _failed_build(project: Path, **extra_env: str) -> str:
    result = run([sys.executable, "-m", "build", "--wheel", "--no-isolation", str(project)], env={**os.environ, **extra_env}, check=False)
    assert result.returncode != 0 and not list((project / "dist").glob("*.whl"))
    return result.stdout + result.stderr


def _captured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory: str, calibration: str | None, template: str = FAILING) -> tuple[Any, Any]:
    """A model of MODELS configured by FAILING (or `template`), captured by the worker's own code in this process."""
    from hatch_precompile.engine.config import parse_config
    from hatch_precompile.worker.capture import build_module, capture

    package = tmp_path / "int8pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    table = tomllib.loads(template.format(factory=factory) + (f'calibration = "int8pkg.models:{calibration}"\n' if calibration else ""))
    model = parse_config(table["tool"]["hatch"]["build"]["hooks"]["precompile"]).models["m"]
    module, reference = build_module(model)
    return model, capture(model, module, {}, reference)


@pytest.mark.parametrize(
    ("factory", "calibration", "expected"),
    [
        ("mlp", "wrong_shapes", "batch 1 does not fit the declared inputs: model 'm', input input: expected size 8 at dim 1 (shape ['batch', 8]), got [2, 9]"),
        ("mlp", "not_batches", "batch 0: expected (args, kwargs), a tuple of a tuple and a dict, got Tensor"),
        ("mlp", "empty", "it yielded no batch; yield at least one (args, kwargs) batch"),
        ("elementwise", None, 'quantize = "int8", but X86InductorQuantizer found no layer to quantize: it quantizes linear layers and convolutions; remove'),
        ("addmm_layer", None, "this model's matrix products are aten.addmm.default, which it leaves in float32 (transformers' Conv1D, as in GPT-2, is an addmm: make each an nn.Linear"),
    ],
)
def test_bad_calibration_and_unquantizable_models_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory: str, calibration: str | None, expected: str) -> None:
    """The worker's quantize step itself, in this process (a build through the hook is above)."""
    import torch._inductor.config as inductor_config

    from hatch_precompile.engine.errors import ModelBuildError
    from hatch_precompile.worker.quantize import quantize

    model, captured = _captured(tmp_path, monkeypatch, factory, calibration)
    global_pass = inductor_config.pre_grad_custom_pass
    with pytest.raises(ModelBuildError) as caught:
        quantize(model, captured)
    assert caught.value.model == "m" and expected in str(caught.value)
    assert inductor_config.pre_grad_custom_pass is global_pass  # torchao's import set it process-wide; quantize undid that
    if calibration:
        assert caught.value.step == f"calibrating with calibration = 'int8pkg.models:{calibration}'"


def test_a_calibration_batch_whose_ids_the_model_cannot_index_names_the_batch_and_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hatch_precompile.engine.errors import ModelBuildError
    from hatch_precompile.worker.quantize import quantize

    ids = FAILING.replace('inputs = [{{ shape = ["batch", 8] }}]', 'inputs = [{{ shape = ["batch", 8], dtype = "int64", range = [0, 10] }}]')
    model, captured = _captured(tmp_path, monkeypatch, "lookup", "ids_past_the_vocabulary", ids)
    with pytest.raises(ModelBuildError) as caught:
        quantize(model, captured)
    assert caught.value.message.startswith("batch 1 does not fit the declared inputs: model 'm', input input: holds 12..12, but the model indexes a size of 10 with it")


@pytest.mark.parametrize(
    ("calibration", "calibrated", "checked"),
    [
        ("eight_batches", 6, ["calibration batch 3 (held out of calibration)", "calibration batch 7 (held out of calibration)"]),
        ("two_batches", 2, [f"calibration batch {i} (calibrated on: fewer than 4 batches, none held out)" for i in (0, 1)]),
        (None, 1, []),
    ],
)
def test_every_fourth_calibration_batch_is_held_out_for_the_accuracy_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calibration: str | None, calibrated: int, checked: list[str]) -> None:
    """With four batches or more, one in four is kept out of the scales and checked
    instead; with fewer, all calibrate and all are checked; without `calibration`,
    the example inputs calibrate and are checked (compile.py)."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from hatch_precompile.worker.quantize import quantize

    model, captured = _captured(tmp_path, monkeypatch, "mlp", calibration)
    seen: list[int] = []
    original = prepare_pt2e

    def counting(module, quantizer):  # counts the batches the prepared module sees
        prepared = original(module, quantizer)
        prepared.register_forward_pre_hook(lambda _module, args: seen.append(args[0].shape[0]))
        return prepared

    monkeypatch.setattr("torchao.quantization.pt2e.quantize_pt2e.prepare_pt2e", counting)
    quantized = quantize(model, captured)
    assert len(seen) == calibrated and [which for which, _ in quantized.checks] == checked
    if calibration == "eight_batches":
        assert 4 not in seen and 8 not in seen  # batches 3 and 7 have 4 and 8 rows


def test_without_torchao_the_build_says_what_to_add(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hatch_precompile.engine.errors import ModelBuildError
    from hatch_precompile.worker.quantize import quantize

    model, captured = _captured(tmp_path, monkeypatch, "mlp", None)
    monkeypatch.setitem(sys.modules, "torchao.quantization.pt2e.quantize_pt2e", None)  # an import of it raises ImportError
    with pytest.raises(ModelBuildError) as caught:
        quantize(model, captured)
    assert str(caught.value).startswith("hatch-precompile: model 'm' failed while quantizing to int8: quantize = \"int8\" needs torchao in the build environment")
    assert 'add "hatch-precompile[int8]" (or "torchao>=0.18,<0.19") to [build-system] requires' in caught.value.message


def test_a_dead_layer_is_left_out_of_the_graph_and_a_torchao_failure_names_the_layer(tmp_path: Path) -> None:
    """A sentence embedder over BertModel computes the pooler and returns
    something else. torchao's quantizer fails on that dead linear layer
    (torch 2.13-2.15, torchao 0.18); the build's message names the layer and its
    source line; capture leaves it out, and the quantizer then succeeds."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer

    from hatch_precompile.worker.capture import without_dead_code
    from hatch_precompile.worker.quantize import torchao_failure

    models: dict = {}
    exec(MODELS, models)
    bert = models["encoder"]()
    bert_with_pooler = type(bert)(bert.config).eval()  # add_pooling_layer defaults to True

    class Embedder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert_with_pooler

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return hidden.mean(1)

    ids = torch.randint(0, 100, (2, 16))
    exported = torch.export.export(Embedder().eval(), (ids, torch.ones_like(ids)))
    quantizer = x86_inductor_quantizer.X86InductorQuantizer()
    quantizer.set_global(x86_inductor_quantizer.get_default_x86_inductor_quantization_config())
    with pytest.raises(IndexError) as caught:  # if this stops failing, torchao handles dead layers itself
        prepare_pt2e(exported.module(), quantizer)
    message = torchao_failure("prepare_pt2e", caught.value)
    assert message.startswith("torchao's prepare_pt2e failed at layer bert.pooler.dense (Linear), at modeling_bert.py:")
    assert "pooled_output = self.dense(first_token_tensor): IndexError: list index out of range" in message
    assert "What to try: leave that layer out of the module the factory returns" in message

    cleaned = without_dead_code(exported)
    layers = {stack[-1][0] for node in cleaned.graph.nodes if (stack := list(node.meta.get("nn_module_stack", {}).values()))}
    assert "bert.encoder.layer.1.output.dense" in layers and not [layer for layer in layers if layer.startswith("bert.pooler")]
    prepare_pt2e(cleaned.module(), quantizer)
