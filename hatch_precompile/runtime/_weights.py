"""The tensors a compiled graph takes before the user inputs: from the wheel, the
factory, or the caller, checked against what was compiled."""

from __future__ import annotations

from typing import Any, Callable

from ._contract import import_object
from ._integrity import verified_weights


def read_weights(weights: dict[str, Any]) -> dict[str, Any]:
    """The shipped tensors by name, memory-mapped by safetensors (no pickle); tied
    weights are stored once and bound under each name."""
    from safetensors.torch import load_file

    tensors = load_file(verified_weights(weights))
    for alias, name in weights["aliases"].items():
        tensors[alias] = tensors[name]
    return tensors


def bind_weights(name: str, model: dict[str, Any], state_dict: dict[str, Any] | None, module: Any) -> list[Any]:
    """The tensors the compiled graph takes before the user inputs, in its order,
    from the caller's module or state_dict, the factory, or the shipped file;
    constants no module attribute holds always come from the shipped file. Each
    is checked against the name, shape and dtype that were compiled: compiled
    code checks nothing."""
    spec = model["weights"]
    shipped = read_weights(spec) if "file" in spec else {}
    if module is not None:
        lookup, source = _tensor_lookup(module), "the module given"
    elif state_dict is not None:
        lookup, source = dict(state_dict).get, "the state_dict given"
    elif spec["mode"] == "factory":
        lookup, source = _tensor_lookup(build_module(model)), f"the module from factory {model['factory']!r}"
    else:
        lookup, source = shipped.get, f"the shipped {spec['file']}"
    tensors, problems = [], []
    for weight in spec["order"]:
        want = spec["specs"][weight]
        tensor = shipped.get(weight) if want["kind"] == "CONSTANT_TENSOR" else lookup(weight)
        if tensor is None:
            problems.append(f"{weight} is missing")
            continue
        found = f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} on {tensor.device.type}"
        if found != f"{want['dtype']}{want['shape']} on cpu":
            problems.append(f"{weight} is {found}, expected {want['dtype']}{want['shape']} on cpu")
        tensors.append(tensor.detach())
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


def build_module(model: dict[str, Any]) -> Any:
    """The factory's module, converted to the compiled dtype, in eval mode."""
    import torch

    module = import_object(model["factory"])()
    if model.get("dtype"):
        module = module.to(getattr(torch, model["dtype"]))
    return module.eval()
