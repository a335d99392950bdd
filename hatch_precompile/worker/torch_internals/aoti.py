"""Compiling an export program with AOTInductor into a model container library
that holds no weights: the C++ form (`worker/cpp_form.py`).

What it relies on (measured on torch 2.13; `tests/test_torch_assumptions.py`
checks each):
- `torch._inductor.aoti_compile_and_package(exported, package_path=...,
  inductor_configs=...)` writes a `.pt2` zip whose one `.so` member is the model
  container: the graph's C++ wrapper and its kernels, linked against
  libtorch_cpu and libgomp, with no Python symbol. With
  `aot_inductor.package_constants_in_so=False` the library holds no constant
  (the weights stay out of it); the loader binds them. An op the container
  cannot call through its C shim (`quantized::int4mm_packed_weight_cpu`) is called
  through its proxy executor, which reads the op calls from `<library>.json`
  beside the `.so` (the runner looks for that name); the package holds it beside
  its library.
- Reproducible libraries. Every C++ compile of it goes through
  `torch._inductor.codecache.CppBuilder(name, sources, BuildOption,
  output_dir)`; `BuildOption._passthrough_args` reach the command line.
  `aot_inductor.enable_line_tables=False` drops `-g1` (line tables name the
  cache folder). What is left of this build's paths is `__FILE__`: torch's
  headers (mapped to `torch/...`, as the kernels' are) and the generated
  sources, whose names hash their text, which quotes the compile command with
  the cache folder in it; each source is mapped to a fixed name
  (`wrapper.cpp`, `kernel.cpp`). Two builds in two cache folders then give the
  same bytes.
- Weights and buffers are the graph's constants, and inductor reads their
  values at compile time unless told not to: it inlines a 0-dim or small one
  into the code (`GraphLowering.get_attr`; `always_keep_tensor_constants=True`
  keeps them tensors), and the joint graph's constant folding folds a uniform
  one, or a 0-dim buffer the graph updates (`steps.add_(1)` compiled to
  `steps = 1`), into a literal (`joint_graph_constant_folding=False`). With
  both, every constant is read at run time from the tensor bound to it, so
  other weights (`state_dict=`) and each handle's state give their own results.
- The precompiled headers come from `codecache._precompile_header`, which
  `kernels.precompiled_headers_in` supplies, as for the kernels.
- `torch._C._aoti.AOTIModelContainerRunnerCpu(path, 1)` loads the library;
  `get_constant_names_to_original_fqns()` maps its constants to the export's
  state-dict names (`runtime/_torch_private.py` binds them at load), but for the
  export's lifted constants (CONSTANT_TENSOR: a plain tensor attribute, a
  `torch.tensor(...)` made in forward): AOTInductor unlifts and traces the
  program again, where they become `_tensor_constant0`, `_tensor_constant1`, ...
  in the graph signature's order. The build's fresh-process check against eager
  runs the library with the weights bound by these names, so a numbering that
  changed would fail there, not ship.
- The torch-free form: `aot_inductor.link_libtorch=False` gives a library that
  links no torch library (ldd: libgomp, libstdc++, libm, libgcc_s, libc) and
  leaves undefined the shim functions and operators it calls (`aoti_torch_*`)
  and ATen's SLEEF vector math (`Sleef_expf16_u10`); the wheel's own shim
  (`hatch_precompile/shim`) gives them. Its C interface is the same. The build's
  check runs it in a venv without torch, so a change here fails the build.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .kernels import TORCH_PATH_MAP, _compiler_outputs, precompiled_headers_in

# Inductor options of the container: no weights inside, no line tables (paths), and
# no weight's or buffer's value compiled into the code (see the module docstring).
CONTAINER_CONFIG = {
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.enable_line_tables": False,
    "always_keep_tensor_constants": True,
    "joint_graph_constant_folding": False,
}
# And for the torch-free form: no libtorch linked (see the module docstring).
TORCH_FREE_CONFIG = {"aot_inductor.link_libtorch": False}


def compile_container(exported: torch.export.ExportedProgram, inductor_config: dict[str, Any]) -> tuple[bytes, bytes | None, dict[str, str]]:
    """The model container library of `exported`, compiled with `inductor_config`
    (the model's options and its CPU target's) and holding no weights; the
    description of the ops it calls through AOTInductor's proxy executor, where it
    calls any (None where not), which the loader must find beside the library;
    and its constants' original names as its generated source sets them (see
    `container_constants`)."""
    with tempfile.TemporaryDirectory(prefix="hatch-precompile-aoti-") as scratch, _reproducible_compiles(), contextlib.ExitStack() as headers:
        if _compiler_outputs:
            headers.enter_context(precompiled_headers_in(_compiler_outputs[-1] / "headers"))
        package = Path(scratch) / "model.pt2"
        with torch.no_grad():
            torch._inductor.aoti_compile_and_package(exported, package_path=str(package), inductor_configs={**inductor_config, **CONTAINER_CONFIG})
        with zipfile.ZipFile(package) as archive:
            libraries = [name for name in archive.namelist() if name.endswith(".so")]
            if len(libraries) != 1:
                raise RuntimeError(f"AOTInductor's package holds {len(libraries)} libraries ({libraries}), where hatch-precompile expects one")
            ops = libraries[0].removesuffix(".so") + ".json"
            wrappers = [name for name in archive.namelist() if name.endswith(".wrapper.cpp")]
            original = _original_names(archive.read(wrappers[0]).decode()) if len(wrappers) == 1 else {}
            return archive.read(libraries[0]), archive.read(ops) if ops in archive.namelist() else None, original


def _original_names(wrapper: str) -> dict[str, str]:
    """The constants' names -> their original (state-dict) names, as AOTInductor's
    wrapper source sets them (`constants_info_[i].name = "..."`, `...original_fqn
    = "..."`): what its runner's `get_constant_names_to_original_fqns` returns,
    read without loading a library that torch's runner cannot load (a torch-free
    one). A changed pattern gives {} and the build's check fails on the binding."""
    names = dict(re.findall(r'constants_info_\[(\d+)\]\.name = "([^"]*)";', wrapper))
    original = dict(re.findall(r'constants_info_\[(\d+)\]\.original_fqn = "([^"]*)";', wrapper))
    return {names[index]: original[index] for index in names if index in original}


