"""The build's uses of torch's private internals, in one place.

The loader's own uses are in `runtime/_torch_private.py`, which ships in wheels;
this module does not. `tests/test_torch_assumptions.py` checks each assumption
below against the installed torch.

What it relies on (measured on torch 2.13):
- Decomposing an export graph with inductor's own table
  (`torch._inductor.decomposition.select_decomp_table()`) gives the graph inductor
  compiles anyway; export's default table fails on some models (transformers'
  GPT-2 `x.view(-1, x.size(-1))` with a dynamic batch and sequence). The table's
  functions reach into compiler modules by attribute, which works only once
  something has imported those modules (inductor's compile does; capture does
  not): `LAZY_DECOMPOSITION_MODULES` lists them (in 2.13-2.15 only
  `torch._inductor.lowering`, used by the max-pool decompositions); a test
  finds them by reading the table's source.
- On an export graph, `standalone_compile(dynamic_shapes="from_graph")` looks for
  the fake mode under `node.meta["example_value"]` of the outputs, while export
  stores its fakes under `meta["val"]`. Copying them across makes the compile use
  export's ShapeEnv, so exactly the export Dims are symbolic; without it every
  size of every input, weights included, becomes symbolic.
- `CppPythonBindingsCodeCache.load_pybinding_async` is where every CPU kernel is
  compiled; recording its arguments and result gives each kernel's key and `.so`.
  Inductor's output module asks for a kernel with
  `async_compile.cpp_pybinding(argtypes, source)`, which passes every other
  argument at its default (so `pybinding_kernel_key` finds the same key).
- A compiled artifact's `inner_fn.compiled_fn` is inductor's compiled graph: its
  `source_code` is the output module's text, `inputs_to_check` the inputs whose
  alignment its wrapper checks, `mutated_input_idxs` the inputs it mutates and
  `constants` the tensors frozen into it.
- State (`state.py`): a graph that ends by `aten.copy_` into an input (a buffer
  the forward updates) is compiled as an inference graph that mutates that
  input: AOTAutograd keeps the mutation in the graph, so the output module
  itself writes it and the runtime wrapper does nothing for it, and the
  compiled graph's `mutated_input_idxs` names those inputs. Inductor's
  reinplacing turns an `index_put` on the whole buffer, copied back into it,
  into an in-place write; through a slice of the buffer it does not
  (`tests/test_torch_assumptions.py` checks that no cache-sized temporary is
  allocated).
- A custom op defined in Python with `torch.library.custom_op` is in
  `torch._library.custom_ops.OPDEFS` under its qualified name, and the function
  it wraps (`_init_fn`) names the module that defines it.
- `torch._inductor.select_algorithm.extern_kernels.<name>`: the extern kernels the
  output module calls; we bind only those that are the torch function of the
  same name.
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
  AVX2. `compiler_outputs_in` runs them with that folder set to one the build
  cache keeps.
- A constraint violation from `torch.export.export` is a `torch._dynamo.exc.UserError`
  with `error_type` `UserErrorType.CONSTRAINT_VIOLATION`, whose `msg` (without
  the `draft_export()` advice `str()` adds) is what torch's public
  `refine_dynamic_shapes_from_suggested_fixes` reads. It maps each rejected Dim
  to an int (a constant), a Dim (a narrowed range, or the other Dim it must equal)
  or a `torch.export.dynamic_shapes._DerivedDim` whose `root` is a Dim and `fn`
  the increasing function `A * root + B`; other Dims come back as the same objects.
- `torch.utils._pytree.tree_leaves` flattens in the order export's call spec
  uses, and its `TreeSpec` exposes `type`, `context`, `is_leaf()` and `children()`.
- Reproducible builds. In an artifact, node `meta["stack_trace"]` (source
  paths) only feeds messages and the debug strings it pickles; the repro script
  `compile_fx` writes with `after_aot.save_graph_repro` copies the environment
  (`TORCHINDUCTOR_CACHE_DIR`) unless `stable_output=True`; the AOTAutograd entry
  (`inner_fn.compiled_fn.serialize()`) records the compile's duration in
  `forward_time_taken_ns` and `backward_time_taken_ns`. In a kernel, `__FILE__`
  names torch's headers and the source file, which the cache names by a hash of
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
- int8 (`worker/quantize.py`). A PT2E-converted graph compiles only with
  inductor's `freezing`, and only from the unlifted module (`convert_pt2e`'s
  GraphModule, weights as `get_attr`): on the lifted export program the
  prepack pass inserts `onednn.qlinear_prepack` on an input, which has no
  lowering. `compile_fx(gm, fakes, inner_compile=...)` compiles it; `fakes`
  are its placeholders' `meta["val"]`, export's FakeTensors, which keep
  export's ShapeEnv, so exactly the export Dims stay symbolic (real tensors
  give a static graph). Without the export's pytree codegen the compiled
  function takes the flat user inputs. The one `CompiledFxGraph` that
  `compile_fx_inner` returns has the output module's `source_code`; its
  `current_callable` runs in the loaded output module, whose globals hold the
  frozen constants under the names the module declares (`name = None  # ...`).
  Freezing's constant folding packs each int8 weight with
  `torch.ops.onednn.qlinear_prepack(w, x_shape)` or `qconv_prepack(w,
  w_scales, x_scale, x_zp, stride, padding, dilation, groups, x_shape)`
  (`PREPACK_OPS`), whose result is an opaque `torch._mkldnn` tensor that no
  file can hold; a `TorchFunctionMode` sees each call, so the loader can call
  it again. Since torch 2.14 the passes that insert those calls are torchao's,
  registered by importing its x86 inductor quantizer. That import also sets
  inductor's process-wide `config.pre_grad_custom_pass` (torchao 0.18:
  `quant_lift_up`), which `pre_grad_pass_kept` undoes, so that only int8
  compiles run it (as a config patch).
- One worker compiles several models. Process-wide counters number the graphs
  a process compiles, and reach the artifact: `AOT_COUNTER` in
  `torch._functorch.aot_autograd` (AOTAutograd's id, `# AOT ID: ['1_inference']`
  in the output module; decomposing consumes one, compiling another) and
  `_graph_counter` in `torch._inductor.compile_fx` (the pickled graph's
  `graph_id`); `_post_grad_graph_counter` in `torch._inductor.graph` and
  `torch._inductor.scheduler` number graphs too. Each is an `itertools.count`
  read as a module global when used. `start_model` restarts them all, so that
  each model compiles to the bytes it would in a fresh process, whatever the
  worker compiled before it (a test compiles twice in one process and compares).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib
import inspect
import itertools
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..runtime._cache import inductor_cache_in
from ..runtime._schema import TreeSpec
from ..runtime._torch_private import PREPACK_OPS, bind_arguments, kernel_key
from .state import state_written_back

# Modules that decompositions in inductor's table use as `torch._inductor.<module>.<name>`
# without importing them (`torch._inductor.lowering.should_fallback_max_pool_with_indices`).
LAZY_DECOMPOSITION_MODULES = ("torch._inductor.lowering",)


# (module, attribute): the counters `start_model` restarts
_GRAPH_COUNTERS = (
    ("torch._functorch.aot_autograd", "AOT_COUNTER"),
    ("torch._inductor.compile_fx", "_graph_counter"),
    ("torch._inductor.graph", "_post_grad_graph_counter"),
    ("torch._inductor.scheduler", "_post_grad_graph_counter"),
)


def start_model() -> None:
    """Forget the graphs this process compiled before: see the module docstring."""
    for module_name, attribute in _GRAPH_COUNTERS:
        module = importlib.import_module(module_name)
        if not isinstance(getattr(module, attribute, None), itertools.count):
            raise RuntimeError(f"hatch-precompile relies on {module_name}.{attribute} being an itertools.count; this torch changed it")
        setattr(module, attribute, itertools.count())


def decompose(exported: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """The export graph decomposed with the table inductor itself uses."""
    from torch._inductor.decomposition import select_decomp_table

    for module in LAZY_DECOMPOSITION_MODULES:
        importlib.import_module(module)
    decomposed: torch.export.ExportedProgram = exported.run_decompositions(select_decomp_table())
    return decomposed


@dataclass(frozen=True)
class DimFix:
    """What torch.export's suggested fix says a rejected dim's size can be:
    `scale * base + offset`, with `base` another declared dim, or None for a
    variable that takes every integer in [low, high]. A constant has scale 0;
    a narrowed range has scale 1 and offset 0."""

    scale: int
    offset: int
    base: str | None = None
    low: int = 0
    high: int = sys.maxsize


def constraint_fixes(error: BaseException, dynamic_shapes: Any) -> dict[str, DimFix] | None:
    """For each Dim of `dynamic_shapes` that `torch.export.export` rejected with
    `error` (a constraint violation): its name and what torch's suggested fixes
    make of it. None for any other error, or fixes torch itself cannot read back,
    so that the caller can show torch's message as it is.

    torch's own reader of its fixes (`refine_dynamic_shapes_from_suggested_fixes`,
    public) does the parsing; the exception carries no other structured data."""
    from torch._dynamo.exc import UserError, UserErrorType
    from torch.export.dynamic_shapes import _DerivedDim, refine_dynamic_shapes_from_suggested_fixes

    if not (isinstance(error, UserError) and error.error_type is UserErrorType.CONSTRAINT_VIOLATION):
        return None
    try:
        refined = refine_dynamic_shapes_from_suggested_fixes(error.msg, dynamic_shapes)
    except Exception:  # no "Suggested fixes:" (say, an example outside the range), or unreadable ones
        return None
    before, after = tree_leaves(dynamic_shapes), tree_leaves(refined)
    declared = {dim.__name__ for dim in before if isinstance(dim, torch.export.Dim)}
    fixes: dict[str, DimFix] = {}
    for old, new in zip(before, after):
        if not isinstance(old, torch.export.Dim) or new is old:
            continue
        if isinstance(new, int):
            fixes[old.__name__] = DimFix(0, new)
        elif isinstance(new, _DerivedDim):  # A * root + B
            offset, root = int(new.fn(0)), new.root.__name__
            scale = int(new.fn(1)) - offset
            fix = DimFix(scale, offset, root) if root in declared else DimFix(scale, offset, None, *_bounds(new.root))
            fixes[old.__name__] = fix
        elif isinstance(new, torch.export.Dim) and new.__name__ != old.__name__:
            fixes[old.__name__] = DimFix(1, 0, new.__name__)
        elif isinstance(new, torch.export.Dim):
            fixes[old.__name__] = DimFix(1, 0, None, *_bounds(new))
        else:
            return None
    return fixes


def _bounds(dim: Any) -> tuple[int, int]:
    """A Dim's [min, max], with torch's unbounded max (`int_oo`) as sys.maxsize."""
    return int(dim.min), (int(dim.max) if dim.max < sys.maxsize else sys.maxsize)


def compile_exported(exported: torch.export.ExportedProgram, inductor_config: dict[str, Any]) -> Any:
    """Compile a `torch.export` program with `standalone_compile(aot=True)`.

    Returns the AOTCompiledArtifact. Exactly the export Dims stay dynamic. A
    graph that updates buffers updates them in place and returns the user's
    outputs alone (`state.state_written_back`).
    """
    for node in exported.graph_module.graph.nodes:
        node.meta.pop("stack_trace", None)  # source paths, which the artifact would keep
    graph_module = state_written_back(exported)
    fake_inputs = [node.meta["val"] for node in graph_module.graph.nodes if node.op == "placeholder"]
    output_node = next(iter(reversed(graph_module.graph.nodes)))
    for node in output_node.args[0]:
        if isinstance(node, torch.fx.Node) and "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]
    from torch._dynamo.repro import after_aot

    original = after_aot.save_graph_repro
    # The repro script the artifact keeps would copy the environment (the cache's path).
    after_aot.save_graph_repro = functools.partial(original, stable_output=True)
    try:
        with torch.no_grad():
            return torch._inductor.standalone_compile(
                graph_module,
                fake_inputs,
                dynamic_shapes="from_graph",
                options={"config_patches": {**inductor_config, "cpp_cache_precompile_headers": True}},
                aot=True,
            )
    finally:
        after_aot.save_graph_repro = original


_TORCH_DIR = os.path.dirname(torch.__file__)
# `__FILE__` of torch's headers as `torch/...`, for the kernels and the precompiled header alike.
_TORCH_PATH_MAP = shlex.quote(f"-ffile-prefix-map={_TORCH_DIR}=torch")


_vector_isa_probes: list[Path] = []  # where `vector_isa` has the probes kept: the innermost `compiler_outputs_in`'s folder


@contextlib.contextmanager
def compiler_outputs_in(folder: Path) -> Iterator[None]:
    """While active, what the C++ compiler builds for every model alike is kept
    in `folder`, which builds share when it is in the build cache: the
    precompiled headers (`precompiled_headers_in`) and the vector-ISA probes
    (`probe_vector_isas_in`, run by the first `vector_isa`, so that a worker
    whose artifacts all come from a cache compiles no probe)."""
    _vector_isa_probes.append(folder / "vector-isa")
    try:
        with precompiled_headers_in(folder / "headers"):
            yield
    finally:
        _vector_isa_probes.pop()


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
    options._passthrough_args.append(_TORCH_PATH_MAP)
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


@dataclass
class FrozenGraph:
    """A graph compiled with its weights frozen in (int8): what the lean form ships."""

    run: Callable[..., list[Any]]  # the flat user inputs -> the flat outputs
    source: str  # the output module
    constants: dict[str, torch.Tensor]  # the tensors among the module's globals (it declares each `name = None`)
    prepacks: dict[str, tuple[str, tuple[Any, ...]]]  # a packed constant's name -> (op in PREPACK_OPS, its arguments)
    inputs_to_check: list[int]  # as `output_module`'s
    mutated_inputs: list[int]


class _PrepackRecorder(torch.overrides.TorchFunctionMode):
    """Records every `PREPACK_OPS` call made on real tensors while active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[Any, ...], torch.Tensor]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(getattr(func, "_overloadpacket", func))  # an OpOverload, or the packet itself
        if name in PREPACK_OPS and not kwargs and not isinstance(out, torch._subclasses.FakeTensor):
            self.calls.append((name, args, out))
        return out


