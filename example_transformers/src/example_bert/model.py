"""A BERT-style encoder from transformers, from a small config with fixed weights."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel

CONFIG = BertConfig(
    vocab_size=1000,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=64,
)


def build_bert() -> BertModel:
    """Weights from seed 0, so every build and test sees the same model."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return BertModel(CONFIG).eval()
