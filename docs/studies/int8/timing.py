"""Interleaved timing in one process (the cores are shared with CI): fp32 eager vs the
lean int8 form loaded as load.py does. usage: timing.py {mlp,bert} OUTDIR"""

import json, statistics, sys, time
from pathlib import Path

name, outdir = sys.argv[1], Path(sys.argv[2])
sys.argv = ["load.py", str(outdir)]
sys.path.insert(0, "/tmp/int8study")
import load  # fake compilers on PATH, torch imported
import torch
from common import make

code, _ = load.lean_source((outdir / "output_module.py").read_text())
load.ShippedKernels.kdir = outdir / "kernels"
ns = {
    "__name__": "lean",
    "AsyncCompile": load.ShippedKernels,
    "extern_kernels": None,
    "assert_tensor_metadata": load.assert_tensor_metadata,
    "run_intermediate_hooks": None,
    "maybe_profile": None,
    "align": None,
}
exec(code, ns)
consts, _ = load.rebuild_constants(outdir)
ns.update(consts)
call = ns["call"]
model, _, _, test = make(name)
fns = {"fp32_eager": lambda: model(*test), "int8_lean": lambda: call(list(test))}
times = {k: [] for k in fns}
with torch.no_grad():
    for f in fns.values():
        for _ in range(3):
            f()
    for _ in range(6):
        for k, f in fns.items():
            for _ in range(5):
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
res = {k: {"median_ms": round(statistics.median(v) * 1e3, 3), "min_ms": round(min(v) * 1e3, 3), "n": len(v)} for k, v in times.items()}
res["speedup_median"] = round(res["fp32_eager"]["median_ms"] / res["int8_lean"]["median_ms"], 2)
res["speedup_min"] = round(res["fp32_eager"]["min_ms"] / res["int8_lean"]["min_ms"], 2)
res["torch"] = torch.__version__
res["threads"] = torch.get_num_threads()
print(json.dumps(res))
