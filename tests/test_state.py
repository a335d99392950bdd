"""Models with state (tests/stateful/models.py): a decoder with its static KV cache
in buffers, transformers decoders (Llama, Qwen3, GPT-2) through transformers'
export wrapper with a static cache, and a step counter. Built once with the real
hook, installed in a fresh environment without a compiler or transformers, and
run in fresh processes: outputs, state and greedy tokens against eager and
against transformers' own `generate`; per-handle state, threads, reset, and the
bad inputs, with their messages."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch

from conftest import REPO, Venv, build_wheel, deploy, no_compiler_env, on_a_release_leg, write_project

pytestmark = [pytest.mark.e2e, pytest.mark.standalone]

MODELS = (REPO / "tests" / "stateful" / "models.py").read_text()
LM_DIMS = 'dims = { seq = { min = 1, max = 48, axes = ["input_ids:1", "cache_position:0"] } }'
# A release leg (another torch) runs only the release-marked tests: it builds our
# decoder and Llama (transformers' static-cache wrapper, captured strictly where
# the non-strict capture fails); Qwen3 (Llama's layout with q/k norms), GPT-2
# (learned positions, Conv1D) and the counter are checked on the default release.
ON_A_LEG = on_a_release_leg()
LMS = ("llama",) if ON_A_LEG else ("llama", "qwen3", "gpt2")
# The decoder and Llama run in the C++ form (the release legs cover it), the others in the lean form.
CPP_FORM = "cpp-form = true"
COUNTER = """
[models.counter]
factory = "statepkg.models:counter"
inputs = [{ shape = ["batch", 8] }]
dims = { batch = { min = 1, max = 8 } }
"""
PROJECT = (
    """
[models.decoder]
factory = "statepkg.models:decoder"
example-inputs = "statepkg.models:prompt"
example-steps = "statepkg.models:steps"
dims = { batch = { min = 1, max = 4, axes = ["0:0"] }, seq = { min = 1, max = 64, axes = ["0:1", "1:0"] } }
cpp-form = true
"""
    + ("" if ON_A_LEG else COUNTER)
    + "".join(
        f"""
[models.{name}]
factory = "statepkg.models:{name}"
example-inputs = "statepkg.models:lm_prompt"
example-steps = "statepkg.models:lm_steps"
{LM_DIMS}
{CPP_FORM if name == "llama" else ""}
"""
        for name in LMS
    )
)


@pytest.fixture(scope="module")
def state_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = write_project(tmp_path_factory.mktemp("state"), "statepkg", MODELS, PROJECT.replace("[models.", "[tool.hatch.build.hooks.precompile.models."))
    return build_wheel(project)


@pytest.fixture(scope="module")
def state_venv(tmp_path_factory: pytest.TempPathFactory, state_wheel: Path) -> Venv:
    """The wheel and what it requires (torch, safetensors): no transformers, no compiler."""
    env = deploy(state_wheel, tmp_path_factory.mktemp("state-deploy") / "venv")
    assert env.script("import importlib.util; print(importlib.util.find_spec('transformers'))").stdout.strip() == "None"
    return env


def _run(venv: Venv, tmp_path: Path, code: str) -> dict:
    """Run `code` without a compiler; it prints one JSON line, returned."""
    done = venv.script(code, env=no_compiler_env(tmp_path))
    assert not (tmp_path / "compiler-used").exists()
    return json.loads(done.stdout.strip().splitlines()[-1])


# Greedy tokens from the compiled decoder and from the eager module, for prompts of
# several lengths and batch sizes, and the state after them against eager's buffers;
# and the transformers decoders' tokens, compared in the test with transformers' own.
DECODER_RUNS = ((1, 3, 20), (2, 7, 12), (4, 30, 9))  # batch, prompt length, new tokens
LM_PROMPTS, LM_NEW = (2, 9, 20), 12
GENERATE = f"""
import json, sys, torch
from statepkg import load_compiled
from statepkg.models import VOCAB, decoder
compiled = load_compiled("decoder")
report = {{"explain": {{name: load_compiled.explain(name) for name in ("decoder", *{LMS!r})}}, "decoder": []}}
for batch, length, new in {DECODER_RUNS!r}:
    prompt = torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(length))
    eager = decoder()
    with torch.no_grad():
        logits, tokens = eager(prompt, torch.arange(length)), []
        for position in range(length, length + new):
            tokens.append(logits[:, -1].argmax(-1))
            logits = eager(tokens[-1][:, None], torch.tensor([position]))
    ours = compiled.generate(prompt, new)
    compiled(ours[:, -1:], torch.tensor([length + new - 1]))  # eager's loop fed the last token too
    buffers = dict(eager.named_buffers())
    worst = max((compiled.state[n] - buffers[n]).abs().max().item() for n in compiled.state)
    report["decoder"].append({{"equal": torch.equal(ours, torch.stack(tokens, 1)), "shape": list(ours.shape), "state": worst, "prompt": prompt.tolist(), "tokens": ours.tolist()}})
