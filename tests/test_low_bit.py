"""Weight-only int8 and int4 (`quantize = "int8-weight-only"`, `"int4-weight-only"`),
and int8 weights with int8 inputs per call (`"int8-dynamic"`), on decoders with state of tests/stateful (the hand-written one, and GPT-2
through transformers' export wrapper) and on a stateless
encoder whose blocks feed one input to two layers (quantized as one). Built once with the real hook (torchao at build time), installed in a
fresh environment with neither torchao, transformers nor a compiler, and run in
one fresh process: the lean form, the quantized weights alone in the wheel,
outputs against the same quantization run eagerly, generate (greedy, sampled,
streamed) from the installed wheel, and what `inspect` says of each model.

Random weights at two layers of 32-64 make logits near ties, so the build's
token agreement is measured, not bounded, here (each model's `accuracy` says so);
benchmarks/real_decoder.py measures it on a trained checkpoint."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from conftest import REPO, Venv, build_wheel, deploy, no_compiler_env, write_project

pytestmark = [pytest.mark.e2e, pytest.mark.standalone]  # a project of its own: nothing of the session's

ENCODER = '''

class Gated(nn.Module):
    """A gated MLP (SwiGLU's shape): gate and up take the same input."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.gate, self.up, self.down = nn.LayerNorm(64), nn.Linear(64, 128), nn.Linear(64, 128, bias=False), nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        return self.down(F.gelu(self.gate(x)) * self.up(x))


class Encoder(nn.Module):
    """Token embeddings, two residual gated MLP blocks, mean pooling: stateless."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.blocks = nn.ModuleList(Gated() for _ in range(2))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = x + block(x)
        return x.mean(1)


def encoder() -> nn.Module:
    torch.manual_seed(0)
    return Encoder().eval()


# transformers' static cache keeps its tensors in objects that `.to()` does not
# reach: a factory that takes `dtype` makes the LM in it before wrapping it (and
# the build calls it again without, for the float32 module it checks against).
def gpt2_in(dtype=torch.float32) -> nn.Module:
    return _static_cache(gpt2_lm().to(dtype))
'''
MODELS = (REPO / "tests" / "stateful" / "models.py").read_text() + ENCODER
UNBOUNDED_TOKENS = "accuracy = { min-token-agreement = 0.01 }  # random weights: near-tie logits"
DECODER = """factory = "lowbit.models:decoder"
example-inputs = "lowbit.models:prompt"
example-steps = "lowbit.models:steps"
dims = { batch = { min = 1, max = 4, axes = ["0:0"] }, seq = { min = 1, max = 64, axes = ["0:1", "1:0"] } }"""
LM = """example-inputs = "lowbit.models:lm_prompt"
example-steps = "lowbit.models:lm_steps"
dims = { seq = { min = 1, max = 48, axes = ["input_ids:1", "cache_position:0"] } }"""
# (model, factory, scheme, group size): our decoder in int8 and in int4, GPT-2
# (transformers' static cache and Conv1D, its weight stored transposed) in int4.
# Qwen3 and Llama in int8 and int4 and GPT-2 in int8 were here too: their layers
# are the same nn.Linear as our decoder's, GPT-2's Conv1D becomes rows the same
# way for either scheme (linears.quantize_weights), transformers' static cache
# is GPT-2's too, and they cost CI two and a half minutes.
MODELS_BUILT = [
    ("decoder_int8", "decoder", "int8-weight-only", None),
    ("decoder_int8_dynamic", "decoder", "int8-dynamic", None),
    ("decoder_int4", "decoder", "int4-weight-only", 32),
    ("gpt2_int4", "gpt2_in", "int4-weight-only", 32),
]


def _table(name: str, factory: str, scheme: str, group_size: int | None) -> str:
    call = DECODER if factory == "decoder" else f'factory = "lowbit.models:{factory}"\n{LM}'
    group = f"\ngroup-size = {group_size}" if group_size else ""
    return f'\n[models.{name}]\n{call}\ndtype = "bfloat16"\nquantize = "{scheme}"{group}\n{UNBOUNDED_TOKENS}\n'


ENCODERS = {"encoder_int8": "int8-weight-only", "encoder_int8_dynamic": "int8-dynamic"}
PROJECT = "".join(_table(*model) for model in MODELS_BUILT) + "".join(
    f"""
[models.{name}]
factory = "lowbit.models:encoder"
inputs = [{{ shape = ["batch", "seq"], dtype = "int64", range = [0, 256] }}]
dims = {{ batch = {{ min = 1, max = 8 }}, seq = {{ min = 1, max = 32 }} }}
dtype = "bfloat16"
quantize = "{scheme}"
"""
    for name, scheme in ENCODERS.items()
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = write_project(tmp_path_factory.mktemp("lowbit"), "lowbit", MODELS, PROJECT.replace("[models.", "[tool.hatch.build.hooks.precompile.models."))
    return build_wheel(project)


@pytest.fixture(scope="module")
def manifest(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read("lowbit/_precompiled/manifest.json"))


# One fresh process: each model's form, its outputs on the inputs the test wrote
# (to compare with the same quantization run eagerly), and generate's paths.
RUN = """
import json, sys, torch
from lowbit import load_compiled
data = torch.load(sys.argv[1])
report = {"explain": {}, "outputs": {}}
for name, (args, kwargs) in data.items():
    report["explain"][name] = load_compiled.explain(name)
    model = load_compiled(name)
    report["outputs"][name] = model(*args, **kwargs)
decoder = load_compiled("decoder_int4")
prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(5))
greedy = decoder.generate(prompt, 10)
streamed = torch.stack(list(decoder.stream(prompt, 10)), 1)
sampled = [decoder.generate(prompt, 10, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=s) for s in (1, 1, 2)]
gpt2 = load_compiled("gpt2_int4").generate(torch.ones(1, 4, dtype=torch.long), 6, stop_tokens=[])
report["generate"] = {
    "streamed": torch.equal(greedy, streamed), "shape": list(greedy.shape),
    "seeded": torch.equal(sampled[0], sampled[1]), "seeds_differ": not torch.equal(sampled[0], sampled[2]),
    "gpt2": list(gpt2.shape),
}
report["modules"] = sorted(m for m in ("torchao", "transformers", "torch._inductor", "torch._dynamo") if m in sys.modules)
torch.save(report, sys.argv[2])
"""


def _calls() -> dict:
    """Each model's call on which the wheel and the eager quantization are compared."""
    ids = torch.randint(0, 256, (3, 9), generator=torch.Generator().manual_seed(0))
    lm = ((), {"input_ids": ids[:1], "cache_position": torch.arange(9)})
    calls = {name: ((ids, torch.arange(9)), {}) if factory == "decoder" else lm for name, factory, _, _ in MODELS_BUILT}
    return {**calls, **{name: ((ids,), {}) for name in ENCODERS}}


