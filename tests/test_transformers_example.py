"""The transformers example: a BERT encoder built from a small config, compiled with
input_ids and attention_mask and a dynamic batch, a GPT-2 decoder with a
dynamic batch and sequence length, and a Llama decoder with a static cache that
generates transformers' tokens, through `python -m build` with
build isolation (transformers reaches the build environment through hatchling's
require-runtime-dependencies), installed in a fresh environment and compared
with the eager model in a fresh process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO, isolated_build, make_venv, no_compiler_env, pin_build_torch, with_find_links

pytestmark = [pytest.mark.e2e, pytest.mark.standalone]  # a project of its own: nothing of the session's but the plugin's wheel

# BERT at several batch sizes, GPT-2 at several batch sizes and sequence lengths
# (both dynamic), and the Llama decoder generating transformers' own greedy tokens
# (static cache) for prompts of several lengths: one fresh process, which imports
# torch and transformers once.
COMPARE = """
import json, torch
from example_bert import load_compiled
from example_bert.model import build_bert, build_gpt2, build_llama_lm
bert, eager = load_compiled("bert"), build_bert()
encoder = {}
for batch in (1, 5, 16):
    generator = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, 1000, (batch, 32), generator=generator)
    mask = (torch.rand(batch, 32, generator=generator) > 0.2).long()
    out = bert(ids, attention_mask=mask)
    with torch.no_grad():
        ref = eager(input_ids=ids, attention_mask=mask)
    assert type(out) is type(ref), (type(out), type(ref))
    for key in ("last_hidden_state", "pooler_output"):
        torch.testing.assert_close(out[key], ref[key], rtol=1e-4, atol=1e-5)
    encoder[batch] = [type(out).__name__, list(out.last_hidden_state.shape), list(out.pooler_output.shape)]
encoder["loaded"] = repr(bert)

gpt2, eager = load_compiled("gpt2"), build_gpt2()
decoder = {"loaded": repr(gpt2)}
for batch, sequence in ((1, 4), (3, 17), (8, 96)):
    ids = torch.randint(0, 1000, (batch, sequence), generator=torch.Generator().manual_seed(sequence))
    out = gpt2(ids)
    with torch.no_grad():
        ref = eager(ids)
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-5)
    decoder[f"{batch}x{sequence}"] = [type(out).__name__, list(out.logits.shape)]

llama, lm = load_compiled("llama"), build_llama_lm()
lm.generation_config.eos_token_id = None
generated = {"loaded": repr(llama), "equal": []}
for length in (1, 12, 60):
    prompt = torch.randint(0, 1000, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        expected = lm.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)[:, length:]
    generated["equal"].append(torch.equal(llama.generate(prompt, 20), expected))
print(json.dumps({"encoder": encoder, "decoder": decoder, "generated": generated}))
"""

# outputs="plain": a dict with the same contents, and transformers is never imported.
PLAIN = """
import json, sys, torch
from example_bert import load_compiled
bert = load_compiled("bert", outputs="plain")
out = bert(torch.zeros(2, 32, dtype=torch.long), attention_mask=torch.ones(2, 32, dtype=torch.long))
print(json.dumps([type(out).__name__, sorted(out), "transformers" in sys.modules, "torch._inductor" in sys.modules]))
"""


def test_bert_and_gpt2_from_transformers_round_trip(wheelhouse: Path, tmp_path: Path) -> None:
    project = tmp_path / "example_transformers"
    shutil.copytree(REPO / "example_transformers", project, ignore=shutil.ignore_patterns("dist", "__pycache__"))
    pin_build_torch(project / "pyproject.toml")
    # One worker for the three models (conftest's write_project says why), as the user's `jobs` would.
    isolated_build("--wheel", str(project), env={**with_find_links(wheelhouse), "HATCH_PRECOMPILE_JOBS": "1"})
    (wheel,) = (project / "dist").glob("*.whl")
    env = make_venv(tmp_path / "venv")
    env.pip(str(wheel))
    found = json.loads(env.script(COMPARE, env=no_compiler_env(tmp_path)).stdout)
    report = found["encoder"]
    assert report.pop("loaded") == "<compiled model 'bert' from bert/cpu_avx2_cpp.so>"  # its C++ form: kwargs, output classes, plain outputs
    name = "BaseModelOutputWithPoolingAndCrossAttentions"
    assert report == {str(b): [name, [b, 32, 64], [b, 64]] for b in (1, 5, 16)}
    decoder = found["decoder"]
    assert decoder.pop("loaded") == "<compiled model 'gpt2' from gpt2/cpu_avx2.py>"
    assert decoder == {f"{b}x{s}": ["CausalLMOutputWithCrossAttentions", [b, s, 1000]] for b, s in ((1, 4), (3, 17), (8, 96))}
    assert found["generated"] == {"loaded": "<compiled model 'llama' from llama/cpu_avx2.py>", "equal": [True, True, True]}
    plain = json.loads(env.script(PLAIN, env=no_compiler_env(tmp_path)).stdout)
    assert plain == ["dict", ["last_hidden_state", "pooler_output"], False, False]
    assert not (tmp_path / "compiler-used").exists()
