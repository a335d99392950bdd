"""Compiling an export program with `standalone_compile(aot=True)`, and reading
what the artifact holds: its output module, what its wrapper does, its bytes.

What it relies on (measured on torch 2.13; `tests/test_torch_assumptions.py`
checks each):
- On an export graph, `standalone_compile(dynamic_shapes="from_graph")` looks for
  the fake mode under `node.meta["example_value"]` of the outputs, while export
  stores its fakes under `meta["val"]`. Copying them across makes the compile use
  export's ShapeEnv, so exactly the export Dims are symbolic; without it every
  size of every input, weights included, becomes symbolic.
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
- `torch._inductor.select_algorithm.extern_kernels.<name>`: the extern kernels the
  output module calls; we bind only those that are the torch function of the
  same name.
- Reproducible builds. In an artifact, node `meta["stack_trace"]` (source
  paths) only feeds messages and the debug strings it pickles; the repro script
  `compile_fx` writes with `after_aot.save_graph_repro` copies the environment
  (`TORCHINDUCTOR_CACHE_DIR`) unless `stable_output=True`; the AOTAutograd entry
  (`inner_fn.compiled_fn.serialize()`) records the compile's duration in
  `forward_time_taken_ns` and `backward_time_taken_ns`.
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

import copy
import functools
import itertools
import sys
from typing import Any

import torch

from ..state import state_written_back

# (module, attribute): the counters `start_model` restarts
_GRAPH_COUNTERS = (
    ("torch._functorch.aot_autograd", "AOT_COUNTER"),
    ("torch._inductor.compile_fx", "_graph_counter"),
    ("torch._inductor.graph", "_post_grad_graph_counter"),
    ("torch._inductor.scheduler", "_post_grad_graph_counter"),
)


def start_model() -> None:
    """Forget the graphs this process compiled before: see the module docstring.
    A module not imported yet has compiled nothing (its counter starts when it
    is), and is left so: a worker imports the compiler for its first compile,
    not before its first model."""
    for module_name, attribute in _GRAPH_COUNTERS:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        if not isinstance(getattr(module, attribute, None), itertools.count):
            raise RuntimeError(f"hatch-precompile relies on {module_name}.{attribute} being an itertools.count; this torch changed it")
        setattr(module, attribute, itertools.count())


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
    # An output that is an input (a weight, a buffer or the caller's own tensor), or
    # a view of one, needs no wrapper: the output module returns that input, or a
    # view of it made at run time with the call's sizes (`reinterpret_tensor`), as
    # AOTAutograd's epilogue would rebuild it. A view of an intermediate it would
    # return beside an extra output, which the lean form does not strip.
    input_storages = {StorageWeakRef(v.untyped_storage()) for v in placeholders if isinstance(v, torch.Tensor)}
    seen = set()
    for index, value in enumerate(outputs):
        if not isinstance(value, torch.Tensor):
            return f"output {index} is not a tensor"
        storage = StorageWeakRef(value.untyped_storage())
        if storage in input_storages:
            continue
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


def extern_kernel_is_torch_function(name: str) -> bool:
    """Whether the output module's `extern_kernels.<name>` is `torch.<name>`."""
    from torch._inductor.select_algorithm import extern_kernels

    return getattr(extern_kernels, name, None) is getattr(torch, name, object())