def is_onednn_packed(tensor: torch.Tensor) -> bool:
    """Whether a tensor has oneDNN's opaque layout (a prepacked weight)."""
    return bool(tensor.layout == torch._mkldnn)  # type: ignore[attr-defined]  # torch's name for that layout


@contextlib.contextmanager
def pre_grad_pass_kept() -> Iterator[None]:
    """Restore inductor's process-wide pre-grad pass after the block (see the module docstring)."""
    import torch._inductor.config as inductor_config

    kept = inductor_config.pre_grad_custom_pass
    try:
        yield
    finally:
        inductor_config.pre_grad_custom_pass = kept


def compile_frozen(graph_module: torch.fx.GraphModule, inductor_config: dict[str, Any]) -> FrozenGraph:
    """Compile a PT2E-converted, unlifted graph with `freezing` (see the module docstring)."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    graph_module.graph._codegen = torch.fx.graph.CodeGen()  # take and return flat lists, not the export's pytrees
    for node in graph_module.graph.nodes:
        node.meta.pop("stack_trace", None)
    graph_module.recompile()
    fakes = [node.meta["val"] for node in graph_module.graph.nodes if node.op == "placeholder"]
    graphs: list[Any] = []

    def inner_compile(*args: Any, **kwargs: Any) -> Any:
        graphs.append(compile_fx_inner(*args, **kwargs))
        return graphs[-1]

    config = {**inductor_config, "freezing": True, "cpp_cache_precompile_headers": True}
    with torch.no_grad(), torch._inductor.config.patch(config), _PrepackRecorder() as recorder:
        run: Any = compile_fx(graph_module, fakes, inner_compile=inner_compile)
    if len(graphs) != 1:
        raise RuntimeError(f"hatch-precompile relies on compile_fx compiling one graph here; it compiled {len(graphs)}")
    graph = graphs[0]
    constants = {name: value for name, value in _output_module_globals(graph.current_callable).items() if isinstance(value, torch.Tensor)}
    prepacks = {}
    for name, value in constants.items():
        found = [(op, args) for op, args, out in recorder.calls if out is value]
        if found:
            prepacks[name] = found[0]
    return FrozenGraph(run, graph.source_code, constants, prepacks, list(graph.inputs_to_check), sorted(graph.mutated_input_idxs))


def _output_module_globals(function: Any) -> dict[str, Any]:
    """The globals of the output module a compiled graph's callable runs in
    (inductor may wrap `call`, for alignment copies)."""
    for _ in range(8):
        namespace = getattr(function, "__globals__", None)
        if namespace is not None and callable(namespace.get("call")):
            return dict(namespace)
        cells = [cell.cell_contents for cell in getattr(function, "__closure__", None) or ()]
        function = getattr(function, "__func__", None) or next((c for c in cells if callable(c)), None)
    raise RuntimeError("hatch-precompile relies on a compiled graph's callable running in its output module; not found")


def save_artifact(artifact: Any, path: str) -> None:
    """Save with the compile's duration, which the AOTAutograd entry records, as 0."""
    compiled = artifact.inner_fn.compiled_fn
    entry_of = compiled.serialize

    def entry_without_timings() -> Any:
        entry = copy.copy(entry_of())
        entry.forward_time_taken_ns = entry.backward_time_taken_ns = 0
        return entry

    compiled.serialize = entry_without_timings
    try:
        artifact.save(path=path, format="binary")
    finally:
        compiled.serialize = entry_of


