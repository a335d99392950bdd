"""Build a model from its factory, make example inputs, and capture it with torch.export.

Runs in the compile worker (it imports torch and the project's code). The result
names every user input and says which of its sizes are static and which are the
declared dims, so the loader can check calls without torch's help.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import importlib
import inspect
import itertools
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..engine.config import TABLE
from ..engine.errors import ModelBuildError
from ..engine.model_config import Dim, ModelConfig, TensorInput
from ..runtime._contract import import_object
from ..runtime._schema import InputLeaf, TreeSpec
from .index_bounds import index_bounds
from .state import mutated_buffers
from .torch_internals import DimFix, constraint_fixes, decompose, tree_leaves, tree_map, treespec_to_json

Call = tuple[tuple[Any, ...], dict[str, Any]]  # one call's (args, kwargs)
Run = tuple[list[list[Any]], list[torch.Tensor]]  # a module's flat outputs for each call, and its state after the last
InputPath = tuple[int | str, ...]  # positional index or keyword, then keys and indices into nested inputs
Axes = dict[InputPath, dict[int, str]]  # the dims by axis of each tensor input that has any


@dataclass
class Captured:
    module: torch.nn.Module
    exported: torch.export.ExportedProgram
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    input_tree: TreeSpec
    input_leaves: list[InputLeaf]
    reference: torch.nn.Module | None = None  # the float32 module a lower-precision one was converted from
    unquantized: torch.nn.Module | None = None  # a weight-only model's bfloat16 module before its weights were quantized
    float32_quantized: torch.nn.Module | None = None  # int8-dynamic: the float32 module with the same quantized layers
    # `quantize` models only: the export before inductor's decompositions, which
    # PT2E quantizes (its quantizer annotates aten.linear and convolutions, which they rewrite)
    undecomposed: torch.export.ExportedProgram | None = None
    strict_because: str = ""  # why the capture is torch.export's strict one (the non-strict one failed), or ""
    # A model with state (buffers its forward updates): their names, their values
    # before any call, and the calls after the example inputs that the build checks
    # the compiled graph on, from that state, against eager.
    state: list[str] = dataclasses.field(default_factory=list)
    initial_state: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    steps: list[Call] = dataclasses.field(default_factory=list)
    # A model without state, whose inputs the build made from their declared shapes:
    # `steps` are the calls at the dims' min, a size between and max instead (what
    # each size was, by dim), so that every form is checked over the range it accepts.
    step_sizes: list[dict[str, int]] = dataclasses.field(default_factory=list)

    def call_name(self, index: int) -> str:
        """Where call `index` (0: the example inputs) is, in the build's messages."""
        if index == 0:
            return "on the example inputs"
        if self.step_sizes:
            return f"at {', '.join(f'{dim}={size}' for dim, size in self.step_sizes[index - 1].items())} (the dims' min, a size between and max)"
        return f"on call {index + 1} of the build's check (after the example inputs)"

    @property
    def calls(self) -> list[Call]:
        """Every call the build checks, in order: the example inputs, then the steps."""
        return [(self.args, self.kwargs), *self.steps]

    @functools.cached_property
    def eager_run(self) -> Run:
        """The module's flat outputs for each call, and its state after the last,
        from the initial state (on a copy, so the module itself keeps it)."""
        return self._run(self.module)

    @property
    def eager_outputs(self) -> list[Any]:
        """The module's flat outputs on the example inputs, computed once and checked
        against every CPU target's artifact."""
        return self.eager_run[0][0]

    @property
    def reference_outputs(self) -> list[Any] | None:
        """The float32 module's flat outputs on the example inputs (floating ones as
        float32), what `accuracy.py` holds a lower-precision model to; None for a
        float32 model."""
        return None if self.reference is None else self.reference_run[0][0]

    @functools.cached_property
    def reference_run(self) -> Run:
        """The float32 module's flat outputs for each call (floating inputs as
        float32), and its state after the last, from its own initial state, on a copy."""
        assert self.reference is not None
        return self._run(self.reference)

    @functools.cached_property
    def precision_run(self) -> Run:
        """The module in its activations' dtype before its weights were quantized
        (the module itself where they were not), for each call from the initial
        state: with `reference_run`, how far that dtype's rounding alone moves a
        computation from float32 (worker/accuracy.py)."""
        return self.eager_run if self.unquantized is None else self._run(self.unquantized)

    @functools.cached_property
    def float32_quantized_run(self) -> Run:
        """The float32 module with the model's own int8-dynamic layers, on the calls'
        floating inputs as float32, from its own state: what bfloat16 between the
        int8 products moves eager from (worker/accuracy.py)."""
        assert self.float32_quantized is not None
        return self._run(self.float32_quantized)

    def _run(self, module: torch.nn.Module) -> Run:
        """`module` on every call, the float32 module on the calls' floating inputs as
        float32 and from its own state (in its dtype), the others from the initial state."""
        from .accuracy import reference_inputs

        float32 = module is self.reference or module is self.float32_quantized
        if self.state:
            module = copy.deepcopy(module)  # the module's own state stays as it was
            buffers = dict(module.named_buffers())
            for name in [] if float32 else self.state:
                buffers[name].copy_(self.initial_state[name])
        with torch.no_grad():
            outputs = [tree_leaves(module(*args, **kwargs)) for args, kwargs in (reference_inputs(*call) if float32 else call for call in self.calls)]
        buffers = dict(module.named_buffers())
        return outputs, [buffers[name] for name in self.state]


