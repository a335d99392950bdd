"""The tensors a compiled graph takes before the user's inputs, and how the wheel ships them.

The compiled graph takes parameters, buffers and constants as call arguments, so
they are stored once per model, as safetensors, whatever the number of artifacts.
The loader maps the file and views each tensor in place, so each tensor's data
starts at a multiple of ALIGNMENT bytes: some kernels that compiled code calls
need aligned operands (torch's int8-weight matrix product crashed on an int8
weight at an odd offset, where safetensors' own writer puts the narrow dtypes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..engine.model_config import ModelConfig
from ..runtime._layout import WEIGHTS_FILE
from ..runtime._schema import WeightsEntry
from ..runtime._weights import PADDING_PREFIX, SAFETENSORS_DTYPES
from .capture import Captured

_LIFTED_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")
ALIGNMENT = 64  # bytes: a cache line, what torch's allocator gives and torch.save aligns storages to


def lifted_weights(captured: Captured) -> dict[str, torch.Tensor]:
    """The parameters, buffers and constants the compiled graph takes before the
    user inputs, by state-dict name, in that order."""
    exported = captured.exported
    return {s.target: _lifted_tensor(exported, s.target) for s in exported.graph_signature.input_specs if s.kind.name in _LIFTED_KINDS}


def save_weights(model: ModelConfig, captured: Captured, out_dir: Path) -> WeightsEntry:
    """Write what the wheel ships of the weights; return the manifest's description:
    every lifted tensor's kind, shape and dtype (the loader checks weights given at
    run time against it). `embed` ships all of them; `factory` only the constants,
    which no module attribute holds. State that starts as zeros (a KV cache) is
    not stored: the loader makes it, so neither the wheel nor the memory map
    carries bytes that each handle overwrites with its own copy."""
    kinds = {s.target: s.kind.name for s in captured.exported.graph_signature.input_specs if s.kind.name in _LIFTED_KINDS}
    tensors = lifted_weights(captured)
    shipped = {n: t for n, t in tensors.items() if model.weights == "embed" or kinds[n] == "CONSTANT_TENSOR"}
    entry: WeightsEntry = {
        "mode": model.weights,
        "order": list(tensors),
        "specs": {n: {"kind": kinds[n], "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for n, t in tensors.items()},
    }
    zeros = [n for n in captured.state if n in shipped and not shipped[n].any()]
    if zeros:
        entry["zeros"] = zeros
        shipped = {n: t for n, t in shipped.items() if n not in zeros}
    if shipped:
        # Tied weights are lifted once per name but are one tensor: store it once.
        first_name: dict[tuple[Any, ...], str] = {}
        aliases = {}
        for n, t in shipped.items():
            identity = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
            if identity in first_name:
                aliases[n] = first_name[identity]
            else:
                first_name[identity] = n
        write_aligned({n: t for n, t in shipped.items() if n not in aliases}, out_dir / WEIGHTS_FILE)
        entry["file"], entry["aliases"] = WEIGHTS_FILE, aliases
    return entry


def _lifted_tensor(exported: torch.export.ExportedProgram, target: str) -> torch.Tensor:
    tensor: torch.Tensor = exported.state_dict[target] if target in exported.state_dict else exported.constants[target]
    return tensor.detach()


def write_aligned(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write `tensors` as a safetensors file whose every tensor's data starts at a
    multiple of ALIGNMENT bytes from the file's start. The format allows no holes
    between tensors, so each gap is a uint8 tensor named with PADDING_PREFIX (the
    loader skips those); the header's JSON is padded with spaces, as safetensors'
    own writer pads it. Any safetensors reader reads the file."""
    header: dict[str, Any] = {}
    chunks: list[bytes] = []
    offset = 0
    for name, tensor in tensors.items():
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        if gap := -offset % ALIGNMENT:
            header[f"{PADDING_PREFIX}{len(header)}"] = {"dtype": "U8", "shape": [gap], "data_offsets": [offset, offset + gap]}
            chunks.append(bytes(gap))
            offset += gap
        dtype = SAFETENSORS_DTYPES[str(tensor.dtype).removeprefix("torch.")]
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGNMENT)  # the data starts aligned too
    with open(path, "wb") as file:
        file.write(len(text).to_bytes(8, "little") + text)
        file.writelines(chunks)
