"""The lean form: inductor's output module, rewritten to run without the compiler.

Runs in the compile worker. `rewrite` takes the output module of a compiled CPU
graph and returns the text the wheel ships, or refuses with the reason. It is
strict on purpose: a lean module is shipped only where it is exactly what the
artifact runs, minus the compiler. Then `check` runs every rewritten module the
way the loader will, in a new interpreter, and compares its outputs with the
artifact's, bit for bit (the artifact's passed the accuracy check,
`accuracy.py`). The build's form interface (`form.py`): `produce`, `check`.

The rewrite, on the module's syntax tree (never on guessed text patterns):
- drops the leading docstring (compile-time autotuning notes) and the benchmark
  harness (`get_args`, `benchmark_compiled_module`, the `__main__` block);
- drops the compiler imports; the loader binds `AsyncCompile`,
  `extern_kernels` and (torch >= 2.14) `assert_tensor_metadata`
  (`runtime/_torch_private.py`, `LEAN_BINDINGS`); the other three names must be
  unused;
- replaces each `async_compile.cpp_pybinding(argtypes, source)` with
  `shipped_kernel("<key>")`, the key of a kernel this compile built;
- in an int8 (frozen) module, keeps each constant's declaration
  (`_frozen_param3 = None`), which the loader binds, without inductor's comment
  after it, which ends in the tensor's memory address; and drops the addresses
  from the message strings of its size checks (`<function qlinear at 0x7f..>`),
  so that a rebuild writes the same bytes.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..engine.errors import ModelBuildError
from ..engine.model_config import ModelConfig
from ..runtime._layout import KERNELS_DIR, artifact_file, lean_module_file
from ..runtime._schema import LeanRecord, has_lean_form, is_lean_only
from ..runtime._torch_private import LEAN_BINDINGS
from . import torch_internals
from .form import Pending, Step, Variant
from .frozen_tensors import ConstantsRefused, save_constants
from .lean_check import CheckRequest, ModuleCheck, check_all, read_results
from .torch_internals import FrozenGraph

# The compiler imports inductor writes, by module. The loader binds the names in
# LEAN_BINDINGS; the others must be unused.
_COMPILER_IMPORTS = {
    "torch._inductor.hooks": {"run_intermediate_hooks"},
    "torch._inductor.utils": {"maybe_profile"},
    "torch._inductor.codegen.memory_planning": {"_align"},
    "torch._inductor.async_compile": {"AsyncCompile"},
    "torch._inductor.select_algorithm": {"extern_kernels"},
    # torch >= 2.14: size, stride and dtype check of a fallback op's output
    # (e.g. CPU flash attention); the loader binds its own copy.
    "torch._inductor.runtime.runtime_utils": {"assert_tensor_metadata"},
}
_PLAIN_IMPORTS = {"torch", "math", "cmath", "random", "os", "tempfile", "ctypes"}
_BENCHMARK_HARNESS = {"get_args", "benchmark_compiled_module"}
_ADDRESS = re.compile(r" at 0x[0-9a-f]+>")
CHECK_MODULE = "hatch_precompile.worker.lean_check"


class LeanRefused(Exception):
    """The output module cannot run on its own exactly as the artifact runs it."""


@dataclass(frozen=True)
class LeanModule:
    text: str
    extern_kernels: list[str]  # the torch functions it calls as extern_kernels.<name>
    kernels: list[str]  # the keys of the kernels it loads
    constants: list[str]  # the globals it declares `= None` for the loader to bind (an int8 module's frozen constants)


def rewrite(source: str, built_kernels: set[str], title: str) -> LeanModule:
    """The lean module for an output module whose kernels `built_kernels` were
    compiled (by key); raises LeanRefused with the reason where it cannot be one."""
    tree = ast.parse(source)
    edits: list[tuple[Any, str]] = []  # (an ast node or a _ToLineEnd: a span of lines and columns, replacement text)
    constants: list[str] = []
    unbound: set[str] = set()
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        edits.append((body[0], ""))
    for statement in body:
        harness = isinstance(statement, ast.FunctionDef) and statement.name in _BENCHMARK_HARNESS
        main_guard = isinstance(statement, ast.If) and "__main__" in ast.unparse(statement.test)
        if harness or main_guard:
            edits.append((statement, ""))
        elif _declares_constant(statement):
            name = statement.targets[0].id  # type: ignore[attr-defined]  # _declares_constant checked it
            constants.append(name)
            edits.append((_ToLineEnd(statement, source), f"{name} = None"))
        elif isinstance(statement, ast.ImportFrom) and statement.module in _COMPILER_IMPORTS:
            for alias in statement.names:
                if alias.name not in _COMPILER_IMPORTS[statement.module]:
                    raise LeanRefused(f"it imports {alias.name} from {statement.module}")
                if alias.name not in LEAN_BINDINGS:
                    unbound.add(alias.asname or alias.name)
                elif alias.asname not in (None, alias.name):
                    raise LeanRefused(f"it imports {alias.name} from {statement.module} as {alias.asname}")
            edits.append((statement, ""))
    removed = {id(node) for node, _ in edits}
    kernels: list[str] = []
    extern: set[str] = set()
    for node in ast.walk(ast.Module(body=[s for s in body if id(s) not in removed], type_ignores=[])):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module not in _PLAIN_IMPORTS:
                    raise LeanRefused(f"it imports {module}")
        elif isinstance(node, ast.Name) and node.id in unbound:
            raise LeanRefused(f"it uses {node.id} (an optional inductor feature is on)")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "extern_kernels":
            if not torch_internals.extern_kernel_is_torch_function(node.attr):
                raise LeanRefused(f"it calls extern_kernels.{node.attr}, which is not torch.{node.attr}")
            extern.add(node.attr)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "async_compile":
            if node.attr not in ("cpp_pybinding", "wait"):
                raise LeanRefused(f"it compiles kernels with async_compile.{node.attr}")
        elif isinstance(node, ast.Call) and _is_cpp_pybinding(node):
            key = _kernel_key(node)
            if key not in built_kernels:
                raise LeanRefused(f"its kernel {key} is not one this compile built")
            kernels.append(key)
            edits.append((node, f'shipped_kernel("{key}")'))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _ADDRESS.search(node.value):
            edits.append((node, repr(_ADDRESS.sub(">", node.value))))
    text = _apply(source, edits)
    try:
        rewritten = ast.parse(text)
    except SyntaxError as error:
        raise LeanRefused(f"the rewritten module does not parse: {error}") from None
    if not any(isinstance(s, ast.Assign) and any(getattr(t, "id", None) == "call" for t in s.targets) for s in rewritten.body):
        raise LeanRefused("it defines no call")
    header = (
        f"# {title}: inductor's output module, in the lean form written by hatch-precompile {__version__}.\n"
        "# The build removed the autotuning notes, the benchmark harness and the compiler imports;\n"
        f"# the loader binds {', '.join(name for name in LEAN_BINDINGS if name != 'shipped_kernel')},\n"
        "# and shipped_kernel(key) loads kernels/k_<key>.so.\n"
    )
    return LeanModule(header + text.strip() + "\n", sorted(extern), kernels, constants)


def _declares_constant(statement: ast.stmt) -> bool:
    """`name = None` at the top level: a frozen constant inductor binds after loading."""
    return (
        isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Constant) and statement.value.value is None
    )


class _ToLineEnd:
    """A statement's span extended to the end of its line: its trailing comment too."""

    def __init__(self, statement: ast.stmt, source: str) -> None:
        end_line = statement.end_lineno or statement.lineno
        self.lineno, self.col_offset = statement.lineno, statement.col_offset
        self.end_lineno, self.end_col_offset = end_line, len(source.splitlines()[end_line - 1].encode())


