"""Run side: load a frozen graph's lean form in a fresh process with no C++ compiler,
without inductor's compiler: exec the output module (compiler imports removed),
answer async_compile.cpp_pybinding with the shipped .so, bind the frozen constants
from the saved storage bytes, run `call`.

usage: load.py OUTDIR [--from-pt] [--no-time]
"""

import ast
import hashlib
import importlib.util
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
FAKE = HERE / "fakecc"
CC_LOG = HERE / "fakecc.log"


def no_compiler():
    FAKE.mkdir(exist_ok=True)
    for name in ("g++", "gcc", "cc", "c++", "clang", "clang++", "ld"):
        p = FAKE / name
        p.write_text(f'#!/bin/sh\necho "{name} $*" >> {CC_LOG}\nexit 1\n')
        p.chmod(0o755)
    os.environ["PATH"] = f"{FAKE}:{os.environ['PATH']}"
    os.environ["CC"] = str(FAKE / "gcc")
    os.environ["CXX"] = str(FAKE / "g++")


no_compiler()
t_start = time.perf_counter()
import torch  # noqa: E402

modules_after_torch = set(sys.modules)

KERNEL_INIT_VARIABLE = "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"


def kernel_key(argtypes, main_code):
    return hashlib.sha256(json.dumps([list(argtypes), main_code]).encode()).hexdigest()[:40]


def load_kernel(path, key):
    # what runtime/_torch_private.load_kernel does
    os.environ[KERNEL_INIT_VARIABLE] = str(torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr)
    name = f"int8study_{key}.kernel"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module.kernel


def assert_tensor_metadata(tensor, expected_size, expected_stride, expected_dtype, op_name=None):
    """copy of torch._inductor.runtime.runtime_utils.assert_tensor_metadata (torch >= 2.14),
    as in the project's runtime/_torch_private.py"""
    if tensor is None:
        return
    if tensor.dtype != expected_dtype:
        raise RuntimeError(f"expected dtype {expected_dtype} but got {tensor.dtype}")
    torch._C._dynamo.guards.assert_size_stride(tensor, expected_size, expected_stride, op_name)


class ShippedKernels:
    """Stands in for inductor's AsyncCompile: cpp_pybinding(argtypes, source) -> shipped .so."""

    kdir: Path = None
    loaded: list = []

    def cpp_pybinding(self, argtypes, source):
        key = kernel_key(argtypes, source)
        path = self.kdir / f"k_{key}.so"
        if not path.exists():
            raise RuntimeError(f"kernel {key} not shipped (refusing to compile)")
        self.loaded.append(key)
        return load_kernel(path, key)

    def wait(self, scope):
        pass


def lean_source(source):
    """Drop the torch._inductor imports, the benchmark harness and the __main__ block."""
    tree = ast.parse(source)
    dropped = []
    body = []
    for s in tree.body:
        if isinstance(s, ast.ImportFrom) and (s.module or "").startswith("torch._inductor"):
            dropped.append(f"from {s.module} import {', '.join(a.name + (' as ' + a.asname if a.asname else '') for a in s.names)}")
            continue
        if isinstance(s, ast.FunctionDef) and s.name in ("get_args", "benchmark_compiled_module"):
            continue
        if isinstance(s, ast.If) and "__main__" in ast.unparse(s.test):
            continue
        body.append(s)
    tree.body = body
    return compile(tree, "output_module_lean.py", "exec"), dropped


def _bytes(t):
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def rebuild_constants(outdir):
    from safetensors import safe_open

    with safe_open(str(outdir / "constants.safetensors"), framework="pt") as f:
        meta = json.loads(f.metadata()["constants"])
        storages = {}
        plain = {m["weight"]: f.get_tensor(m["weight"]).clone() for m in meta.values() if m.get("mkldnn")}
        for sid in {m["storage"] for m in meta.values() if not m.get("mkldnn")}:
            raw = f.get_tensor(sid)
            fresh = torch.empty(raw.numel(), dtype=torch.uint8)  # allocator-aligned, writable, own memory
            fresh.copy_(raw)
            storages[sid] = fresh.untyped_storage()
    out = {}
    for name, m in meta.items():
        if m.get("mkldnn"):
            # opaque prepacked weight: re-run the prepack op on the plain weight, here, on this CPU
            fn = torch.ops
            for part in m["op"].split("."):
                fn = getattr(fn, part)
            weight = f.get_tensor(m["weight"]) if False else plain[m["weight"]]
            out[name] = fn(weight, *m["args"], **m["kwargs"])
            continue
        dtype = getattr(torch, m["dtype"])
        t = torch.empty(0, dtype=dtype)
        t.set_(storages[m["storage"]], m["offset"], m["size"], m["stride"])
        out[name] = t
    return out, meta


