"""What the C++ compiler builds: the kernels (recorded, built against the stable
ABI, without paths of this build), the precompiled headers and the vector-ISA probes.

What it relies on (measured on torch 2.13; `tests/test_torch_assumptions.py`
checks each):
- `CppPythonBindingsCodeCache.load_pybinding_async` is where every CPU kernel is
  compiled; recording its arguments and result gives each kernel's key and `.so`.
  Inductor's output module asks for a kernel with
  `async_compile.cpp_pybinding(argtypes, source)`, which passes every other
  argument at its default (so `pybinding_kernel_key` finds the same key).
- `torch._inductor.cpu_vec_isa.pick_vec_isa()` under `config.cpp.simdlen`
  names the vector ISA a compile targets, with the compiler flags it adds.
- Which vector ISAs are usable is decided once per process by
  `cpu_vec_isa.valid_vec_isa_list()` (a `functools.cache`): for each ISA the
  CPU's flags list, it compiles a test program into inductor's cache folder
  (`runtime.cache_dir_utils.cache_dir()`, which reads `TORCHINDUCTOR_CACHE_DIR`
  at each call) under a name that hashes the compiler's version, the ISA's flags
  and torch's version, and skips the compile where that file exists (a child
  Python then only `dlopen`s it). Each build has an inductor cache of its own,
  so each compiled the probes again: 9.5 s here for AVX-512 VNNI, AVX-512 and
  AVX2. `vector_isa` runs them before a worker's first compile (none, where
  every artifact comes from a cache) with that folder set to the one
  `compiler_outputs_in` names, which the build cache keeps.
- Reproducible kernels. In a kernel, `__FILE__` names torch's headers and the source file, which the cache names by a hash of
  the command line (absolute paths); `extra_flags` reach every compiler call but
  the precompiled header's (`config.cpp_cache_precompile_headers`). Kernels
  spend most of their compile parsing that header (3.2 of 3.6 s for one kernel),
  so the build uses it. `CppCodeCache.load_async` gets it from the module global
  `codecache._precompile_header(header, hashable_cmd_line, **compile_command)`,
  the path to `-include` (the `.gch` beside it), even when the kernel's `.so` is
  already built; `cpp_builder.CppTorchDeviceOptions(**compile_command,
  precompiling=True)`, whose `_passthrough_args` reach the command line, with
  `CppBuilder` builds `<source>.gch`. The build supplies its own
  (`precompiled_headers_in`), with the path map added.
- The Python binding inductor appends to each kernel's `main_code`
  (`CppPythonBindingsCodeCache.suffix_template`) includes `Python.h` itself, after
  the code it is given, and uses only the stable ABI (the limited API of 3.11:
  `PyTuple_CheckExact`, `PyLong_AsSsize_t`, `PyModule_Create`, ...) but, in 2.13,
  for two macros, `PyTuple_GET_ITEM` and `PyTuple_GET_SIZE`, whose stable-ABI
  functions (`PyTuple_GetItem`, `PyTuple_Size`) take the same arguments (2.15's
  binding takes METH_FASTCALL arguments and uses neither). The kernel code
  and the precompiled header (`cpp_prefix.h`) include no Python header. So a
  kernel whose `main_code` starts with `STABLE_ABI_PRELUDE` is built against the
  limited API: the compile itself fails if the binding uses anything else, and
  the `.so` loads in every CPython from the one it was built with.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ...runtime._cache import inductor_cache_in
from ...runtime._torch_private import bind_arguments, kernel_key

_TORCH_DIR = os.path.dirname(torch.__file__)


# `__FILE__` of torch's headers as `torch/...`, for the kernels and the precompiled header alike.
TORCH_PATH_MAP = shlex.quote(f"-ffile-prefix-map={_TORCH_DIR}=torch")


_compiler_outputs: list[Path] = []  # the innermost `compiler_outputs_in`'s folder last


@contextlib.contextmanager
def compiler_outputs_in(folder: Path) -> Iterator[None]:
    """While active, what the C++ compiler builds for every model alike is kept
    in `folder`, which builds share when it is in the build cache: the
    vector-ISA probes (`probe_vector_isas_in`, run by the first `vector_isa`)
    and the precompiled headers (`precompiled_headers_in`, for each compile
    under `captured_kernels`). Entering it imports nothing of inductor: a worker
    whose artifacts all come from a cache compiles no probe, and one whose model
    fails before compiling (an import, a capture) never imports the compiler,
    which costs about 3 s of CPU here (7 s where Python's bytecode cache is off)."""
    _compiler_outputs.append(folder)
    try:
        yield
    finally:
        _compiler_outputs.pop()


def probe_vector_isas_in(folder: Path) -> None:
    """Decide now, for this process, which vector ISAs inductor may use, with
    the test programs its probes compile kept in `folder`: a later process given
    the same folder, with the same compiler and torch, compiles none of them.
    Where the probes fail (no working compiler), nothing is decided: the first
    compile probes again and reports the failure for its model."""
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    with inductor_cache_in(folder), contextlib.suppress(Exception):  # say, no working compiler: see above
        valid_vec_isa_list()


@contextlib.contextmanager
def precompiled_headers_in(folder: Path) -> Iterator[None]:
    """While active, inductor's precompiled headers are kept in `folder`, named by
    what decides their bytes, and built with `__FILE__` of torch's headers
    relative to torch, as the kernels are (`_shipped_kernel_arguments`): a kernel that
    includes one gets its strings from it.

    Inductor's own `_precompile_header` names a header by a hash of its command
    line and of the preprocessed header, both of which hold torch's absolute
    path, and keeps it under /tmp/torchinductor_<user>: every isolated build
    environment compiled a new 156 MB header (9 s here) and left it there. Here
    the name hashes the command line with torch's folder taken out, the torch
    build and the compiler's version, so builds in any environment of the same
    torch share one header, in the build cache."""
    from torch._inductor import codecache

    original = codecache._precompile_header
    codecache._precompile_header = functools.cache(functools.partial(_precompiled_header, folder))
    try:
        yield
    finally:
        codecache._precompile_header = original


def _precompiled_header(folder: Path, header: str, hashable_cmd_line: str, **compile_command: Any) -> str:
    """What `codecache._precompile_header(header, hashable_cmd_line, **compile_command)`
    returns: the path to `-include`, with the `.gch` beside it built if missing."""
    from torch._inductor.cpp_builder import CppBuilder, CppTorchDeviceOptions, get_compiler_version_info
    from torch.utils._filelock import FileLock

    compile_command.pop("extra_flags", None)  # link inputs, which a header compile rejects (as torch does)
    options = CppTorchDeviceOptions(**compile_command, precompiling=True)
    options._passthrough_args.append(TORCH_PATH_MAP)
    own_line = CppBuilder(name="h", sources="h.h", BuildOption=options).get_command_line()
    identity = "\0".join(
        (
            header,
            hashable_cmd_line.replace(_TORCH_DIR, "torch"),  # the including compiles' flags must match
            own_line.replace(_TORCH_DIR, "torch"),
            torch.__version__,
            torch.version.git_version,
            get_compiler_version_info(options.get_compiler()),
        )
    )
    path = folder / f"{hashlib.sha256(identity.encode()).hexdigest()[:40]}.h"
    if not Path(f"{path}.gch").exists():
        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock"):
            if not Path(f"{path}.gch").exists():
                path.write_text(f"#include <{header}>\n")
                with tempfile.TemporaryDirectory(dir=folder) as scratch:  # a killed compile leaves no half header
                    source = Path(scratch) / path.name
                    source.write_text(f"#include <{header}>\n")
                    CppBuilder(name=str(source), sources=str(source), BuildOption=options).build()
                    os.replace(f"{source}.gch", f"{path}.gch")
    return str(path)


@contextlib.contextmanager
def captured_kernels() -> Iterator[dict[str, Callable[[], str]]]:
    """While active, record every CPU kernel inductor builds: key -> thunk giving
    the path of its compiled `.so` (call it once compilation has finished).
    Within `compiler_outputs_in`, the kernels use its precompiled headers."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache as cls

    original = cls.__dict__["load_pybinding_async"].__func__
    signature = inspect.signature(original)
    built: dict[str, Callable[[], str]] = {}

    def record(loader_cls: Any, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        arguments = bind_arguments(signature, loader_cls, args, kwargs)
        key = kernel_key(arguments)
        get_entry: Callable[[], Any] = original(**_shipped_kernel_arguments(arguments, key))
        built[key] = lambda: get_entry().__self__.__file__  # the entry function's module
        return get_entry

    with contextlib.ExitStack() as headers:
        if _compiler_outputs:
            headers.enter_context(precompiled_headers_in(_compiler_outputs[-1] / "headers"))
        cls.load_pybinding_async = classmethod(record)  # type: ignore[method-assign,assignment]  # restored below
        try:
            yield built
        finally:
            cls.load_pybinding_async = classmethod(original)  # type: ignore[method-assign,assignment]


# Builds a kernel's binding against the stable ABI of this CPython and later ones
# (3.11: 0x030B0000); the two macros outside it become the functions that are in it.
STABLE_ABI_PRELUDE = f"#define Py_LIMITED_API 0x{sys.version_info.major:02X}{sys.version_info.minor:02X}0000\n#define PyTuple_GET_ITEM PyTuple_GetItem\n#define PyTuple_GET_SIZE PyTuple_Size\n"


def _shipped_kernel_arguments(arguments: dict[str, Any], key: str) -> dict[str, Any]:
    """`load_pybinding_async` arguments that build the same kernel as a stable-ABI
    extension (`STABLE_ABI_PRELUDE`) with no path of this build in it: `__FILE__`
    of torch's headers relative to torch, the source's `__FILE__` named after the
    kernel's key (the cache names the file by a hash of the command line, which
    holds absolute paths), and no symbol table or debug info (they name that file
    and the cache)."""
    flags = (TORCH_PATH_MAP, "-s")
    arguments = {**arguments, "extra_flags": (*arguments["extra_flags"], *flags)}
    arguments["main_code"] = STABLE_ABI_PRELUDE + f'#line 1 "{key}.cpp"\n' + arguments["main_code"]
    if arguments["kernel_code"] is not None:
        arguments["kernel_code"] = f'#line 1 "{key}.kernel.cpp"\n' + arguments["kernel_code"]
    return arguments


def pybinding_kernel_key(argtypes: list[str], source: str) -> str:
    """The key of the kernel an output module's `cpp_pybinding(argtypes, source)` loads."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache as cls

    signature = inspect.signature(cls.__dict__["load_pybinding_async"].__func__)
    return kernel_key(bind_arguments(signature, cls, (argtypes, source), {}))


def vector_isa(simdlen: int) -> tuple[str, str]:
    """(name, compiler flags) of the vector ISA inductor picks for `simdlen` bits
    here; called before each compile, so it runs the probes first."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    if _compiler_outputs:
        probe_vector_isas_in(_compiler_outputs[-1] / "vector-isa")  # once: valid_vec_isa_list is cached after it succeeds
    with config.patch({"cpp.simdlen": simdlen}):
        isa = pick_vec_isa()
    if not isa:
        return "", ""
    return str(isa), isa.build_arch_flags()
