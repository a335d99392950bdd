"""Build side: quantize (PT2E, torchao X86InductorQuantizer), compile with freezing,
and write the lean form of the frozen graph: output module source, kernel .so files,
frozen constants (exact storage bytes + dtype/size/stride/offset), test data.

usage: produce.py {mlp,bert} OUTDIR [--fp32-frozen]
"""

import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import make  # noqa: E402


def kernel_key(argtypes, main_code):
    return hashlib.sha256(json.dumps([list(argtypes), main_code]).encode()).hexdigest()[:40]


def bench(fn, args, n=30, warm=5):
    with torch.no_grad():
        for _ in range(warm):
            fn(*args)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e3, 3), round(min(times) * 1e3, 3)


def compare(out, ref):
    out, ref = out.float().flatten(), ref.float().flatten()
    return {
        "max_abs": (out - ref).abs().max().item(),
        "cos": torch.nn.functional.cosine_similarity(out, ref, dim=0).item(),
    }


def quantize(model, example, calib, dynamic_shapes=None):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    exported = torch.export.export(model, example, dynamic_shapes=dynamic_shapes, strict=False).module()
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for batch in calib:
            prepared(*batch)
    return convert_pt2e(prepared)


def compile_frozen(gm, example, inputs=None):
    """compile_fx with freezing; returns (callable, CompiledFxGraph, kernels {key: so}). compile_fx
    gets `inputs` where given (produce_dynamic.py: fake inputs with a symbolic batch), else `example`;
    the recorded prepack calls are left in PREPACKS."""
    from torch._inductor import config
    from torch._inductor.codecache import CppPythonBindingsCodeCache as cls
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    graphs = []
    kernels = {}

    def inner(*args, **kwargs):
        out = compile_fx_inner(*args, **kwargs)
        graphs.append(out)
        return out

    original = cls.__dict__["load_pybinding_async"].__func__

    def record(loader_cls, argtypes, main_code, *args, **kwargs):
        get = original(loader_cls, argtypes, main_code, *args, **kwargs)
        key = kernel_key(argtypes, main_code)

        def get_and_record():
            entry = get()
            kernels[key] = entry.__self__.__file__
            return entry

        return get_and_record

    cls.load_pybinding_async = classmethod(record)
    try:
        with torch.no_grad(), config.patch(freezing=True), PrepackRecorder() as rec:
            fn = compile_fx(gm, list(example if inputs is None else inputs), inner_compile=inner)
            fn(*example)  # make sure everything is loaded
    finally:
        cls.load_pybinding_async = classmethod(original)
    assert len(graphs) == 1, f"{len(graphs)} graphs"
    global PREPACKS
    PREPACKS = rec.calls
    return fn, graphs[0], kernels


PREPACKS = []
PREPACK_OPS = ("onednn.qlinear_prepack", "mkldnn._reorder_linear_weight", "mkl._mkl_reorder_linear_weight", "mkldnn._reorder_convolution_weight", "onednn.qconv_prepack")


class PrepackRecorder(torch.overrides.TorchFunctionMode):
    """Records the weight-prepacking op calls the freezing pass's constant folding makes."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(getattr(func, "_overloadpacket", func))
        if any(op in name for op in PREPACK_OPS) and isinstance(out, torch.Tensor) and not isinstance(out, torch._subclasses.FakeTensor):
            self.calls.append((name, str(func), out, args, kwargs))
        return out


def module_globals(graph):
    """The loaded output module's globals (where inductor bound the constants)."""
    fn = graph.current_callable
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        g = getattr(fn, "__globals__", None)
        if g is not None and "call" in g and g.get("call") is fn or (g is not None and "_frozen_param0" in g):
            return g
        cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
        fn = next((c for c in cells if callable(c)), getattr(fn, "__wrapped__", None))
    raise RuntimeError("output module globals not found")


def mkldnn_recipe(name, t, tensors):
    """An opaque (mkldnn-layout) prepacked weight: ship the plain weight and the prepack call."""
    calls = [c for c in PREPACKS if c[2] is t]
    assert len(calls) == 1, (name, len(calls), len(PREPACKS))
    op, overload, _, args, kwargs = calls[0]
    dense_in = args[0]
    assert dense_in.layout == torch.strided
    plain = dense_in.contiguous()
    tensors[f"{name}.weight"] = plain
    rest = [list(a) if isinstance(a, (list, tuple, torch.Size)) else a for a in args[1:]]
    assert all(a is None or isinstance(a, (int, float, str, list)) for a in rest), rest
    try:
        d = t.to_dense()
        dense_eq = bool(d.shape == dense_in.shape and torch.equal(d, dense_in))
    except Exception as e:
        dense_eq = f"{type(e).__name__}: {e}"
    return {
        "mkldnn": True,
        "op": overload,
        "weight": f"{name}.weight",
        "args": rest,
        "kwargs": kwargs,
        "dtype": str(t.dtype).removeprefix("torch."),
        "size": list(t.size()),
        "to_dense_equals_input": dense_eq,
        "mkldnn_nbytes": torch.ops.mkldnn._nbytes(t),
    }


