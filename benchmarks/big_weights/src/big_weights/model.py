"""MLPs whose load time is their weights: eight square Linear layers with ReLU."""

import torch
from torch import nn


def _mlp(width: int) -> nn.Module:
    torch.manual_seed(0)  # no-op on the meta device, where the benchmark's eager fast path builds it
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).eval()


def mlp_537mb() -> nn.Module:
    return _mlp(4096)


def mlp_2gb() -> nn.Module:
    return _mlp(8192)
