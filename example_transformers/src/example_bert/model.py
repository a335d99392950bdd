"""A BERT-style encoder and a GPT-2 style decoder from transformers, from small
configs with fixed weights."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

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


GPT2_CONFIG = GPT2Config(
    vocab_size=1000,
    n_embd=64,
    n_layer=3,
    n_head=4,
    n_positions=128,
    use_cache=False,  # outputs are the logits only, no key/value cache object
    attn_implementation="sdpa",
)


def build_gpt2() -> GPT2LMHeadModel:
    """A GPT-2 style decoder (causal attention, input and output embeddings tied),
    weights from seed 0."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2_CONFIG).eval()