def _eager(name: str, manifest: dict) -> torch.nn.Module:
    """The model as the build quantized it, run eagerly: its factory's module in
    bfloat16 with the same layers quantized (worker/linears.py)."""
    import importlib.util
    import tomllib

    from hatch_precompile.engine.config import parse_config
    from hatch_precompile.worker.capture import example_calls
    from hatch_precompile.worker.linears import quantize_weights

    spec = importlib.util.spec_from_file_location("lowbit_models", REPO / "tests" / "stateful" / "models.py")
    assert spec is not None and spec.loader is not None
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    exec(ENCODER, models.__dict__)
    model = parse_config({"package": "lowbit", "models": tomllib.loads(PROJECT)["models"]}).models[name]
    factory = getattr(models, model.factory.split(":")[1])
    module = factory(dtype=torch.bfloat16) if model.factory.endswith("_in") else factory().to(torch.bfloat16)
    sys.modules["lowbit.models"] = models  # where the build's example calls come from: the layers sharing an input, int8-dynamic's smoothing
    try:
        record = quantize_weights(model, module, example_calls(model))
        assert {key: record.get(key) for key in ("layers", "shared_input")} == {key: manifest["models"][name]["quantization"].get(key) for key in ("layers", "shared_input")}
    finally:
        del sys.modules["lowbit.models"]
    return module


def test_quantized_models_load_lean_without_torchao_and_match_their_eager_quantization(wheel: Path, manifest: dict, tmp_path: Path) -> None:
    venv: Venv = deploy(wheel, tmp_path / "venv")
    calls = _calls()
    torch.save(calls, tmp_path / "calls.pt")
    venv.script(RUN.replace("sys.argv[1]", repr(str(tmp_path / "calls.pt"))).replace("sys.argv[2]", repr(str(tmp_path / "report.pt"))), env=no_compiler_env(tmp_path))
    report = torch.load(tmp_path / "report.pt")
    assert report["modules"] == []  # no compiler, no torchao, no transformers
    for name, (args, kwargs) in calls.items():
        assert "lean form" in report["explain"][name], report["explain"][name]
        with torch.no_grad():
            expected = _eager(name, manifest)(*args, **kwargs)
        got = report["outputs"][name]
        relative = ((got.double() - expected.double()).norm() / expected.double().norm()).item()
        assert relative < 0.03, (name, relative)  # bfloat16 arithmetic fused differently, the same quantized weights
    assert report["generate"] == {"streamed": True, "shape": [2, 10], "seeded": True, "seeds_differ": True, "gpt2": [1, 6]}, report["generate"]
    assert not (tmp_path / "compiler-used").exists()


