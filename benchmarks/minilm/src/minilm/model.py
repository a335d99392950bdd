"""A BertModel with all-MiniLM-L6-v2's shape: 6 layers, 384 wide, 12 heads, 1536
intermediate, its 30522-token vocabulary; random weights with a fixed seed. And
the batches its int8 build calibrates on."""

import torch
from transformers import BertConfig, BertModel


def minilm() -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=512,
    )
    return BertModel(config).eval()


def calibration_batches():
    """Four batches of 8 x 128 token ids with padding masks, like the benchmark's call."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):
        ids = torch.randint(0, 30522, (8, 128), generator=generator)
        lengths = torch.randint(16, 129, (8, 1), generator=generator)
        yield (ids,), {"attention_mask": (torch.arange(128) < lengths).long()}
