"""What an artifact is compiled from, hashed: the build cache's and parts' key.

Equal keys compile to the same bytes (builds are reproducible), so an artifact
stored under its key can stand in for a compile. Anything that changes what
inductor produces must be in the key; anything else must not be, or a rebuild
would miss for nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
from typing import Any

import torch

from ..engine.cache import plugin_fingerprint
from ..engine.model_config import ModelConfig
from ..engine.targets import CpuTarget
from ..runtime._manifest import torch_and_python
from ..runtime._schema import BuiltWith
from . import torch_internals
from .capture import Captured


def artifact_key(model: ModelConfig, captured: Captured, fixed: dict[str, int], target: CpuTarget, quantized: torch.fx.GraphModule | None = None) -> str:
    """What an artifact is compiled from, hashed: equal keys compile to the same bytes.

    The graph (with every node's shape, stride and dtype), its signature and
    symbolic ranges, the inputs, dims and shape variant, the inductor options and
    CPU target, the torch build and Python, and this plugin's code. Weight values
    are not in it: the graph takes them as inputs (`options` cannot set inductor's
    `freezing`, which would compile them in). An int8 model's are: its
    `quantized` module, compiled frozen, is hashed with every tensor it holds
    (the int8 weights and the scales calibration set)."""
    exported = captured.exported
    parts: dict[str, Any] = {
        "graphs": {name: _graph_text(gm.graph) for name, gm in exported.graph_module.named_modules() if hasattr(gm, "graph")},
        "signature": str(exported.graph_signature),
        "ranges": {str(symbol): str(bounds) for symbol, bounds in exported.range_constraints.items()},
        "inputs": [captured.input_tree, captured.input_leaves],
        "model": model.keyed_json(),
        "quantized": None if quantized is None else _module_digest(quantized),
        "fixed": fixed,
        "target": dataclasses.asdict(target),
        "built_with": build_environment(),
        "plugin": plugin_fingerprint(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _module_digest(module: torch.fx.GraphModule) -> str:
    """The graph and the bytes of every tensor it reads, hashed."""
    digest = hashlib.sha256(json.dumps(_graph_text(module.graph)).encode())
    for node in module.graph.nodes:
        if node.op == "get_attr":
            value = module
            for part in node.target.split("."):
                value = getattr(value, part)
            if isinstance(value, torch.Tensor):
                digest.update(f"{node.target} {value.dtype} {list(value.shape)}".encode())
                digest.update(value.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _graph_text(graph: torch.fx.Graph) -> list[str]:
    return [f"{node.format_node()} :: {_describe_value(node.meta.get('val'))}" for node in graph.nodes]


def _describe_value(value: Any) -> str:
    """What inductor compiles a node's value as: a tensor's dtype, device, shape and
    strides (symbolic sizes by their expressions), a symbolic or constant scalar's
    expression, each element of a list or tuple."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {value.device} {tuple(map(str, value.shape))} {tuple(map(str, value.stride()))}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_describe_value, value)) + "]"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool, str, type(None))):
        return str(value)
    return type(value).__name__


def build_environment() -> BuiltWith:
    """What an artifact depends on; the loader compares these with the running process."""
    return BuiltWith(**torch_and_python(), torch_key=torch_internals.torch_key().hex(), machine=platform.machine())
