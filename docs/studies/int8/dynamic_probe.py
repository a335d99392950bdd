"""Which way of freeze-compiling the unlifted PT2E int8 module gives a graph that is dynamic in batch?

Exports the model with torch.export.Dim("batch", min=1, max=16) on dim 0 of every input, quantizes
(prepare_pt2e/convert_pt2e, X86InductorQuantizer), then tries, each in a fresh dynamo/inductor state:
  A  compile_fx(gm, fake inputs with a symbolic batch dim from a FakeTensorMode with a ShapeEnv)
  B  torch.compile(gm, backend=compile_fx, dynamic=None) on inputs marked with torch._dynamo.mark_dynamic(x, 0)
  C  compile_fx(gm, real inputs marked with mark_dynamic)   (expected: silently static)
  D  torch.compile(gm, backend=compile_fx, dynamic=True)
  E  compile_fx(gm, the placeholders' meta["val"] fake tensors left by torch.export (shared symbol, range [1, 16]))
For each: error or not, the x_shape of every onednn.qlinear_prepack call, whether the output module
source has symbolic sizes (s0, s77, ...), the number of graphs, and the outputs at batch 1, 7, 16
(recompiles counted).

usage: dynamic_probe.py {mlp,bert} [A B C D]
"""

import json
import os
import re
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import produce  # noqa: E402
from common_dynamic import make_dynamic, quantize_dynamic  # noqa: E402


def run(method, converted, example, tests):
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    torch._dynamo.reset()
    graphs = []

    def inner(*args, **kwargs):
        out = compile_fx_inner(*args, **kwargs)
        graphs.append(out)
        return out

    def backend(gm, ex):
        return compile_fx(gm, ex, inner_compile=inner)

    res = {"method": method}
    try:
        with torch.no_grad(), config.patch(freezing=True), produce.PrepackRecorder() as rec:
            if method == "A":
                from torch._subclasses.fake_tensor import FakeTensorMode
                from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

                mode = FakeTensorMode(shape_env=ShapeEnv())
                fakes = [mode.from_tensor(x, symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] + [DimDynamic.STATIC] * (x.dim() - 1))) for x in example]
                fn = compile_fx(converted, fakes, inner_compile=inner)
                call = lambda *a: fn(*a)  # noqa: E731
            elif method == "E":
                # the export's own fake inputs: one shared batch symbol, range [1, 16], export's ShapeEnv
                fakes = [n.meta["val"] for n in converted.graph.nodes if n.op == "placeholder"]
                res["export_fake_shapes"] = [str(f.shape) for f in fakes]
                fn = compile_fx(converted, fakes, inner_compile=inner)
                call = lambda *a: fn(*a)  # noqa: E731
            elif method == "B":
                for x in example:
                    torch._dynamo.mark_dynamic(x, 0)
                fn = torch.compile(converted, backend=backend)
                call = fn
            elif method == "C":
                ex = [x.clone() for x in example]
                for x in ex:
                    torch._dynamo.mark_dynamic(x, 0)
                fn = compile_fx(converted, ex, inner_compile=inner)
                call = fn
            elif method == "D":
                fn = torch.compile(converted, backend=backend, dynamic=True)
                call = fn
            call(*example)
            res["graphs_after_example"] = len(graphs)
            outs = {}
            for b, t in tests.items():
                o = call(*t)
                o = o[0] if isinstance(o, (tuple, list)) else o
                outs[b] = o
                res[f"graphs_after_batch_{b}"] = len(graphs)
        res["graphs"] = len(graphs)
        res["prepack_calls"] = [(c[1], [a if not isinstance(a, torch.Tensor) else f"Tensor{tuple(a.shape)}" for a in c[3][1:]]) for c in rec.calls]
        res["prepack_x_shapes"] = sorted({repr(c[3][-1] if "qlinear" in c[0] else c[3][1:]) for c in rec.calls})
        srcs = [g.source_code for g in graphs]
        res["symbols_in_source"] = [sorted(set(re.findall(r"\bs\d+\b", s)))[:10] for s in srcs]
        res["size_lines"] = [re.findall(r"^    (s\d+ = .*)$", s, re.M)[:3] for s in srcs]
        res["call_signature"] = [re.search(r"^    (.*) = args$", s, re.M).group(1) if re.search(r"^    (.*) = args$", s, re.M) else None for s in srcs]
        with torch.no_grad():
            eager = {b: converted(*t) for b, t in tests.items()}
            eager = {b: o[0] if isinstance(o, (tuple, list)) else o for b, o in eager.items()}
        res["vs_int8_eager_max_abs"] = {b: (outs[b].float() - eager[b].float()).abs().max().item() for b in tests}
        res["out_shapes"] = {b: list(o.shape) for b, o in outs.items()}
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {str(e)[:1500]}"
        res["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
    return res


def main():
    name = sys.argv[1]
    methods = sys.argv[2:] or ["A", "B", "C", "D"]
    model, example, calib, tests, _ = make_dynamic(name)
    converted = quantize_dynamic(model, example, calib)
    out = {"torch": torch.__version__}
    for m in methods:
        r = run(m, converted, example, tests)
        print(json.dumps(r, indent=1), flush=True)
        out[m] = r
    return out


if __name__ == "__main__":
    main()