def import_callable(model: str, key: str, spec: str) -> Any:
    """The callable a model's `key` names, by the loader's own import_object; its
    module imported first, so that a module that fails to import is told apart
    from a missing attribute."""
    step = f"importing {key} = {spec!r}"
    module_name = spec.partition(":")[0]
    try:
        importlib.import_module(module_name)
    except Exception as error:
        raise ModelBuildError(model, step, f"cannot import module {module_name!r}: {_one_line(error)}") from None
    try:
        target = import_object(spec)
    except AttributeError as error:
        raise ModelBuildError(model, step, str(error)) from None
    if not callable(target):
        raise ModelBuildError(model, step, f"expected a callable, found {type(target).__name__}")
    return target


def build_module(model: ModelConfig) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The factory's module, in eval mode, converted to the model's `dtype` if set;
    and, for a bfloat16, float16 or int8 model, the float32 module it was converted
    from (for a dtype, a copy: converting works in place), to check its accuracy
    against. A factory with a `dtype` parameter is called with the model's dtype,
    and again without it for the float32 module: a module whose buffers other
    objects also hold, as transformers' static cache does, cannot be converted
    once made. One that returns its module in the dtype already has no float32
    module to check against."""
    factory = import_callable(model.name, "factory", model.factory)
    dtype = getattr(torch, model.dtype) if model.dtype else None
    makes_dtype = dtype is not None and "dtype" in inspect.signature(factory).parameters
    module = _call_factory(model, factory, {"dtype": dtype} if makes_dtype else {})
    reference = None
    floating = [t for t in itertools.chain(module.parameters(), module.buffers()) if t.is_floating_point()]
    if makes_dtype and dtype != torch.float32:
        reference = _call_factory(model, factory, {})
    elif model.dtype in ("bfloat16", "float16") and any(t.dtype != dtype for t in floating):
        reference = copy.deepcopy(module)
    elif model.quantize == "int8":
        reference = module  # int8 is quantized from a copy the export makes; the module itself stays float32
    if dtype is not None:
        module = module.to(dtype)
    return module, reference


def _call_factory(model: ModelConfig, factory: Any, kwargs: dict[str, Any]) -> torch.nn.Module:
    """The factory's module, in eval mode; a failure or another return type stops the build."""
    called = f"calling factory {model.factory!r}" + (f" with dtype={kwargs['dtype']}" if kwargs else "")
    try:
        module = factory(**kwargs)
    except Exception:
        raise ModelBuildError(model.name, called, traceback.format_exc()) from None
    if not isinstance(module, torch.nn.Module):
        raise ModelBuildError(model.name, called, f"expected it to return a torch.nn.Module, got {type(module).__module__}.{type(module).__qualname__}")
    return module.eval()


