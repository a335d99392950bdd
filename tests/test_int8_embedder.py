"""int8 for a sentence embedder as people write one: a BertModel checkpoint
loaded with `from_pretrained` (the test writes it: the width of
all-MiniLM-L6-v2, two of its layers, random weights, a small WordPiece vocabulary), mean pooling
over the attention mask and an L2 norm, a dict output. BERT's pooler is computed
and never used, which made torchao's quantizer fail; the batch (1-32) and the
sequence length (8-128) are dynamic, and the calibration is tokenized sentences
of several lengths, as docs/configuration.md#int8 shows. Built by the real hook,
loaded lean in a fresh environment with neither torchao nor a compiler, and held
to int8's default bounds against float32 eager at each dim's min, max and a size
between."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from conftest import Venv, build_wheel, deploy, no_compiler_env, write_project

pytestmark = [pytest.mark.e2e, pytest.mark.standalone]

MODELS = '''
from pathlib import Path

import torch
from torch import nn

# The checkpoint and its vocabulary sit in the project, beside src/, so the wheel does not ship them.
CHECKPOINT = Path(__file__).resolve().parents[2] / "checkpoint"

SENTENCES = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog near the river bank.",
    "Compiled models start fast.",
    "Search results are ranked by how close each document is to the question that was asked.",
    "Rain is expected tomorrow.",
    "The train to the city leaves at eight in the morning and returns late at night after the concert.",
    "Open the door.",
    "Every wheel carries its own compiled kernels, so nothing is compiled on the machine that installs it, "
    "and the model starts as fast as the library that runs it can be imported.",
    "Is the shop open on Sunday?",
    "The river flows to the sea.",
    "She asked the question again, more slowly this time.",
    "Numbers that are silently wrong are worse than no numbers at all.",
]


def words() -> list[str]:
    """The vocabulary: BERT's special tokens, every word of SENTENCES, the letters as pieces."""
    found = sorted({w.strip(".,?").lower() for s in SENTENCES for w in s.split()} | set(".,?"))
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *found, *letters, *(f"##{c}" for c in letters)]