def torch_key() -> bytes:
    """The hash torch writes into every artifact: torch's version and module bytes."""
    from torch._inductor.codecache import torch_key as key

    return key()


@contextlib.contextmanager
def captured_kernels() -> Iterator[dict[str, Callable[[], str]]]:
    """While active, record every CPU kernel inductor builds: key -> thunk giving
    the path of its compiled `.so` (call it once compilation has finished)."""
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
    flags = (_TORCH_PATH_MAP, "-s")
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

    if _vector_isa_probes:
        probe_vector_isas_in(_vector_isa_probes[-1])  # once: valid_vec_isa_list is cached after it succeeds
    with config.patch({"cpp.simdlen": simdlen}):
        isa = pick_vec_isa()
    if not isa:
        return "", ""
    return str(isa), isa.build_arch_flags()


def output_module(artifact: Any, state_inputs: set[int]) -> tuple[str, list[int], str]:
    """(source of the output module, indices of the inputs whose alignment the
    compiled graph's wrapper checks, why the wrapper does more than that or "").
    `state_inputs` are the inputs holding the model's state, which the output
    module itself updates in place (AOTAutograd keeps an inference graph's input
    mutations in the graph, so its wrapper has nothing to do for them)."""
    graph = artifact.inner_fn.compiled_fn
    source = getattr(graph, "source_code", None)
    if not isinstance(source, str):
        return "", [], "the compiled graph carries no output module source"
    if set(graph.mutated_input_idxs) != state_inputs:
        return source, [], f"the compiled graph mutates inputs {sorted(graph.mutated_input_idxs)}, its state is inputs {sorted(state_inputs)}"
    if graph.constants:
        return source, [], "the compiled graph has frozen constants"
    return source, list(graph.inputs_to_check), ""


