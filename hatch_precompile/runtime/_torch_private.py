"""The loader's uses of torch's private internals, in one place.

hatch-precompile copies this file into wheels with the loader; the build side's
own uses are in `hatch_precompile/worker/torch_internals/`, which does not ship. A
torch upgrade touches only this module and that package, and
`tests/test_torch_assumptions.py` checks each assumption below against the
installed torch, failing loudly when one stops holding.

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
- Inductor loads each compiled CPU kernel through
  `CppPythonBindingsCodeCache.load_pybinding_async(argtypes, main_code, ...)`,
  which would compile the source with the local C++ compiler, for the running CPU.
  We key each kernel by what the artifact itself supplies (`kernel_key`), and
  answer that call with the `.so` the build shipped. The parameters changed
  across releases, so arguments are bound by name.
- A compiled kernel is a CPython extension whose init function is
  `PyInit_kernel` (so its module name must end in `.kernel`), whose entry
  function is `kernel`, and whose init reads the address of
  `torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr` from the
  environment variable `_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR`.
- The lean form: what a CPU artifact runs is inductor's output module, plain
  Python that defines `call(args) -> tuple` (it empties the list it is given).
  Its only compiler imports are `AsyncCompile` (its `cpp_pybinding` returns the
  kernels, `wait(globals())` waits for them) and `extern_kernels` (matrix products,
  which are the torch functions of the same name), from torch 2.14 on
  `torch._inductor.runtime.runtime_utils.assert_tensor_metadata` (the dtype,
  size and stride check of a fallback op's output; `assert_tensor_metadata`
  below is a copy), plus three names that are unused unless optional inductor
  features are on. The build rewrites those
  imports and each `cpp_pybinding` call (`hatch_precompile/worker/lean.py`); the loader
  binds the names in `LEAN_BINDINGS`. Everything else the module uses comes from
  `import torch` itself (`torch._C._dynamo.guards` helpers, `torch.ops.inductor`).
- An int8 variant's output module declares its frozen constants as globals
  (`name = None  # <device> <dtype> <size> <stride> <address>`), which inductor
  binds after loading it, and calls oneDNN's int8 ops (`torch.ops.onednn.
  qlinear_pointwise`, `qconv_pointwise`), which torch registers. Its packed
  weights are rebuilt by `torch.ops.onednn.qlinear_prepack(weight, x_shape)`
  and `qconv_prepack(weight, w_scales, x_scale, x_zp, stride, padding,
  dilation, groups, x_shape)` (`PREPACK_OPS`), the calls the build recorded.
- The C++ form: `torch._C._aoti.AOTIModelContainerRunnerCpu(path, 1)` loads an
  AOTInductor model container library (`dlopen`, no compiler, neither
  `torch._inductor` nor `torch._dynamo` imported);
  `get_constant_names_to_original_fqns()` names every constant it reads;
  `update_constant_buffer(map,
  use_inactive=False, validate_full_updates=True, user_managed=True)` binds
  every constant to the given tensor without a copy (a missing one is a
  RuntimeError), and `run(tensors)` takes the graph's tensor inputs and returns
  its user outputs, having updated the state (bound constants) in place. Each
  runner is a container of its own, so each binds its own state.
- The NumPy path, without torch's Python: `libtorch_cpu.so` exports
  `at::set_num_threads(int)` (`_ZN2at15set_num_threadsEi`, Itanium C++ ABI),
  which `torch.set_num_threads` calls; the shim has no C function for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import os
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ARTIFACT_HEADER = b"AOTCompiledArtifact"
_CRC_SIZE = 4
_LENGTH_SIZE = 8

KERNEL_ENTRY = "kernel"  # CppPythonBindingsCodeCache.entry_function
KERNEL_INIT_VARIABLE = "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"

# The names a lean module expects the loader to bind, and how it uses them.
LEAN_BINDINGS = (
    "AsyncCompile",  # async_compile = AsyncCompile(); async_compile.wait(globals())
    "extern_kernels",  # extern_kernels.addmm(..., out=buf): torch.addmm
    "shipped_kernel",  # name = shipped_kernel("<key>"): written by the build for each cpp_pybinding
    "assert_tensor_metadata",  # torch >= 2.14: checks a fallback op's output (assert_tensor_metadata below)
)


# The ops that rebuild an int8 variant's packed weights; any other in a manifest is refused.
PREPACK_OPS = ("onednn.qlinear_prepack", "onednn.qconv_prepack")


class ArtifactFormatError(ValueError):
    """The artifact file is damaged or is not an AOTCompiledArtifact."""


class MissingKernelError(RuntimeError):
    """The artifact asked for a compiled kernel the wheel does not carry."""


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
    """Unpickle an artifact's bundle into its compiled callable (runs code from the
    file, and imports torch._inductor)."""
    from torch._inductor.standalone_compile import AOTCompiledArtifact

    return AOTCompiledArtifact.deserialize(payload)


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


def load_kernel(path: Path, key: str) -> Callable[..., Any]:
    """The entry function of a shipped kernel extension, loaded without inductor.
    Raises ImportError (the dynamic loader's message) if it cannot be loaded."""
    import torch

    os.environ[KERNEL_INIT_VARIABLE] = str(torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr)  # type: ignore[attr-defined]  # not in torch's stubs
    module_name = f"hatch_precompile_{key}.{KERNEL_ENTRY}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[module_name] = module
    entry: Callable[..., Any] = getattr(module, KERNEL_ENTRY)
    return entry


@contextlib.contextmanager
def shipped_kernels(kernels: dict[str, Path]) -> Iterator[None]:
    """While active, compiled CPU kernels come from `kernels` (key -> `.so`), never
    from a compiler. A kernel not in `kernels` raises `MissingKernelError`."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache as cls

    original = cls.__dict__["load_pybinding_async"].__func__
    signature = inspect.signature(original)

    def load_shipped(loader_cls: Any, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        key = kernel_key(bind_arguments(signature, loader_cls, args, kwargs))
        if key not in kernels:
            raise MissingKernelError(f"compiled kernel {key} is not shipped with this artifact (refusing to compile it here)")
        entry = load_kernel(kernels[key], key)
        return lambda: entry

    cls.load_pybinding_async = classmethod(load_shipped)  # type: ignore[method-assign,assignment]  # restored below
    try:
        yield
    finally:
        cls.load_pybinding_async = classmethod(original)  # type: ignore[method-assign,assignment]


def bind_arguments(signature: inspect.Signature, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = signature.bind(cls, *args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


class _ReadyKernels:
    """Stands in for inductor's AsyncCompile in a lean module: the build replaced
    every kernel compile with `shipped_kernel(key)`, so there is nothing to wait for."""

    def wait(self, scope: dict[str, Any]) -> None:
        pass


def assert_tensor_metadata(tensor: Any, expected_size: tuple[Any, ...], expected_stride: tuple[Any, ...], expected_dtype: Any, op_name: str | None = None) -> None:
    """inductor's `torch._inductor.runtime.runtime_utils.assert_tensor_metadata`
    (torch 2.14, 2.15), without importing inductor: a fallback op's output has the
    dtype, sizes and strides the compile expected."""
    import torch

    if tensor is None:
        return
    if tensor.dtype != expected_dtype:
        raise RuntimeError(f"expected dtype {expected_dtype} but got {tensor.dtype}" + (f"\nError in op: {op_name}" if op_name else ""))
    torch._C._dynamo.guards.assert_size_stride(tensor, expected_size, expected_stride, op_name)


def run_lean_module(source: str, filename: str, extern_kernels: list[str], kernel: Callable[[str], Any], constants: dict[str, Any]) -> Callable[[list[Any]], tuple[Any, ...]]:
    """Execute a lean module's source with the loader's bindings; return its `call`.
    `kernel(key)` gives a shipped kernel's entry function; `extern_kernels` names
    the torch functions the module calls as `extern_kernels.<name>`; `constants`
    are an int8 variant's frozen globals, bound over the `None` it declares them as."""
    import torch

    namespace: dict[str, Any] = {
        "__name__": f"hatch_precompile_lean_{hashlib.sha256(filename.encode()).hexdigest()[:12]}",
        "__file__": filename,
        # exactly LEAN_BINDINGS, which the build leaves unbound (a test holds them equal)
        "AsyncCompile": _ReadyKernels,
        "extern_kernels": SimpleNamespace(**{name: getattr(torch, name) for name in extern_kernels}),
        "shipped_kernel": kernel,
        "assert_tensor_metadata": assert_tensor_metadata,
    }
    exec(compile(source, filename, "exec"), namespace)
    namespace.update(constants)
    call: Callable[[list[Any]], tuple[Any, ...]] = namespace["call"]
    return call


def prepack(op: str, arguments: list[Any]) -> Any:
    """Call one of `PREPACK_OPS` (by its "namespace.name")."""
    import torch

    if op not in PREPACK_OPS:
        raise ValueError(f"{op} is not an op this loader rebuilds packed weights with ({', '.join(PREPACK_OPS)})")
    namespace, name = op.split(".")
    return getattr(getattr(torch.ops, namespace), name)(*arguments)


def misaligned(tensor: Any) -> bool:
    """Whether inductor would copy this input before a call that checks alignment
    (`torch._inductor.utils.ALIGNMENT`, 16 bytes)."""
    return bool(tensor.data_ptr() % 16 != 0)


def load_container(path: Path) -> Any:
    """AOTInductor's model container in the library at `path` (its C++ runner, one
    model instance: concurrent calls on it wait for each other). Raises RuntimeError
    where the dynamic loader refuses the library."""
    import torch

    return torch._C._aoti.AOTIModelContainerRunnerCpu(str(path), 1)


def container_constant_names(container: Any) -> list[str]:
    """The names the container's library reads its constants by."""
    return list(container.get_constant_names_to_original_fqns())


def bind_constants(container: Any, constants: dict[str, Any]) -> None:
    """Make the container read its constants (every one, by its own name) from
    these tensors, without copying them (`user_managed`): the weights stay in the
    mapped file, and a state tensor it updates is the caller's."""
    container.update_constant_buffer(constants, False, True, True)  # use_inactive, validate_full_updates, user_managed


SET_NUM_THREADS_SYMBOL = "_ZN2at15set_num_threadsEi"  # at::set_num_threads(int)


def set_num_threads(libtorch_cpu: Any, count: int) -> None:
    """`torch.set_num_threads(count)` without torch's Python: the C++ function it
    calls, from the loaded `libtorch_cpu.so` (a ctypes.CDLL)."""
    import ctypes

    function = getattr(libtorch_cpu, SET_NUM_THREADS_SYMBOL)
    function.argtypes, function.restype = [ctypes.c_int], None
    function(count)
