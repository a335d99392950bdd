"""Build side, dynamic batch: quantize a model exported with Dim("batch", min=1, max=16), freeze-compile
the unlifted converted module so that the compiled graph is dynamic in batch, and write the lean form
(as produce.py does: output_module.py, kernels/k_<key>.so, constants.safetensors, data.pt, produce.json).

How the graph is made dynamic (see dynamic_probe.py): compile_fx(gm, fake inputs) where the fake
inputs carry a symbolic batch size:
  --method E (default): the placeholders' meta["val"] left by torch.export (one shared symbol, range [1, 16]);
  --method A: fresh FakeTensorMode(ShapeEnv()) with DimDynamic.DYNAMIC on dim 0 of each input.
Also compiles the same converted module statically at batch 8 (real example inputs) for timing.

usage: produce_dynamic.py {mlp,bert,conv} OUTDIR [--method E|A]
"""

import json
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import produce  # noqa: E402
from common_dynamic import BATCHES, make_dynamic, quantize_dynamic  # noqa: E402
from produce import compare, module_globals, save_constants  # noqa: E402


def symbolic_inputs(gm, example, method):
    if method == "E":
        return [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    return [mode.from_tensor(x, symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] + [DimDynamic.STATIC] * (x.dim() - 1))) for x in example]


def first(o):
    return o[0] if isinstance(o, (tuple, list)) else o


def interleaved(fns, rounds=6, per=5):
    times = {k: [] for k in fns}
    with torch.no_grad():
        for f in fns.values():
            for _ in range(3):
                f()
        for _ in range(rounds):
            for k, f in fns.items():
                for _ in range(per):
                    t = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t)
    return {k: [round(statistics.median(v) * 1e3, 3), round(min(v) * 1e3, 3)] for k, v in times.items()}


def main():
    name, outdir = sys.argv[1], Path(sys.argv[2])
    method = sys.argv[sys.argv.index("--method") + 1] if "--method" in sys.argv else "E"
    outdir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    if name == "conv":  # qconv_prepack has a tensor argument (the weight scales)
        import produce_conv

        produce.mkldnn_recipe = produce_conv.mkldnn_recipe
    model, example, calib, tests, _ = make_dynamic(name)
    res = {"torch": torch.__version__, "threads": torch.get_num_threads(), "method": method}
    with torch.no_grad():
        fp32 = {b: first(model(*t)) for b, t in tests.items()}

    t0 = time.perf_counter()
    converted = quantize_dynamic(model, example, calib)
    res["quantize_s"] = round(time.perf_counter() - t0, 2)
    with torch.no_grad():
        int8_eager = {b: first(converted(*t)) for b, t in tests.items()}

    t0 = time.perf_counter()
    inputs = symbolic_inputs(converted, example, method)
    res["compile_inputs"] = [str(getattr(x, "shape", x)) for x in inputs]
    fn, graph, kernels = produce.compile_frozen(converted, example, inputs)
    calls = produce.PREPACKS
    res["dynamic_compile_s"] = round(time.perf_counter() - t0, 2)
    res["prepack_x_shapes"] = sorted({repr(c[3][-1]) for c in calls})
    res["prepack_ops"] = sorted({c[1] for c in calls})
    source = graph.source_code
    res["symbols_in_source"] = sorted(set(re.findall(r"\bs\d+\b", source)))
    res["size_lines"] = re.findall(r"^    (s\d+ = .*)$", source, re.M)
    with torch.no_grad():
        built = {b: first(fn(*t)) for b, t in tests.items()}
    for b in BATCHES:
        res[f"batch{b}"] = {
            "dynamic_compiled_vs_fp32": compare(built[b], fp32[b]),
            "dynamic_compiled_vs_int8_eager": compare(built[b], int8_eager[b]),
            "int8_eager_vs_fp32": compare(int8_eager[b], fp32[b]),
        }

    # the lean form (as produce.py)
    (outdir / "output_module.py").write_text(source)
    glb = module_globals(graph)
    declared = [m.group(1) for m in re.finditer(r"^(\w+) = None(?:  #.*)?$", source, re.M)]
    const_names = [n for n in declared if isinstance(glb.get(n), torch.Tensor)]
    res["constants"] = len(const_names)
    meta = save_constants(const_names, glb, outdir / "constants.safetensors")
    torch.save({n: glb[n] for n in const_names if glb[n].layout == torch.strided}, outdir / "constants.pt")
    kdir = outdir / "kernels"
    kdir.mkdir(exist_ok=True)
    for key, so in kernels.items():
        shutil.copy(so, kdir / f"k_{key}.so")
    res["kernels"] = len(kernels)
    res["mkldnn_constants"] = sum(1 for m in meta.values() if m.get("mkldnn"))
    res["mkldnn_args"] = sorted({json.dumps(m["args"]) for m in meta.values() if m.get("mkldnn")})
    res["reprepack_to_dense_equal"] = sorted({str(m.get("reprepack_to_dense_equal")) for m in meta.values() if m.get("mkldnn")})
    res["to_dense_equals_input"] = sorted({str(m["to_dense_equals_input"]) for m in meta.values() if m.get("mkldnn")})
    torch.save({"tests": tests, "example": example, "fp32": fp32, "int8_eager": int8_eager, "built": built}, outdir / "data.pt")

    # static batch-8 compile of the same converted module (real inputs: x_shape baked in), for timing
    t0 = time.perf_counter()
    fn8, graph8, _ = produce.compile_frozen(converted, example)
    calls8 = produce.PREPACKS
    res["static8_compile_s"] = round(time.perf_counter() - t0, 2)
    res["static8_prepack_x_shapes"] = sorted({repr(c[3][-1]) for c in calls8})
    with torch.no_grad():
        o8, d8 = first(fn8(*example)), first(fn(*example))
    res["batch8_static_vs_dynamic"] = compare(o8, d8)
    res["batch8_static_equal_dynamic"] = bool(torch.equal(o8, d8))
    res["ms_batch8_median_min"] = interleaved(
        {
            "fp32_eager": lambda: model(*example),
            "int8_static8_compiled": lambda: fn8(*example),
            "int8_dynamic_compiled": lambda: fn(*example),
        }
    )
    (outdir / "produce.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