def wrapper_work(exported: torch.export.ExportedProgram) -> str:
    """What AOTAutograd's runtime wrapper would do around this graph's compiled
    code at run time, or "" if nothing: the lean form runs the code alone."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    signature = exported.graph_signature
    if signature.user_inputs_to_mutate:  # buffers it updates are written in the graph (`state.py`)
        return f"it mutates its inputs ({', '.join(signature.user_inputs_to_mutate.values())})"
    if getattr(signature, "input_tokens", None) or getattr(signature, "output_tokens", None):
        return "it carries effect tokens (ops with side effects)"
    nodes = list(exported.graph_module.graph.nodes)
    for node in nodes:
        if node.op == "call_function" and _draws_random_numbers(node):
            return f"it draws random numbers ({node.target})"
    placeholders = [n.meta.get("val") for n in nodes if n.op == "placeholder"]
    outputs = [n.meta.get("val") if isinstance(n, torch.fx.Node) else n for n in nodes[-1].args[0]]
    tensors = [v for v in [*placeholders, *outputs] if isinstance(v, torch.Tensor)]
    if any(is_traceable_wrapper_subclass(v) for v in tensors):
        return "its inputs or outputs are tensor subclasses"
    input_storages = {StorageWeakRef(v.untyped_storage()) for v in placeholders if isinstance(v, torch.Tensor)}
    seen = set()
    for index, value in enumerate(outputs):
        if not isinstance(value, torch.Tensor):
            return f"output {index} is not a tensor"
        storage = StorageWeakRef(value.untyped_storage())
        if storage in input_storages:
            return f"output {index} is an input or a view of one"
        if storage in seen:
            return f"output {index} is a view of another output"
        seen.add(storage)
    return ""


def _draws_random_numbers(node: torch.fx.Node) -> bool:
    """Whether an op call draws random numbers. Attention ops are tagged random for
    their dropout, which a call with dropout_p=0 (every model in eval mode) never runs."""
    if torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ()):
        return False
    schema = getattr(node.target, "_schema", None)
    names = [argument.name for argument in schema.arguments] if schema is not None else []
    if "dropout_p" not in names:
        return True
    index = names.index("dropout_p")
    dropout = node.args[index] if index < len(node.args) else node.kwargs.get("dropout_p", 0.0)
    return bool(dropout != 0)


def python_op_libraries(exported: torch.export.ExportedProgram) -> dict[str, str]:
    """The custom ops the graph calls that a library defines in Python
    (`torch.library.custom_op`, recorded in `torch._library.custom_ops.OPDEFS`):
    op name -> the module defining it, which must be imported before the op can
    run. torch's own (its prims) are there once torch is imported."""
    from torch._library.custom_ops import OPDEFS

    found: dict[str, str] = {}
    for node in exported.graph_module.graph.nodes:
        name = getattr(getattr(node.target, "_schema", None), "name", None) if node.op == "call_function" else None
        if not isinstance(name, str) or name not in OPDEFS:
            continue  # not an op call, or one of torch's own
        module = OPDEFS[name]._init_fn.__module__
        if module.partition(".")[0] != "torch":
            found[name] = module
    return dict(sorted(found.items()))


def extern_kernel_is_torch_function(name: str) -> bool:
    """Whether the output module's `extern_kernels.<name>` is `torch.<name>`."""
    from torch._inductor.select_algorithm import extern_kernels

    return getattr(extern_kernels, name, None) is getattr(torch, name, object())


def tree_leaves(tree: Any) -> list[Any]:
    """Flatten nested inputs or outputs in the order the compiled graph uses."""
    from torch.utils._pytree import tree_leaves as leaves

    return leaves(tree)


def tree_map(function: Callable[[Any], Any], tree: Any) -> Any:
    """`function` applied to every leaf of nested inputs, keeping their structure."""
    from torch.utils._pytree import tree_map as map_leaves

    return map_leaves(function, tree)


def treespec_to_json(spec: Any) -> TreeSpec:
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
    raise TypeError(f"{_import_path(spec.type)} in inputs or outputs is not supported yet; use tuples, lists, dicts, named tuples and tensors")


def _import_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
