"""The constants an int8 (frozen) graph's lean module binds, written for the loader.

Runs in the compile worker. Strided constants (biases, scales, zero points, the
layers left in float32) are saved as their storage's bytes with dtype, size,
stride and offset, which rebuild the exact tensor, with no pickle. A
oneDNN-packed weight (layout `torch._mkldnn`) holds a CPU-specific layout that
no Python API can read or write; it is saved as the arguments of the prepack
call that made it (the plain int8 weight first), which the loader calls again,
on the CPU that runs it (`runtime/_frozen_tensors.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..runtime._schema import ConstantSpec, PrepackArgument
from .torch_internals import FrozenGraph, is_onednn_packed


class ConstantsRefused(Exception):
    """A constant the loader could not rebuild."""


def save_constants(frozen: FrozenGraph, path: Path) -> dict[str, ConstantSpec]:
    """Write the frozen graph's constants to `path` (safetensors); returns how
    the loader rebuilds each, by global name."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    storages: dict[int, str] = {}  # data pointer -> its name in the file; constants may share one
    specs: dict[str, ConstantSpec] = {}
    for name, tensor in frozen.constants.items():
        if not isinstance(tensor, torch.Tensor):
            raise ConstantsRefused(f"its global {name} is a {type(tensor).__name__}, not a tensor")
        if is_onednn_packed(tensor):
            if name not in frozen.prepacks:
                raise ConstantsRefused(f"its global {name} is a oneDNN-packed tensor that no prepack call the build knows made")
            op, args = frozen.prepacks[name]
            specs[name] = {"prepack": op, "arguments": [_argument(f"{name}.{i}", value, tensors) for i, value in enumerate(args)]}
            continue
        if tensor.layout != torch.strided or tensor.is_quantized or tensor.device.type != "cpu":
            raise ConstantsRefused(f"its global {name} is a {tensor.layout} {tensor.dtype} tensor on {tensor.device}")
        storage = tensor.untyped_storage()
        stored = storages.setdefault(storage.data_ptr(), f"storage{len(storages)}")
        if stored not in tensors:
            tensors[stored] = torch.empty(0, dtype=torch.uint8).set_(storage).clone()
        specs[name] = {
            "storage": stored,
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "size": list(tensor.shape),
            "stride": list(tensor.stride()),
            "offset": int(tensor.storage_offset()),
        }
    save_file(tensors, str(path))
    return specs


def _argument(name: str, value: Any, tensors: dict[str, torch.Tensor]) -> PrepackArgument:
    if isinstance(value, torch.Tensor) and value.layout == torch.strided:
        tensors[name] = value.detach().contiguous().clone()
        return {"tensor": name}
    if isinstance(value, (tuple, list, torch.Size)) and all(isinstance(v, int) for v in value):
        return {"value": list(value)}
    if value is None or isinstance(value, (int, float)):
        return {"value": value}
    raise ConstantsRefused(f"a prepack argument ({name}) is a {type(value).__name__}, which the loader cannot rebuild")