for name in {LMS!r}:
    model = load_compiled(name)
    report[name] = {{}}
    for length in {LM_PROMPTS!r}:
        prompt = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(length))
        report[name][str(length)] = model.generate(prompt, {LM_NEW}).tolist()
report["modules"] = sorted(m for m in ("torch._inductor", "torch._dynamo", "transformers") if m in sys.modules)
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def generated(state_venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What the installed wheel generated, in one fresh process without a compiler."""
    return _run(state_venv, tmp_path_factory.mktemp("generate"), GENERATE)


@pytest.mark.release
def test_the_decoder_generates_eagers_tokens_from_the_wheel(generated: dict) -> None:
    assert generated["modules"] == []  # no compiler, and no transformers: the wheel needs neither
    assert "(C++ form)" in generated["explain"]["decoder"], generated["explain"]
    assert "(C++ form)" in generated["explain"]["llama"], generated["explain"]
    assert all("(lean form)" in generated["explain"][name] for name in LMS if name != "llama"), generated["explain"]
    for run, (batch, _, new) in zip(generated["decoder"], DECODER_RUNS):
        assert run["equal"] and run["shape"] == [batch, new], generated["decoder"]
        assert run["state"] < 1e-4, generated["decoder"]  # the cache holds eager's keys and values


# The same generation on NumPy arrays (`arrays="numpy"`), in a process that never
# imports torch: greedy tokens equal the torch path's, seeded sampling repeats,
# stop tokens and streaming, per-handle state with reset, threads.
NUMPY = """
import json, sys, threading
import numpy as np
from statepkg import load_compiled
given = json.loads(GIVEN)  # the prompts of GENERATE, and how many tokens each
report = {"decoder": [], "explain": load_compiled.explain("decoder").splitlines()[-1]}
for prompt, new in given["decoder"]:
    report["decoder"].append(load_compiled("decoder", arrays="numpy").generate(np.array(prompt), new).tolist())
report["llama"] = {length: load_compiled("llama", arrays="numpy").generate(np.array(prompt), given["lm_new"]).tolist() for length, prompt in given["llama"].items()}
model, prompt = load_compiled("decoder", arrays="numpy"), np.array(given["decoder"][1][0], dtype=np.int64)
greedy = model.generate(prompt, 8)
sampled = [model.generate(prompt, 8, do_sample=True, temperature=0.8, top_k=40, top_p=0.9, seed=seed).tolist() for seed in (3, 3, 4)]
report["sampled"] = [sampled[0] == sampled[1], sampled[0] != sampled[2], bool(np.array(sampled).min() >= 0)]
stop = int(greedy[0, 2])
stopped = model.generate(prompt[:1], 8, stop_tokens=[stop])
report["stopped"] = [stopped.shape[1], int(stopped[0, -1]) == stop]
report["stream"] = bool(np.array_equal(np.stack(list(model.stream(prompt, 8)), axis=1), greedy))
other = load_compiled("decoder", arrays="numpy")
model(prompt, np.arange(prompt.shape[1]))
report["own state"] = [any(bool(s.any()) for s in model.state.values()), all(not s.any() for s in other.state.values())]
model.reset()
report["reset"] = all(not s.any() for s in model.state.values())
alone = [load_compiled("decoder", arrays="numpy").generate(prompt[i : i + 1], 10) for i in range(2)]
results = {}
def work(i):
    handle = load_compiled("decoder", arrays="numpy")
    results[i] = [handle.generate(prompt[i : i + 1], 10) for _ in range(3)]
threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
report["threads"] = all(np.array_equal(r, alone[i]) for i in range(2) for r in results[i])
report["torch imported"] = "torch" in sys.modules
print(json.dumps(report))
"""


@pytest.mark.release
def test_decoders_generate_the_torch_paths_tokens_on_numpy_arrays_without_torch(generated: dict, state_venv: Venv, tmp_path: Path) -> None:
    state_venv.pip("numpy")
    given = {
        "decoder": [[run["prompt"], new] for run, (_, _, new) in zip(generated["decoder"], DECODER_RUNS)],
        "llama": {str(length): torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(length)).tolist() for length in LM_PROMPTS},
        "lm_new": LM_NEW,
    }
    report = _run(state_venv, tmp_path, NUMPY.replace("GIVEN", repr(json.dumps(given))))
    assert report["decoder"] == [run["tokens"] for run in generated["decoder"]]
    assert report["llama"] == generated["llama"]
    assert report["explain"].startswith("  without torch (arrays='numpy'): yes, would load decoder/cpu_avx2_cpp.so (C++ form)"), report["explain"]
    assert report["sampled"] == [True, True, True]
    assert report["stopped"][1] and report["stopped"][0] <= 3
    assert report["stream"] and report["own state"] == [True, True] and report["reset"] and report["threads"]
    assert report["torch imported"] is False


# Two handles: separate caches, reset, a new handle from load_compiled, and two threads
# each generating with its own handle.
HANDLES = """
import json, threading, torch
from statepkg import load_compiled
from statepkg.models import VOCAB
first, second = load_compiled("decoder"), load_compiled("decoder")
prompt = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
first(prompt, torch.arange(6))
report = {
    "distinct": first is not second,
    "second_untouched": all(bool((t == 0).all()) for t in second.state.values()),
    "first_written": any(bool((t != 0).any()) for t in first.state.values()),
}
first.reset()
report["reset"] = all(bool((t == 0).all()) for t in first.state.values())
alone = {i: load_compiled("decoder").generate(prompt[i : i + 1], 15) for i in range(2)}
results = {}
def work(i):
    model = load_compiled("decoder")
    for _ in range(3):
        results.setdefault(i, []).append(model.generate(prompt[i : i + 1], 15))
threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
for t in threads: t.start()
for t in threads: t.join()
report["threads"] = all(torch.equal(r, alone[i]) for i in range(2) for r in results[i])
report["threads_differ"] = not torch.equal(alone[0], alone[1])
print(json.dumps(report))
"""


def test_each_handle_has_its_own_state_reset_and_threads(state_venv: Venv, tmp_path: Path) -> None:
    report = _run(state_venv, tmp_path, HANDLES)
    assert report == {"distinct": True, "second_untouched": True, "first_written": True, "reset": True, "threads": True, "threads_differ": True}, report


COUNTER = """
import json, torch
from statepkg import load_compiled
from statepkg.models import counter
compiled, eager = load_compiled("counter"), counter()
worst = 0.0
for batch in (3, 1, 8, 2):
    x = torch.randn(batch, 8, generator=torch.Generator().manual_seed(batch))
    with torch.no_grad():
        worst = max(worst, (compiled(x) - eager(x)).abs().max().item())
print(json.dumps({"worst": worst, "calls": int(compiled.state["calls"]), "total": (compiled.state["total"] - eager.total).abs().max().item()}))
"""


def test_a_counter_and_a_running_sum_match_eager(state_venv: Venv, tmp_path: Path) -> None:
    report = _run(state_venv, tmp_path, COUNTER)
    assert report["calls"] == 4 and report["worst"] < 1e-5 and report["total"] < 1e-5, report


# Positions past the cache, a batch larger than it: errors naming the model, the
# input and the limit; the process and the other positions of the cache survive.
BAD = """
import json, torch
from statepkg import load_compiled
decoder = load_compiled("decoder")
report = {}
def attempt(name, call):
    try:
        call()
        report[name] = "no error"
    except (IndexError, ValueError) as error:
        report[name] = f"{type(error).__name__}: {error}"
decoder(torch.ones(1, 4, dtype=torch.long), torch.arange(4))
kept = {n: t.clone() for n, t in decoder.state.items()}
attempt("past", lambda: decoder(torch.ones(1, 1, dtype=torch.long), torch.tensor([64])))
attempt("batch", lambda: decoder(torch.ones(5, 1, dtype=torch.long), torch.tensor([4])))
attempt("token", lambda: decoder(torch.full((1, 1), 256), torch.tensor([4])))
report["kept"] = all(torch.equal(kept[n], t) for n, t in decoder.state.items())
attempt("budget", lambda: decoder.generate(torch.ones(1, 60, dtype=torch.long), 10))
report["alive"] = decoder.generate(torch.ones(1, 3, dtype=torch.long), 2).shape[1]
attempt("lm_past", lambda: load_compiled("llama")(input_ids=torch.ones(1, 2, dtype=torch.long), cache_position=torch.tensor([47, 48])))
print(json.dumps(report))
"""


def test_positions_past_the_cache_and_too_large_a_batch_say_so(state_venv: Venv, tmp_path: Path) -> None:
    report = _run(state_venv, tmp_path, BAD)
    past = "IndexError: model 'decoder', input cache_position: holds 64..64, but the model indexes a size of 64 with it, so its values must be in [0, 63]"
    assert report["past"].startswith(past), report["past"]
    assert report["batch"] == "ValueError: model 'decoder', input input_ids: dim 'batch' (dim 0) must be in [1, 4], got 5", report["batch"]
    assert report["budget"] == "ValueError: the prompt's 60 tokens and 10 new ones need 69 positions of the cache, which holds 64; ask for at most 5 new tokens", report["budget"]
    assert report["alive"] == 2
    assert report["token"].startswith("IndexError: model 'decoder', input input_ids: holds 256..256, but the model indexes a size of 256"), report
    assert report["lm_past"].startswith("IndexError: model 'llama', input cache_position: holds 47..48, but the model indexes a size of 48"), report
    assert report["kept"], report  # a refused call writes nothing


def _transformers_tokens(name: str, prompt: torch.Tensor, new: int) -> list[list[int]]:
    """transformers' own greedy `generate` with a static cache, on the same weights."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("state_models", REPO / "tests" / "stateful" / "models.py")
    assert spec is not None and spec.loader is not None
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    lm = getattr(models, f"{name}_lm")().eval()
    lm.generation_config.eos_token_id = None  # every token counts, as in the compiled loop
    with torch.no_grad():
        out = lm.generate(prompt, max_new_tokens=new, do_sample=False, cache_implementation="static", pad_token_id=0)
    return out[:, prompt.shape[1] :].tolist()


@pytest.mark.release
def test_transformers_decoders_generate_transformers_tokens(generated: dict, state_wheel: Path) -> None:
    for name in LMS:
        assert ("(C++ form)" if name == "llama" else "(lean form)") in generated["explain"][name], generated["explain"]
        prompts = {length: torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(length)) for length in LM_PROMPTS}
        expected = {str(length): _transformers_tokens(name, prompt, LM_NEW) for length, prompt in prompts.items()}
        assert generated[name] == expected, name
    with zipfile.ZipFile(state_wheel) as archive:
        llama = json.loads(archive.read("statepkg/_precompiled/manifest.json"))["models"]["llama"]
        weights = archive.read(f"statepkg/_precompiled/{llama['weights']['file']}")
    assert llama["state"] == ["cumulative_length_0", "cumulative_length_1", "key_cache_0", "value_cache_0", "key_cache_1", "value_cache_1"]
    # The state starts as zeros, so the loader makes it: the weights file holds none of it.
    assert llama["weights"]["zeros"] == llama["state"]
    stored = json.loads(weights[8 : 8 + int.from_bytes(weights[:8], "little")])
    assert not set(stored) & set(llama["state"]) and "model.model.embed_tokens.weight" in stored, sorted(stored)