def save_constants(names, glb, path):
    """Each constant as its untyped storage bytes (uint8) + view metadata, in safetensors."""
    from safetensors.torch import save_file

    tensors, meta, storages = {}, {}, {}
    for name in names:
        t = glb[name]
        assert isinstance(t, torch.Tensor), (name, type(t))
        if t.layout == torch._mkldnn:
            meta[name] = mkldnn_recipe(name, t, tensors)
            continue
        assert t.layout == torch.strided and not t.is_quantized and t.device.type == "cpu", (name, t.layout, t.dtype)
        st = t.untyped_storage()
        sid = storages.setdefault(st.data_ptr(), f"storage{len(storages)}")
        if sid not in tensors:
            tensors[sid] = torch.empty(0, dtype=torch.uint8).set_(st).clone()  # the storage's bytes
        meta[name] = {
            "storage": sid,
            "dtype": str(t.dtype).removeprefix("torch."),
            "size": list(t.size()),
            "stride": list(t.stride()),
            "offset": t.storage_offset(),
            "storage_nbytes": st.nbytes(),
        }
    save_file(tensors, str(path), metadata={"constants": json.dumps(meta)})
    return meta


def main():
    name, outdir = sys.argv[1], Path(sys.argv[2])
    fp32_frozen = "--fp32-frozen" in sys.argv
    outdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model, example, calib, test = make(name)
    results = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    with torch.no_grad():
        ref = model(*test)
    results["fp32_eager_ms"] = bench(model, test)

    t0 = time.perf_counter()
    compiled = torch.compile(model)
    with torch.no_grad():
        out = compiled(*test)
    results["fp32_compiled_compile_s"] = time.perf_counter() - t0
    results["fp32_compiled_ms"] = bench(compiled, test)
    results["fp32_compiled_vs_fp32"] = compare(out, ref)
    torch._dynamo.reset()

    if fp32_frozen:
        t0 = time.perf_counter()
        gm32 = torch.export.export(model, example, strict=False).module()
        fn32, _, _ = compile_frozen(gm32, example)
        results["fp32_frozen_compile_s"] = time.perf_counter() - t0
        with torch.no_grad():
            out = fn32(*test)
        out = out[0] if isinstance(out, (tuple, list)) else out
        results["fp32_frozen_ms"] = bench(fn32, test)
        results["fp32_frozen_vs_fp32"] = compare(out, ref)
        del fn32

    t0 = time.perf_counter()
    converted = quantize(model, example, calib)
    results["quantize_s"] = time.perf_counter() - t0
    with torch.no_grad():
        qref = converted(*test)
    results["int8_eager_ms"] = bench(converted, test)
    results["int8_eager_vs_fp32"] = compare(qref, ref)

    t0 = time.perf_counter()
    fn, graph, kernels = compile_frozen(converted, example)
    results["int8_frozen_compile_s"] = time.perf_counter() - t0
    with torch.no_grad():
        out = fn(*test)
    out = out[0] if isinstance(out, (tuple, list)) else out
    results["int8_frozen_ms"] = bench(fn, test)
    results["int8_frozen_vs_fp32"] = compare(out, ref)
    results["int8_frozen_vs_int8_eager"] = compare(out, qref)

    # the lean form
    source = graph.source_code
    (outdir / "output_module.py").write_text(source)
    glb = module_globals(graph)
    import re

    declared = [m.group(1) for m in re.finditer(r"^(\w+) = None(?:  #.*)?$", source, re.M)]
    const_names = [n for n in declared if isinstance(glb.get(n), torch.Tensor)]
    results["constants"] = len(const_names)
    results["frozen_param_names"] = dict(graph.frozen_param_names)
    results["graph_constants"] = sorted((graph.constants or {}).keys())
    results["inputs_to_check"] = list(graph.inputs_to_check)
    results["mutated_input_idxs"] = sorted(graph.mutated_input_idxs)
    meta = save_constants(const_names, glb, outdir / "constants.safetensors")
    try:
        torch.save({n: glb[n] for n in const_names}, outdir / "constants.pt")
        results["torch_save_constants"] = "ok"
    except Exception as e:
        results["torch_save_constants"] = f"{type(e).__name__}: {e}"
        torch.save({n: glb[n] for n in const_names if glb[n].layout == torch.strided}, outdir / "constants.pt")
    kdir = outdir / "kernels"
    kdir.mkdir(exist_ok=True)
    for key, so in kernels.items():
        shutil.copy(so, kdir / f"k_{key}.so")
    results["kernels"] = len(kernels)
    # what the compiled callable is fed: user inputs flattened (params are frozen in)
    torch.save({"test": test, "fp32_ref": ref, "int8_eager": qref, "int8_frozen": out}, outdir / "data.pt")
    results["mkldnn_constants"] = {n: {k: m[k] for k in ("op", "args", "size", "to_dense_equals_input", "mkldnn_nbytes")} for n, m in meta.items() if m.get("mkldnn")}
    results["prepack_calls_recorded"] = len(PREPACKS)
    (outdir / "produce.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