@contextlib.contextmanager
def _reproducible_compiles() -> Iterator[None]:
    """While active, AOTInductor's C++ compiles write no path of this build into
    the library: see the module docstring."""
    from torch._inductor import codecache

    original = codecache.CppBuilder

    class Reproducible(original):  # type: ignore[misc,valid-type]
        def __init__(self, name: str, sources: str | list[str], BuildOption: Any, output_dir: str = "") -> None:
            names = [sources] if isinstance(sources, str) else list(sources)
            fixed = [f"-ffile-prefix-map={source}={os.path.basename(source).split('.', 1)[-1]}" for source in names if source.endswith(".cpp")]
            BuildOption._passthrough_args = [*BuildOption._passthrough_args, TORCH_PATH_MAP, "-s", *fixed]
            super().__init__(name, sources, BuildOption, output_dir)

    codecache.CppBuilder = Reproducible  # type: ignore[misc]
    try:
        yield
    finally:
        codecache.CppBuilder = original  # type: ignore[misc]


def container_constants(library: Path, exported: torch.export.ExportedProgram, original: dict[str, str] | None = None) -> dict[str, str]:
    """The library's constants: its name for each -> the export's state-dict name
    (the weights file's), as torch's runner reads them from the library, or as
    `original` gives them (a torch-free library, which torch's runner cannot
    load). See the module docstring for the lifted constants."""
    if original is None:
        original = torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), 1).get_constant_names_to_original_fqns()
    lifted = [spec.target for spec in exported.graph_signature.input_specs if spec.kind.name == "CONSTANT_TENSOR"]
    names = {}
    for constant, fqn in original.items():
        match = _RETRACED_CONSTANT.fullmatch(fqn)
        names[constant] = lifted[int(match.group(1))] if match and int(match.group(1)) < len(lifted) else fqn
    return names


_RETRACED_CONSTANT = re.compile(r"_tensor_constant(\d+)")


def returned_inputs(exported: torch.export.ExportedProgram) -> dict[int, int]:
    """The user outputs that are a user input itself (a library module returning
    its features dict with more in it), by output index -> input index (the
    loader's flat inputs). The container returns a new tensor over such an
    input's storage, not the input, so the loader hands back the caller's own
    tensor, as eager does."""
    user_inputs = [spec.arg.name for spec in exported.graph_signature.input_specs if spec.kind.name == "USER_INPUT"]
    return {index: user_inputs.index(node.name) for index, node in enumerate(_user_outputs(exported)) if isinstance(node, torch.fx.Node) and node.op == "placeholder" and node.name in user_inputs}


def _user_outputs(exported: torch.export.ExportedProgram) -> list[Any]:
    """The output node's arguments that are the user's outputs (not the state's new values)."""
    user = [spec.kind.name == "USER_OUTPUT" for spec in exported.graph_signature.output_specs]
    return [node for node, is_user in zip(list(exported.graph_module.graph.nodes)[-1].args[0], user) if is_user]


def aliased_output(exported: torch.export.ExportedProgram) -> str:
    """Why the container cannot return this graph's outputs as the module does, or
    "": an output that is a weight or a buffer, or a view of one or of an input
    (the container returns a tensor of its own, so the caller would lose the
    aliasing), or one that is not a tensor. An input returned as it is can be
    handed back (`returned_inputs`)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    inputs = {StorageWeakRef(n.meta["val"].untyped_storage()) for n in exported.graph_module.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)}
    returned = returned_inputs(exported)
    for index, node in enumerate(_user_outputs(exported)):
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
        if not isinstance(value, torch.Tensor):
            return f"output {index} is not a tensor ({type(value).__name__})"
        if index not in returned and StorageWeakRef(value.untyped_storage()) in inputs:
            return f"output {index} is a weight or a buffer, or a view of one or of an input, and the container would return a copy"
    return ""
