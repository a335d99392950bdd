"""Each assumption that `runtime/_torch_private.py` (the loader's) and
`worker/torch_internals/` (the build's) make about torch, checked against the
installed torch. When one of these fails after a torch upgrade, fix that module."""

from __future__ import annotations

import ast
import copy
import itertools
import json
import os
import re
import subprocess
import sys
import zlib
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hatch_precompile.runtime import _torch_private
from hatch_precompile.runtime._torch_private import ArtifactFormatError
from hatch_precompile.worker import lean, torch_internals

from conftest import session_compiler_outputs

pytestmark = pytest.mark.release


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.relu(self.first(x))
        return {"out": self.second(hidden), "pair": (hidden, x.sum(-1))}


@dataclass
class Compiled:
    module: nn.Module
    exported: torch.export.ExportedProgram
    artifact: Any  # the AOTCompiledArtifact, as the build holds it
    path: Path  # the artifact saved
    cache: Path  # the inductor cache it was compiled in
    kernels: dict[str, Path]  # key -> compiled .so, as the build records them


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    """A small model exported with a dynamic batch, compiled into a private cache, saved.
    The vector-ISA probes (decided once per process: every later compile in this
    one uses them) and the precompiled header are the session build cache's, as
    a build's would be."""
    folder = tmp_path_factory.mktemp("compiled")
    cache = folder / "inductor-cache"
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    try:
        torch_internals.probe_vector_isas_in(session_compiler_outputs() / "vector-isa")
        module = Small().eval()
        batch = torch.export.Dim("batch", min=1, max=32)
        exported = torch.export.export(module, (torch.randn(3, 8),), dynamic_shapes=({0: batch},))
        exported = torch_internals.decompose(exported)
        with torch_internals.precompiled_headers_in(session_compiler_outputs() / "headers"), torch_internals.captured_kernels() as built:
            artifact = torch_internals.compile_exported(exported, {})
            kernels = {key: Path(path()) for key, path in built.items()}
        path = folder / "small.bin"
        torch_internals.save_artifact(artifact, str(path))
    finally:
        if previous is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
    return Compiled(module, exported, artifact, path, cache, kernels)


def _weights(exported: torch.export.ExportedProgram) -> list[torch.Tensor]:
    return [exported.state_dict[s.target] for s in exported.graph_signature.input_specs if s.kind.name == "PARAMETER"]


def test_artifact_file_is_framed_header_torch_key_bundle(compiled) -> None:
    key, payload = _torch_private.split_artifact(compiled.path.read_bytes())
    assert key == torch_internals.torch_key() and len(key) == 32
    assert payload[:1] == b"\x80"  # a pickle


