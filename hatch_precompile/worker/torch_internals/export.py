"""What `torch.export` gives the build, and how the build reads it: decomposition,
its constraint violations, its pytrees and the custom ops a graph calls.

What it relies on (measured on torch 2.13; `tests/test_torch_assumptions.py`
checks each):
- Decomposing an export graph with inductor's own table
  (`torch._inductor.decomposition.select_decomp_table()`) gives the graph inductor
  compiles anyway; export's default table fails on some models (transformers'
  GPT-2 `x.view(-1, x.size(-1))` with a dynamic batch and sequence). The table's
  functions reach into compiler modules by attribute, which works only once
  something has imported those modules (inductor's compile does; capture does
  not): `LAZY_DECOMPOSITION_MODULES` lists them (in 2.13-2.15 only
  `torch._inductor.lowering`, used by the max-pool decompositions); a test
  finds them by reading the table's source.
- On CPU, `scaled_dot_product_attention` decomposes to
  `aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p,
  is_causal, *, attn_mask, scale) -> (output, logsumexp)`, its mask of the
  query's dtype and its output contiguous, and a table entry for it replaces it
  (`attention_as_float32_math`). Inductor's pattern matcher turns a matrix
  product, softmax and matrix product back into that kernel
  (`fx_passes/fuse_attention.py`, which matches the softmax's division); the
  softmax written as `exp(scores - logsumexp)` is not matched.
- A constraint violation from `torch.export.export` is a `torch._dynamo.exc.UserError`
  with `error_type` `UserErrorType.CONSTRAINT_VIOLATION`, whose `msg` (without
  the `draft_export()` advice `str()` adds) is what torch's public
  `refine_dynamic_shapes_from_suggested_fixes` reads. It maps each rejected Dim
  to an int (a constant), a Dim (a narrowed range, or the other Dim it must equal)
  or a `torch.export.dynamic_shapes._DerivedDim` whose `root` is a Dim and `fn`
  the increasing function `A * root + B`; other Dims come back as the same objects.
- `torch.utils._pytree.tree_leaves` flattens in the order export's call spec
  uses, and its `TreeSpec` exposes `type`, `context`, `is_leaf()` and `children()`.
- A custom op defined in Python with `torch.library.custom_op` is in
  `torch._library.custom_ops.OPDEFS` under its qualified name, and the function
  it wraps (`_init_fn`) names the module that defines it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...runtime._schema import TreeSpec

# Modules that decompositions in inductor's table use as `torch._inductor.<module>.<name>`
# without importing them (`torch._inductor.lowering.should_fallback_max_pool_with_indices`).
LAZY_DECOMPOSITION_MODULES = ("torch._inductor.lowering",)


def decompose(exported: torch.export.ExportedProgram, attention_in_float32: bool = False) -> torch.export.ExportedProgram:
    """The export graph decomposed with the table inductor itself uses; with
    `attention_in_float32`, CPU flash attention as its math in float32 instead
    (`attention_as_float32_math`)."""
    from torch._inductor.decomposition import select_decomp_table

    for module in LAZY_DECOMPOSITION_MODULES:
        importlib.import_module(module)
    table = dict(select_decomp_table())
    if attention_in_float32:
        table[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default] = attention_as_float32_math
    decomposed: torch.export.ExportedProgram = exported.run_decompositions(table)
    return decomposed


def attention_as_float32_math(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`aten._scaled_dot_product_flash_attention_for_cpu` (what `scaled_dot_product_attention`
    becomes on CPU) as matrix products and a softmax in float32, returning its output
    (in the query's dtype, in its memory layout) and logsumexp, as torch's own
    decomposition does but accumulating in float32 as the flash kernel does. For
    bfloat16 decoders: torch 2.13's CPU flash kernel packs the whole key/value cache
    on every call in bfloat16, 253 us per call for one query over 512 positions of
    9 heads, against 31 us in float32 and 40 us as this math compiled."""
    torch._check(dropout_p == 0.0, lambda: f"dropout probability must be zero, got {dropout_p}")
    scores = query.float() @ key.float().transpose(-2, -1) * (query.size(-1) ** -0.5 if scale is None else scale)
    if is_causal:
        scores = scores.masked_fill(~torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril(), float("-inf"))
    if attn_mask is not None:  # the kernel takes only a mask of the query's dtype, added to the scores
        scores = scores + attn_mask.float()
    logsumexp = torch.logsumexp(scores, -1)
    # The softmax as exp(scores - logsumexp): inductor's attention patterns (fx_passes/fuse_attention.py)
    # match a softmax's division and would put the flash kernel back. A row with every position
    # masked gives zeros, as the kernel does.
    probabilities = torch.exp(scores - logsumexp.masked_fill(torch.isneginf(logsumexp), 0.0).unsqueeze(-1))
    return (probabilities @ value.float()).to(query.dtype).contiguous(), logsumexp  # contiguous, as the kernel's


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


def tensor_version(tensor: torch.Tensor) -> int | None:
    """`tensor._version`, the counter every in-place change bumps (private: what
    autograd's own saved-tensor checks read), or None while dynamo traces (strict
    torch.export), which cannot guard on it: there the call runs as written, once."""
    if torch.compiler.is_dynamo_compiling():
        return None
    return int(tensor._version)