def capture(
    model: ModelConfig,
    module: torch.nn.Module,
    fixed: dict[str, int],
    reference: torch.nn.Module | None = None,
    unquantized: torch.nn.Module | None = None,
    float32_quantized: torch.nn.Module | None = None,
) -> Captured:
    """Export the model so that exactly the declared dims not in `fixed` are dynamic;
    those in `fixed` are static at the given size. A model torch cannot capture
    stops the build with the reason in the configuration's terms."""
    try:
        captured = dataclasses.replace(_export(model, module, fixed), reference=reference, unquantized=unquantized, float32_quantized=float32_quantized)
    except _ExportFailed as failed:
        if failed.step == "decomposition":
            raise ModelBuildError(model.name, "decomposing the captured graph", _decomposition_failure(failed)) from None
        message = _capture_failure(model, module, fixed, failed)
        raise ModelBuildError(model.name, "capturing with torch.export", message) from None
    state = mutated_buffers(captured.exported)
    if not state:
        sizes = _range_sizes(model, fixed)
        calls = [_inputs_at(model, at, torch.Generator().manual_seed(index))[:2] for index, at in enumerate(sizes, start=1)]
        return dataclasses.replace(captured, steps=calls, step_sizes=sizes)
    buffers = dict(module.named_buffers())
    initial = {name: buffers[name].detach().clone() for name in state}
    return dataclasses.replace(captured, state=state, initial_state=initial, steps=_example_steps(model, (captured.args, captured.kwargs)))


def example_calls(model: ModelConfig) -> list[Call]:
    """The example inputs (at the first shape variant's sizes where made from
    shapes), then `example-steps`' calls where the model has them: real inputs to
    measure a module on before it is captured (worker/linears.py)."""
    if model.example_inputs:
        first = _example_inputs_from_callable(model.name, model.example_inputs)
    else:
        args, kwargs, _ = _example_inputs_from_shapes(model, model.shape_variants()[0])
        first = (args, kwargs)
    return [first, *(_example_steps(model, first) if model.example_steps is not None else [])]


def _example_steps(model: ModelConfig, first: Call) -> list[Call]:
    """The calls after the example inputs (`first`) that a model with state is
    checked on: `example-steps`' calls, else the example inputs twice more."""
    if model.example_steps is None:
        return [first] * 2
    key = "example-steps"
    make = import_callable(model.name, key, model.example_steps)
    try:
        steps = list(make())
    except Exception:
        raise ModelBuildError(model.name, f"calling {key} {model.example_steps!r}", traceback.format_exc()) from None
    for index, step in enumerate(steps):
        if not (isinstance(step, tuple) and len(step) == 2 and isinstance(step[0], (tuple, list)) and isinstance(step[1], dict)):
            raise ModelBuildError(
                model.name,
                f"calling {key} {model.example_steps!r}",
                f"expected an iterable of (args, kwargs) calls, each a tuple of a tuple and a dict; call {index} is a {type(step).__name__}",
            )
    return [tree_map(_in_call_layout, (tuple(args), dict(kwargs))) for args, kwargs in steps]


def _decomposition_failure(failed: _ExportFailed) -> str:
    return (
        "torch.export captured the model, but decomposing its graph for inductor failed inside torch; the build "
        "then tried torch.export's strict capture (dynamo) of the same module, which failed too"
        f"\n\ntorch's message (non-strict capture, decomposing):\n{_torch_error(failed.error)}"
        + (f"\n\ntorch's message (strict capture):\n{_torch_error(failed.strict_error)}" if failed.strict_error else "")
    )


class _ExportFailed(Exception):
    """torch.export (or the decomposition after it) raised `error`."""

    def __init__(self, error: BaseException, dynamic_shapes: Any, args: tuple[Any, ...], kwargs: dict[str, Any], example_sizes: dict[str, int]) -> None:
        super().__init__(str(error))
        self.error, self.dynamic_shapes, self.example_sizes = error, dynamic_shapes, example_sizes
        self.example_args, self.example_kwargs = args, kwargs
        self.step = "capture"  # or "decomposition": torch.export captured it, decomposing failed
        self.strict_error: BaseException | None = None  # the strict capture's, tried after a failed decomposition


