"""int8 graphs, compiled with their weights frozen in (`worker/quantize.py`).

What it relies on (measured on torch 2.13; `tests/test_torch_assumptions.py`
checks each):
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
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ...runtime._torch_private import PREPACK_OPS


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