def test_deserialized_bundle_takes_weights_then_inputs_and_returns_a_flat_list(compiled) -> None:
    _, payload = _torch_private.split_artifact(compiled.path.read_bytes())
    run = _torch_private.deserialize_artifact(payload)
    x = torch.randn(5, 8)
    with torch.no_grad():
        out = run(*_weights(compiled.exported), x)
        expected = torch_internals.tree_leaves(compiled.module(x))
    assert isinstance(out, list) and len(out) == 3
    for got, want in zip(out, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_exactly_the_export_dims_are_symbolic_in_the_generated_code(compiled) -> None:
    """Weights and the input's feature size stay static; only the batch is a symbol."""
    wrappers = [p.read_text() for p in compiled.cache.rglob("*.py") if "def call(" in p.read_text()]
    assert len(wrappers) == 1
    sizes = _input_size_asserts(wrappers[0])
    entries = [s for group in sizes for s in group]
    symbolic = [s for s in entries if not s.isdigit()]
    assert len(sizes) == 5  # four weights, one input
    assert len(symbolic) == 1 and symbolic[0].startswith("s"), sizes


def _input_size_asserts(wrapper: str) -> list[list[str]]:
    """The sizes `call` asserts for each graph input (`argN_1`): one
    `assert_size_stride(arg, sizes, strides)` each (torch 2.13), or grouped as
    `assert_size_stride_grouped((args), (sizes), (strides), 'input')` (2.14, 2.15)."""
    sizes = []
    for node in ast.walk(ast.parse(wrapper)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id == "assert_size_stride":
            pairs = [(node.args[0], node.args[1])]
        elif node.func.id == "assert_size_stride_grouped":
            pairs = list(zip(node.args[0].elts, node.args[1].elts, strict=True))
        else:
            continue
        sizes += [[ast.unparse(e) for e in size.elts] for name, size in pairs if re.fullmatch(r"arg\d+_1", ast.unparse(name))]
    return sizes


def test_tree_specs_become_plain_data(compiled) -> None:
    assert torch_internals.treespec_to_json(compiled.exported.call_spec.out_spec) == {
        "type": "dict",
        "keys": ["out", "pair"],
        "children": [{"type": "leaf"}, {"type": "tuple", "children": [{"type": "leaf"}, {"type": "leaf"}]}],
    }


Point = namedtuple("Point", "x y")


class Keyed:
    """Flattened by key, the way transformers registers its ModelOutput classes."""

    def __init__(self, **values: torch.Tensor) -> None:
        self.values = values


torch.utils._pytree.register_pytree_node(Keyed, lambda k: (list(k.values.values()), list(k.values)), lambda v, keys: Keyed(**dict(zip(keys, v, strict=True))))


def test_named_tuples_and_keyed_classes_are_recorded_by_import_path() -> None:
    leaves = (torch.ones(1), torch.ones(1))
    point = torch.utils._pytree.tree_flatten(Point(*leaves))[1]
    keyed = torch.utils._pytree.tree_flatten(Keyed(a=leaves[0], b=leaves[1]))[1]
    assert torch_internals.treespec_to_json(point) == {
        "type": "namedtuple",
        "class": "test_torch_assumptions:Point",
        "children": [{"type": "leaf"}, {"type": "leaf"}],
    }
    assert torch_internals.treespec_to_json(keyed) == {
        "type": "keyed",
        "class": "test_torch_assumptions:Keyed",
        "keys": ["a", "b"],
        "children": [{"type": "leaf"}, {"type": "leaf"}],
    }


def test_containers_without_keys_are_refused_by_name() -> None:
    spec = torch.utils._pytree.tree_flatten(torch.return_types.max((torch.ones(1), torch.ones(1))))[1]
    with pytest.raises(TypeError, match="max in inputs or outputs is not supported yet"):
        torch_internals.treespec_to_json(spec)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[: len(data) // 2], "checksum mismatch"),
        (lambda data: data[:3], "too short"),
        (lambda data: data[:10] + bytes([data[10] ^ 1]) + data[11:], "checksum mismatch"),
        (lambda data: zlib.crc32(data[4:-5]).to_bytes(4, "big") + data[4:-5], "runs past the end"),
        (lambda data: zlib.crc32(b"junk").to_bytes(4, "big") + b"junk", "length is cut off"),
    ],
)
def test_damaged_files_raise_a_format_error_not_an_assertion(compiled, damage, message: str) -> None:
    with pytest.raises(ArtifactFormatError, match=message):
        _torch_private.split_artifact(damage(compiled.path.read_bytes()))


# --- The lean form --------------------------------------------------------------------


def test_the_compiled_graph_carries_its_output_module_with_five_compiler_imports(compiled) -> None:
    source, inputs_to_check, refused = torch_internals.output_module(compiled.artifact, set())
    assert refused == "" and inputs_to_check == []
    imports = sorted(set(re.findall(r"^from (torch\._inductor[\w.]*) import", source, flags=re.M)))
    assert imports == [
        "torch._inductor.async_compile",
        "torch._inductor.codegen.memory_planning",
        "torch._inductor.hooks",
        "torch._inductor.select_algorithm",
        "torch._inductor.utils",
    ]
    assert "def call(self, args)" in source and "call = runner.call" in source


def test_each_cpp_pybinding_in_the_module_is_a_kernel_the_compile_built(compiled) -> None:
    """The build keys kernels from load_pybinding_async's arguments; the module's
    cpp_pybinding(argtypes, source) must pass the others at their defaults."""
    source, _, _ = torch_internals.output_module(compiled.artifact, set())
    module = lean.rewrite(source, set(compiled.kernels), "small")
    assert module.kernels and set(module.kernels) <= set(compiled.kernels)
    assert module.extern_kernels == ["addmm"]
    assert "torch._inductor" not in module.text and "cpp_pybinding" not in module.text
    assert "def benchmark_compiled_module" not in module.text and "__main__" not in module.text


def test_the_lean_module_runs_in_a_fresh_process_without_the_compiler_and_equals_the_artifact(compiled, tmp_path: Path) -> None:
    """Kernels load through importlib with PyInit_kernel and the tensor-pointer
    environment variable; extern_kernels.addmm is torch.addmm; nothing imports
    torch._inductor or torch._dynamo."""
    source, _, _ = torch_internals.output_module(compiled.artifact, set())
    module = lean.rewrite(source, set(compiled.kernels), "small")
    (tmp_path / "small.py").write_text(module.text)
    x = torch.randn(6, 8)
    with torch.no_grad():
        expected = compiled.artifact(*_weights(compiled.exported), x)
    torch.save({"flat": [*_weights(compiled.exported), x], "expected": expected}, tmp_path / "data.pt")
    kernels = {key: str(compiled.kernels[key]) for key in module.kernels}
    script = f"""
import json, sys, torch
from pathlib import Path
from hatch_precompile.runtime._lean import make_runner
data = torch.load({str(tmp_path / "data.pt")!r}, weights_only=True)
kernels = {{k: Path(v) for k, v in {kernels!r}.items()}}
run = make_runner(Path({str(tmp_path / "small.py")!r}).read_text(), "small.py", kernels, {module.extern_kernels!r}, [], {{}})
with torch.no_grad():
    out = run(list(data["flat"]))
print(json.dumps({{"equal": all(torch.equal(a, b) for a, b in zip(out, data["expected"])), "count": len(out),
    "compiler": [m for m in sys.modules if m.startswith(("torch._inductor", "torch._dynamo"))]}}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip().endswith('{"equal": true, "count": 3, "compiler": []}'), result.stdout


def test_the_kernel_loading_names_the_loader_relies_on() -> None:
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    assert CppPythonBindingsCodeCache.entry_function == _torch_private.KERNEL_ENTRY
    assert _torch_private.KERNEL_INIT_VARIABLE in CppPythonBindingsCodeCache.suffix_template
    assert hasattr(torch._C._dynamo.guards, "_torchinductor_pyobject_tensor_data_ptr")
    assert torch_internals.extern_kernel_is_torch_function("addmm")
    assert torch_internals.extern_kernel_is_torch_function("bmm")


class MutatesItsInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2


class ReturnsItsInput(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x.t()


class ReturnsTwoViews(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        return y, y.view(-1)


class Random(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (MutatesItsInput(), "it mutates its inputs (x)"),
        (ReturnsTwoViews(), "output 1 is a view of another output"),
        (Random(), "it draws random numbers"),
    ],
)
def test_graphs_whose_runtime_wrapper_does_work_are_named(module: nn.Module, reason: str) -> None:
    with torch.no_grad():
        exported = torch_internals.decompose(torch.export.export(module, (torch.randn(3, 4),)))
    assert torch_internals.wrapper_work(exported).startswith(reason)


def test_a_plain_graph_needs_no_runtime_wrapper(compiled) -> None:
    assert torch_internals.wrapper_work(compiled.exported) == ""


def test_outputs_that_are_inputs_or_views_of_them_need_no_runtime_wrapper() -> None:
    """The output module returns such an output as the input itself or a view of it
    made with the call's sizes (`reinterpret_tensor`), which the lean form runs as it
    is; test_model_forms.py checks the result against eager and the artifact."""
    with torch.no_grad():
        exported = torch_internals.decompose(torch.export.export(ReturnsItsInput(), (torch.randn(3, 4),)))
    assert torch_internals.wrapper_work(exported) == ""


def test_a_module_importing_more_of_the_compiler_is_refused() -> None:
    source = "from torch._inductor.runtime.triton_heuristics import grid\ndef call(args):\n    return ()\ncall = call\n"
    with pytest.raises(lean.LeanRefused, match=re.escape("it imports torch._inductor.runtime.triton_heuristics")):
        lean.rewrite(source, set(), "made-up")
    hooks = "from torch._inductor.hooks import run_intermediate_hooks\ndef f(args):\n    run_intermediate_hooks('a', 1)\ncall = f\n"
    with pytest.raises(lean.LeanRefused, match="it uses run_intermediate_hooks"):
        lean.rewrite(hooks, set(), "made-up")


def test_the_loaders_assert_tensor_metadata_behaves_as_inductors() -> None:
    """torch 2.14 and 2.15 output modules check a fallback op's output (CPU flash
    attention) with inductor's assert_tensor_metadata; the loader binds a copy."""
    from torch._inductor.runtime import runtime_utils

    theirs = getattr(runtime_utils, "assert_tensor_metadata", None)
    if theirs is None:
        pytest.skip("this torch's output modules do not call assert_tensor_metadata")
    tensor = torch.zeros(2, 3)
    cases = [((2, 3), (3, 1), torch.float32), ((2, 3), (3, 1), torch.float64), ((3, 2), (2, 1), torch.float32), ((2, 3), (1, 2), torch.float32)]
    for case in cases:
        outcomes = []
        for function in (theirs, _torch_private.assert_tensor_metadata):
            try:
                function(tensor, *case, "op")
                outcomes.append(None)
            except Exception as error:
                outcomes.append((type(error), str(error).splitlines()[:2]))
        assert outcomes[0] == outcomes[1], case
    assert theirs(None, (1,), (1,), torch.float32) is None and _torch_private.assert_tensor_metadata(None, (1,), (1,), torch.float32) is None


