"""The build cache's key: equal for what compiles to the same bytes, different for
anything inductor would compile differently. Real capture of small modules."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from hatch_precompile.engine.config import parse_config
from hatch_precompile.engine.model_config import ModelConfig
from hatch_precompile.engine.targets import CPU_TARGETS
from hatch_precompile.worker.capture import capture
from hatch_precompile.worker.key import artifact_key

AVX2 = CPU_TARGETS["avx2"]


class Scaled(nn.Module):
    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(8, 4)
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.linear(x)) * self.scale


def model(**table: Any) -> ModelConfig:
    raw = {"factory": "made_up:factory", "inputs": [{"shape": ["batch", 8]}], "dims": {"batch": {"min": 1, "max": 16}}, **table}
    return parse_config({"models": {"m": raw}}).models["m"]


def key(module: nn.Module, table: dict[str, Any] | None = None, fixed: dict[str, int] | None = None, target=AVX2) -> str:
    m = model(**(table or {}))
    return artifact_key(m, capture(m, module.eval(), fixed or {}), fixed or {}, target)


def test_the_same_model_captured_twice_has_the_same_key() -> None:
    assert key(Scaled()) == key(Scaled())


def test_weight_values_are_not_in_the_key() -> None:
    other = Scaled()
    with torch.no_grad():
        other.linear.weight.add_(1.0)
    assert key(other) == key(Scaled())


def test_what_changes_the_compiled_code_changes_the_key() -> None:
    base = key(Scaled())
    assert key(Scaled(scale=3.0)) != base  # a constant in the graph
    assert key(Scaled(), {"options": {"max_autotune": False}}) != base
    assert key(Scaled(), {"options": {"epilogue_fusion": False}}) != base
    assert key(Scaled(), {"dims": {"batch": {"min": 1, "max": 32}}}) != base
    assert key(Scaled(), {"dims": {"batch": [4]}}, fixed={"batch": 4}) != base
    assert key(Scaled(), target=CPU_TARGETS["avx512"]) != base
    assert key(Scaled(), target=dataclasses.replace(AVX2, march="x86-64-v2")) != base
    assert key(Scaled(), {"dtype": "bfloat16"}) != base


def test_what_only_the_manifest_records_is_not_in_the_key() -> None:
    assert key(Scaled(), {"outputs": "plain", "weights": "factory", "fallback": "error"}) == key(Scaled())
