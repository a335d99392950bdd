"""The call contract: flatten and check a call's arguments against what was
compiled, give compiled code the memory layout it was compiled for, and rebuild
the module's output structure.

Compiled code checks nothing itself: a wrong dtype gives garbage, a wrong size
a bare AssertionError or a crash. Every check here names the model, the input,
what was expected and what was given.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._arrays import ArrayKind
from ._schema import CallInputs, DimRecord, InputLeaf, TreeSpec


class CallContract:
    """One model's input contract, prepared once at load, so that a call that
    meets it costs a few comparisons per input (the C++ form's whole graph is
    100-200 us at batch 1, and each microsecond here is on top of it). A call
    that does not meet it, or whose tree is not flat, takes the general path:
    `flatten_call` and `check_inputs` name what differs, `conform_layouts`
    copies a view into the layout compiled for. The fast path only ever
    decides that nothing differs."""

    def __init__(self, name: str, inputs: CallInputs, dims: dict[str, DimRecord], kind: ArrayKind) -> None:
        self.name, self._inputs, self._dims, self._kind = name, inputs, dims, kind
        arg_spec, kwarg_spec = inputs["tree"]["children"]
        self._arity, self._keys = len(arg_spec["children"]), kwarg_spec.get("keys", [])
        self._keyword_constants = {leaf["name"]: leaf["value"] for leaf in inputs["leaves"] if "value" in leaf and leaf["name"] in self._keys}
        self._bounds = {dim: (record["min"], record["max"]) for dim, record in dims.items()}
        self._tensors = [
            (
                index,
                kind.dtype(leaf["dtype"]),
                tuple(leaf["shape"]),
                leaf.get("below"),
                kind.layout(leaf.get("layout")),
                f"model {name!r}, input {leaf['name']}",  # what an index error names
            )
            for index, leaf in enumerate(inputs["leaves"])
            if "dtype" in leaf and leaf["device"] == "cpu"
        ]
        self._constants = [(index, leaf["value"]) for index, leaf in enumerate(inputs["leaves"]) if "value" in leaf]
        flat = all(child["type"] == "leaf" for child in [*arg_spec["children"], *kwarg_spec["children"]])
        self._fast = flat and len(self._tensors) + len(self._constants) == len(inputs["leaves"])

    @property
    def tree(self) -> TreeSpec:
        """The call's (args, kwargs) structure."""
        return self._inputs["tree"]

    def accept(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], list[Any], dict[str, int]]:
        """A call's flat inputs as given, the same in the layouts compiled for
        (the given list itself where nothing was copied), and the size of each
        dim. Raises ValueError (IndexError for index values) naming the input."""
        if self._keyword_constants:  # compiled-in keyword constants may be left out
            kwargs = {**self._keyword_constants, **kwargs}
        if self._fast and len(args) == self._arity and len(kwargs) == len(self._keys):
            try:
                given = [*args, *[kwargs[key] for key in self._keys]]
            except KeyError:  # the general path names it
                given = []
            sizes = self._sizes(given) if given else None
            if sizes is not None:
                return given, given, sizes
        given = flatten_call(self.name, self._inputs["tree"], args, kwargs)
        sizes = check_inputs(self.name, self._inputs["leaves"], self._dims, given, self._kind)
        return given, conform_layouts(self._inputs["leaves"], given, self._kind), sizes

    def _sizes(self, given: list[Any]) -> dict[str, int] | None:
        """The dims' sizes where every input meets its spec as compiled, else None."""
        sizes: dict[str, int] = {}
        fits, has_values = self._kind.fits, self._kind.has_values
        for index, dtype, shape, below, layout, where in self._tensors:
            value = given[index]
            if not fits(value, dtype, layout):
                return None
            got = value.shape
            if len(got) != len(shape):
                return None
            for want, size in zip(shape, got):
                if isinstance(want, int):
                    if size != want:
                        return None
                elif want in sizes:
                    if sizes[want] != size:
                        return None
                else:
                    low, high = self._bounds[want]
                    if not low <= size <= high:
                        return None
                    sizes[want] = size
            if below is not None and has_values(value):
                _check_index_values(where, value, below, self._kind)
        for index, constant in self._constants:
            if type(given[index]) is not type(constant) or given[index] != constant:
                return None
        return sizes


