"""A model's state: the buffers its forward updates in place (a static KV cache, a
step counter), and the graph that updates them where they lie.

After inductor's decompositions an export graph is functional: each buffer the
forward mutates is returned as an extra output (`graph_signature.buffers_to_mutate`)
instead of being written. `state_written_back` turns those outputs into
`aten.copy_` into the buffer's placeholder at the end of the graph, which is how
AOTAutograd itself keeps an inference graph's input mutations; inductor then
updates the buffer in place (its reinplacing pass turns an `index_put` whose
result is copied back into its own input into `index_put_`), and the compiled
graph returns the user's outputs alone.

One pattern defeats that pass: an update through a slice, which is how a cache
sized for the largest batch is written (`self.k_cache[:b].index_copy_(2, pos, k)`).
Decomposed, it is `slice_scatter(cache, index_put(slice(cache, 0, 0, b), [None,
None, pos], k), 0, 0, b)`, and inductor compiles that as a copy of `cache[:b]`,
the update, and a copy back: two copies of the cache per call (measured on torch
2.13-2.15). `_index_into_base` rewrites it as one `index_put` on the whole
buffer, the slice taken by an index (`arange(b)`) on its dim, which inductor
updates in place. `tests/test_torch_assumptions.py` checks that a compiled cache
update allocates no cache-sized temporary.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

aten = torch.ops.aten


def mutated_buffers(exported: torch.export.ExportedProgram) -> list[str]:
    """The state-dict names of the buffers the forward updates, in the graph's input order."""
    mutated = set(exported.graph_signature.buffers_to_mutate.values())
    return [s.target for s in exported.graph_signature.input_specs if s.kind.name == "BUFFER" and s.target in mutated]


def state_written_back(exported: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    """A copy of the decomposed export graph that writes each mutated buffer in
    place and returns the user outputs only (see the module docstring); the
    graph itself where the model updates no buffer."""
    signature = exported.graph_signature
    if not signature.buffers_to_mutate:
        unchanged: torch.fx.GraphModule = exported.graph_module
        return unchanged
    graph_module: torch.fx.GraphModule = copy.deepcopy(exported.graph_module)
    graph = graph_module.graph
    placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    buffer_placeholder = {s.target: placeholders[s.arg.name] for s in signature.input_specs if s.kind.name == "BUFFER"}
    output = next(iter(reversed(graph.nodes)))
    user_outputs = []
    for spec, node in zip(signature.output_specs, output.args[0]):
        if spec.kind.name == "BUFFER_MUTATION":
            buffer = buffer_placeholder[spec.target]
            with graph.inserting_before(output):
                graph.call_function(aten.copy_.default, (buffer, _index_into_base(graph, buffer, node)))
        else:
            user_outputs.append(node)
    output.args = (user_outputs,)
    graph.eliminate_dead_code()
    graph.lint()
    graph_module.recompile()
    return graph_module


def _index_into_base(graph: torch.fx.Graph, buffer: torch.fx.Node, new_value: torch.fx.Node) -> torch.fx.Node:
    """`new_value`, or, where it is `slice_scatter(buffer, index_put(slice(buffer,
    0, start, end), indices, values), 0, start, end)`, the same update as one
    `index_put` on `buffer` (the slice becomes the index `arange(start, end)` on
    dim 0). Anything else is left as it is: correct, if not in place."""
    scatter = new_value
    if scatter.target is not aten.slice_scatter.default or scatter.args[0] is not buffer:
        return new_value
    update, bounds = scatter.args[1], _slice_bounds(scatter.args[2:])
    if not isinstance(update, torch.fx.Node) or update.target is not aten.index_put.default:
        return new_value
    view = update.args[0]
    if not isinstance(view, torch.fx.Node) or view.target is not aten.slice.Tensor or view.args[0] is not buffer:
        return new_value
    dim, start, end, step = bounds
    if _slice_bounds(view.args[1:]) != bounds or dim != 0 or step != 1 or end is None:
        return new_value
    indices: list[Any] = list(update.args[1])  # type: ignore[arg-type]  # index_put's Tensor?[] indices
    values, accumulate = update.args[2], update.args[3:]
    tensors = [i for i in indices if i is not None]
    first = next(p for p, i in enumerate(indices) if i is not None) if tensors else None
    if len(tensors) != 1 or first == 0 or _rank(tensors[0]) != 1 or _rank(values) != _rank(buffer):
        return new_value  # the form index_copy_ on one dim decomposes to; others are left alone
    with graph.inserting_before(scatter):
        rows = graph.call_function(aten.arange.start, (start, end), {"dtype": torch.int64})
        rows = graph.call_function(aten.unsqueeze.default, (rows, 1))
        # Index tensors at dims 0 and `first` (not adjacent unless first == 1) put
        # their broadcast dims (rows, positions) first: move the positions there.
        moved = graph.call_function(aten.movedim.int, (values, first, 1))
        whole = graph.call_function(aten.index_put.default, (buffer, [rows, *indices[1:]], moved, *accumulate))
    scatter.replace_all_uses_with(whole)
    return whole


def _slice_bounds(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """(dim, start, end, step) of a slice from its arguments after the tensor(s),
    aten's defaults filled in."""
    dim, start, end, step = [*args, None, None, None, None][:4]
    return dim or 0, start or 0, end, 1 if step is None else step


def _rank(node: object) -> int | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value.dim() if isinstance(value, torch.Tensor) else None