def main():
    outdir = Path(sys.argv[1])
    from_pt = "--from-pt" in sys.argv
    report = {"torch": torch.__version__, "source": "constants.pt" if from_pt else "constants.safetensors"}
    code, dropped = lean_source((outdir / "output_module.py").read_text())
    report["dropped_imports"] = dropped
    ShippedKernels.kdir = outdir / "kernels"
    src = (outdir / "output_module.py").read_text()
    extern = sorted(set(re.findall(r"extern_kernels\.(\w+)", src)))
    ns = {
        "__name__": "int8study_lean",
        "AsyncCompile": ShippedKernels,
        "extern_kernels": SimpleNamespace(**{n: getattr(torch, n) for n in extern}),
        # imported by the module, unused unless optional inductor features are on
        "assert_tensor_metadata": assert_tensor_metadata,
        "run_intermediate_hooks": None,
        "maybe_profile": None,
        "align": None,
    }
    exec(code, ns)
    report["extern_kernels"] = extern
    report["kernels_loaded"] = len(ShippedKernels.loaded)

    if from_pt:
        consts = torch.load(outdir / "constants.pt", weights_only=True)
        meta = None  # (lacks the mkldnn ones)
    else:
        t0 = time.perf_counter()
        consts, meta = rebuild_constants(outdir)
        report["rebuild_constants_s"] = round(time.perf_counter() - t0, 4)
    # check: bit-exact against the torch.save copy (dtype, size, stride, offset, storage bytes)
    ref = torch.load(outdir / "constants.pt", weights_only=True)
    mism = []
    for n, t in consts.items():
        if t.layout != torch.strided:
            continue  # not in constants.pt: torch.save cannot save opaque tensors
        r = ref[n]
        same = t.dtype == r.dtype and t.size() == r.size() and t.stride() == r.stride() and t.storage_offset() == r.storage_offset() and torch.equal(_bytes(t), _bytes(r))
        if not same:
            mism.append(n)
    report["constants"] = len(consts)
    report["constants_mismatch_vs_torch_save"] = mism
    report["mkldnn_constants_rebuilt"] = sum(t.layout == torch._mkldnn for t in consts.values())
    report["misaligned_constants"] = [n for n, t in consts.items() if t.layout == torch.strided and t.untyped_storage().data_ptr() % 64]
    declared = re.findall(r"^(\w+) = None(?:  #.*)?$", src, re.M)
    report["declared_not_bound"] = [n for n in declared if n not in consts]
    for n, t in consts.items():
        ns[n] = t
    call = ns["call"]

    data = torch.load(outdir / "data.pt", weights_only=True)
    flat = list(data["test"])
    with torch.no_grad():
        t0 = time.perf_counter()
        out = call(list(flat))
        report["first_call_s"] = time.perf_counter() - t0
    report["startup_to_first_output_s"] = time.perf_counter() - t_start
    out = out[0]

    def cmp(a, b):
        a, b = a.float().flatten(), b.float().flatten()
        return {"max_abs": (a - b).abs().max().item(), "cos": torch.nn.functional.cosine_similarity(a, b, dim=0).item()}

    report["vs_fp32_eager"] = cmp(out, data["fp32_ref"])
    report["vs_int8_eager"] = cmp(out, data["int8_eager"])
    report["vs_int8_frozen_in_build_process"] = cmp(out, data["int8_frozen"])
    report["bitwise_equal_to_build_process"] = bool(torch.equal(out, data["int8_frozen"]))
    if "--no-time" not in sys.argv:
        with torch.no_grad():
            for _ in range(5):
                call(list(flat))
            ts = []
            for _ in range(30):
                t = time.perf_counter()
                call(list(flat))
                ts.append(time.perf_counter() - t)
        report["lean_int8_ms"] = (round(statistics.median(ts) * 1e3, 3), round(min(ts) * 1e3, 3))
    new = sorted(set(sys.modules) - modules_after_torch)
    report["inductor_modules_after_import_torch"] = sorted(m for m in modules_after_torch if m.startswith("torch._inductor"))
    report["inductor_modules_imported_by_load"] = [m for m in new if m.startswith("torch._inductor")]
    report["dynamo_modules_imported_by_load"] = [m for m in new if m.startswith("torch._dynamo")]
    report["torchao_imported"] = any(m.startswith("torchao") for m in sys.modules)
    report["codecache_imported"] = "torch._inductor.codecache" in sys.modules
    report["compiler_invocations"] = CC_LOG.read_text().splitlines() if CC_LOG.exists() else []
    report["which_gxx"] = __import__("shutil").which("g++")
    report["onednn_isa_env"] = os.environ.get("ONEDNN_MAX_CPU_ISA")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