def _is_cpp_pybinding(node: ast.Call) -> bool:
    function = node.func
    return isinstance(function, ast.Attribute) and function.attr == "cpp_pybinding" and isinstance(function.value, ast.Name) and function.value.id == "async_compile"


def _kernel_key(node: ast.Call) -> str:
    if len(node.args) != 2 or node.keywords:
        raise LeanRefused("a cpp_pybinding call has other arguments than (argtypes, source)")
    try:
        argtypes, source = ast.literal_eval(node.args[0]), ast.literal_eval(node.args[1])
    except ValueError:
        raise LeanRefused("a cpp_pybinding call's arguments are not literals") from None
    return torch_internals.pybinding_kernel_key(argtypes, source)


def _apply(source: str, edits: list[tuple[Any, str]]) -> str:
    """The source with each node's text replaced (a removed statement takes its
    line break with it). ast's columns count UTF-8 bytes, so edit the bytes."""
    data = source.encode()
    line_starts = [0]
    for line in data.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    spans = []
    for node, replacement in edits:
        start = line_starts[node.lineno - 1] + node.col_offset
        end = line_starts[node.end_lineno - 1] + node.end_col_offset
        if replacement == "" and data[end : end + 1] == b"\n":
            end += 1
        spans.append((start, end, replacement.encode()))
    for start, end, encoded in sorted(spans, reverse=True):
        data = data[:start] + encoded + data[end:]
    return data.decode()


NAME, TITLE = "lean", "lean form"
TIMED = False  # a rewrite of the artifact's module: milliseconds


def wanted(model: ModelConfig) -> bool:
    return True  # every variant that can have one


def produce(variant: Variant) -> LeanRecord:
    """Write the variant's lean module into its folder, or say why there is none;
    an int8 variant's (compiled frozen: its only form) with its constants, or
    the build stops (`ModelBuildError`)."""
    if variant.frozen is not None:
        return _produce_frozen(variant, variant.frozen)
    assert variant.output_module is not None  # an artifact's, where not frozen
    source, inputs_to_check, refused = variant.output_module
    entry = variant.entry
    refused = refused or torch_internals.wrapper_work(variant.captured.exported)
    module_path = variant.out_dir / lean_module_file(entry["file"])
    if not refused:
        try:
            lean = rewrite(source, set(entry["kernels"]), f"{variant.model.name}/{module_path.name}")
        except LeanRefused as reason:
            refused = str(reason)
    if refused:
        return {"refused": refused}
    module_path.write_text(lean.text, encoding="utf-8")
    return {"file": module_path.name, "extern_kernels": lean.extern_kernels, "inputs_to_check": inputs_to_check}


