"""The tensors a compiled graph takes before the user inputs: from the wheel, the
factory, or the caller, checked against what was compiled."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._arrays import ArrayKind
from ._contract import import_object
from ._errors import PrecompiledIntegrityError
from ._integrity import verified_weights
from ._manifest import HERE
from ._schema import ModelEntry, SourceModel, WeightsEntry, ships_weights

# safetensors' dtype names -> torch's
_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "F16": "float16", "BF16": "bfloat16",
    "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}  # fmt: skip
SAFETENSORS_DTYPES = {torch_name: name for name, torch_name in _DTYPES.items()}
ITEM_SIZES = {
    "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint16": 2, "uint32": 4, "uint64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip
# The build's writer fills the gaps that align each tensor with uint8 tensors so named.
PADDING_PREFIX = "__padding__"


def read_weights(weights: WeightsEntry, kind: ArrayKind) -> dict[str, Any]:
    """The shipped arrays by name: views of the checked, memory-mapped file (no
    copy, no pickle, and no page read before a call reads it); tied weights are
    stored once and bound under each name. State that starts as zeros is one
    zero broadcast to its shape: no memory until a handle copies it into a state
    of its own."""
    tensors = safetensors_views(verified_weights(weights, kind), HERE / weights["file"], kind) if "file" in weights else {}
    for alias, name in weights.get("aliases", {}).items():
        tensors[alias] = tensors[name]
    for name in weights.get("zeros", []):
        spec = weights["specs"][name]
        tensors[name] = kind.broadcast_zero(spec["dtype"], spec["shape"])
    return tensors


def safetensors_views(mapping: Any, path: Path, kind: ArrayKind) -> dict[str, Any]:
    """Tensors viewing a safetensors file's bytes in place. The layout
    (huggingface.co/docs/safetensors): an 8-byte little-endian header length, a
    JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, with
    an optional "__metadata__"}, then the data those offsets count from. Read
    here rather than by the safetensors library, whose own mapping the integrity
    check could not read through."""
    try:
        length = int.from_bytes(mapping[:8], "little")
        header = json.loads(mapping[8 : 8 + length])
        tensors = {}
        for name, info in header.items():
            if name == "__metadata__" or name.startswith(PADDING_PREFIX):
                continue
            dtype = _DTYPES[info["dtype"]]
            (begin, end), count = info["data_offsets"], math.prod(info["shape"])
            if end - begin != count * ITEM_SIZES[dtype] or 8 + length + end > len(mapping):
                raise ValueError(f"tensor {name!r}: its offsets do not fit its shape and dtype or the file")
            tensors[name] = kind.frombuffer(mapping, dtype, count, 8 + length + begin).reshape(info["shape"])
    except (ValueError, KeyError, TypeError) as error:  # json.JSONDecodeError is a ValueError
        raise PrecompiledIntegrityError(f"{path} is not a safetensors file this loader can read: {error}") from None
    return tensors


def bind_weights(name: str, model: ModelEntry, state_dict: dict[str, Any] | None, module: Any, kind: ArrayKind) -> list[Any]:
    """The tensors the compiled graph takes before the user inputs, in its order,
    from the caller's module or state_dict, the factory, or the shipped file;
    constants no module attribute holds always come from the shipped file. Each
    is checked against the name, shape and dtype that were compiled: compiled
    code checks nothing."""
    spec = model["weights"]
    shipped = read_weights(spec, kind) if ships_weights(spec) else {}
    if module is not None:
        lookup, source = _tensor_lookup(module), "the module given"
    elif state_dict is not None:
        lookup, source = dict(state_dict).get, "the state_dict given"
    elif spec["mode"] == "factory":
        lookup, source = _tensor_lookup(build_module(model)), f"the module from factory {model['factory']!r}"
    else:
        lookup, source = shipped.get, f"the shipped {spec.get('file', 'weights')}"  # a model without weights has no file
    tensors, problems = [], []
    for weight in spec["order"]:
        want = spec["specs"][weight]
        tensor = shipped.get(weight) if want["kind"] == "CONSTANT_TENSOR" else lookup(weight)
        if tensor is None:
            problems.append(f"{weight} is missing")
            continue
        found = f"{kind.dtype_name(tensor)}{list(tensor.shape)} on {kind.device(tensor)}"
        if found != f"{kind.stored_dtype_name(want['dtype'])}{want['shape']} on cpu":
            problems.append(f"{weight} is {found}, expected {want['dtype']}{want['shape']} on cpu")
        tensors.append(kind.plain(tensor))
    if problems:
        more = f"; and {len(problems) - 8} more" if len(problems) > 8 else ""
        raise ValueError(f"model {name!r}: {source} does not fit the compiled model: {'; '.join(problems[:8])}{more}")
    return tensors


def _tensor_lookup(module: Any) -> Callable[[str], Any]:
    """Find a module's tensor by state-dict name: parameters and buffers (tied ones
    under each name), then plain tensor attributes."""
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))

    def lookup(name: str) -> Any:
        if name in named:
            return named[name]
        target = module
        for part in name.split("."):
            target = getattr(target, part, None)
        return target

    return lookup


def build_module(model: SourceModel) -> Any:
    """The factory's module in the compiled dtype, in eval mode: as the build made
    it, a factory with a `dtype` parameter is given it (a module whose buffers
    other objects hold cannot be converted once made), any other's module converted."""
    import inspect

    import torch

    factory = import_object(model["factory"])
    dtype = getattr(torch, model["dtype"]) if model["dtype"] else None
    if dtype is not None and "dtype" in inspect.signature(factory).parameters:
        return factory(dtype=dtype).eval()
    module = factory()
    return (module.to(dtype) if dtype is not None else module).eval()
