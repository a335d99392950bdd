"""The torch-free form (`torch-free = true`): a wheel built with the real hook
whose C++ forms link no torch library and run on the wheel's own shim; it
requires NumPy, not torch, installs into a fresh venv without torch, and there
gives eager's outputs (the example encoder, and a model with state over a
sequence of calls, with `reset()`), under threads and in a child forked after a
call, with torch never importable. A model whose
graph calls an operator the shim lacks ships the usual C++ form under the
eager fallback, saying which operator, and fails the build under "error".
A manifest that lost its shim is refused as damaged, and a process that runs
the wheel's shim refuses torch's beside it. The shim's generator, compile and
operators are tested here too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import EXAMPLE, Venv, build_wheel, deploy, no_compiler_env, reseal, run, write_project

MODELS = (
    (EXAMPLE / "src" / "example_pkg" / "model.py").read_text()
    + '''


class Accumulator(nn.Module):
    """State a call updates: the running sum of its inputs, added to a projection."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("total", torch.zeros(16))

    def forward(self, x):
        self.total.add_(x.sum(0))
        return torch.tanh(self.proj(x)) + self.total


def accumulator():
    torch.manual_seed(1)
    return Accumulator().eval()


class TopK(nn.Module):
    """An operator the wheel's shim does not give (aten's topk)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        return self.proj(x).topk(3, dim=-1).values


def topk():
    torch.manual_seed(2)
    return TopK().eval()
'''
)

TORCH_FREE_MODELS = """
[tool.hatch.build.hooks.precompile.models.encoder]
factory = "free_pkg.models:build_encoder"
inputs = [{ shape = ["batch", 64], dtype = "int64", range = [0, 1000] }]
dims = { batch = { min = 1, max = 16 } }
cpp-form = true
torch-free = true

[tool.hatch.build.hooks.precompile.models.accumulator]
factory = "free_pkg.models:accumulator"
inputs = [{ shape = ["rows", 16], dtype = "float32" }]
dims = { rows = { min = 1, max = 8 } }
cpp-form = true
torch-free = true
"""

TOPK_MODEL = """
[tool.hatch.build.hooks.precompile.models.topk]
factory = "free_pkg.models:topk"
inputs = [{ shape = ["rows", 16], dtype = "float32" }]
dims = { rows = { min = 1, max = 8 } }
cpp-form = true
torch-free = true
"""


@pytest.fixture(scope="module")
def free_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = write_project(tmp_path_factory.mktemp("torch-free"), "free_pkg", MODELS, TORCH_FREE_MODELS)
    return build_wheel(project)


@pytest.fixture(scope="module")
def free_venv(tmp_path_factory: pytest.TempPathFactory, free_wheel: Path) -> Venv:
    """A fresh venv with the wheel and what its metadata requires: NumPy, no torch."""
    return deploy(free_wheel, tmp_path_factory.mktemp("no-torch") / "venv")


def _eager() -> dict[str, list]:
    """Eager's outputs, in this process (which has torch), for the calls the venv makes."""
    import numpy
    import torch

    namespace: dict = {}
    exec(compile(MODELS, "models.py", "exec"), namespace)
    ids = torch.from_numpy((numpy.arange(5 * 64, dtype=numpy.int64) * 7 % 1000).reshape(5, 64))
    rows = [torch.from_numpy(numpy.linspace(-1, 1, n * 16, dtype=numpy.float32).reshape(n, 16)) for n in (1, 8, 3)]
    with torch.no_grad():
        encoder = namespace["build_encoder"]()
        accumulator = namespace["accumulator"]()
        return {"embedding": encoder(ids)["embedding"].tolist(), "sums": [accumulator(x).tolist() for x in rows]}