def _produce_frozen(variant: Variant, frozen: FrozenGraph) -> LeanRecord:
    """An int8 variant's lean module, and its constants written as its `file`."""
    entry = variant.entry
    module_name = lean_module_file(artifact_file(entry["cpu_target"], entry["specialized"]))
    refused = torch_internals.wrapper_work(variant.captured.exported)
    if frozen.mutated_inputs:
        refused = f"the compiled graph mutates inputs {frozen.mutated_inputs}"
    try:
        entry["constants"] = save_constants(frozen, variant.out_dir / entry["file"])
        lean = rewrite(frozen.source, set(entry["kernels"]), f"{variant.model.name}/{module_name}")
    except (ConstantsRefused, LeanRefused) as reason:
        refused = str(reason)
    else:
        if not refused and set(lean.constants) != set(entry["constants"]):
            refused = f"it declares the constants {sorted(lean.constants)}, the compiled graph holds {sorted(entry['constants'])}"
    if refused:
        raise ModelBuildError(variant.model.name, "writing the int8 graph's lean form, its only form", refused)
    (variant.out_dir / module_name).write_text(lean.text, encoding="utf-8")
    return {"file": module_name, "extern_kernels": lean.extern_kernels, "inputs_to_check": frozen.inputs_to_check}


def check(pending: list[Pending], scratch: Path, step: Step) -> None:
    """Run each lean module on the calls it was checked on, against its artifact's
    outputs and state, bit for bit: freshly compiled ones in a new interpreter,
    as the loader would (one for all the models that import the same custom-op
    libraries: usually one in all); ones from the build cache or a part in this
    one (they passed that check when compiled, their key pins their code, and
    here they meet this build's weights). A module that fails is removed, and its
    variant ships in the artifact form, the reason in the manifest; an int8
    variant, whose lean form is its only one, stops the build."""
    ours = [p for p in pending if has_lean_form(p.entry)]
    fresh: dict[str, list[Pending]] = {}  # by the op libraries their process imports
    for variant in ours:
        if variant.compiled_here:
            fresh.setdefault(json.dumps(variant.op_libraries, sort_keys=True), []).append(variant)
    reused = [p for p in ours if not p.compiled_here]
    first = pending[0].model.name if pending else ""
    reasons: dict[str, str] = {}
    for index, (op_libraries, group) in enumerate(fresh.items()):
        folder = scratch / f"fresh-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        with step(first, f"ran the lean form of {len(group)} artifact(s) in a fresh process and compared"):
            reasons.update(_check_in_fresh_process(group, folder, json.loads(op_libraries)))
    if reused:
        with step(first, f"ran the lean form of {len(reused)} cached artifact(s) and compared"):
            reasons.update(check_all([_check_request(p) for p in reused]))
    for variant in ours:
        module_path = _module_path(variant)
        reason = reasons.get(str(module_path), "the check did not report on it")
        if reason and is_lean_only(variant.entry):
            raise ModelBuildError(variant.model.name, f"running the int8 lean form {module_path.name} in a fresh process", reason)
        if reason:
            module_path.unlink()
            variant.entry["lean"] = {"refused": reason}


def _module_path(variant: Pending) -> Path:
    return variant.out_dir / variant.entry["lean"]["file"]


def _check_in_fresh_process(pending: list[Pending], scratch: Path, op_libraries: dict[str, str]) -> dict[str, str]:
    """Run every module in a new interpreter as the loader would (after importing
    the modules defining the custom ops the graph calls); returns, per module
    file, "" if it matched or the reason it did not."""
    request = scratch / "lean-check.json"
    checks: CheckRequest = {"modules": [_check_request(p) for p in pending], "op_libraries": op_libraries}
    request.write_text(json.dumps(checks), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", CHECK_MODULE, str(request)], capture_output=True, text=True)
    results_path = scratch / "lean-check.result.json"
    if done.returncode != 0 or not results_path.is_file():
        reason = f"the check process exited with {done.returncode}: {done.stderr.strip()[-1500:]}"
        return {str(_module_path(p)): reason for p in pending}
    return read_results(results_path)


def _check_request(variant: Pending) -> ModuleCheck:
    lean, entry = variant.entry["lean"], variant.entry
    return {
        "file": str(_module_path(variant)),
        "data": str(variant.data_path),
        "extern_kernels": lean["extern_kernels"],
        "inputs_to_check": lean["inputs_to_check"],
        "kernels": entry["kernels"],
        "kernels_dir": str(variant.out_dir / KERNELS_DIR),
        "constants": {"file": str(variant.out_dir / entry["file"]), "specs": entry["constants"]} if is_lean_only(entry) else None,
    }
