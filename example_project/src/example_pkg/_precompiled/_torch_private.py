"""Every use of torch's private internals, in one place.

hatch-precompile copies this file into wheels next to the loader, and the build
side imports it too, so a torch upgrade touches only this module.
`tests/test_torch_assumptions.py` checks each assumption below against the
installed torch and fails loudly when one stops holding.

What it relies on (measured on torch 2.13):
- The artifact file written by `AOTCompiledArtifact.save(format="binary")` is
  `torch.utils._appending_byte_serializer` framing: a big-endian crc32 of the rest,
  then fields each prefixed by a big-endian u64 length: the header
  b"AOTCompiledArtifact", `torch_key()` (32 bytes), the pickled bundle.
  We parse it ourselves: torch's reader checks the key inside `assert`s, which
  `python -O` strips (the reader then falls out of step), and it reports damage
  as a bare AssertionError.
- `AOTCompiledArtifact.deserialize(payload)` turns the bundle back into a callable
  taking the graph's flat inputs (lifted weights first, then user inputs) and
  returning a flat list of tensors.
- On an export graph, `standalone_compile(dynamic_shapes="from_graph")` looks for
  the fake mode under `node.meta["example_value"]` of the outputs, while export
  stores its fakes under `meta["val"]`. Copying them across makes the compile use
  export's ShapeEnv, so exactly the export Dims are symbolic; without it every
  size of every input, weights included, becomes symbolic.
- Inductor loads each compiled CPU kernel through
  `CppPythonBindingsCodeCache.load_pybinding_async(argtypes, main_code, ...,
  kernel_code=...)`, which compiles the source with the local C++ compiler and
  returns a thunk giving the extension's entry function. Loading an artifact
  calls it again with the same source, and compiles again, for the running CPU
  (not the one the source was generated for: an AVX2 kernel rebuilt for AVX512
  corrupts memory). We key each kernel by what the artifact itself supplies
  (argument types and source), keep the `.so` built at compile time, and at load
  answer that call with the shipped `.so`, loaded by the class's own
  `_load_library` (it sets the environment variable the extension's init reads).
  The parameters changed across releases, so arguments are bound by name.
- `torch._inductor.cpu_vec_isa.pick_vec_isa()` under `config.cpp.simdlen`
  names the vector ISA a compile targets, with the compiler flags it adds.
- `torch.utils._pytree.tree_leaves` flattens in the order export's call spec
  uses, and its `TreeSpec` exposes `type`, `context`, `is_leaf()` and `children()`.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

ARTIFACT_HEADER = b"AOTCompiledArtifact"
_CRC_SIZE = 4
_LENGTH_SIZE = 8


class ArtifactFormatError(ValueError):
    """The artifact file is damaged or is not an AOTCompiledArtifact."""


def split_artifact(data: bytes) -> tuple[bytes, bytes]:
    """Return (torch_key, pickled bundle) of an artifact file, checking its framing."""
    if len(data) < _CRC_SIZE:
        raise ArtifactFormatError(f"file is {len(data)} bytes long, too short for an artifact")
    if zlib.crc32(data[_CRC_SIZE:]).to_bytes(_CRC_SIZE, "big") != data[:_CRC_SIZE]:
        raise ArtifactFormatError("checksum mismatch: the file is truncated or corrupted")
    fields = []
    offset = _CRC_SIZE
    while offset < len(data):
        if offset + _LENGTH_SIZE > len(data):
            raise ArtifactFormatError("a field's length is cut off: the file is truncated")
        size = int.from_bytes(data[offset : offset + _LENGTH_SIZE], "big")
        offset += _LENGTH_SIZE
        if offset + size > len(data):
            raise ArtifactFormatError("a field runs past the end of the file: the file is truncated")
        fields.append(data[offset : offset + size])
        offset += size
    if len(fields) != 3 or fields[0] != ARTIFACT_HEADER:
        raise ArtifactFormatError(f"expected the fields [{ARTIFACT_HEADER!r}, torch key, bundle]")
    return fields[1], fields[2]


def deserialize_artifact(payload: bytes) -> Callable[..., list[Any]]:
    """Unpickle an artifact's bundle into its compiled callable (runs code from the file)."""
    from torch._inductor.standalone_compile import AOTCompiledArtifact

    return AOTCompiledArtifact.deserialize(payload)


def torch_key() -> bytes:
    """The hash torch writes into every artifact: torch's version and module bytes."""
    from torch._inductor.codecache import torch_key as key

    return key()


def kernel_key(arguments: dict[str, Any]) -> str:
    """A kernel's identity, from the arguments of `load_pybinding_async` that the
    artifact supplies (never from compiler flags, which hold local paths)."""
    identity = [
        list(arguments["argtypes"]),
        arguments["main_code"],
        arguments["kernel_code"],
        arguments["num_outputs"],
        arguments["device_type"],
        list(arguments["extra_flags"]),
    ]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:40]