class SentenceEmbedder(nn.Module):
    """sentence-transformers' recipe: the mean of the last hidden states over the
    real tokens, L2-normalised. BertModel's pooler runs too, and is never used."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return {"embedding": nn.functional.normalize(mean, dim=-1)}


def embedder():
    from transformers import BertModel

    return SentenceEmbedder(BertModel.from_pretrained(CHECKPOINT)).eval()


def tokenizer():
    from transformers import BertTokenizerFast

    return BertTokenizerFast(vocab_file=str(CHECKPOINT / "vocab.txt"))


def calibration():
    """Batches of four sentences, padded to the longest (a multiple of 8, so at least the 8 declared)."""
    tokenize = tokenizer()
    for start in range(0, len(SENTENCES), 4):
        batch = tokenize(SENTENCES[start : start + 4], padding=True, pad_to_multiple_of=8, return_tensors="pt")
        yield (batch["input_ids"],), {"attention_mask": batch["attention_mask"]}
'''

PROJECT = """
[tool.hatch.build.hooks.precompile.models.embedder]
factory = "embedpkg.models:embedder"
inputs = [{ shape = ["batch", "seq"], dtype = "int64", range = [0, 160] }]
kwargs = { attention_mask = { shape = ["batch", "seq"], dtype = "int64", range = [1, 2] } }
dims = { batch = { min = 1, max = 32 }, seq = { min = 8, max = 128 } }
quantize = "int8"
calibration = "embedpkg.models:calibration"
outputs = "plain"
"""

SIZES = [(1, 8), (5, 37), (32, 128)]  # (batch, seq): each dim's min, a size between, its max


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project, with the checkpoint its factory loads: BertModel (pooler
    included) the width of all-MiniLM-L6-v2, as `save_pretrained` writes it."""
    import torch
    from transformers import BertConfig, BertModel

    root = write_project(tmp_path_factory.mktemp("embedder"), "embedpkg", MODELS, PROJECT)
    vocabulary = _models(root).words()
    assert len(vocabulary) <= 160  # the embedding's rows, the declared range of the token ids
    config = BertConfig(  # two of its six layers: the same kernels, a third of the compile
        vocab_size=160, hidden_size=384, num_hidden_layers=2, num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(root / "checkpoint")
    (root / "checkpoint" / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    return root


@pytest.fixture(scope="module")
def embedder_venv(tmp_path_factory: pytest.TempPathFactory, project: Path) -> Venv:
    """The wheel and what its metadata requires: torch and safetensors, no torchao, no transformers."""
    return deploy(build_wheel(project), tmp_path_factory.mktemp("embedder-deploy") / "venv")


CALL = """
import json, sys
import torch
from embedpkg import load_compiled

data = torch.load(sys.argv[1], weights_only=True)
embedder = load_compiled("embedder")
report = {"loaded": repr(embedder), "sizes": []}
for ids, mask, want in zip(data["ids"], data["masks"], data["embeddings"]):
    got = embedder(ids, attention_mask=mask)["embedding"]
    g, w = got.double().flatten(), want.double().flatten()
    report["sizes"].append({
        "size": list(ids.shape),
        "relative_error": ((g - w).norm() / w.norm()).item(),
        "cosine": torch.nn.functional.cosine_similarity(g, w, dim=0).item(),
        "worst_sentence_cosine": torch.nn.functional.cosine_similarity(got.double(), want.double(), dim=1).min().item(),
    })
report["compiler_modules"] = sorted(m for m in sys.modules if m.startswith(("torch._inductor", "torch._dynamo", "torchao", "transformers")))
print(json.dumps(report))
"""


def _models(project: Path) -> ModuleType:
    """The project's models.py, imported from where the build reads it (so it finds the checkpoint)."""
    spec = importlib.util.spec_from_file_location("embedpkg_models", project / "src" / "embedpkg" / "models.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tokenized(project: Path, batch: int, seq: int) -> tuple:
    """`batch` texts of the project's sentences, cut or padded to `seq` tokens, of different lengths."""
    import torch

    models = _models(project)
    text = " ".join(models.SENTENCES)
    tokens = models.tokenizer()(text, add_special_tokens=False)["input_ids"]
    ids = torch.zeros(batch, seq, dtype=torch.int64)
    mask = torch.zeros(batch, seq, dtype=torch.int64)
    for row in range(batch):
        length = seq if row == 0 else max(3, seq - (row * 7) % seq)  # the longest fills the batch, as padding makes it
        start = (row * 11) % (len(tokens) - seq)
        ids[row, :length] = torch.tensor([2, *tokens[start : start + length - 2], 3])  # [CLS] ... [SEP]
        mask[row, :length] = 1
    return ids, mask


def test_the_embedder_builds_and_holds_int8s_bounds_over_its_dynamic_batch_and_sequence(project: Path, embedder_venv: Venv, tmp_path: Path) -> None:
    import torch

    eager = _models(project).embedder()
    data: dict = {"ids": [], "masks": [], "embeddings": []}
    for batch, seq in SIZES:
        ids, mask = _tokenized(project, batch, seq)
        with torch.no_grad():
            data["embeddings"].append(eager(ids, mask)["embedding"])
        data["ids"].append(ids)
        data["masks"].append(mask)
    torch.save(data, tmp_path / "data.pt")
    result = embedder_venv.script(CALL.replace("sys.argv[1]", repr(str(tmp_path / "data.pt"))), env=no_compiler_env(tmp_path))
    report = json.loads(result.stdout)
    print(json.dumps(report["sizes"]))  # shown by pytest -s, or on a failure
    assert report["loaded"].endswith(".py>"), report  # the lean form
    assert [entry["size"] for entry in report["sizes"]] == [list(size) for size in SIZES]
    for entry in report["sizes"]:  # int8's default bounds (accuracy.py), and each sentence's embedding close
        assert entry["relative_error"] <= 0.1 and entry["cosine"] >= 0.99 and entry["worst_sentence_cosine"] >= 0.98, report
    assert report["compiler_modules"] == []
    assert not (tmp_path / "compiler-used").exists()