# docs/battery.md's section on models with state, from what this module found.
DOCS = REPO / "docs" / "battery.md"
ROWS = {
    "decoder": ("A decoder with its KV cache in buffers, written through the batch rows (`k_cache[:b].index_copy_`)", "its eager module's greedy loop"),
    "llama": ("LlamaForCausalLM through `TorchExportableModuleForDecoderOnlyLM` (static cache)", "transformers' `generate` (static cache)"),
    "qwen3": ("Qwen3ForCausalLM (q/k norms) through the same wrapper", "transformers' `generate` (static cache)"),
    "gpt2": ("GPT2LMHeadModel (learned positions, Conv1D) through the same wrapper", "transformers' `generate` (static cache)"),
}


def test_the_battery_docs_show_the_models_with_state(generated: dict) -> None:
    """HATCH_PRECOMPILE_UPDATE_DOCS=1 rewrites the section."""
    import os

    lines = ["| model | architecture | form | tokens against | prompts: batch x length +new tokens | result |", "|---|---|---|---|---|---|"]
    for name, (what, against) in ROWS.items():
        form = next(form for form in ("C++", "lean", "artifact") if f"({form} form" in generated["explain"][name])
        if name == "decoder":
            prompts = "; ".join(f"{b}x{length} +{new}" for b, length, new in DECODER_RUNS)
            equal = all(run["equal"] for run in generated["decoder"])
        else:
            prompts = "; ".join(f"1x{length} +{LM_NEW}" for length in LM_PROMPTS)
            equal = generated[name] == {str(length): _transformers_tokens(name, torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(length)), LM_NEW) for length in LM_PROMPTS}
        lines.append(f"| {name} | {what} | {form} | {against} | {prompts} | {'every token equal' if equal else 'tokens differ'} |")
    table = "\n".join(lines) + "\n"
    text = DOCS.read_text(encoding="utf-8")
    begin = text.index("-->\n", text.index("<!-- generated by tests/test_state.py")) + len("-->\n")
    end = text.index("<!-- end of the models with state -->")
    if os.environ.get("HATCH_PRECOMPILE_UPDATE_DOCS"):
        DOCS.write_text(text[:begin] + table + text[end:], encoding="utf-8")
    assert text[begin:end] == table, "docs/battery.md's models with state drifted: rerun with HATCH_PRECOMPILE_UPDATE_DOCS=1"
