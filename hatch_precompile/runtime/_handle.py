"""The handles `load_compiled` returns: compiled graphs with weights bound
(`CompiledModel`, for either kind of array), the module itself where nothing
compiled fits (`EagerModel`), and, for a caller holding NumPy arrays where
only torch can run the model, one of those behind NumPy arrays (`OnTorch`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _fork
from ._arrays import ArrayKind
from ._contract import CallContract, given_back, unflatten
from ._generate import Generating
from ._schema import ModelEntry, SourceModel
from ._variants import Variants


class CompiledModel(Generating):
    """Compiled graphs with weights bound: call it like the module's forward,
    with the kind of array it was loaded for.

    A model with state (`state`: the buffers its graphs update in place, such as
    a KV cache) holds its own copy of them, which every call reads and updates
    as the module's forward does its buffers; the weights are shared."""

    def __init__(self, name: str, model: ModelEntry, variants: Variants, weights: list[Any], classes: bool, *, own_state: bool = True) -> None:
        """`own_state=False` makes the handle `load_compiled` keeps and never returns
        for a model with state: its state is the shared initial values, which
        `with_own_state` copies for each handle it makes."""
        self.name, self._model = name, model
        self._inputs, self._outputs = model["inputs"], model["outputs"]
        self._variants, self._classes, self._kind = variants, classes, variants.kind
        self._contract = variants.contract
        order = model["weights"]["order"]
        self._state_at = {state: order.index(state) for state in model["state"]}
        self._initial = weights  # shared by every handle; the state's values before any call
        copied = set(self._state_at.values()) if own_state else set()
        self._weights = [self._kind.copy(w) if index in copied else w for index, w in enumerate(weights)]
        # Each variant with these weights; the kept handle of a model with state is never called.
        self._runs = [graph.bind(self._weights) for _, _, graph in variants.variants] if own_state or not self._state_at else []

    @property
    def has_state(self) -> bool:
        return bool(self._state_at)

    @property
    def state(self) -> dict[str, Any]:
        """This handle's state by buffer name: the arrays its calls update in place."""
        return {state: self._weights[index] for state, index in self._state_at.items()}

    def reset(self) -> None:
        """Put the state back as the build left it (a KV cache's zeros): start a new sequence."""
        for index in self._state_at.values():
            self._kind.assign(self._weights[index], self._initial[index])

    def with_own_state(self) -> CompiledModel:
        """A handle on the same graphs and weights with a state of its own, as the build left it."""
        return CompiledModel(self.name, self._model, self._variants, self._initial, self._classes)

    def _decoder_call(self) -> Callable[[Any, Any], Any]:
        if {"input_ids", "cache_position"} <= set(self._inputs["tree"]["children"][1].get("keys", [])):
            return lambda ids, positions: self(input_ids=ids, cache_position=positions)
        return self

    def _cache_positions(self) -> int | None:
        """The cache's positions: the bound the build found on `cache_position`'s
        values (the size the graph indexes with them)."""
        leaf = next((leaf for leaf in self._inputs["leaves"] if leaf["name"] == "cache_position"), None)
        return None if leaf is None else leaf.get("below")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        given, conformed, sizes = self._contract.accept(args, kwargs)
        run = self._runs[self._variants.pick(sizes)]
        _fork.note_call()
        outputs = run(conformed)
        if conformed is not given:
            outputs = given_back(outputs, conformed, given)
        return unflatten(self._outputs["tree"], iter(outputs), self._classes)

    def artifact_for(self, *args: Any, **kwargs: Any) -> str:
        """Which shipped file would serve this call (shape buckets dispatch on size)."""
        return self._variants.files[self._variants.pick(self._contract.accept(args, kwargs)[2])]

    def check_inputs(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Flatten a call's arguments and check them against what was compiled
        (compiled code checks nothing: a wrong dtype or size gives garbage or a
        crash). Raises ValueError naming the input; returns the flat inputs."""
        return self._contract.accept(args, kwargs)[0]

    def __repr__(self) -> str:
        return f"<compiled model {self.name!r} from {', '.join(self._variants.files)}{'' if self._kind.NAME == 'torch' else ' on NumPy arrays'}>"


class EagerModel(Generating):
    """The module built by its factory, called without autograd like the compiled
    one; with state, as the compiled one: per handle, and `reset()`."""

    def __init__(self, module: Any, config: SourceModel, reason: str, state: list[str]) -> None:
        from ._arrays import array_kind

        self.module, self.config, self.reason = module, config, reason
        self._kind = array_kind("torch")
        buffers = dict(module.named_buffers())
        self._initial = {name: buffers[name].clone() for name in state}

    @property
    def has_state(self) -> bool:
        return bool(self._initial)

    @property
    def state(self) -> dict[str, Any]:
        buffers = dict(self.module.named_buffers())
        return {name: buffers[name] for name in self._initial}

    def reset(self) -> None:
        for name, tensor in self.state.items():
            tensor.copy_(self._initial[name])

    def with_own_state(self) -> EagerModel:
        """A copy of the module that shares its parameters and owns its buffers, reset."""
        import copy

        shared = {id(parameter): parameter for parameter in self.module.parameters()}
        handle = EagerModel(copy.deepcopy(self.module, memo=shared), self.config, self.reason, [])
        handle._initial = self._initial
        handle.reset()
        return handle

    def _decoder_call(self) -> Callable[[Any, Any], Any]:
        return lambda ids, positions: self(input_ids=ids, cache_position=positions)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        _fork.note_call()
        with torch.no_grad():
            return self.module(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<eager fallback {type(self.module).__name__}>"


class OnTorch(Generating):
    """A torch-path handle (compiled in a form that needs torch, or eager) behind
    NumPy arrays, where the NumPy path cannot serve the model and the fallback
    policy is "eager": each call's arrays are checked and conformed by the model's
    NumPy contract, cross to torch without a copy, and its outputs come back as
    NumPy arrays (plain dicts and tuples). torch is imported."""

    def __init__(self, on_torch: CompiledModel | EagerModel, contract: CallContract | None, kind: ArrayKind, reason: str) -> None:
        self._on_torch, self._contract, self._kind, self.reason = on_torch, contract, kind, reason

    @property
    def has_state(self) -> bool:
        return self._on_torch.has_state

    @property
    def state(self) -> dict[str, Any]:
        return {name: _to_numpy(tensor, self._kind) for name, tensor in self._on_torch.state.items()}

    def reset(self) -> None:
        self._on_torch.reset()

    def with_own_state(self) -> OnTorch:
        return OnTorch(self._on_torch.with_own_state(), self._contract, self._kind, self.reason)

    def _cache_positions(self) -> int | None:
        return self._on_torch._cache_positions()

    def _decoder_call(self) -> Callable[[Any, Any], Any]:
        call = self._on_torch._decoder_call()
        return lambda ids, positions: _tree(call(_tree(ids, _to_torch), _tree(positions, _to_torch)), lambda tensor: _to_numpy(tensor, self._kind))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._contract is not None:
            _, conformed, _ = self._contract.accept(args, kwargs)
            args, kwargs = unflatten(self._contract.tree, iter(conformed), classes=False)
        outputs = self._on_torch(*_tree(args, _to_torch), **_tree(kwargs, _to_torch))
        return _tree(outputs, lambda tensor: _to_numpy(tensor, self._kind))

    def __repr__(self) -> str:
        return f"<{self._on_torch!r} behind NumPy arrays: {self.reason}>"


def _tree(value: Any, change: Callable[[Any], Any]) -> Any:
    """`value` with `change` applied to each array in its dicts, lists and tuples."""
    if isinstance(value, dict):
        return {key: _tree(item, change) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_tree(item, change) for item in value) if not hasattr(value, "_fields") else type(value)(*(_tree(item, change) for item in value))
    if hasattr(value, "keys") and hasattr(value, "values"):  # a library's output class
        return {key: _tree(value[key], change) for key in value.keys()}  # noqa: SIM118  # a mapping that is no dict
    return change(value)


def _to_torch(value: Any) -> Any:
    import numpy
    import torch

    if not isinstance(value, numpy.ndarray):
        return value
    if value.dtype.name == "bfloat16":
        return torch.from_numpy(numpy.ascontiguousarray(value).view(numpy.uint16)).view(torch.bfloat16)
    return torch.from_numpy(numpy.ascontiguousarray(value))


def _to_numpy(value: Any, kind: ArrayKind) -> Any:
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    value = value.detach()
    if value.dtype == torch.bfloat16:
        return value.view(torch.uint16).numpy().view(kind.dtype("bfloat16"))
    return value.numpy()
