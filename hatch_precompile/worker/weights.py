"""The tensors a compiled graph takes before the user's inputs, and how the wheel ships them.

The compiled graph takes parameters, buffers and constants as call arguments, so
they are stored once per model, as safetensors, whatever the number of artifacts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..engine.model_config import ModelConfig
from ..runtime._layout import WEIGHTS_FILE
from ..runtime._schema import WeightsEntry
from .capture import Captured

_LIFTED_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")


def lifted_weights(captured: Captured) -> dict[str, torch.Tensor]:
    """The parameters, buffers and constants the compiled graph takes before the
    user inputs, by state-dict name, in that order."""
    exported = captured.exported
    return {s.target: _lifted_tensor(exported, s.target) for s in exported.graph_signature.input_specs if s.kind.name in _LIFTED_KINDS}


def save_weights(model: ModelConfig, captured: Captured, out_dir: Path) -> WeightsEntry:
    """Write what the wheel ships of the weights; return the manifest's description:
    every lifted tensor's kind, shape and dtype (the loader checks weights given at
    run time against it). `embed` ships all of them; `factory` only the constants,
    which no module attribute holds."""
    kinds = {s.target: s.kind.name for s in captured.exported.graph_signature.input_specs if s.kind.name in _LIFTED_KINDS}
    tensors = lifted_weights(captured)
    shipped = {n: t for n, t in tensors.items() if model.weights == "embed" or kinds[n] == "CONSTANT_TENSOR"}
    entry: WeightsEntry = {
        "mode": model.weights,
        "order": list(tensors),
        "specs": {n: {"kind": kinds[n], "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for n, t in tensors.items()},
    }
    if shipped:
        from safetensors.torch import save_file

        # Tied weights are lifted once per name but are one tensor: store it once.
        first_name: dict[tuple[Any, ...], str] = {}
        aliases = {}
        for n, t in shipped.items():
            identity = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
            if identity in first_name:
                aliases[n] = first_name[identity]
            else:
                first_name[identity] = n
        # safetensors refuses tensors that share memory (views): store copies.
        unique = {n: t.contiguous().clone() for n, t in shipped.items() if n not in aliases}
        save_file(unique, str(out_dir / WEIGHTS_FILE))
        entry["file"], entry["aliases"] = WEIGHTS_FILE, aliases
    return entry


def _lifted_tensor(exported: torch.export.ExportedProgram, target: str) -> torch.Tensor:
    tensor: torch.Tensor = exported.state_dict[target] if target in exported.state_dict else exported.constants[target]
    return tensor.detach()