def _bind(signature: inspect.Signature, cls: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = signature.bind(cls, *args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def _kernel_loader() -> tuple[Any, Callable[..., Any], inspect.Signature]:
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    original = CppPythonBindingsCodeCache.__dict__["load_pybinding_async"].__func__
    return CppPythonBindingsCodeCache, original, inspect.signature(original)


@contextlib.contextmanager
def shipped_kernels(kernels: dict[str, Path]) -> Iterator[None]:
    """While active, compiled CPU kernels come from `kernels` (key -> `.so`), never
    from a compiler. A kernel not in `kernels` raises `MissingKernelError`."""
    cls, original, signature = _kernel_loader()

    def load_shipped(loader_cls: Any, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        key = kernel_key(_bind(signature, loader_cls, args, kwargs))
        if key not in kernels:
            raise MissingKernelError(f"compiled kernel {key} is not shipped with this artifact (refusing to compile it here)")
        library = loader_cls._load_library(str(kernels[key]), f"hatch_precompile_{key}")
        entry = getattr(library, loader_cls.entry_function)
        return lambda: entry

    cls.load_pybinding_async = classmethod(load_shipped)
    try:
        yield
    finally:
        cls.load_pybinding_async = classmethod(original)


class MissingKernelError(RuntimeError):
    """The artifact asked for a compiled kernel the wheel does not carry."""


# --- Build side only -------------------------------------------------------------


@contextlib.contextmanager
def captured_kernels() -> Iterator[dict[str, Callable[[], str]]]:
    """While active, record every CPU kernel inductor builds: key -> thunk giving
    the path of its compiled `.so` (call it once compilation has finished)."""
    cls, original, signature = _kernel_loader()
    built: dict[str, Callable[[], str]] = {}

    def record(loader_cls: Any, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        key = kernel_key(_bind(signature, loader_cls, args, kwargs))
        get_entry = original(loader_cls, *args, **kwargs)
        built[key] = lambda: get_entry().__self__.__file__  # the entry function's module
        return get_entry

    cls.load_pybinding_async = classmethod(record)
    try:
        yield built
    finally:
        cls.load_pybinding_async = classmethod(original)


def vector_isa(simdlen: int) -> tuple[str, str]:
    """(name, compiler flags) of the vector ISA inductor picks for `simdlen` bits here."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    with config.patch({"cpp.simdlen": simdlen}):
        isa = pick_vec_isa()
    if not isa:
        return "", ""
    return str(isa), isa.build_arch_flags()



def compile_exported(exported: Any, inductor_config: dict[str, Any]) -> Any:
    """Compile a `torch.export` program with `standalone_compile(aot=True)`.

    Returns the AOTCompiledArtifact. Exactly the export Dims stay dynamic.
    """
    import torch

    graph_module = exported.graph_module
    fake_inputs = [node.meta["val"] for node in graph_module.graph.nodes if node.op == "placeholder"]
    output_node = next(iter(reversed(graph_module.graph.nodes)))
    for node in output_node.args[0]:
        if isinstance(node, torch.fx.Node) and "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]
    with torch.no_grad():
        return torch._inductor.standalone_compile(
            graph_module,
            fake_inputs,
            dynamic_shapes="from_graph",
            options={"config_patches": dict(inductor_config)},
            aot=True,
        )


def save_artifact(artifact: Any, path: str) -> None:
    artifact.save(path=path, format="binary")


def tree_leaves(tree: Any) -> list[Any]:
    """Flatten nested inputs or outputs in the order the compiled graph uses."""
    from torch.utils._pytree import tree_leaves as leaves

    return leaves(tree)


def treespec_to_json(spec: Any) -> dict[str, Any]:
    """A pytree spec as plain data: tuple, list and dict nodes around tensor leaves;
    named tuples and classes flattened by key (transformers' ModelOutput) by the
    import path of their class."""
    from collections import namedtuple

    if spec.is_leaf():
        return {"type": "leaf"}
    children = [treespec_to_json(c) for c in spec.children()]
    kind = {tuple: "tuple", list: "list", dict: "dict"}.get(spec.type)
    if kind == "dict":
        return {"type": kind, "keys": list(spec.context), "children": children}
    if kind is not None:
        return {"type": kind, "children": children}
    if spec.type is namedtuple:  # torch records the named tuple's class as the context
        return {"type": "namedtuple", "class": _import_path(spec.context), "children": children}
    if isinstance(spec.context, (list, tuple)) and all(isinstance(key, str) for key in spec.context):
        return {"type": "keyed", "class": _import_path(spec.type), "keys": list(spec.context), "children": children}
    raise TypeError(
        f"{_import_path(spec.type)} in inputs or outputs is not supported yet; "
        "use tuples, lists, dicts, named tuples and tensors"
    )


def _import_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