def _export(model: ModelConfig, module: torch.nn.Module, fixed: dict[str, int]) -> Captured:
    name = model.name
    if model.example_inputs:
        args, kwargs = _example_inputs_from_callable(model.name, model.example_inputs)
        axes = _dims_from_axes(model, args, kwargs)
    else:
        args, kwargs, axes = _example_inputs_from_shapes(model, fixed)

    export_dims = {d: torch.export.Dim(d, min=spec.min, max=spec.max) for d, spec in model.dims.items() if d not in fixed}

    def dynamic(value: Any, path: InputPath) -> Any:
        """export's dynamic_shapes entry for the input at `path`: Dims by axis for a
        tensor, the same structure for a container, None where all is static."""
        if isinstance(value, (tuple, list)):
            return type(value)(dynamic(item, (*path, i)) for i, item in enumerate(value))
        if isinstance(value, dict):
            return {key: dynamic(item, (*path, key)) for key, item in value.items()}
        return {axis: export_dims[d] for axis, d in axes.get(path, {}).items() if d in export_dims} or None

    signature = inspect.signature(module.forward)
    try:
        bound = signature.bind(*[dynamic(value, (i,)) for i, value in enumerate(args)], **{key: dynamic(value, (key,)) for key, value in kwargs.items()})
    except TypeError as error:
        raise ModelBuildError(name, "matching inputs to forward()", f"the declared inputs do not fit forward(): {error}") from None
    dynamic_shapes = dict(bound.arguments) or None
    sizes = {dim: _at(args, kwargs, path).shape[axis] for path, by_axis in axes.items() for axis, dim in by_axis.items()}
    strict_because = ""
    try:
        with torch.no_grad():
            undecomposed = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes)
    except Exception as error:
        raise _ExportFailed(error, dynamic_shapes, args, kwargs, sizes) from None
    try:
        with torch.no_grad():
            exported = _decomposed(model, undecomposed)
    except Exception as error:
        # Some graphs (transformers' static-cache decoders on torch 2.13) decompose
        # only from the strict capture, which is also what their own export uses.
        failed = _ExportFailed(error, dynamic_shapes, args, kwargs, sizes)
        failed.step = "decomposition"
        try:
            with torch.no_grad():
                undecomposed = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=True)
                exported = _decomposed(model, undecomposed)
        except Exception as strict_error:
            failed.strict_error = strict_error
            raise failed from None
        strict_because = f"the non-strict capture failed to decompose ({_torch_error(error).splitlines()[0][:200]})"

    input_tree = treespec_to_json(exported.call_spec.in_spec)
    positional = [p.name for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    leaves = _describe_inputs(input_tree, args, kwargs, positional, axes)
    placeholders = {node.name: node for node in exported.graph_module.graph.nodes if node.op == "placeholder"}
    user_inputs = [s.arg.name for s in exported.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    bounds = index_bounds(exported.graph_module.graph, [placeholders[name] for name in user_inputs if name in placeholders])
    for leaf, name in zip(leaves, user_inputs):
        if name in bounds:
            leaf["below"] = bounds[name]
    undecomposed_kept = undecomposed if model.quantize == "int8" else None
    return Captured(module, exported, args, kwargs, input_tree, leaves, undecomposed=undecomposed_kept, strict_because=strict_because)


def without_dead_code(exported: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """`exported` with the computations no output needs taken out of its graph
    (in place), such as BERT's pooler under a model that returns mean-pooled
    hidden states. torch.export keeps them; torchao's quantizer fails on a dead
    linear layer, and everything after capture would compile or quantize them for
    nothing. fx keeps what has side effects (mutations, assertions); the weights
    of a dead layer stay as unused inputs of the graph."""
    graph_module = exported.graph_module
    if graph_module.graph.eliminate_dead_code():
        graph_module.recompile()
    return exported


def _describe_inputs(
    tree: TreeSpec,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    positional: list[str],
    axes: Axes,
) -> list[InputLeaf]:
    """Name, dtype, device and shape (dim names for dynamic sizes) of each tensor
    the compiled graph takes, in its order. Inputs are named after forward()'s
    parameters, with the keys and indices that lead into nested ones."""
    leaves: list[InputLeaf] = []

    def walk(spec: TreeSpec, value: Any, name: str, path: InputPath) -> None:
        dims = axes.get(path, {})
        if spec["type"] == "leaf":
            if not isinstance(value, torch.Tensor):
                leaves.append({"name": name, "value": value})  # compiled in: calls must pass the same
                return
            shape = [dims.get(axis, size) for axis, size in enumerate(value.shape)]
            leaves.append(
                {
                    "name": name,
                    "dtype": str(value.dtype).removeprefix("torch."),
                    "device": value.device.type,
                    "shape": shape,
                    "layout": _layout(value),
                }
            )
            return
        keys: Sequence[int | str] = spec["keys"] if "keys" in spec else range(len(spec["children"]))
        for key, child in zip(keys, spec["children"]):
            walk(child, value[key], f"{name}[{key!r}]" if spec["type"] == "dict" else f"{name}[{key}]", (*path, key))

    args_spec, kwargs_spec = tree["children"]
    for i, (child, value) in enumerate(zip(args_spec["children"], args)):
        walk(child, value, positional[i] if i < len(positional) else f"args[{i}]", (i,))
    for key, child in zip(kwargs_spec.get("keys", []), kwargs_spec["children"]):
        walk(child, kwargs[key], key, (key,))
    return leaves


def _example_inputs_from_shapes(model: ModelConfig, fixed: dict[str, int]) -> tuple[tuple[Any, ...], dict[str, Any], Axes]:
    return _inputs_at(model, _example_sizes(model, fixed), torch.Generator().manual_seed(0))


def _example_sizes(model: ModelConfig, fixed: dict[str, int]) -> dict[str, int]:
    static_sizes = {s for spec in [*model.args, *model.kwargs.values()] for s in spec.shape if isinstance(s, int)}
    static_sizes |= set(fixed.values())
    return {d: fixed.get(d) or _example_size(spec.min, spec.max, static_sizes) for d, spec in model.dims.items()}


def _range_sizes(model: ModelConfig, fixed: dict[str, int]) -> list[dict[str, int]]:
    """The dims' sizes a model without state is also checked at: every dim the
    variant leaves dynamic at its min, at a size between and at its max (those
    the example inputs were not made at); none where the inputs are the
    project's own (`example-inputs`) or the model is quantized (its calibration
    batches are what it is held to)."""
    dynamic = {d: spec for d, spec in model.dims.items() if d not in fixed and spec.dynamic}
    if not dynamic or model.example_inputs or model.quantize:
        return []
    example = _example_sizes(model, fixed)
    candidates = [{d: s.min for d, s in dynamic.items()}, {d: min((s.min + s.max) // 2 + 1, s.max) for d, s in dynamic.items()}, {d: s.max for d, s in dynamic.items()}]
    sizes = [{**example, **at} for at in candidates]
    return [at for index, at in enumerate(sizes) if at != example and at not in sizes[:index]]


def _inputs_at(model: ModelConfig, sizes: dict[str, int], generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any], Axes]:
    """The declared inputs made at these dims' sizes (random, in each input's range)."""

    def make(spec: TensorInput) -> tuple[Any, dict[int, str]]:
        if spec.constant is not None:
            return spec.constant, {}
        shape = [sizes[s] if isinstance(s, str) else s for s in spec.shape]
        dims = {axis: s for axis, s in enumerate(spec.shape) if isinstance(s, str)}
        return _random_tensor(shape, getattr(torch, spec.dtype), spec.value_range, generator), dims

    made_args = [make(spec) for spec in model.args]
    made_kwargs = {key: make(spec) for key, spec in model.kwargs.items()}
    axes: Axes = {(i,): d for i, (_, d) in enumerate(made_args)} | {(k,): d for k, (_, d) in made_kwargs.items()}
    return tuple(t for t, _ in made_args), {k: t for k, (t, _) in made_kwargs.items()}, axes


def _example_size(low: int, high: int, avoid: set[int]) -> int:
    """A size in range that export will not specialise: not 0 or 1, and not equal to
    a static size (export would otherwise assume the two are related)."""
    for size in range(max(low, 2), high + 1):
        if size not in avoid:
            return size
    return max(low, 2)


def _random_tensor(shape: list[int], dtype: torch.dtype, value_range: tuple[float, float] | None, generator: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point:
        values = torch.rand(shape, generator=generator) if value_range else torch.randn(shape, generator=generator)
        if value_range:
            values = value_range[0] + values * (value_range[1] - value_range[0])
        return values.to(dtype)
    low, high = value_range or (0, 2)
    return torch.randint(int(low), int(high), shape, generator=generator, dtype=dtype)


def _layout(value: torch.Tensor) -> str:
    """The memory layout calls are given in: channels_last where the example is,
    else contiguous (examples in any other layout are made contiguous first)."""
    if value.dim() == 4 and not value.is_contiguous() and value.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    return "contiguous"


def _in_call_layout(value: Any) -> Any:
    """An example tensor in the layout `_layout` names: what the graph is compiled for."""
    if isinstance(value, torch.Tensor) and _layout(value) == "contiguous" and not value.is_contiguous():
        return value.contiguous()
    return value


def _example_inputs_from_callable(model: str, spec: str) -> Call:
    key = "example-inputs"
    make = import_callable(model, key, spec)
    try:
        result = make()
    except Exception:
        raise ModelBuildError(model, f"calling {key} {spec!r}", traceback.format_exc()) from None
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], (tuple, list)) and isinstance(result[1], dict)):
        raise ModelBuildError(
            model,
            f"calling {key} {spec!r}",
            f"expected it to return (args, kwargs): a tuple of a tuple and a dict, got {type(result).__name__}",
        )
    args, kwargs = tree_map(_in_call_layout, (tuple(result[0]), dict(result[1])))
    return args, kwargs


def _dims_from_axes(model: ModelConfig, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Axes:
    """Each dim's axes (`"0:0"`, `"attention_mask:1"`, `"0.input_ids:1"`) as the
    dims by axis of the example input each path leads to."""
    axes: Axes = {}
    for dim, spec in model.dims.items():
        for which, axis in spec.axes:
            where = f"tool.hatch.build.hooks.precompile.models.{model.name}.dims.{dim}.axes: '{which}:{axis}'"
            path = _walk_path(model.name, where, args, kwargs, str(which))
            value = _at(args, kwargs, path)
            if not isinstance(value, torch.Tensor) or axis >= value.dim():
                found = f"a {type(value).__name__}" + (f" with {value.dim()} dims" if isinstance(value, torch.Tensor) else "")
                raise ModelBuildError(model.name, "reading example inputs", f"{where} expects a tensor with an axis {axis}, found {found}")
            axes.setdefault(path, {})[axis] = dim
    return axes


def _walk_path(name: str, where: str, args: tuple[Any, ...], kwargs: dict[str, Any], which: str) -> InputPath:
    """The path an axes entry names, checked step by step against the example
    inputs: the first step a positional index or a keyword, then a key of a dict
    or an index of a list or tuple."""
    first, *rest = which.split(".")
    if first.isdigit():
        if int(first) >= len(args):
            raise ModelBuildError(name, "reading example inputs", f"{where}: there is no positional input {first}; the example inputs have {len(args)}")
        path: InputPath = (int(first),)
    elif first not in kwargs:
        known = sorted(kwargs)
        raise ModelBuildError(name, "reading example inputs", f"{where}: there is no keyword input {first!r}; the example inputs have {known or 'none'}{_did_you_mean(first, known)}")
    else:
        path = (first,)
    for step in rest:
        value, here = _at(args, kwargs, path), ".".join(str(p) for p in path)
        if isinstance(value, dict):
            if step not in value:
                known = sorted(map(str, value))
                raise ModelBuildError(name, "reading example inputs", f"{where}: {here} has no key {step!r}; its keys are {known}{_did_you_mean(step, known)}")
            path = (*path, step)
        elif isinstance(value, (list, tuple)):
            if not step.isdigit() or int(step) >= len(value):
                raise ModelBuildError(name, "reading example inputs", f"{where}: {here} is a {type(value).__name__} of {len(value)} items, so {step!r} names none of them")
            path = (*path, int(step))
        else:
            raise ModelBuildError(name, "reading example inputs", f"{where}: {here} is a {type(value).__name__}, which has no {step!r} in it")
    return path


def _at(args: tuple[Any, ...], kwargs: dict[str, Any], path: InputPath) -> Any:
    value = args[path[0]] if isinstance(path[0], int) else kwargs[path[0]]
    for step in path[1:]:
        value = value[step]
    return value


def _did_you_mean(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _capture_failure(model: ModelConfig, module: torch.nn.Module, fixed: dict[str, int], failed: _ExportFailed) -> str:
    """Why torch.export could not capture the model, in the configuration's terms
    where that can be found, then torch's own message.

    A constraint violation comes with torch's suggested fixes. Any other error with
    dims dynamic is looked into, since a model whose code needs a fixed size (a
    position table, a size check) fails with a message about torch's symbols
    (`s100*s4`), not the dims declared: the module is run eagerly on the example
    inputs, then captured again with every dim static, then with each alone."""
    message = _torch_error(failed.error) + _raised_in(failed.error)
    fixes = constraint_fixes(failed.error, failed.dynamic_shapes)
    if fixes:
        return f"{_violations(model, fixes)}\n\ntorch's message:\n{message}"
    if "which is not a known type" in message:
        return (
            "the model takes or returns an object torch.export cannot flatten into tensors; return tensors, "
            "tuples, lists, dicts or library output classes (for a transformers decoder, set `use_cache=False` "
            f"in its config, so that it returns no cache object)\n\ntorch's message:\n{message}"
        )
    dynamic = [d for d in model.dims if d not in fixed and d in failed.example_sizes]
    if not dynamic:
        return message
    static = {d: failed.example_sizes[d] for d in dynamic}
    try:
        with torch.no_grad():
            module(*failed.example_args, **failed.example_kwargs)
    except Exception as error:
        at = ", ".join(f"{d} = {size}" for d, size in static.items())
        return (
            f"the model fails on the build's example inputs ({at}) even without torch.export: {_one_line(error)}\n"
            "If it supports only some sizes, narrow the dims' ranges to them or declare them as buckets "
            "(the build makes its examples at the smallest size in each range other than 1, or at a bucket's size)."
        )
    if not _exports(model, module, {**fixed, **static}):
        return f"torch.export cannot capture the model even with every declared dim static, so no `dims` setting helps: the model's code must change\n\ntorch's message:\n{message}"
    blocking = [d for d in dynamic if _exports(model, module, {**fixed, d: static[d]})]
    by_axes = bool(model.example_inputs)
    items = []
    for dim in blocking or dynamic:
        path = f"{TABLE}.models.{model.name}.dims.{dim}"
        advice = f"Make it static by removing `{dim}` from dims" if by_axes else (f"Declare the sizes the model supports as buckets, e.g. `{dim} = [{static[dim]}]` (a static artifact each)")
        items.append(f"  - {path} = {_declared(model.dims[dim])}\n    {advice}, or fix the model so that it does not need a fixed {dim}.")
    if blocking:
        head = f"the model's code needs a fixed size for {_count(blocking, 'declared dim')}: torch.export captures it with {_listed(blocking)} static, not dynamic:"
    else:
        head = f"the model's code needs fixed sizes for the declared dims {_listed(dynamic)} together: torch.export captures it only with all of them static:"
    return f"{head}\n" + "\n".join(items) + f"\n\ntorch's message:\n{message}"


def _decomposed(model: ModelConfig, undecomposed: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """The capture decomposed; for a decoder with state (a KV cache) in bfloat16 or
    float16, with its attention as float32 math instead of torch's CPU flash kernel,
    which one query at a time costs 8x its float32 time in bfloat16
    (torch_internals.attention_as_float32_math). Only the decomposed graph says
    whether the model has state (the capture updates its buffers in place), so
    such a model is decomposed twice. A model without state keeps the flash
    kernel, whose memory does not grow with the square of long inputs."""
    exported = decompose(without_dead_code(undecomposed))
    if model.dtype in ("bfloat16", "float16") and mutated_buffers(exported):
        exported = decompose(without_dead_code(undecomposed), attention_in_float32=True)
    return exported


def _exports(model: ModelConfig, module: torch.nn.Module, fixed: dict[str, int]) -> bool:
    """Whether torch.export captures the model with the dims in `fixed` static."""
    try:
        _export(model, module, fixed)
    except _ExportFailed:
        return False
    return True


def _count(dims: list[str], noun: str) -> str:
    return f"{len(dims)} {noun}{'s' if len(dims) > 1 else ''}"


def _listed(dims: list[str]) -> str:
    return ", ".join(dims[:-1]) + f" and {dims[-1]}" if len(dims) > 1 else dims[0]


def _violations(model: ModelConfig, fixes: dict[str, DimFix]) -> str:
    """A constraint violation in the configuration's words: for each declared dim
    that cannot be dynamic over its range, the range as configured, the sizes
    torch found the model works for, and what to change. torch's own text speaks
    of guards and `Dim`s, which the user never wrote."""
    items = []
    for dim, fix in fixes.items():
        spec = model.dims[dim]
        found, advice = _finding(dim, spec, fix, by_axes=bool(model.example_inputs))
        path = f"{TABLE}.models.{model.name}.dims.{dim}"
        items.append(f"  - {path} = {_declared(spec)}: torch.export found that {found}.\n    {advice}")
    if len(items) == 1:
        return "a declared dim cannot be dynamic over its range:\n" + items[0]
    return f"{len(items)} declared dims cannot be dynamic over their ranges:\n" + "\n".join(items)


def _finding(dim: str, spec: Dim, fix: DimFix, by_axes: bool) -> tuple[str, str]:
    """(what torch found, what to do) for one dim, in the configuration's terms.
    Models with `example-inputs` cannot declare buckets, so they are told to make
    the dim static instead."""
    fix_model = f"or fix the model so that it does not depend on the size of {dim}"
    if fix.base is not None:
        related = _linear(fix.scale, fix.base, fix.offset)
        advice = f"Use one dim for both (`{related}` in place of `{dim}`)" if related == fix.base else ("Dims cannot be tied to each other: make one of them static")
        return f"the model only works when {dim} == {related}", f"{advice}, {fix_model}."
    step = max(fix.scale, 1)  # a constant (scale 0) is a range of one size
    lowest = max(spec.min, fix.scale * fix.low + fix.offset)
    highest = min(spec.max, fix.scale * fix.high + fix.offset)
    sizes = range(lowest + (fix.offset - lowest) % step, highest + 1, step)
    static = f"Make it static by removing `{dim}` from dims" if by_axes else ""
    if len(sizes) <= 1:
        found = f"the model only works when {dim} == {sizes[0]}" if sizes else f"no size of {dim} in that range works"
        bucket = f"Declare that size as a bucket: `{dim} = [{sizes[0]}]` (a static artifact)" if sizes else "Change the range"
        return found, f"{static or bucket}, {fix_model}."
    if step == 1:
        narrow = f"min = {sizes[0]}, max = {sizes[-1]}"
        advice = f"Narrow the range to {narrow}" if by_axes else (f"Narrow the range: `{dim} = {{ {narrow} }}`, declare `buckets` for the sizes the model supports")
        return f"the model only works for {dim} in [{sizes[0]}, {sizes[-1]}]", f"{advice}, {fix_model}."
    listed = ", ".join(map(str, sizes)) if len(sizes) <= 8 else f"{sizes[0]}, {sizes[1]}, ..., {sizes[-1]}"
    buckets = ", ".join(map(str, sizes if len(sizes) <= 8 else sizes[:4]))
    found = f"the model only works when {dim} % {step} == {fix.offset % step} (sizes {listed} in the declared range)"
    bucket = f"Declare the sizes the model supports as buckets, e.g. `{dim} = [{buckets}]` (a static artifact each)"
    return found, f"{static or bucket}, {fix_model}."


def _linear(scale: int, base: str, offset: int) -> str:
    """`scale * base + offset` as torch writes a derived dim: `4*batch - 3`, `batch + 1`."""
    term = base if scale == 1 else f"{scale}*{base}"
    return term if offset == 0 else f"{term} {'+' if offset > 0 else '-'} {abs(offset)}"


def _declared(spec: Dim) -> str:
    """A dim's declaration as written in the configuration (its inline-table form)."""
    parts = [f"min = {spec.min}", f"max = {spec.max}"]
    if spec.buckets:
        parts.append(f"buckets = {list(spec.buckets)}")
    if spec.axes:
        parts.append("axes = [" + ", ".join(f'"{which}:{axis}"' for which, axis in spec.axes) + "]")
    return "{ " + ", ".join(parts) + " }"


def _torch_error(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text if len(text) < 4000 else text[:4000] + "\n... (truncated)"


def _raised_in(error: BaseException) -> str:
    """Where the model's (or its library's) code raised `error`: the innermost frame
    outside torch, or "" when torch itself raised it from its own code."""
    torch_dir = str(Path(torch.__file__).parent)
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not frame.filename.startswith(torch_dir)]
    if not frames or frames[-1].filename == __file__:
        return ""
    frame = frames[-1]
    return f"\n(raised in {frame.filename}, line {frame.lineno}, in {frame.name}: {frame.line})"


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
