"""A small transformer text encoder: token ids [batch, 64] -> one vector per input."""

from __future__ import annotations

import torch
from torch import nn

VOCAB_SIZE = 1000
SEQUENCE_LENGTH = 64
WIDTH = 64
HEADS = 4
LAYERS = 2


class EncoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)
        self.mlp_norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, length, HEADS, WIDTH // HEADS).transpose(1, 2) for t in (q, k, v))
        attended = torch.softmax(q @ k.transpose(-2, -1) / (WIDTH // HEADS) ** 0.5, dim=-1) @ v
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, WIDTH))
        return x + self.mlp(self.mlp_norm(x))


class TextEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB_SIZE, WIDTH)
        self.positions = nn.Parameter(torch.randn(SEQUENCE_LENGTH, WIDTH) * 0.02)
        self.layers = nn.ModuleList(EncoderLayer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.tokens(input_ids) + self.positions
        for layer in self.layers:
            x = layer(x)
        hidden = self.norm(x)
        return {"embedding": nn.functional.normalize(hidden.mean(dim=1), dim=-1), "hidden_states": hidden}


def build_encoder() -> TextEncoder:
    """The encoder with fixed weights (seed 0), so every build and test sees the same model."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return TextEncoder().eval()
