"""A BertModel with all-MiniLM-L6-v2's shape: 6 layers, 384 wide, 12 heads, 1536
intermediate, its 30522-token vocabulary; random weights with a fixed seed."""

import torch
from transformers import BertConfig, BertModel


def minilm() -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=512,
    )
    return BertModel(config).eval()