CALLS = """
import json, sys
import numpy as np
from free_pkg import load_compiled
report = {}
ids = (np.arange(5 * 64, dtype=np.int64) * 7 % 1000).reshape(5, 64)
rows = [np.linspace(-1, 1, n * 16, dtype=np.float32).reshape(n, 16) for n in (1, 8, 3)]
try:
    import torch
    report["torch importable"] = True
except ImportError:
    report["torch importable"] = False
encoder = load_compiled("encoder", arrays="numpy")
report["embedding"] = encoder(ids)["embedding"].tolist()
report["repr"] = repr(encoder)
accumulator = load_compiled("accumulator", arrays="numpy")
report["sums"] = [accumulator(x).tolist() for x in rows]
accumulator.reset()
report["after reset"] = accumulator(rows[0]).tolist()
report["explain"] = load_compiled.explain()
expected = report["embedding"]
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(4) as pool:  # four threads calling one model at once
    report["threads"] = all(output["embedding"].tolist() == expected for output in pool.map(lambda _: encoder(ids), range(8)))
import os
reading, writing = os.pipe()
child = os.fork()  # after the model ran: the child gets one OpenMP thread, and runs it
if child == 0:
    os.write(writing, b"1" if encoder(ids)["embedding"].tolist() == expected else b"0")
    os._exit(0)
os.waitpid(child, 0)
report["forked child"] = os.read(reading, 1) == b"1"
try:
    load_compiled("encoder")
except Exception as error:
    report["torch path"] = f"{type(error).__name__}: {error}"
report["torch imported"] = "torch" in sys.modules
print(json.dumps(report))
"""