def test_a_module_checking_fallback_outputs_gets_the_loaders_check() -> None:
    source = (
        "import torch\nfrom torch._inductor.runtime.runtime_utils import assert_tensor_metadata\n"
        "def f(args):\n    assert_tensor_metadata(args[0], (2,), (1,), torch.float32, 'op')\n    return ()\ncall = f\n"
    )
    module = lean.rewrite(source, set(), "made-up")
    assert "torch._inductor" not in module.text
    call = _torch_private.run_lean_module(module.text, "made-up.py", [], lambda key: None, {})
    assert call([torch.zeros(2)]) == ()
    with pytest.raises(RuntimeError, match=re.escape("expected dtype torch.float32")):
        call([torch.zeros(2, dtype=torch.float64)])


class Attention(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(x, x, x, dropout_p=self.dropout)


def test_attention_counts_as_random_only_with_dropout() -> None:
    """Attention ops carry the nondeterministic_seeded tag for their dropout."""
    x = torch.randn(2, 4, 8, 16)
    with torch.no_grad():
        without = torch_internals.decompose(torch.export.export(Attention(0.0), (x,)))
        with_dropout = torch_internals.decompose(torch.export.export(Attention(0.5), (x,)))
    assert torch_internals.wrapper_work(without) == ""
    assert torch_internals.wrapper_work(with_dropout).startswith("it draws random numbers")


def test_the_hooks_reproducible_builds_rely_on(compiled) -> None:
    """What torch_internals changes so that a build does not record its own paths
    and timings (the end-to-end proof is two byte-identical wheels)."""
    import inspect

    from torch._dynamo.repro import after_aot
    from torch._inductor import config

    assert "stable_output" in inspect.signature(after_aot.save_graph_repro).parameters
    assert hasattr(config, "cpp_cache_precompile_headers")
    entry = compiled.artifact.inner_fn.compiled_fn.serialize()
    assert isinstance(entry.forward_time_taken_ns, int) and hasattr(entry, "backward_time_taken_ns")
    assert all("stack_trace" not in node.meta for node in compiled.exported.graph_module.graph.nodes)
    torch_dir = os.path.dirname(torch.__file__)
    for path in compiled.kernels.values():
        binary = path.read_bytes().decode("latin-1")
        assert str(compiled.cache) not in binary and torch_dir not in binary
    headers = list((session_compiler_outputs() / "headers").glob("*.h.gch"))
    assert headers, "the kernels were compiled without the build's precompiled header"


def test_precompiled_headers_come_from_a_module_global_the_build_can_replace() -> None:
    """`precompiled_headers_in` replaces `codecache._precompile_header`, which the
    C++ code cache calls by its global name, and builds the header itself with
    options whose passthrough arguments (the path map) reach the command line."""
    import inspect

    from torch._inductor import codecache
    from torch._inductor.cpp_builder import CppBuilder, CppTorchDeviceOptions

    parameters = inspect.signature(codecache._precompile_header.__wrapped__).parameters
    assert list(parameters)[:2] == ["header", "hashable_cmd_line"] and "compile_command" in parameters
    assert "_precompile_header(" in inspect.getsource(codecache.CppCodeCache.load_async)
    options = CppTorchDeviceOptions(device_type="cpu", precompiling=True)
    options._passthrough_args.append(torch_internals.TORCH_PATH_MAP)
    assert torch_internals.TORCH_PATH_MAP in CppBuilder(name="o", sources="i.h", BuildOption=options).get_command_line()


def test_the_loader_binds_exactly_the_names_the_build_leaves_unbound() -> None:
    source = "def call(args):\n    return sorted(name for name in globals() if not name.startswith('__') and name != 'call')\n"
    call = _torch_private.run_lean_module(source, "made-up.py", [], lambda key: None, {})
    assert call([]) == sorted(_torch_private.LEAN_BINDINGS)


class GroupsOfFour(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, 4, x.shape[1]).sum(1)


class Adds(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class OneRowMore(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y[1:]


def _violation(module: nn.Module, inputs: tuple[torch.Tensor, ...], shapes: Any) -> Any:
    """The error export raises for a constraint violation (a UserError)."""
    from torch._dynamo.exc import UserError, UserErrorType

    with pytest.raises(UserError) as caught:
        torch.export.export(module, inputs, dynamic_shapes=shapes)
    assert caught.value.error_type is UserErrorType.CONSTRAINT_VIOLATION
    assert "Suggested fixes:" in caught.value.msg and "draft_export" not in caught.value.msg
    return caught.value


def test_constraint_violations_carry_suggested_fixes_torch_can_read_back() -> None:
    """Export's constraint violation is a UserError (CONSTRAINT_VIOLATION) whose `msg`
    ends with suggested fixes that `refine_dynamic_shapes_from_suggested_fixes` turns
    into ints, Dims and derived Dims (`root`, `fn` = A * root + B), leaving other
    Dims as they were; `torch_internals.constraint_fixes` relies on all of it."""
    from torch.export.dynamic_shapes import _DerivedDim, refine_dynamic_shapes_from_suggested_fixes

    batch = torch.export.Dim("batch", min=4, max=64)
    error = _violation(GroupsOfFour(), (torch.randn(8, 3),), ({0: batch},))
    derived = refine_dynamic_shapes_from_suggested_fixes(error.msg, ({0: batch},))[0][0]
    assert isinstance(derived, _DerivedDim) and isinstance(derived.root, torch.export.Dim), derived
    assert (derived.fn(0), derived.fn(1)) == (0, 4)
    fix = torch_internals.constraint_fixes(error, ({0: batch},))
    assert fix == {"batch": torch_internals.DimFix(4, 0, None, derived.root.min, derived.root.max)}

    x, y = torch.export.Dim("x", min=1, max=16), torch.export.Dim("y", min=1, max=16)
    shapes = {"x": {0: x}, "y": {0: y}}
    error = _violation(OneRowMore(), (torch.randn(2, 8), torch.randn(3, 8)), shapes)
    refined = refine_dynamic_shapes_from_suggested_fixes(error.msg, shapes)
    assert isinstance(refined["y"][0], _DerivedDim) and refined["y"][0].root is refined["x"][0]
    fixes = torch_internals.constraint_fixes(error, shapes)
    assert fixes is not None and fixes["y"] == torch_internals.DimFix(1, 1, "x")
    assert fixes["x"].scale == 1 and fixes["x"].base is None and fixes["x"].high == 15

    error = _violation(Adds(), (torch.randn(2, 8), torch.randn(2, 8)), shapes)
    assert refine_dynamic_shapes_from_suggested_fixes(error.msg, shapes)["x"][0] is x  # unchanged: the same object
    assert torch_internals.constraint_fixes(error, shapes) == {"y": torch_internals.DimFix(1, 0, "x")}

    error = _violation(Adds(), (torch.randn(2, 8), torch.randn(2, 8)), {"x": {0: x}, "y": None})
    assert torch_internals.constraint_fixes(error, {"x": {0: x}, "y": None}) == {"x": torch_internals.DimFix(0, 2)}


def test_constraint_fixes_read_narrowed_ranges_and_ignore_other_errors() -> None:
    class Branches(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.shape[0] <= 8 else x

    batch = torch.export.Dim("batch", min=1, max=16)
    with pytest.raises(Exception) as caught:
        torch.export.export(Branches(), (torch.randn(3, 4),), dynamic_shapes=({0: batch},))
    fixes = torch_internals.constraint_fixes(caught.value, ({0: batch},))
    assert fixes is not None and fixes["batch"].scale == 1 and fixes["batch"].base is None and fixes["batch"].high == 8
    assert torch_internals.constraint_fixes(RuntimeError("Constraints violated (batch)!"), ({0: batch},)) is None
    small = torch.export.Dim("small", min=4, max=16)
    with pytest.raises(Exception) as outside:  # an example outside the range: no fixes to suggest
        torch.export.export(Branches(), (torch.randn(3, 4),), dynamic_shapes=({0: small},))
    assert torch_internals.constraint_fixes(outside.value, ({0: small},)) is None


# Run in a fresh process: by then this one may have imported the compiler's modules.
LAZY_REFERENCES = r'''
import importlib.util, inspect, json, pathlib, re, sys
import torch
from torch._inductor.decomposition import select_decomp_table

def unimported_module(chain):
    """The first module along torch.a.b.c that exists but is not an attribute yet."""
    value, parts = torch, chain.split(".")
    for index, part in enumerate(parts[1:], 2):
        if not hasattr(value, part):
            name = ".".join(parts[:index])
            try:
                return name if importlib.util.find_spec(name) is not None else None
            except (ImportError, ValueError):
                return None
        value = getattr(value, part)
    return None

root = pathlib.Path(torch.__file__).parent
files = {root / "_inductor" / "decomposition.py", root / "_prims_common" / "__init__.py"}
for function in select_decomp_table().values():
    function = inspect.unwrap(getattr(function, "func", function))  # a functools.partial for CIA ops
    module = sys.modules.get(getattr(function, "__module__", ""))
    if getattr(module, "__file__", None):
        files.add(pathlib.Path(module.__file__))
for pattern in ("_decomp/*.py", "_refs/**/*.py", "_prims/*.py"):
    files.update(root.glob(pattern))
found = {}
for file in sorted(files):
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith(("from ", "import ", "#")):
            continue
        for chain in re.findall(r"(?<![\w.])torch(?:\.\w+)+", line):
            module = unimported_module(chain)
            if module:
                found.setdefault(module, []).append(f"{file.relative_to(root)}:{number}")
print(json.dumps({"files": len(files), "found": found}))
'''


def test_decompositions_reach_only_the_compiler_modules_capture_imports() -> None:
    """Inductor's decomposition table calls `torch._inductor.<module>.<name>` in a
    few places without importing the module (inductor's compile has imported it
    by then; capture has not). Every such module, found by reading the table's
    source, must be in `LAZY_DECOMPOSITION_MODULES`, which capture imports."""
    result = subprocess.run([sys.executable, "-c", LAZY_REFERENCES], capture_output=True, text=True, check=True)
    report = json.loads(result.stdout)
    assert report["files"] > 10  # the table's modules were found and read
    assert set(report["found"]) <= set(torch_internals.LAZY_DECOMPOSITION_MODULES), report["found"]


POOLING_CAPTURE = r"""
import json, torch
from torch import nn
from hatch_precompile.worker import torch_internals
cases = {
    "max_pool1d": (nn.MaxPool1d(3, 2), (2, 4, 16)),
    "max_pool2d": (nn.MaxPool2d(3, 2, padding=1), (2, 4, 16, 16)),
    "max_pool3d": (nn.MaxPool3d(2), (2, 4, 8, 8, 8)),
    "max_pool2d_ceil": (nn.MaxPool2d(2, ceil_mode=True), (2, 4, 15, 15)),
    "adaptive_max_pool2d": (nn.AdaptiveMaxPool2d(3), (2, 4, 16, 16)),
}
report = {}
for name, (module, shape) in cases.items():
    x = torch.randn(*shape)
    exported = torch_internals.decompose(torch.export.export(module.eval(), (x,)))
    report[name] = bool(torch.equal(exported.module()(x), module(x)))
print(json.dumps(report))
"""


def test_max_pooling_decomposes_in_a_process_that_never_compiled() -> None:
    result = subprocess.run([sys.executable, "-c", POOLING_CAPTURE], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == dict.fromkeys(["max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_ceil", "adaptive_max_pool2d"], True)


@torch.library.custom_op("hatch_precompile_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class CallsACustomOp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.hatch_precompile_test.twice(nn.functional.max_pool2d(x, 2)) + torch.arange(4)


def test_custom_ops_defined_in_python_are_found_with_their_module_and_torchs_own_are_not() -> None:
    exported = torch_internals.decompose(torch.export.export(CallsACustomOp(), (torch.randn(1, 2, 8, 8),)))
    targets = {str(node.target) for node in exported.graph_module.graph.nodes if node.op == "call_function"}
    assert any(target.startswith("prims.") for target in targets)  # torch's own Python-defined ops are in the graph
    assert torch_internals.python_op_libraries(exported) == {"hatch_precompile_test::twice": __name__}


def _binding_source(prelude: str) -> str:
    """A kernel's `main_code` as the build passes it (`prelude` first), with the
    Python binding inductor appends to it (`load_pybinding_async`'s formatting)."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache as cls

    argtypes = ["float*", "const float*", "int64_t", "uintptr_t", "float"]
    parse = ", ".join(f"parse_arg<{argtype.replace('const ', '')}>(args, {n})" for n, argtype in enumerate(argtypes))
    suffix = cls.suffix_template.format(
        arg_len=len(argtypes),
        call_entry_func=cls.call_entry_function.format(parse),
        entry_func=cls.entry_function,
        extra_parse_arg=cls.extra_parse_arg.format(array_len=-1),
    )
    kernel = '#include <cstdint>\nextern "C" void kernel(float* out, const float* in, int64_t n, uintptr_t, float scale) { out[0] = in[0] * n * scale; }\n'
    return prelude + kernel + suffix


def test_the_kernels_python_binding_builds_against_the_stable_abi_with_the_builds_prelude(tmp_path: Path) -> None:
    """With `STABLE_ABI_PRELUDE` the binding compiles under Py_LIMITED_API, and the
    define is in effect (a name outside the limited API fails); with the limited
    API alone, the only names missing are the two macros the prelude renames
    (2.13's binding uses them; 2.15's takes METH_FASTCALL arguments and uses neither)."""
    import sysconfig

    def compile_check(source: str) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "binding.cpp"
        path.write_text(source)
        command = ["g++", "-std=c++17", "-fsyntax-only", f"-I{sysconfig.get_paths()['include']}", str(path)]
        return subprocess.run(command, capture_output=True, text=True)

    prelude = torch_internals.STABLE_ABI_PRELUDE
    built = compile_check(_binding_source(prelude))
    assert built.returncode == 0, built.stderr[-3000:]
    outside = compile_check(_binding_source(prelude) + "static void probe(PyObject* t) { PyTuple_SET_ITEM(t, 0, nullptr); }\n")
    assert outside.returncode != 0 and "PyTuple_SET_ITEM" in outside.stderr, outside.stderr[-3000:]
    limited_only = prelude.splitlines()[0] + "\n"
    assert limited_only.startswith(f"#define Py_LIMITED_API 0x{sys.version_info.major:02X}{sys.version_info.minor:02X}0000")
    errors = [line for line in compile_check(_binding_source(limited_only)).stderr.splitlines() if "error:" in line]
    assert all("PyTuple_GET_ITEM" in line or "PyTuple_GET_SIZE" in line for line in errors), errors
    plain = compile_check(_binding_source(""))
    assert plain.returncode == 0, plain.stderr[-3000:]


def test_after_start_model_a_model_compiles_to_the_bytes_it_would_in_a_fresh_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker compiles its models in turn (worker/main.py), and torch numbers the
    graphs a process compiles into the artifacts; `start_model` restarts those
    numbers, so a model's artifact does not depend on what was compiled before it.
    (Each compile gets its own inductor cache: a cache hit would hide the numbers.)"""

    def compiled_bytes(module: nn.Module, name: str) -> bytes:
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / f"{name}-cache"))
        exported = torch_internals.decompose(torch.export.export(module.eval(), (torch.randn(3, 8),)))
        with torch_internals.precompiled_headers_in(session_compiler_outputs() / "headers"):
            artifact = torch_internals.compile_exported(exported, {})
        torch_internals.save_artifact(artifact, str(tmp_path / name))
        return (tmp_path / name).read_bytes()

    torch_internals.start_model()
    first = compiled_bytes(Small(), "first.bin")
    compiled_bytes(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)), "between.bin")  # advances the counters
    torch_internals.start_model()
    assert compiled_bytes(Small(), "again.bin") == first
    # start_model passes over a module not imported yet: after a compile each must be there, with its counter.
    from hatch_precompile.worker.torch_internals.inductor import _GRAPH_COUNTERS

    assert [isinstance(getattr(sys.modules.get(name), attribute, None), itertools.count) for name, attribute in _GRAPH_COUNTERS] == [True] * len(_GRAPH_COUNTERS)


PROBE_VECTOR_ISAS = """
import json, sys
from pathlib import Path
from hatch_precompile.worker import torch_internals
from torch._inductor.cpu_vec_isa import valid_vec_isa_list
torch_internals.probe_vector_isas_in(Path(sys.argv[1]))
print(json.dumps(sorted(str(isa) for isa in valid_vec_isa_list())))
"""


def test_the_vector_isa_probes_compile_into_the_folder_given_and_only_once(tmp_path: Path) -> None:
    """`probe_vector_isas_in` decides the process's vector ISAs with inductor's
    probe programs in the folder given, and a process given a folder that holds
    them finds the ISAs without building any program again, here or elsewhere
    (its own inductor cache stays empty). The folder is the session's, where
    the builds before this test (which use the same function) have built the
    programs already; run alone, a first process builds them (a fresh process
    importing inductor costs about 4 s of CPU, so only then)."""
    folder = session_compiler_outputs() / "vector-isa"

    def probe() -> list[str]:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-cache")}
        done = subprocess.run([sys.executable, "-c", PROBE_VECTOR_ISAS, str(folder)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def programs() -> dict[str, tuple[int, int]]:
        return {str(p): (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.rglob("*.so")}

    if not programs():
        probe()
    built = programs()
    found = probe()
    assert len(built) >= len(found) > 0, (found, built)  # a program per usable ISA at least
    assert not list((tmp_path / "inductor-cache").rglob("*.so")), "a probe was built outside the folder given"
    assert programs() == built, "a process given the folder built the probe programs again"
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    torch_internals.probe_vector_isas_in(folder)  # this process, given the same folder (decided once per process)
    assert found == sorted(str(isa) for isa in valid_vec_isa_list())


def test_int8_weights_pack_into_an_opaque_layout_that_the_recorded_call_rebuilds() -> None:
    """The loader rebuilds an int8 variant's packed weights by calling the prepack
    ops again (`_torch_private.prepack`): they are torch's own (no torchao), their
    result cannot be saved, and packing the same plain weight gives the same one."""
    weight = torch.randint(-128, 128, (16, 32), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    packed = _torch_private.prepack("onednn.qlinear_prepack", [weight, None])
    assert packed.layout == torch._mkldnn and torch.equal(packed.to_dense(), weight.t())
    with pytest.raises(NotImplementedError, match="OpaqueTensorImpl"):
        packed.untyped_storage()
    conv = torch.randint(-128, 128, (8, 3, 3, 3), dtype=torch.int8, generator=torch.Generator().manual_seed(1))
    scales = torch.rand(8) / 100
    packed = _torch_private.prepack("onednn.qconv_prepack", [conv, scales, 0.02, 0, [1, 1], [1, 1], [1, 1], 1, None])
    assert packed.layout == torch._mkldnn and torch.equal(packed.to_dense(), conv)
    assert set(_torch_private.PREPACK_OPS) == {"onednn.qlinear_prepack", "onednn.qconv_prepack"}
    with pytest.raises(ValueError, match="not an op this loader rebuilds packed weights with"):
        _torch_private.prepack("aten.add", [weight, weight])


# --- State: buffers updated in place (worker/state.py) -------------------------------


class Cached(nn.Module):
    """A static KV cache written as users write one for torch.export: through the
    rows of the batch (`[:b]`), and, as transformers' StaticCache does, whole; and
    a step counter."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("rows", torch.zeros(4, 2, 32, 8))
        self.register_buffer("whole", torch.zeros(4, 2, 32, 8))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        self.rows[:b].index_copy_(2, position, x)
        self.whole.index_copy_(2, position, x.sum(0, keepdim=True).expand(4, -1, -1, -1))
        self.steps.add_(1)
        return self.rows[:b].sum(2) + self.whole[:b].sum(2) + self.steps


def test_a_cache_update_compiles_in_place_with_no_copy_of_the_cache() -> None:
    """The graph `state_written_back` makes: the compiled graph mutates exactly the
    state's inputs, allocates no temporary of a cache's size (a copy of the cache
    per call), returns the user's output alone, and leaves eager's state after
    each call."""
    from hatch_precompile.worker.state import mutated_buffers

    module, eager = Cached().eval(), Cached().eval()
    batch, seq = torch.export.Dim("batch", min=1, max=4), torch.export.Dim("seq", min=1, max=32)
    x, position = torch.randn(2, 2, 5, 8), torch.arange(5)
    with torch.no_grad():
        exported = torch_internals.decompose(torch.export.export(module, (x, position), dynamic_shapes=({0: batch, 2: seq}, {0: seq})))
        artifact = torch_internals.compile_exported(exported, {})
    assert mutated_buffers(exported) == ["rows", "whole", "steps"]
    names = [s.target for s in exported.graph_signature.input_specs if s.kind.name != "USER_INPUT"]
    state_inputs = {names.index(name) for name in ("rows", "whole", "steps")}
    source, _, refused = torch_internals.output_module(artifact, state_inputs)
    assert refused == "", refused
    allocations = re.findall(r"empty_strided_cpu\(\(([^)]*)\)", source)
    assert not [shape for shape in allocations if shape.replace(" ", "").endswith("2,32,8")], allocations
    weights = [exported.constants.get(n, exported.state_dict.get(n)).clone() for n in names]
    calls = [(x, position), (torch.randn(2, 2, 1, 8), torch.tensor([5])), (torch.randn(1, 2, 3, 8), torch.tensor([6, 7, 8]))]
    with torch.no_grad():
        for args in calls:
            outputs = artifact(*weights, *args)
            assert len(outputs) == 1
            torch.testing.assert_close(outputs[0], eager(*args), rtol=1e-5, atol=1e-5)
    for name, tensor in zip(names, weights):
        torch.testing.assert_close(tensor, dict(eager.named_buffers())[name])


# -- torch_internals.low_bit: the kernels behind weight-only int8 and int4, and int8-dynamic --


@pytest.mark.parametrize("scheme", ["int8", "int4-32", "int4-64", "int4-128"])
def test_the_weight_only_layers_compute_what_torchaos_own_linear_does(scheme: str) -> None:
    """worker/linears.py reads torchao's tensor data (qdata, scale,
    scale_and_zero) and calls torch's kernel itself: the same numbers as
    F.linear on torchao's tensor."""
    from torchao.prototype.quantization.int4.int4_opaque_tensor import Int4OpaqueTensor
    from torchao.quantization.granularity import PerRow
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import Int8Tensor

    from hatch_precompile.worker.linears import Int4WeightOnlyLinear, Int8WeightOnlyLinear

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(384, 256, generator=generator).to(torch.bfloat16)
    bias = torch.randn(384, generator=generator).to(torch.bfloat16)
    x = torch.randn(3, 5, 256, generator=generator).to(torch.bfloat16)
    if scheme == "int8":
        quantized = Int8Tensor.from_hp(weight, PerRow())
        layer: nn.Module = Int8WeightOnlyLinear(quantized.qdata, quantized.scale.reshape(-1).to(torch.bfloat16), bias)
    else:
        group = int(scheme.split("-")[1])
        quantized = Int4OpaqueTensor.from_hp(weight, [1, group])
        layer = Int4WeightOnlyLinear(quantized.qdata, quantized.scale_and_zero, group, 384, bias)
    with torch.no_grad():
        ours, torchaos = layer(x), nn.functional.linear(x, quantized, bias)
    assert ours.dtype == torch.bfloat16 and ours.shape == (3, 5, 384)
    # int8: torchao rounds its float32 scales to bfloat16 after the product, the kernel before it
    tolerance = {"rtol": 0.02, "atol": 0.05} if scheme == "int8" else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(ours, torchaos, **tolerance)


def test_int_mm_multiplies_int8_exactly_on_any_shape() -> None:
    """int8-dynamic's product (torch_internals.int8_matmul, torch._int_mm): exact
    int32 sums, the weight passed as the transpose of its (out, in) rows, on shapes
    no multiple of any vector width and a row of 1 (a decode step)."""
    generator = torch.Generator().manual_seed(0)
    for rows, inputs, outputs in [(1, 576, 192), (3, 17, 5), (1, 8, 1), (40, 96, 33)]:
        x = torch.randint(-127, 128, (rows, inputs), dtype=torch.int8, generator=generator)
        weight = torch.randint(-127, 128, (outputs, inputs), dtype=torch.int8, generator=generator)
        product = torch_internals.int8_matmul(x, weight.t())
        assert product.dtype == torch.int32 and torch.equal(product, x.int() @ weight.int().t()), (rows, inputs, outputs)


def test_the_int8_dynamic_layer_is_its_rounding_written_out() -> None:
    """Int8DynamicLinear computes, up to float32 summation order, each row rounded
    to int8 at its own scale (after unsmoothing) times the int8 weight and its scales."""
    from hatch_precompile.worker.linears import Int8DynamicLinear

    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (48, 40), dtype=torch.int8, generator=generator)
    scales, unsmoothing = torch.rand(48, generator=generator) / 100, torch.rand(40, generator=generator) + 0.5
    bias = torch.randn(48, generator=generator).to(torch.bfloat16)
    x = (torch.randn(2, 3, 40, generator=generator) * 4).to(torch.bfloat16)
    rows = x.reshape(6, 40).float() * unsmoothing
    step = rows.abs().amax(1, keepdim=True) / 127
    expected = ((torch.round(rows / step) @ weight.float().t()) * step * scales).to(torch.bfloat16).reshape(2, 3, 48) + bias
    with torch.no_grad():
        got = Int8DynamicLinear(weight, scales, unsmoothing, bias)(x)
    torch.testing.assert_close(got, expected, rtol=0.01, atol=0.01)


@pytest.mark.parametrize(
    ("scheme", "kernel"),
    [("int8", "torch.ops.aten._weight_int8pack_mm"), ("int4", "torch.ops.quantized.int4mm_packed_weight_cpu"), ("int8-dynamic", "extern_kernels._int_mm")],
)
def test_a_weight_only_layer_compiles_to_its_kernel_with_no_constant(scheme: str, kernel: str) -> None:
    """The compiled graph calls the kernel with the weights as inputs and freezes
    no constant (inductor's lowering of aten._weight_int4pack_mm_for_cpu would:
    the group size), so its output module runs alone, in the lean form."""
    from hatch_precompile.worker.linears import Int4WeightOnlyLinear, Int8DynamicLinear, Int8WeightOnlyLinear

    generator = torch.Generator().manual_seed(0)
    if scheme == "int8-dynamic":
        layer: nn.Module = Int8DynamicLinear(torch.randint(-127, 127, (64, 32), dtype=torch.int8, generator=generator), torch.rand(64) / 100, torch.rand(32) + 0.5, None)
    elif scheme == "int8":
        layer = Int8WeightOnlyLinear(torch.randint(-127, 127, (64, 32), dtype=torch.int8, generator=generator), torch.rand(64).to(torch.bfloat16), None)
    else:
        weight = torch.randint(0, 16, (64, 32), dtype=torch.int32, generator=generator)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(weight, 1)
        layer = Int4WeightOnlyLinear(packed, torch.rand(1, 64, 2).to(torch.bfloat16), 32, 64, None)
    x = torch.randn(2, 7, 32).to(torch.bfloat16)
    exported = torch_internals.decompose(torch.export.export(layer.eval(), (x,), dynamic_shapes=({1: torch.export.Dim("seq", min=1, max=64)},)))
    artifact = torch_internals.compile_exported(exported, {})
    source, _, refused = torch_internals.output_module(artifact, set())
    assert refused == "" and kernel in source, refused or source
    with torch.no_grad():
        torch.testing.assert_close(artifact(*[b for _, b in layer.named_buffers()], x)[0], layer(x), rtol=0.02, atol=0.02)


class _SharedInput(nn.Module):
    """Two layers on one input, and a third on another: what a block's q/k/v or gate/up look like."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gate, self.up, self.other = nn.Linear(32, 48), nn.Linear(32, 16, bias=False), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.gate(x) * 2, self.up(x), self.other(x + 1)], -1)


@pytest.mark.parametrize("strict", [False, True])
def test_layers_sharing_an_input_capture_as_one_product_and_stay_each_their_own(strict: bool) -> None:
    """linears.SharedInputLinears (with torch_internals.tensor_version) relies on torch.export passing one traced tensor
    to every layer the module hands the same tensor (non-strict: Python runs the
    forward as written; strict: dynamo keeps the identity, reads no version): one
    product per group in the graph. Eagerly, a member called with another input,
    or with its input changed in place since, gets its own product."""
    from hatch_precompile.engine.model_config import ModelConfig
    from hatch_precompile.worker.linears import SharedInputPart, quantize_weights

    module = _SharedInput().to(torch.bfloat16)
    expected_module = copy.deepcopy(module)
    x = torch.randn(3, 32).to(torch.bfloat16)
    model = ModelConfig(name="m", factory="pkg:factory", dtype="bfloat16", quantize="int8-weight-only")  # type: ignore[arg-type]
    record = quantize_weights(model, module, [((x,), {}), ((x[:1],), {})])
    quantize_weights(model, expected_module, ())  # each layer on its own
    assert record["shared_input"] == {"gate__up": ["gate", "up"]} and isinstance(module.up, SharedInputPart), record
    with torch.no_grad():
        assert torch.equal(module(x), expected_module(x))
        y = torch.randn(3, 32).to(torch.bfloat16)
        assert torch.equal(module.up(y), expected_module.up(y)) and torch.equal(module.gate(x), expected_module.gate(x))  # another input each
        z = x.clone()
        module.gate(z)
        z.add_(1)  # changed in place after gate took it: up multiplies what it holds now
        assert torch.equal(module.up(z), expected_module.up(z))
    exported = torch.export.export(module.eval(), (x,), strict=strict)
    products = [node for node in exported.graph.nodes if node.target is torch.ops.aten._weight_int8pack_mm.default]
    assert len(products) == 2, exported.graph  # gate and up as one, other alone
    with torch.no_grad():
        assert torch.equal(exported.module()(x), expected_module(x))


# -- torch_internals.aoti and the loader's container calls: the C++ form --


class CachedWithConstants(Cached):
    """Cached, with the two kinds of lifted constant: a plain tensor attribute and
    a tensor made in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.offsets = torch.linspace(-1, 1, 8)

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return super().forward(x, position) * self.offsets + torch.tensor([0.5])


def test_a_weightless_container_binds_by_name_and_updates_each_handles_state(tmp_path: Path) -> None:
    """The library's constants are the export's state-dict names (its lifted
    constants found by their order); bound without a copy, each container runs
    the graph as eager does, updates its own state tensors in place (a 0-dim step
    counter included: it is not compiled in) and returns the user's outputs
    alone. (Two builds giving the same library bytes: tests/test_example_wheel.py;
    no weight inside it: the same file.)"""
    module, eager = CachedWithConstants().eval(), CachedWithConstants().eval()
    batch, seq = torch.export.Dim("batch", min=1, max=4), torch.export.Dim("seq", min=1, max=32)
    x, position = torch.randn(2, 2, 5, 8), torch.arange(5)
    exported = torch_internals.decompose(torch.export.export(module, (x, position), dynamic_shapes=({0: batch, 2: seq}, {0: seq})))
    with torch_internals.compiler_outputs_in(session_compiler_outputs()):
        library, ops, _ = torch_internals.compile_container(exported, {})
    assert ops is None  # every op it calls is in the C shim
    path = tmp_path / "model.so"
    path.write_bytes(library)
    names = [s.target for s in exported.graph_signature.input_specs if s.kind.name != "USER_INPUT"]
    tensors = {n: exported.constants.get(n, exported.state_dict.get(n)) for n in names}
    constants = torch_internals.container_constants(path, exported)
    assert sorted(constants.values()) == sorted(names) and {"offsets", "lifted_tensor_0"} <= set(names)
    handles = []
    for _ in range(2):
        own = {n: t.clone() for n, t in tensors.items()}
        container = _torch_private.load_container(path)
        assert sorted(_torch_private.container_constant_names(container)) == sorted(constants)
        _torch_private.bind_constants(container, {constant: own[name] for constant, name in constants.items()})
        handles.append((container, own))
    (first, state), (_, untouched) = handles
    calls = [(x, position), (torch.randn(2, 2, 1, 8), torch.tensor([5])), (torch.randn(1, 2, 3, 8), torch.tensor([6, 7, 8]))]
    with torch.no_grad():
        for args in calls:
            outputs = first.run(list(args))
            assert len(outputs) == 1
            torch.testing.assert_close(outputs[0], eager(*args), rtol=1e-5, atol=1e-5)
    for name, tensor in dict(eager.named_buffers()).items():
        torch.testing.assert_close(state[name], tensor)  # written in place, in this handle's tensors
    assert all(torch.equal(untouched[name], tensors[name]) for name in names)


def test_a_torch_free_library_links_no_torch_and_its_source_names_its_constants_as_the_runner_does(tmp_path: Path) -> None:
    """`aot_inductor.link_libtorch=False` (the torch-free form): the library needs
    no torch library, what it leaves undefined of torch is the shim's functions and
    SLEEF's, all of which the wheel's shim gives; and the constants' original names
    read from the generated source (which torch's runner cannot load for it) are
    the names torch's runner reads from the usual library."""
    from hatch_precompile.shim.build import referenced, unprovided

    module = CachedWithConstants().eval()
    batch, seq = torch.export.Dim("batch", min=1, max=4), torch.export.Dim("seq", min=1, max=32)
    exported = torch_internals.decompose(torch.export.export(module, (torch.randn(2, 2, 5, 8), torch.arange(5)), dynamic_shapes=({0: batch, 2: seq}, {0: seq})))
    with torch_internals.compiler_outputs_in(session_compiler_outputs()):
        usual, _, usual_names = torch_internals.compile_container(exported, {})
        free, ops, free_names = torch_internals.compile_container(exported, torch_internals.TORCH_FREE_CONFIG)
    (tmp_path / "usual.so").write_bytes(usual)
    (tmp_path / "free.so").write_bytes(free)
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(tmp_path / "usual.so"), 1)
    assert usual_names == free_names == runner.get_constant_names_to_original_fqns() and usual_names
    needed = subprocess.run(["readelf", "-d", str(tmp_path / "free.so")], capture_output=True, text=True, check=True).stdout
    assert ops is None and "libtorch" not in needed and "libc10" not in needed
    symbols = referenced(tmp_path / "free.so")
    assert any(symbol.startswith("aoti_torch_") for symbol in symbols) and unprovided(symbols) == []


def test_outputs_that_alias_inputs_or_buffers_are_named_for_the_container_and_inputs_returned_as_they_are_by_position() -> None:
    class Returns(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.ones(4))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * 2, self.table[:2]

    exported = torch_internals.decompose(torch.export.export(Returns(), (torch.randn(3),)))
    assert torch_internals.aliased_output(exported) == "output 1 is a weight or a buffer, or a view of one or of an input, and the container would return a copy"
    assert torch_internals.aliased_output(torch_internals.decompose(torch.export.export(Small(), (torch.randn(2, 8),)))) == ""
    # An input returned as it is (a features dict with more in it) is named by position: the loader hands the caller's back.
    features = {"x": torch.randn(3), "mask": torch.ones(3, dtype=torch.long)}
    exported = torch_internals.decompose(torch.export.export(ReturnsFeatures(), (features,)))
    assert torch_internals.returned_inputs(exported) == {0: 0, 1: 1}
    assert torch_internals.aliased_output(exported) == ""


class ReturnsFeatures(nn.Module):
    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**features, "twice": features["x"] * 2}


def test_the_process_is_read_without_torch_as_torch_reads_it() -> None:
    """The NumPy path decides what loads without importing torch: the version and
    git revision from torch's version.py, the CPU features from /proc/cpuinfo by
    torch's names, the ATen kernels' level by torch's rule, also where
    ATEN_CPU_CAPABILITY lowers it."""
    from hatch_precompile.runtime import _manifest

    installed = _manifest.installed_torch()
    assert (installed.version, installed.git_version) == (torch.__version__, torch.version.git_version)
    assert (installed.libraries / "libtorch_cpu.so").is_file()
    theirs = {name for name, present in torch.cpu.get_capabilities().items() if present is True}
    assert _manifest.cpu_features() == theirs & set(_manifest.CPUINFO_FLAGS)
    assert _manifest.aten_capability(_manifest.cpu_features()) == torch.backends.cpu.get_cpu_capability()
    for forced in ("avx2", "default"):
        code = "import torch; from hatch_precompile.runtime import _manifest as m; print(torch.backends.cpu.get_cpu_capability(), m.aten_capability(m.cpu_features()))"
        result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ATEN_CPU_CAPABILITY": forced}, capture_output=True, text=True, check=True)
        theirs_forced, ours_forced = result.stdout.split()
        assert ours_forced == theirs_forced, forced


def test_the_shim_and_the_container_interface_run_a_library_on_numpy_arrays_as_torchs_runner_does(tmp_path: Path) -> None:
    """The NumPy path's calls (`runtime/_shim.py`, `runtime/_container.py`): tensor
    handles over NumPy memory, constants bound by name without a copy, a state
    updated in place in the caller's array, outputs equal to torch's runner bit
    for bit and viewed without a copy; and `at::set_num_threads`, exported by
    libtorch_cpu, is what torch.set_num_threads sets."""
    import numpy

    from hatch_precompile.runtime import _shim
    from hatch_precompile.runtime._container import ContainerLibrary

    module = CachedWithConstants().eval()
    batch, seq = torch.export.Dim("batch", min=1, max=4), torch.export.Dim("seq", min=1, max=32)
    x, position = torch.randn(2, 2, 5, 8), torch.arange(5)
    exported = torch_internals.decompose(torch.export.export(module, (x, position), dynamic_shapes=({0: batch, 2: seq}, {0: seq})))
    with torch_internals.compiler_outputs_in(session_compiler_outputs()):
        library, _, _ = torch_internals.compile_container(exported, {})
    path = tmp_path / "model.so"
    path.write_bytes(library)
    constants = torch_internals.container_constants(path, exported)
    tensors = {n: exported.constants.get(n, exported.state_dict.get(n)) for n in constants.values()}
    theirs = _torch_private.load_container(path)
    own = {n: t.clone() for n, t in tensors.items()}
    _torch_private.bind_constants(theirs, {c: own[n] for c, n in constants.items()})

    shim = _shim.load()
    container = ContainerLibrary(path, shim).create()
    assert sorted(container.constant_names()) == sorted(constants)
    arrays = {n: t.numpy().copy() for n, t in tensors.items()}
    container.bind({c: (arrays[n], shim.dtype_code(str(tensors[n].dtype).removeprefix("torch."))) for c, n in constants.items()})
    run = container.runner([shim.dtype_code("float32"), shim.dtype_code("int64")])
    calls = [(x, position), (torch.randn(2, 2, 1, 8), torch.tensor([5]))]
    with torch.no_grad():
        for args in calls:
            (expected,) = theirs.run(list(args))
            (handle,) = run([a.numpy() for a in args])
            got = shim.array(handle, numpy.dtype("float32"))
            assert numpy.array_equal(got, expected.numpy()) and got.base is not None  # a view of the output's memory
    for name, tensor in own.items():
        assert numpy.array_equal(arrays[name], tensor.numpy())  # the state, updated in place in the caller's arrays

    before = torch.get_num_threads()
    _torch_private.set_num_threads(shim.library, 1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(before)


class _CachedAttention(nn.Module):
    """One bfloat16 attention over a static cache of 16 positions, updated in place: a decoder's step."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keys", torch.randn(1, 4, 16, 8, generator=torch.Generator().manual_seed(0)).bfloat16())

    def forward(self, query: torch.Tensor, key: torch.Tensor, position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.keys.index_copy_(2, position, key)
        return nn.functional.scaled_dot_product_attention(query, self.keys, self.keys, attn_mask=mask).transpose(1, 2).reshape(1, -1, 32)


def test_cpu_flash_attention_is_what_sdpa_decomposes_to_and_the_float32_math_replaces_it() -> None:
    """torch_internals.attention_as_float32_math: sdpa becomes the CPU flash kernel
    (its output contiguous), a table entry replaces it, and the math matches it."""
    generator = torch.Generator().manual_seed(1)
    query, key = (torch.randn(1, 4, 1, 8, generator=generator).bfloat16() for _ in range(2))
    mask = torch.zeros(1, 1, 1, 16, dtype=torch.bfloat16)
    mask[..., 6:] = float("-inf")
    args = (query, key, torch.tensor([5]), mask)
    exported = torch.export.export(_CachedAttention(), args)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    targets = {node.target for node in torch_internals.decompose(exported).graph.nodes}
    assert flash in targets
    replaced = torch_internals.decompose(exported, attention_in_float32=True)
    assert flash not in {node.target for node in replaced.graph.nodes}
    expected = flash(query, _CachedAttention().keys, _CachedAttention().keys, 0.0, False, attn_mask=mask)
    assert expected[0].is_contiguous()
    got = torch_internals.attention_as_float32_math(query, _CachedAttention().keys, _CachedAttention().keys, attn_mask=mask)
    assert got[0].dtype == torch.bfloat16 and got[0].stride() == expected[0].stride()
    torch.testing.assert_close(got[0], expected[0], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got[1], expected[1], atol=1e-3, rtol=1e-4)  # the kernel's scores of bfloat16 products
    torch.testing.assert_close(replaced.module()(*args), exported.module()(*args), atol=2e-2, rtol=2e-2)
