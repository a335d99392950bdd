"""A small MLP classifier: features [batch, 32] -> scores for 8 classes."""

from __future__ import annotations

import torch
from torch import nn

FEATURES = 32
HIDDEN = 64
CLASSES = 8


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN),
            nn.GELU(),
            nn.LayerNorm(HIDDEN),
            nn.Linear(HIDDEN, HIDDEN),
            nn.GELU(),
            nn.Linear(HIDDEN, CLASSES),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.layers(features), dim=-1)


def build_mlp() -> MLP:
    """The MLP with fixed weights (seed 0), so every build and test sees the same model."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return MLP().eval()
