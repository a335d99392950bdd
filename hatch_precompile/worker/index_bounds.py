"""How large the values of each integer input may be: the sizes the graph indexes with them.

A compiled CPU kernel checks an index it computes from an input (a token id into
an embedding table, a position into a KV cache) with a C++ exception, and where
that check runs inside an OpenMP parallel loop the exception ends the process
(`terminate called after throwing an instance of 'std::runtime_error' ... index
out of bounds`, measured on torch 2.13 with the example decoder: a position
past the cache). Eager raises an IndexError for the same call. So the loader
checks such inputs before calling compiled code, against the bounds found here.

The bound of an input is the smallest size it indexes: it follows the input
through ops that keep its values (views, selects, slices, copies, into state
and out of it, dtype conversions) and through an added `arange` (transformers'
static cache writes its keys at `arange(seq) + cache_position[0]`), to the
index of `embedding`, `index_put`, `index`, `index_select` or `index_copy`. An
input it does not reach that way gets no bound.
"""

from __future__ import annotations

import torch

aten, prims = torch.ops.aten, torch.ops.prims

# Ops whose result holds the values of their first argument (or a subset)
_KEEPS_VALUES = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.squeeze.default, aten.expand.default, aten.select.int, aten.slice.Tensor, aten.clone.default,
    aten.alias.default, aten._to_copy.default, aten.permute.default, aten.t.default, aten.lift_fresh_copy.default,
}  # fmt: skip
_ARANGES = {prims.iota.default, aten.arange.default, aten.arange.start, aten.arange.start_step}


def index_bounds(graph: torch.fx.Graph, inputs: list[torch.fx.Node]) -> dict[str, int]:
    """For each of `inputs` (placeholders) the graph indexes a static size with:
    its name -> that size (its values must be in [0, size))."""
    origin: dict[torch.fx.Node, torch.fx.Node] = {node: node for node in inputs}  # node -> the input whose values it holds
    bounds: dict[str, int] = {}

    def source(arg: object) -> torch.fx.Node | None:
        return origin.get(arg) if isinstance(arg, torch.fx.Node) else None

    def limit(index: object, tensor: object, dim: object) -> None:
        value = tensor.meta.get("val") if isinstance(tensor, torch.fx.Node) else None
        found = source(index)
        if found is not None and isinstance(value, torch.Tensor) and isinstance(dim, int) and isinstance(size := value.shape[dim], int):
            bounds[found.name] = min(bounds.get(found.name, size), size)

    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target, args = node.target, node.args
        kept = None
        if target in _KEEPS_VALUES:
            kept = source(args[0])
        elif target is aten.copy.default:  # into a buffer (transformers' cumulative_length)
            kept = source(args[1])
        elif target is aten.add.Tensor and len(args) == 2:
            first, second = args
            kept = source(first) if _is_arange(second) else source(second) if _is_arange(first) else None
        if kept is not None:
            origin[node] = kept
        elif target is aten.embedding.default:
            limit(args[1], args[0], 0)
        elif target in (aten.index_put.default, aten.index.Tensor, aten.index_put_.default):
            for dim, index in enumerate(args[1]):
                limit(index, args[0], dim)
        elif target in (aten.index_select.default, aten.index_copy.default, aten.index_copy_.default):
            limit(args[2], args[0], args[1])
    return bounds


def _is_arange(arg: object) -> bool:
    return isinstance(arg, torch.fx.Node) and arg.target in _ARANGES