def flatten_call(name: str, tree: TreeSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """Flatten (args, kwargs) along the spec recorded at build time, naming what differs."""
    arg_spec, kwarg_spec = tree["children"]
    if len(args) != len(arg_spec["children"]):
        raise ValueError(f"model {name!r}: expected {len(arg_spec['children'])} positional argument(s), got {len(args)}")
    expected = set(kwarg_spec.get("keys", []))
    if set(kwargs) != expected:
        missing, unexpected = sorted(expected - set(kwargs)), sorted(set(kwargs) - expected)
        raise ValueError(f"model {name!r}: keyword arguments differ from the compiled signature: missing {missing or 'none'}, unexpected {unexpected or 'none'}")
    leaves: list[Any] = []
    _flatten(name, (args, kwargs), tree, "", leaves)
    return leaves


def _flatten(name: str, value: Any, spec: TreeSpec, path: str, leaves: list[Any]) -> None:
    kind = spec["type"]
    if kind == "leaf":
        leaves.append(value)
    elif kind in ("dict", "keyed"):
        if not hasattr(value, "keys") or set(value.keys()) != set(spec["keys"]):
            raise ValueError(f"model {name!r}: input {path or 'kwargs'} must be a mapping with keys {spec['keys']}")
        for key, child in zip(spec["keys"], spec["children"]):
            _flatten(name, value[key], child, f"{path}[{key!r}]", leaves)
    else:
        container = list if kind == "list" else tuple
        if not isinstance(value, container) or len(value) != len(spec["children"]):
            raise ValueError(f"model {name!r}: input {path or 'args'} must be a {kind} of {len(spec['children'])} item(s)")
        for i, (item, child) in enumerate(zip(value, spec["children"])):
            _flatten(name, item, child, f"{path}[{i}]", leaves)


def check_inputs(name: str, specs: list[InputLeaf], dims: dict[str, DimRecord], values: list[Any], kind: ArrayKind) -> dict[str, int]:
    """Check each flat input against its spec; return the size of each dim."""
    sizes: dict[str, tuple[int, str]] = {}
    for spec, value in zip(specs, values):
        where = f"model {name!r}, input {spec['name']}"
        if "value" in spec:
            if value != spec["value"] or type(value) is not type(spec["value"]):
                raise ValueError(f"{where}: compiled for the constant {spec['value']!r}, got {value!r}")
            continue
        if not isinstance(value, kind.array_type):
            raise ValueError(f"{where}: expected {kind.WHAT}, got {type(value).__name__}")
        problem = kind.dtype_problem(value, spec["dtype"])
        if problem:
            raise ValueError(f"{where}: {problem}")
        if kind.device(value) != spec["device"]:
            raise ValueError(f"{where}: expected a tensor on {spec['device']}, got one on {value.device}")
        shape = spec["shape"]
        if value.ndim != len(shape):
            raise ValueError(f"{where}: expected {len(shape)} dimensions {shape}, got shape {list(value.shape)}")
        for axis, (want, got) in enumerate(zip(shape, value.shape)):
            if isinstance(want, int):
                if got != want:
                    raise ValueError(f"{where}: expected size {want} at dim {axis} (shape {shape}), got {list(value.shape)}")
                continue
            low, high = dims[want]["min"], dims[want]["max"]
            if not low <= got <= high:
                raise ValueError(f"{where}: dim {want!r} (dim {axis}) must be in [{low}, {high}], got {got}")
            first = sizes.setdefault(want, (got, spec["name"]))
            if first[0] != got:
                raise ValueError(f"{where}: dim {want!r} is {got} here but {first[0]} in input {first[1]}")
        if "below" in spec and kind.has_values(value):
            _check_index_values(where, value, spec["below"], kind)
    return {dim: size for dim, (size, _) in sizes.items()}


def _check_index_values(where: str, value: Any, below: int, kind: ArrayKind) -> None:
    """The graph indexes a size with this input's values (a token id into an
    embedding table, a position into a KV cache): compiled code checks the
    index inside a parallel loop, where a failed check ends the process, so the
    values are checked here (`worker/index_bounds.py`)."""
    low, high = kind.value_range(value)
    if low < 0 or high >= below:
        raise IndexError(
            f"{where}: holds {low}..{high}, but the model indexes a size of {below} with it, so its values must be in "
            f"[0, {below - 1}] (a position past the cache's length, a token id past the vocabulary?)"
        )


def conform_layouts(specs: list[InputLeaf], values: list[Any], kind: ArrayKind) -> list[Any]:
    """The arrays in the dtype and memory layout the graph was compiled for.
    Compiled code asserts exact strides, so a transposed, sliced or expanded view
    (which the eager module accepts) is copied into that layout first, as is a
    NumPy array of another byte order, or of an integer dtype narrower than the
    one compiled for; arrays already so pass through untouched. (Strides of
    size-1 dims are ignored by both `is_contiguous` and the compiled code's own
    assertions.)"""
    return [given if "value" in spec else kind.conformed(given, spec["dtype"], kind.layout(spec.get("layout"))) for spec, given in zip(specs, values)]


def given_back(outputs: Any, conformed: list[Any], given: list[Any]) -> Any:
    """The outputs, where one is an input the module returns as it is (a library
    module returning its features), as the caller's own tensor rather than the
    copy `conform_layouts` made of it: what eager returns."""
    copies = {id(copy): original for copy, original in zip(conformed, given) if copy is not original}
    return [copies.get(id(output), output) for output in outputs] if copies else outputs


def unflatten(spec: TreeSpec, leaves: Any, classes: bool) -> Any:
    """Rebuild the module's output structure. With `classes`, named tuples and
    library output classes (transformers' ModelOutput) are imported by name and
    rebuilt; without, or if that import fails, the caller gets a tuple (named
    tuples) or a dict (keyed classes) with the same contents."""
    kind = spec["type"]
    if kind == "leaf":
        return next(leaves)
    children = [unflatten(child, leaves, classes) for child in spec["children"]]
    if kind in ("dict", "keyed"):
        values = dict(zip(spec["keys"], children))
        cls = _output_class(spec) if kind == "keyed" and classes else None
        return cls(**values) if cls is not None else values
    if kind == "namedtuple":
        cls = _output_class(spec) if classes else None
        return cls(*children) if cls is not None else tuple(children)
    return tuple(children) if kind == "tuple" else children


_output_classes: dict[str, Any] = {}


def _output_class(spec: TreeSpec) -> Any:
    if spec["class"] not in _output_classes:
        try:
            _output_classes[spec["class"]] = import_object(spec["class"])
        except (ImportError, AttributeError):
            _output_classes[spec["class"]] = None
    return _output_classes[spec["class"]]


def import_object(spec: str) -> Any:
    """The object named by "module:attribute.path". The build imports factories
    and callables through this too (worker/capture.py)."""
    module_name, _, attribute = spec.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise AttributeError(f"{getattr(target, '__name__', target)!r} has no attribute {part!r}")
        target = getattr(target, part)
    return target
