"""Run side, dynamic batch: load the lean form written by produce_dynamic.py in a fresh process with
no C++ compiler (load.py's fake compilers, its lean_source / ShippedKernels / rebuild_constants),
then run `call` at batch 1, 7 and 16 and compare with the build process's compiled outputs
(bit equality, max abs) and with float32 eager (max abs, cosine). Also runs batch 17 (outside the
exported range [1, 16]) to see whether anything checks the range, and times batch 8.

usage: load_dynamic.py OUTDIR [--no-time]
"""

import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load  # noqa: E402  (installs the fake compilers, imports torch)
import torch  # noqa: E402
from load_conv import rebuild_constants  # noqa: E402  (load.py's, plus tensor arguments of a recipe)


def cmp(a, b):
    """max abs diff, and cosine computed in float64 (float32 sums over 500k elements give cos > 1)"""
    a, b = a.double().flatten(), b.double().flatten()
    return {"max_abs": (a - b).abs().max().item(), "cos": torch.nn.functional.cosine_similarity(a, b, dim=0).item()}


def main():
    outdir = Path(sys.argv[1])
    torch.set_num_threads(1)
    report = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    src = (outdir / "output_module.py").read_text()
    code, dropped = load.lean_source(src)
    report["dropped_imports"] = dropped
    load.ShippedKernels.kdir = outdir / "kernels"
    extern = sorted(set(re.findall(r"extern_kernels\.(\w+)", src)))
    ns = {
        "__name__": "int8study_lean_dynamic",
        "AsyncCompile": load.ShippedKernels,
        "extern_kernels": SimpleNamespace(**{n: getattr(torch, n) for n in extern}),
        "assert_tensor_metadata": load.assert_tensor_metadata,
        "run_intermediate_hooks": None,
        "maybe_profile": None,
        "align": None,
    }
    exec(code, ns)
    report["kernels_loaded"] = len(load.ShippedKernels.loaded)
    t0 = time.perf_counter()
    consts, meta = rebuild_constants(outdir)
    report["rebuild_constants_s"] = round(time.perf_counter() - t0, 4)
    report["mkldnn_constants_rebuilt"] = sum(t.layout == torch._mkldnn for t in consts.values())
    report["prepack_args"] = sorted({json.dumps(m["args"]) for m in meta.values() if m.get("mkldnn")})
    ref = torch.load(outdir / "constants.pt", weights_only=True)
    report["constants_mismatch_vs_torch_save"] = [
        n
        for n, t in consts.items()
        if t.layout == torch.strided and not (t.dtype == ref[n].dtype and t.size() == ref[n].size() and t.stride() == ref[n].stride() and torch.equal(load._bytes(t), load._bytes(ref[n])))
    ]
    declared = re.findall(r"^(\w+) = None(?:  #.*)?$", src, re.M)
    report["declared_not_bound"] = [n for n in declared if n not in consts]
    ns.update(consts)
    call = ns["call"]

    data = torch.load(outdir / "data.pt", weights_only=True)
    with torch.no_grad():
        for b, t in data["tests"].items():
            t0 = time.perf_counter()
            out = call(list(t))[0]
            dt = time.perf_counter() - t0
            report[f"batch{b}"] = {
                "first_call_s": round(dt, 4),
                "bitwise_equal_to_build_process": bool(torch.equal(out, data["built"][b])),
                "vs_build_process": cmp(out, data["built"][b]),
                "vs_fp32_eager": cmp(out, data["fp32"][b]),
                "vs_int8_eager": cmp(out, data["int8_eager"][b]),
            }
        # outside the exported range: nothing in the lean module checks it
        big = tuple(torch.cat([x, x[:1]]) for x in data["tests"][16])
        try:
            out17 = call(list(big))[0]
            report["batch17_outside_range"] = {"ran": True, "shape": list(out17.shape), "first16_equal_batch16": bool(torch.equal(out17[:16], data["built"][16]))}
        except Exception as e:
            report["batch17_outside_range"] = f"{type(e).__name__}: {str(e)[:300]}"
        if "--no-time" not in sys.argv:
            ex = list(data["example"])
            for _ in range(5):
                call(list(ex))
            ts = []
            for _ in range(30):
                t = time.perf_counter()
                call(list(ex))
                ts.append(time.perf_counter() - t)
            report["lean_dynamic_batch8_ms"] = [round(statistics.median(ts) * 1e3, 3), round(min(ts) * 1e3, 3)]
    report["startup_to_end_s"] = round(time.perf_counter() - load.t_start, 2)
    new = sorted(set(sys.modules) - load.modules_after_torch)
    report["inductor_modules_imported_by_load"] = [m for m in new if m.startswith("torch._inductor")]
    report["dynamo_modules_imported_by_load"] = [m for m in new if m.startswith("torch._dynamo")]
    report["torchao_imported"] = any(m.startswith("torchao") for m in sys.modules)
    report["compiler_invocations"] = load.CC_LOG.read_text().splitlines() if load.CC_LOG.exists() else []
    report["which_gxx"] = __import__("shutil").which("g++")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
