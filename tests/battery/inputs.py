"""A battery model's inputs at given dim sizes, made as its declaration says, and
the tensors of its outputs.

Imported by the processes that run the installed battery wheels (the test's
comparison with eager and `benchmarks/battery_forms.py`), which put this folder
on their path: torch alone, no test machinery.
"""

from __future__ import annotations

from typing import Any

import torch


def make(spec: dict[str, Any], size: dict[str, int], generator: torch.Generator) -> torch.Tensor:
    """One input: a declared shape (dims named), dtype and integer range."""
    shape = [size[s] if isinstance(s, str) else s for s in spec["shape"]]
    dtype = getattr(torch, spec.get("dtype", "float32"))
    if dtype == torch.bool:  # a padding mask: True hides a position; the first stays visible
        mask = torch.rand(shape, generator=generator) < 0.3
        mask[:, 0] = False
        return mask
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    low, high = spec.get("range", [0, 2])
    values = torch.randint(low, high, shape, generator=generator, dtype=dtype)
    if high == 2:  # an attention mask: 1 attends; the first position always does
        values[:, 0] = 1
    return values


def leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of an output, in order: through dicts (and output classes), tuples and lists."""
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "items"):
        return [leaf for _, item in value.items() for leaf in leaves(item)]
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in leaves(item)]
    return []
