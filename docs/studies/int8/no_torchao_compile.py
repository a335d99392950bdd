"""Does freeze-compiling a PT2E int8 graph need torchao's pass registration in the compiling process?

no_torchao_compile.py save OUT.pt2   quantize the MLP (imports torchao), save torch.export of the converted module,
                                     plus the frozen-compiled output and the int8 eager output
no_torchao_compile.py compile OUT.pt2 [--import-torchao]
                                     fresh process: import torch.ao.quantization.fx._decomposed (the
                                     quantized_decomposed ops; without it torch.export.load fails), torch.export.load, .module(), compile_fx with freezing; reports whether
                                     torchao is imported, which onednn/quantized ops the output module calls, whether
                                     qlinear_prepack ran, timing, and the output against the saved ones
"""

import json
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    mode, path = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    if mode == "save":
        import produce
        from common import make

        model, example, calib, test = make("mlp")
        converted = produce.quantize(model, example, calib)
        ep = torch.export.export(converted, example, strict=False)
        torch.export.save(ep, path)
        fn, _, _ = produce.compile_frozen(converted, example)
        with torch.no_grad():
            torch.save(
                {
                    "test": test,
                    "example": example,
                    "int8_eager": converted(*test)[0] if isinstance(converted(*test), (tuple, list)) else converted(*test),
                    "int8_frozen": fn(*test)[0] if isinstance(fn(*test), (tuple, list)) else fn(*test),
                },
                path + ".data",
            )
        print("saved")
        return
    if "--import-torchao" in sys.argv:
        __import__("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
    __import__("torch.ao.quantization.fx._decomposed")  # registers quantized_decomposed.*, torch's own
    import produce  # the compile_frozen helper (imports no torchao)

    res = {"torch": torch.__version__, "torchao_imported_before_compile": any(m.startswith("torchao") for m in sys.modules)}
    ep = torch.export.load(path)
    gm = ep.module()
    data = torch.load(path + ".data", weights_only=True)
    t0 = time.perf_counter()
    try:
        fn, graph, kernels = produce.compile_frozen(gm, data["example"])
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {str(e)[:800]}"
        print(json.dumps(res, indent=1))
        return
    res["compile_s"] = round(time.perf_counter() - t0, 2)
    res["torchao_imported_after_compile"] = any(m.startswith("torchao") for m in sys.modules)
    src = graph.source_code
    res["ops_in_module"] = sorted(set(re.findall(r"torch\.ops\.(?:onednn|quantized|quantized_decomposed|mkldnn)\.\w+", src)))
    res["extern_kernels"] = sorted(set(re.findall(r"extern_kernels\.(\w+)", src)))
    res["prepack_calls"] = len(produce.PREPACKS)
    res["kernels"] = len(kernels)
    with torch.no_grad():
        out = fn(*data["test"])
    out = out[0] if isinstance(out, (tuple, list)) else out
    res["equal_to_frozen_with_torchao"] = bool(torch.equal(out, data["int8_frozen"]))
    res["max_abs_vs_frozen_with_torchao"] = (out - data["int8_frozen"]).abs().max().item()
    res["max_abs_vs_int8_eager"] = (out - data["int8_eager"]).abs().max().item()
    res["ms"] = produce.bench(fn, data["test"])
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