def test_the_wheel_ships_the_quantized_weights_alone_and_records_their_accuracy(wheel: Path, manifest: dict) -> None:
    """No float copy of a quantized layer's weight; the weights file smaller than
    bfloat16 ones would be (int4 smaller than int8); each call's figures and the
    token agreement recorded for the decoders."""
    sizes = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in [name for name, *_ in MODELS_BUILT] + list(ENCODERS):
            entry = manifest["models"][name]
            record, specs = entry["quantization"], entry["weights"]["specs"]
            int4_layers = [layer for layer in record["layers"] if record["scheme"] == "int4-weight-only" and layer not in record.get("int8", {})]
            owner = {member: f"{group}.fused" for group, members in record.get("shared_input", {}).items() for member in members}
            assert not any(f"{layer}.weight" in specs for layer in record["layers"]), name
            in_bfloat16 = quantized = 0
            for layer in dict.fromkeys(owner.get(layer, layer) for layer in record["layers"]):  # a set sharing an input: one weight
                suffix = "weight_int4" if layer in int4_layers or (layer.endswith(".fused") and record["scheme"] == "int4-weight-only") else "weight_int8"
                assert specs[f"{layer}.{suffix}"]["dtype"] in ("int8", "uint8"), (name, layer)
                if suffix == "weight_int4" or record["scheme"] != "int4-weight-only":  # the share of the scheme's own layers
                    shape = specs[f"{layer}.{suffix}"]["shape"]
                    in_bfloat16 += 2 * shape[0] * shape[1] * (2 if suffix == "weight_int4" else 1)
                    quantized += math.prod(shape)
            sizes[name] = quantized / in_bfloat16
            assert record["left"] == {}, record
            for artifact in entry["artifacts"]:
                if entry["state"]:  # each call of the build's check, against float32
                    agreement = artifact["accuracy"]["token_agreement"]
                    assert 0 < agreement["agreed"] <= agreement["positions"] and artifact["accuracy"]["calls"], artifact["accuracy"]
            assert archive.getinfo(f"lowbit/_precompiled/{entry['weights']['file']}").file_size > quantized
    assert manifest["models"]["decoder_int4"]["quantization"]["group_size"] == 32
    assert manifest["models"]["decoder_int8_dynamic"]["quantization"]["smoothed_on"] == 5  # the example inputs and its 4 steps
    for name in ENCODERS:  # each block's gate and up, as one layer
        assert manifest["models"][name]["quantization"]["shared_input"] == {f"blocks.{b}.gate__up": [f"blocks.{b}.gate", f"blocks.{b}.up"] for b in (0, 1)}
    assert all("shared_input" not in manifest["models"][name]["quantization"] for name, *_ in MODELS_BUILT)  # no two layers there share an input
    for artifact in manifest["models"]["decoder_int8_dynamic"]["artifacts"]:  # explain() warns where it runs without VNNI and the check had it
        assert "vnni" in artifact["accuracy"] and artifact["accuracy"]["precision"]["outputs"], artifact["accuracy"]
    int4_outputs = {name: manifest["models"][name]["quantization"].get("int8") for name, *_ in MODELS_BUILT if name.endswith("int4")}
    assert any(int4_outputs.values()), int4_outputs  # a decoder's output layer stays int8, as llama.cpp keeps it
    assert all(share == 0.5 for name, share in sizes.items() if name.endswith(("int8", "int8_dynamic"))), sizes  # a byte for bfloat16's two
    assert all(share == 0.25 for name, share in sizes.items() if name.endswith("int4")), sizes  # half a byte


def test_inspect_shows_each_models_state_precision_and_quantized_layers(wheel: Path) -> None:
    shown = subprocess.run([sys.executable, "-m", "hatch_precompile", "inspect", str(wheel)], capture_output=True, text=True, check=True).stdout
    assert "decoder_int4: int4 weights (group size 32), bfloat16 activations; 9 linear layers quantized" in shown, shown
    assert "encoder_int8: int8 weights, bfloat16 activations; 6 linear layers quantized (2 sets taking one input, each multiplied as one)" in shown, shown
    assert "decoder_int8_dynamic: int8 weights, their inputs rounded to int8 at each call, bfloat16 between them; 9 linear layers quantized" in shown, shown
    assert "state: layers.0.k_cache (4x4x64x16 bfloat16), layers.0.v_cache (4x4x64x16 bfloat16)" in shown, shown
    as_json = json.loads(subprocess.run([sys.executable, "-m", "hatch_precompile", "inspect", "--json", str(wheel)], capture_output=True, text=True, check=True).stdout)
    model = as_json["models"]["gpt2_int4"]
    assert model["precision"] == "int4-weight-only" and "model.transformer.h.0.attn.c_attn" in model["quantized_layers"], model
    assert model["state_bytes_per_handle"] > 0 and {s["dtype"] for s in model["state"]} == {"int64", "bfloat16"}, model  # its lengths and its cache
