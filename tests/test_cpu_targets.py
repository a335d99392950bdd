"""CPU targets and shipped kernels, through a real wheel of a small reduction-heavy
model: built with the hook for avx2 (and avx512 where the build machine has it),
installed into a fresh environment, loaded in fresh processes. Lacking CPUs are
simulated the ways a user meets them: ATEN_CPU_CAPABILITY, and a manifest
whose variant needs a feature this CPU does not have."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import Venv, build_wheel, make_venv, no_compiler_env, reseal, run, write_project

pytestmark = [pytest.mark.e2e, pytest.mark.standalone]

HOST_HAS_AVX512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
TARGETS = ["avx2", "avx512"] if HOST_HAS_AVX512 else ["avx2"]

MODEL = '''
import torch
from torch import nn


class Reductions(nn.Module):
    """Long reductions, where the split across threads and vector lanes matters."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(4096)

    def forward(self, x):
        return {"sum": x.sum(-1), "softmax": torch.softmax(x * 3, -1), "norm": self.norm(x).mean(-1)}


def build():
    torch.manual_seed(0)
    model = Reductions()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
    return model.eval()
'''

# Run in a fresh process: which variant loads, and results against eager.
LOAD = """
import json, torch
from reducepkg import load_compiled, _precompiled
from reducepkg.models import build
model = load_compiled("reductions")
x = torch.randn(5, 4096, generator=torch.Generator().manual_seed(1))
out = model(x)
with torch.no_grad():
    ref = build()(x)
for key in ref:
    torch.testing.assert_close(out[key], ref[key], rtol=1e-4, atol=1e-5)
print(json.dumps({"loaded": repr(model)}))
"""


@pytest.fixture(scope="module")
def reduce_venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    root = tmp_path_factory.mktemp("reduce")
    precompile = f"""
        cpu-targets = {json.dumps(TARGETS)}
        fallback = "error"

        [tool.hatch.build.hooks.precompile.models.reductions]
        factory = "reducepkg.models:build"
        inputs = [{{ shape = ["batch", 4096] }}]
        dims = {{ batch = {{ min = 1, max = 64 }} }}
        """
    wheel = build_wheel(write_project(root, "reducepkg", MODEL, precompile))
    env = make_venv(root / "venv")
    env.pip(str(wheel))
    return env


def installed(env: Venv) -> Path:
    out = env.script("import reducepkg, os; print(os.path.dirname(reducepkg.__file__))").stdout.strip()
    return Path(out) / "_precompiled"


def load(env: Venv, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return env.script(LOAD, env=no_compiler_env(tmp_path, **extra), check=False)


def test_best_variant_loads_without_a_compiler_and_matches_eager(reduce_venv: Venv, tmp_path: Path) -> None:
    result = load(reduce_venv, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    best = "avx512" if HOST_HAS_AVX512 else "avx2"
    assert json.loads(result.stdout)["loaded"] == f"<compiled model 'reductions' from reductions/cpu_{best}.py>"
    assert not (tmp_path / "compiler-used").exists()
    assert not (tmp_path / "inductor").exists()  # the lean form writes nothing to inductor's cache


def test_aten_cpu_capability_downgrade_is_honoured(reduce_venv: Venv, tmp_path: Path) -> None:
    result = load(reduce_venv, tmp_path, ATEN_CPU_CAPABILITY="avx2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cpu_avx2.py" in json.loads(result.stdout)["loaded"]


def test_no_variant_for_a_cpu_without_avx2_falls_back_with_the_reason(reduce_venv: Venv, tmp_path: Path) -> None:
    result = load(reduce_venv, tmp_path, ATEN_CPU_CAPABILITY="default")
    assert result.returncode == 1
    assert "PrecompiledModelError: model 'reductions': no shipped artifact fits this process" in result.stderr
    assert "reductions/cpu_avx2.bin was built with torch " in result.stderr
    assert "for avx2: torch runs DEFAULT kernels here, not AVX2 (see ATEN_CPU_CAPABILITY)" in result.stderr
    assert "with DEFAULT kernels and CPU features: " in result.stderr and not (tmp_path / "compiler-used").exists()


def test_a_variant_is_forced_by_environment_variable(reduce_venv: Venv, tmp_path: Path) -> None:
    result = load(reduce_venv, tmp_path, HATCH_PRECOMPILE_CPU_TARGET="avx2")
    assert "cpu_avx2.py" in json.loads(result.stdout)["loaded"]
    result = load(reduce_venv, tmp_path, HATCH_PRECOMPILE_CPU_TARGET="avx1024")
    assert "HATCH_PRECOMPILE_CPU_TARGET=avx1024 but the shipped CPU targets are: " in result.stderr


@pytest.mark.skipif(not HOST_HAS_AVX512, reason="building the avx512 target needs an AVX512 build machine")
def test_a_variant_needing_missing_cpu_features_is_never_loaded(reduce_venv: Venv, tmp_path: Path) -> None:
    """Copy the installed package, make its avx512 variant need a feature this CPU
    lacks, and wreck that variant's files: loading must pick avx2 without touching them."""
    missing = next(f for f, present in torch.cpu.get_capabilities().items() if present is False)
    site = tmp_path / "site"
    shutil.copytree(installed(reduce_venv).parent, site / "reducepkg")
    manifest_path = site / "reducepkg" / "_precompiled" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    model = manifest["models"]["reductions"]
    (avx512,) = [a for a in model["artifacts"] if a["cpu_target"] == "avx512"]
    avx512["cpu_features"].append(missing)
    reseal(manifest_path, manifest)
    avx2_kernels = {k for a in model["artifacts"] if a["cpu_target"] == "avx2" for k in a["kernels"]}
    wrecked = [avx512["file"], avx512["lean"]["file"], *(model["kernels"][k]["file"] for k in avx512["kernels"] if k not in avx2_kernels)]
    for relative in wrecked:
        (manifest_path.parent / relative).write_bytes(b"not an artifact")
    result = load(reduce_venv, tmp_path, PYTHONPATH=str(site))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cpu_avx2.py" in json.loads(result.stdout)["loaded"]


def test_a_missing_kernel_is_an_error_naming_it_not_a_compile(reduce_venv: Venv, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(installed(reduce_venv).parent, site / "reducepkg")
    manifest = json.loads((site / "reducepkg/_precompiled/manifest.json").read_text())
    model = manifest["models"]["reductions"]
    (loaded,) = [a for a in model["artifacts"] if a["cpu_target"] == TARGETS[-1]]
    key = loaded["kernels"][0]
    (site / "reducepkg/_precompiled" / model["kernels"][key]["file"]).unlink()
    result = load(reduce_venv, tmp_path, PYTHONPATH=str(site))
    assert result.returncode == 1
    assert "PrecompiledIntegrityError" in result.stderr and f"kernels/k_{key}.so is missing" in result.stderr
    assert not (tmp_path / "compiler-used").exists()


def test_results_do_not_depend_on_the_thread_count(reduce_venv: Venv, tmp_path: Path) -> None:
    code = """
import json, torch
from reducepkg import load_compiled
model = load_compiled("reductions")
x = torch.randn(64, 4096, generator=torch.Generator().manual_seed(2))
results = {}
for threads in (1, 2, 8, 32):
    torch.set_num_threads(threads)
    results[threads] = model(x)
base = results[1]
print(json.dumps({t: max((r[k] - base[k]).abs().max().item() for k in base) for t, r in results.items()}))
"""
    result = reduce_venv.script(code, env=no_compiler_env(tmp_path))
    differences = json.loads(result.stdout)
    assert all(d <= 1e-5 for d in differences.values()), differences


def kernel_instructions(env: Venv, target: str) -> str:
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils) is needed to inspect the shipped kernels"
    folder = installed(env)
    manifest = json.loads((folder / "manifest.json").read_text())["models"]["reductions"]
    (artifact,) = [a for a in manifest["artifacts"] if a["cpu_target"] == target]
    files = [str(folder / manifest["kernels"][k]["file"]) for k in artifact["kernels"]]
    return run([objdump, "-d", "--no-show-raw-insn", *files]).stdout


def test_avx2_kernels_use_no_512_bit_registers(reduce_venv: Venv) -> None:
    code = kernel_instructions(reduce_venv, "avx2")
    assert "ymm" in code and "zmm" not in code


@pytest.mark.skipif(not HOST_HAS_AVX512, reason="building the avx512 target needs an AVX512 build machine")
def test_avx512_kernels_use_512_bit_registers_and_record_host_extras(reduce_venv: Venv) -> None:
    assert "zmm" in kernel_instructions(reduce_venv, "avx512")
    manifest = json.loads((installed(reduce_venv) / "manifest.json").read_text())["models"]["reductions"]
    (artifact,) = [a for a in manifest["artifacts"] if a["cpu_target"] == "avx512"]
    assert {"avx512_f", "avx512_bw", "avx512_dq", "avx512_vl", "avx2"} <= set(artifact["cpu_features"])
    assert artifact["vector_isa"].startswith("avx512")
    extras = {"avx512_vnni": "avx512_vnni" in artifact["vector_isa"], "amx_tile": "amx_tile" in artifact["vector_isa"]}
    for feature, added in extras.items():
        assert (feature in artifact["cpu_features"]) == added