@pytest.mark.e2e
@pytest.mark.standalone
def test_the_wheel_requires_numpy_not_torch_and_runs_where_torch_is_absent(free_wheel: Path, free_venv: Venv, tmp_path: Path) -> None:
    with zipfile.ZipFile(free_wheel) as wheel:
        metadata = wheel.read(next(name for name in wheel.namelist() if name.endswith("METADATA"))).decode()
        names = wheel.namelist()
        manifest = json.loads(wheel.read("free_pkg/_precompiled/manifest.json"))
    assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist")] == ["Requires-Dist: numpy>=1.26"]
    assert {"free_pkg/_precompiled/libaoti_shim.so", "free_pkg/_precompiled/libgomp_so_1.so"} <= set(names)
    for model in ("encoder", "accumulator"):
        (artifact,) = manifest["models"][model]["artifacts"]
        assert artifact["cpp"]["provider"] == "wheel", artifact["cpp"]
        library = free_venv.path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / "free_pkg" / "_precompiled" / artifact["cpp"]["file"]
        needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
        assert "libtorch" not in needed and "libc10" not in needed and "libgomp.so.1" in needed

    result = free_venv.script(CALLS, env=no_compiler_env(tmp_path), check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["torch importable"] is False and report["torch imported"] is False
    eager = _eager()
    import numpy

    def close(got: list, expected: list) -> bool:
        scale = float(numpy.abs(numpy.asarray(expected)).max())
        return bool(numpy.abs(numpy.asarray(got) - numpy.asarray(expected)).max() <= 1e-5 * scale)

    assert close(report["embedding"], eager["embedding"])
    assert all(close(got, expected) for got, expected in zip(report["sums"], eager["sums"], strict=True))  # the state carries over calls
    assert close(report["after reset"], eager["sums"][0])
    assert report["repr"] == "<compiled model 'encoder' from encoder/cpu_avx2_cpp.so on NumPy arrays>"
    assert report["threads"] and report["forked child"]
    assert "without torch (arrays='numpy'): yes, would load encoder/cpu_avx2_cpp.so (C++ form)" in report["explain"]
    assert "torch is not installed" in report["torch path"] and 'arrays="numpy"' in report["torch path"], report["torch path"]

    # The OpenMP runtime is the wheel's copy, loaded first: the system's libgomp.so.1 is never opened.
    traced = free_venv.script(CALLS, env=no_compiler_env(tmp_path, LD_DEBUG="files"), check=False)
    opened = {line.split("file=")[1].split()[0] for line in traced.stderr.splitlines() if "file=" in line and "gomp" in line}
    assert opened and all(path.endswith("/free_pkg/_precompiled/libgomp_so_1.so") for path in opened), opened


@pytest.mark.e2e
@pytest.mark.standalone
def test_an_operator_the_shim_lacks_is_named_and_the_fallback_decides(tmp_path: Path) -> None:
    project = write_project(tmp_path / "eager", "free_pkg", MODELS, TOPK_MODEL)
    wheel = build_wheel(project)
    with zipfile.ZipFile(wheel) as archive:
        manifest = json.loads(archive.read("free_pkg/_precompiled/manifest.json"))
        metadata = archive.read(next(name for name in archive.namelist() if name.endswith("METADATA"))).decode()
    (artifact,) = manifest["models"]["topk"]["artifacts"]
    assert "provider" not in artifact["cpp"] and "file" in artifact["cpp"]  # the usual C++ form
    assert "aoti_torch_cpu_topk" in artifact["cpp"]["torch_free_refused"], artifact["cpp"]
    assert "Requires-Dist: torch==" in metadata and "shim" not in manifest

    strict = write_project(tmp_path / "error", "free_pkg", MODELS, TOPK_MODEL + 'fallback = "error"\n')
    failed = run([sys.executable, "-m", "build", "--wheel", "--no-isolation", str(strict)], check=False)
    assert failed.returncode != 0
    said = failed.stdout + failed.stderr
    assert "model 'topk' failed while building its torch-free form" in said and "aoti_torch_cpu_topk" in said and "the wheel's shim does not provide" in said, said[-2000:]


def test_the_shim_is_generated_for_what_a_library_references(tmp_path: Path) -> None:
    from hatch_precompile.shim.build import compile_shim, unprovided, vector_math_source

    symbols = {"aoti_torch_cpu_addmm_out", "aoti_torch_get_sizes", "Sleef_expf16_u10", "Sleef_tanhf8_u10", "Sleef_powd4_u10"}
    assert unprovided(symbols) == []
    assert unprovided({*symbols, "aoti_torch_cpu_topk", "Sleef_sincosf16_u10"}) == ["Sleef_sincosf16_u10", "aoti_torch_cpu_topk"]
    source = vector_math_source(symbols)
    assert "__m512 Sleef_expf16_u10(__m512 x) { return _ZGVeN16v_expf(x); }" in source  # glibc's vector exp
    assert "std::tanh(xs[i])" in source and "__m256d Sleef_powd4_u10(__m256d x, __m256d y) { return _ZGVdN4vv_pow(x, y); }" in source
    compile_shim(symbols, tmp_path / "shim.so")
    exported = subprocess.run(["nm", "-D", "--defined-only", str(tmp_path / "shim.so")], capture_output=True, text=True, check=True).stdout
    assert all(symbol in exported for symbol in symbols)
    with pytest.raises(ValueError, match="cannot provide aoti_torch_cpu_topk"):
        compile_shim({"aoti_torch_cpu_topk"}, tmp_path / "other.so")


def test_torch_free_needs_the_cpp_form(tmp_path: Path) -> None:
    from hatch_precompile.engine.config import ConfigError, parse_config

    table = {"cpp-form": False, "models": {"m": {"factory": "p.m:f", "inputs": [{"shape": [2], "dtype": "float32"}], "torch-free": True}}}
    with pytest.raises(ConfigError, match=r"models\.m\.torch-free: is a kind of C\+\+ form, so it needs `cpp-form = true`"):
        parse_config(table)


SHIM_OPERATORS = r"""
import ctypes, sys
import numpy as np
from hatch_precompile.runtime import _shim

shim = _shim.load(__import__("pathlib").Path(sys.argv[1]))
lib, f32 = shim.library, shim.dtype_code("float32")
rng = np.random.default_rng(0)

def handle(array):
    return shim.tensor(array, f32)

def out_of(pointer):
    return shim.array(pointer.value, np.dtype("float32"))

worst = {}
# addmm: a bias broadcast over rows, mat2 a transposed weight, mat1 a strided view (every other column)
weight, bias, wide = rng.standard_normal((24, 16), dtype=np.float32), rng.standard_normal(24, dtype=np.float32), rng.standard_normal((7, 32), dtype=np.float32)
mat1 = wide[:, ::2]
out = np.empty((7, 24), dtype=np.float32)
assert lib.aoti_torch_cpu_addmm_out(handle(out), handle(bias), handle(mat1), handle(weight.T), ctypes.c_double(0.5), ctypes.c_double(2.0)) == 0
worst["addmm"] = float(np.abs(out - (0.5 * bias + 2.0 * mat1 @ weight.T)).max())
# bmm into a transposed output, one operand broadcast over the batch (stride 0)
left, right = rng.standard_normal((3, 5, 8), dtype=np.float32), np.broadcast_to(rng.standard_normal((1, 8, 6), dtype=np.float32), (3, 8, 6))
result = np.empty((3, 6, 5), dtype=np.float32).transpose(0, 2, 1)
assert lib.aoti_torch_cpu_bmm_out(handle(result), handle(left), handle(right)) == 0
worst["bmm"] = float(np.abs(result - left @ right).max())
# baddbmm: a mask-like self broadcast over the batch, scaled
self_bias = rng.standard_normal((5, 6), dtype=np.float32)
added = np.empty((3, 5, 6), dtype=np.float32)
assert lib.aoti_torch_cpu_baddbmm_out(handle(added), handle(self_bias), handle(left), handle(right), ctypes.c_double(1.0), ctypes.c_double(0.25)) == 0
worst["baddbmm"] = float(np.abs(added - (self_bias + 0.25 * (left @ right))).max())
# attention: causal and with an additive mask, against softmax(q k^T / sqrt(E) + mask) v
q, k, v = (rng.standard_normal((2, 3, 5, 4), dtype=np.float32) for _ in range(3))
mask = rng.standard_normal((5, 5), dtype=np.float32)
for causal, masked in ((1, None), (0, mask)):
    ret0, ret1 = _shim.Handle(), _shim.Handle()
    given = ctypes.byref(handle(masked)) if masked is not None else None
    assert lib.aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu(handle(q), handle(k), handle(v), ctypes.c_double(0.0), causal, given, None, ctypes.byref(ret0), ctypes.byref(ret1)) == 0
    scores = q @ k.transpose(0, 1, 3, 2) / 2.0 + (masked if masked is not None else np.where(np.tri(5, dtype=bool), 0, -np.inf))
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    worst[f"attention causal={causal}"] = float(np.abs(out_of(ret0) - weights @ v).max())
# convolution: 2-D with stride, padding, dilation and groups, from a contiguous and a channels-last input
# (whose output is channels-last too), and 1-D; against a reference summed tap by tap
def reference(x, w, b, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    ho, wo = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1, (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out, og = np.zeros((n, o, ho, wo), dtype=np.float64), o // groups
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dil[0] : i * dil[0] + stride[0] * (ho - 1) + 1 : stride[0], j * dil[1] : j * dil[1] + stride[1] * (wo - 1) + 1 : stride[1]]
            for g in range(groups):
                out[:, g * og : (g + 1) * og] += np.einsum("nchw,oc->nohw", patch[:, g * cg : (g + 1) * cg], w[g * og : (g + 1) * og, :, i, j])
    return out + b[None, :, None, None]

def conv(x, w, b, stride, pad, dil, groups, transposed=0, extra=None):
    ints = lambda values: ((ctypes.c_int64 * len(values))(*values), ctypes.c_int64(len(values)))
    ret = _shim.Handle()
    (s, sn), (p, pn), (d, dn), (op, opn) = ints(stride), ints(pad), ints(dil), ints(extra or [0] * len(stride))
    assert lib.aoti_torch_cpu_convolution(handle(x), handle(w), ctypes.byref(handle(b)), s, sn, p, pn, d, dn, ctypes.c_int32(transposed), op, opn, ctypes.c_int64(groups), ctypes.byref(ret)) == 0
    return out_of(ret)

def transposed_reference(x, w, b, stride, pad, dil, groups, extra):
    n, c, h, wd = x.shape
    cg, og, kh, kw = w.shape[0] // groups, w.shape[1], w.shape[2], w.shape[3]
    full = np.zeros((n, og * groups, (h - 1) * stride[0] + dil[0] * (kh - 1) + 1 + extra[0], (wd - 1) * stride[1] + dil[1] * (kw - 1) + 1 + extra[1]))
    for i in range(kh):
        for j in range(kw):
            for g in range(groups):
                full[:, g * og : (g + 1) * og, i * dil[0] : i * dil[0] + stride[0] * (h - 1) + 1 : stride[0], j * dil[1] : j * dil[1] + stride[1] * (wd - 1) + 1 : stride[1]] += np.einsum(
                    "nchw,co->nohw", x[:, g * cg : (g + 1) * cg], w[g * cg : (g + 1) * cg, :, i, j])
    ho, wo = full.shape[2] - 2 * pad[0], full.shape[3] - 2 * pad[1]
    return full[:, :, pad[0] : pad[0] + ho, pad[1] : pad[1] + wo] + b[None, :, None, None]

x, w, b = rng.standard_normal((2, 6, 9, 11), dtype=np.float32), rng.standard_normal((4, 3, 3, 2), dtype=np.float32), rng.standard_normal(4, dtype=np.float32)
expected = reference(x, w, b, (2, 1), (1, 2), (2, 1), 2)
worst["conv2d"] = float(np.abs(conv(x, w, b, [2, 1], [1, 2], [2, 1], 2) - expected).max())
channels_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
got = conv(channels_last, w, b, [2, 1], [1, 2], [2, 1], 2)
worst["conv2d channels-last"] = float(np.abs(got - expected).max())
channels_last_out = got.strides[1] == got.itemsize
signal, taps = rng.standard_normal((2, 4, 17), dtype=np.float32), rng.standard_normal((5, 4, 3), dtype=np.float32)
expected = reference(signal[:, :, None, :], taps[:, :, None, :], b[:1].repeat(5), (1, 2), (0, 1), (1, 1), 1)[:, :, 0, :]
worst["conv1d"] = float(np.abs(conv(signal, taps, b[:1].repeat(5), [2], [1], [1], 1) - expected).max())
up, up_bias = rng.standard_normal((6, 2, 3, 2), dtype=np.float32), rng.standard_normal(4, dtype=np.float32)  # [C, O/g, kernel], two groups
expected = transposed_reference(x, up, up_bias, (2, 3), (1, 0), (1, 2), 2, (1, 2))
worst["conv2d transposed"] = float(np.abs(conv(x, up, up_bias, [2, 3], [1, 0], [1, 2], 2, transposed=1, extra=[1, 2]) - expected).max())
# clone keeps a dense view's layout (here a transposed one) and its values
cloned = _shim.Handle()
assert lib.aoti_torch_clone(handle(weight.T), ctypes.byref(cloned)) == 0
copy = out_of(cloned)
worst["clone"] = float(np.abs(copy - weight.T).max()) if copy.strides == weight.T.strides else 1.0
# a shape the operator refuses: its reason is kept, and the call returns 1
assert lib.aoti_torch_cpu_mm_out(handle(out), handle(left), handle(weight)) == 1
lib.hatch_precompile_shim_last_error.restype = ctypes.c_char_p
print(__import__("json").dumps({"worst": worst, "error": lib.hatch_precompile_shim_last_error().decode(), "channels-last out": bool(channels_last_out)}))
"""


def test_the_shims_operators_compute_what_numpy_does_on_any_layout(tmp_path: Path) -> None:
    from hatch_precompile.shim.build import compile_shim

    compile_shim({"aoti_torch_cpu_addmm_out"}, tmp_path / "shim.so")
    done = subprocess.run([sys.executable, "-c", SHIM_OPERATORS, str(tmp_path / "shim.so")], capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(difference < 1e-5 for difference in report["worst"].values()), report
    assert report["error"] == "mm: self has 3 dims, expected 2", report
    assert report["channels-last out"], report


@pytest.mark.e2e
@pytest.mark.standalone
def test_a_torch_free_wheel_whose_manifest_lost_its_shim_is_refused_as_damaged(free_venv: Venv, tmp_path: Path) -> None:
    site = Path(free_venv.script("import free_pkg, os; print(os.path.dirname(os.path.dirname(free_pkg.__file__)))").stdout.strip())
    copy = tmp_path / "site"
    shutil.copytree(site / "free_pkg", copy / "free_pkg")
    manifest_path = copy / "free_pkg" / "_precompiled" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["shim"]
    reseal(manifest_path, manifest)
    code = "from free_pkg import load_compiled\ntry:\n    load_compiled('encoder', arrays='numpy')\nexcept Exception as error:\n    print(type(error).__name__, error)\n"
    said = free_venv.script(code, env=no_compiler_env(tmp_path, PYTHONPATH=str(copy))).stdout
    assert said.startswith("PrecompiledIntegrityError") and "has a torch-free C++ form but names no shim for it: the install is damaged" in said, said


ONE_SHIM = """
import sys
from pathlib import Path
from hatch_precompile.runtime import _shim

_shim.load(Path(sys.argv[1]))
try:
    _shim.load()
except _shim.ShimUnavailable as error:
    print(error)
"""


def test_one_process_holds_one_shim_and_the_second_load_says_so(tmp_path: Path) -> None:
    from hatch_precompile.shim.build import compile_shim

    compile_shim({"aoti_torch_get_sizes"}, tmp_path / "shim.so")
    done = subprocess.run([sys.executable, "-c", ONE_SHIM, str(tmp_path / "shim.so")], capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "this process runs C++ forms on the wheel's own shim (torch-free models), and this one needs torch's libtorch_cpu.so: one process holds one shim" in done.stdout, done.stdout
