"""End to end: the example project built with the real hook, installed in fresh
environments, and called in fresh processes."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import safetensors.torch
import torch

from hatch_precompile.engine.assemble import RUNTIME_FILES
from hatch_precompile.engine.native import stricter_platform

from conftest import (
    EXAMPLE,
    REPO,
    ExampleBuild,
    Venv,
    assert_said_plainly,
    no_compiler_env,
    on_a_release_leg,
    run,
    session_compiler_outputs,
    sharing_compiler_outputs,
    with_find_links,
)

pytestmark = pytest.mark.e2e

TORCH_PIN = f"torch=={torch.__version__.split('+')[0]}"
PRECOMPILED = "example_pkg/_precompiled/"

# Runs in a fresh process: the compiled encoder against the eager module from the
# same factory, at several batch sizes and in layouts the eager module accepts
# (transposed, sliced, expanded); float32 tolerance rtol=1e-4, atol=1e-5. Reports
# which compiler modules the first call imported.
COMPARE_WITH_EAGER = """
import json, sys, torch
from example_pkg import load_compiled
ids = torch.randint(0, 1000, (8, 64))
encoder = load_compiled("encoder")
first = encoder(ids)
report = {"repr": repr(encoder), "compiler": sorted(m for m in ("torch._inductor", "torch._dynamo") if m in sys.modules)}
from example_pkg.model import build_encoder
eager = build_encoder()
report["batches"] = {}
generator = torch.Generator().manual_seed(0)
calls = {
    "batch 1": torch.randint(0, 1000, (1, 64), generator=generator),
    "batch 7": torch.randint(0, 1000, (7, 64), generator=generator),
    "batch 64": torch.randint(0, 1000, (64, 64), generator=generator),
    "transposed": torch.randint(0, 1000, (64, 5), generator=generator).t(),
    "sliced": torch.randint(0, 1000, (6, 128), generator=generator)[1:, ::2],
    "expanded": torch.randint(0, 1000, (1, 64), generator=generator).expand(4, 64),
}
for case, call in calls.items():
    out = encoder(call)
    with torch.no_grad():
        ref = eager(call)
    assert type(out) is dict and list(out) == list(ref), (type(out), list(out))
    for key in ref:
        torch.testing.assert_close(out[key], ref[key], rtol=1e-4, atol=1e-5)
    report["batches"][case] = list(out["embedding"].shape)
print(json.dumps(report))
"""


def _metadata(text: str) -> list[str]:
    return Parser().parsestr(text).get_all("Requires-Dist") or []


@pytest.mark.release
def test_wheel_is_tagged_for_the_stable_abi_of_this_python_and_the_stricter_of_torchs_platform_and_its_libraries(example_build: ExampleBuild) -> None:
    tag = example_build.wheel.name.removesuffix(".whl").split("-", 2)[2]
    torch_wheel_info = importlib.metadata.distribution("torch").read_text("WHEEL")
    torch_platform = next(line for line in torch_wheel_info.splitlines() if line.startswith("Tag:")).rsplit("-", 1)[1]
    with zipfile.ZipFile(example_build.wheel) as wheel:
        wheel_info = wheel.read("example_pkg-0.1.0.dist-info/WHEEL").decode()
        (artifact,) = json.loads(wheel.read(PRECOMPILED + "manifest.json"))["models"]["encoder"]["artifacts"]
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert tag == f"{py}-abi3-{stricter_platform(torch_platform, artifact['native']['policy'])}"
    assert "Root-Is-Purelib: false" in wheel_info


@pytest.mark.release
def test_every_shipped_kernel_uses_only_the_stable_abi_of_the_python_it_was_built_with(example_build: ExampleBuild) -> None:
    """abi3audit (PyPA) reads each kernel's dynamic symbols against the stable ABI
    of the wheel's tag: a kernel using a CPython function outside it, or one
    added after 3.11, fails the audit."""
    result = run([sys.executable, "-m", "abi3audit", "--strict", "--report", str(example_build.wheel)], check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    (wheel,) = report["specs"].values()
    audited = wheel["wheel"]
    assert len(audited) >= 1 and all(kernel["result"]["non_abi3_symbols"] == [] for kernel in audited), audited


@pytest.mark.release
def test_wheel_holds_loader_manifest_artifact_and_weights(example_build: ExampleBuild) -> None:
    with zipfile.ZipFile(example_build.wheel) as wheel:
        names = set(wheel.namelist())
        manifest = json.loads(wheel.read(PRECOMPILED + "manifest.json"))
        for expected in (*RUNTIME_FILES, "manifest.json", "_build.py"):
            assert PRECOMPILED + expected in names
        encoder = manifest["models"]["encoder"]
        shipped = [encoder["weights"], *encoder["artifacts"], encoder["artifacts"][0]["lean"], encoder["artifacts"][0]["cpp"], *encoder["kernels"].values()]
        for record in shipped:
            data = wheel.read(PRECOMPILED + record["file"])
            assert len(data) == record["size"]
            assert hashlib.sha256(data).hexdigest() == record["sha256"]
        assert wheel.read(PRECOMPILED + "__init__.py") == (REPO / "hatch_precompile/runtime/__init__.py").read_bytes()

    (artifact,) = encoder["artifacts"]
    assert artifact["built_with"]["torch"] == torch.__version__
    assert artifact["built_with"]["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert artifact["device"] == "cpu" and artifact["file"] == "encoder/cpu_avx2.bin"
    assert artifact["lean"]["file"] == "encoder/cpu_avx2.py" and artifact["lean"]["extern_kernels"] == ["addmm"]
    # The C++ form: one library, holding no weights (they are bound by name at load).
    assert artifact["cpp"]["file"] == "encoder/cpu_avx2_cpp.so"
    assert sorted(artifact["cpp"]["constants"].values()) == sorted(encoder["weights"]["order"])
    with zipfile.ZipFile(example_build.wheel) as wheel:
        library = wheel.read(PRECOMPILED + artifact["cpp"]["file"])
        embedding = safetensors.torch.load(wheel.read(PRECOMPILED + encoder["weights"]["file"]))["tokens.weight"]
    assert embedding.numel() == 1000 * 64 and embedding[:4].numpy().tobytes() not in library
    assert artifact["cpu_target"] == "avx2" and artifact["aten_capability"] == "AVX2"
    assert set(artifact["kernels"]) == set(encoder["kernels"]) and len(artifact["kernels"]) >= 1
    assert encoder["inputs"]["leaves"] == [{"name": "input_ids", "dtype": "int64", "device": "cpu", "shape": ["batch", 64], "layout": "contiguous", "below": 1000}]
    assert encoder["outputs"]["leaves"] == [
        {"dtype": "float32", "shape": ["batch", 64]},
        {"dtype": "float32", "shape": ["batch", 64, 64]},
    ]
    assert encoder["dims"] == {"batch": {"min": 1, "max": 64, "buckets": [], "dynamic": True}}


def test_wheel_and_sdist_pin_the_same_torch_release(example_build: ExampleBuild) -> None:
    with zipfile.ZipFile(example_build.wheel) as wheel:
        wheel_requires = _metadata(wheel.read("example_pkg-0.1.0.dist-info/METADATA").decode())
    with tarfile.open(example_build.sdist) as sdist:
        sdist_requires = _metadata(sdist.extractfile("example_pkg-0.1.0/PKG-INFO").read().decode())
        sdist_names = sdist.getnames()
    assert wheel_requires == [TORCH_PIN]  # the loader reads the weights itself
    assert sorted(wheel_requires) == sorted(sdist_requires)
    compiled = [n for n in sdist_names if n.endswith((".bin", ".safetensors", "manifest.json"))]
    assert compiled == []


@pytest.mark.release
def test_build_reports_progress_per_model_and_step(example_build: ExampleBuild) -> None:
    # the distribution's version: PyPI's builds carry no local label there (torch.__version__ has +cu130)
    assert f"compiling with torch {importlib.metadata.version('torch')}; the wheel requires {TORCH_PIN}" in example_build.log
    for step in ("built the module", "captured with torch.export (dynamic dims)", "avx2 (dynamic dims): compiled (its C++ form in"):
        assert re.search(rf"^precompile: encoder: {re.escape(step)}.* \([\d.]+ s\)$", example_build.log, re.MULTILINE), step
    assert re.search(r"^precompile: encoder: avx2 \(dynamic dims\): compiled \(its C\+\+ form in [\d.]+ s\), checked against eager: relative error", example_build.log, re.MULTILINE)
    assert "precompile: encoder: ran the C++ form of 1 variant(s) in a fresh process and compared with eager" in example_build.log


@pytest.mark.release
@pytest.mark.parametrize(
    ("form", "loaded", "compiler"),
    [
        ("auto", "encoder/cpu_avx2_cpp.so", []),
        ("cpp", "encoder/cpu_avx2_cpp.so", []),
        ("lean", "encoder/cpu_avx2.py", []),
        ("artifact", "encoder/cpu_avx2.bin", ["torch._dynamo", "torch._inductor"]),
    ],
)
def test_compiled_encoder_matches_eager_in_every_form_with_no_compiler(deploy_venv: Venv, tmp_path: Path, form: str, loaded: str, compiler: list[str]) -> None:
    if form == "cpp" and on_a_release_leg():
        pytest.skip("the C++ form asked for by name loads the file `auto` loads: the leg checks that one")
    env = no_compiler_env(tmp_path, HATCH_PRECOMPILE_FORM=form)
    report = json.loads(deploy_venv.script(COMPARE_WITH_EAGER, env=env).stdout)
    assert not (tmp_path / "compiler-used").exists()
    assert report["repr"] == f"<compiled model 'encoder' from {loaded}>"
    assert report["compiler"] == compiler
    assert report["batches"] == {"batch 1": [1, 64], "batch 7": [7, 64], "batch 64": [64, 64], "transposed": [5, 64], "sliced": [5, 64], "expanded": [4, 64]}


@pytest.mark.release
def test_the_lean_form_writes_nothing_to_disk_but_the_weights_stamp(deploy_venv: Venv, tmp_path: Path) -> None:
    env = no_compiler_env(tmp_path)
    deploy_venv.script("import torch\nfrom example_pkg import load_compiled\nload_compiled('encoder')(torch.zeros(2, 64, dtype=torch.long))", env=env)
    written = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert [(p.parent.name, p.stat().st_size) for p in written] == [("verified", 0)]
    assert not (tmp_path / "inductor").exists()


def test_deployed_wheel_needs_neither_the_plugin_nor_a_torch_import_at_package_import(deploy_venv: Venv) -> None:
    out = deploy_venv.script("import sys, importlib.util, example_pkg\nprint('torch' in sys.modules, importlib.util.find_spec('hatch_precompile') is None)").stdout.split()
    assert out == ["False", "True"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("enc(ids.int())", "input input_ids: expected dtype int64, got int32"),
        ("enc(ids[:, :10])", "input input_ids: expected size 64 at dim 1 (shape ['batch', 64]), got [3, 10]"),
        ("enc(torch.zeros(65, 64, dtype=torch.long))", "dim 'batch' (dim 0) must be in [1, 64], got 65"),
        ("enc(torch.zeros(0, 64, dtype=torch.long))", "dim 'batch' (dim 0) must be in [1, 64], got 0"),
        ("enc(ids, ids)", "expected 1 positional argument(s), got 2"),
        ("enc(ids, mask=ids)", "missing none, unexpected ['mask']"),
        ("enc(ids.tolist())", "input input_ids: expected a tensor, got list"),
        ("enc(ids[0])", "expected 2 dimensions ['batch', 64], got shape [64]"),
        ("enc(ids.to('meta'))", "input input_ids: expected a tensor on cpu, got one on meta"),
        ("enc(input_ids=ids)", "expected 1 positional argument(s), got 0"),
    ],
)
def test_bad_calls_raise_value_errors_naming_model_and_input(deploy_venv: Venv, call: str, message: str) -> None:
    code = (
        "import torch\nfrom example_pkg import load_compiled\nenc = load_compiled('encoder')\n"
        "ids = torch.zeros(3, 64, dtype=torch.long)\n"
        f"try:\n    {call}\nexcept ValueError as e:\n    print(e)\nelse:\n    print('no error')"
    )
    out = deploy_venv.script(code).stdout.strip()
    assert out.startswith("model 'encoder'") and message in out, out


def test_concurrent_first_calls_load_once(deploy_venv: Venv) -> None:
    code = """
import threading, torch
from example_pkg import load_compiled
from example_pkg.model import build_encoder
ids = torch.randint(0, 1000, (4, 64))
with torch.no_grad():
    ref = build_encoder()(ids)["embedding"]
models, errors = [], []
def work():
    try:
        model = load_compiled("encoder")
        torch.testing.assert_close(model(ids)["embedding"], ref, rtol=1e-4, atol=1e-5)
        models.append(model)
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
print(len(models), len({id(m) for m in models}), errors)
"""
    assert deploy_venv.script(code).stdout.split(maxsplit=2) == ["8", "1", "[]\n"]


# A server that loads before it forks (gunicorn --preload): the parent loads the
# encoder and, where asked, calls it on two threads, then forks two workers that
# call it; each worker reports its thread count and whether it matched the parent's
# result. Workers that hang are ended by the timeout.
FORKED_WORKERS = """
import json, os, sys, torch
from example_pkg import load_compiled
torch.set_num_threads(2)
encoder = load_compiled("encoder")
ids = torch.randint(0, 1000, (64, 64), generator=torch.Generator().manual_seed(0))
expected = encoder(ids)["embedding"] if sys.argv[1] == "call" else None
workers = []
for _ in range(2):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        got = encoder(ids)["embedding"]
        os.write(write, json.dumps([torch.get_num_threads(), expected is None or torch.equal(got, expected)]).encode())
        os._exit(0)
    os.close(write)
    workers.append((pid, read))
reports = [json.loads(os.read(read, 1000)) for pid, read in workers if os.waitpid(pid, 0)]
print(json.dumps({"parent threads": torch.get_num_threads(), "workers": reports}))
"""


@pytest.mark.parametrize(("parent", "stamped", "worker_threads"), [("call", False, 1), ("load", False, 1), ("load", True, 2)])
def test_workers_forked_after_the_model_ran_get_one_thread_and_do_not_hang(deploy_venv: Venv, tmp_path: Path, parent: str, stamped: bool, worker_threads: int) -> None:
    """GNU OpenMP's pool does not survive fork: eager torch hangs here too (_fork.py).
    A first load checks the weights on every core (torch.sum), which starts the
    pool: its children get one thread; with the stamp a first load left, loading
    runs nothing in parallel, and they keep the parent's two."""
    env = {**os.environ, "HATCH_PRECOMPILE_CACHE_DIR": str(tmp_path / "cache")}
    if stamped:
        deploy_venv.script("from example_pkg import load_compiled; load_compiled('encoder')", env=env)
    process = subprocess.Popen([deploy_venv.python, "-c", FORKED_WORKERS, parent], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the hung workers too
        process.communicate()
        pytest.fail(f"a worker forked after the parent {parent}ed the model hung")
    assert process.returncode == 0, stderr[-3000:]
    assert json.loads(stdout) == {"parent threads": 2, "workers": [[worker_threads, True]] * 2}


FALLBACK_CHECK = """
import warnings, torch
from example_pkg import load_compiled, _precompiled
from example_pkg.model import build_encoder
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = load_compiled("encoder")
    load_compiled("encoder")
ids = torch.randint(0, 1000, (2, 64))
with torch.no_grad():
    torch.testing.assert_close(model(ids), build_encoder()(ids))
fallbacks = [w for w in caught if issubclass(w.category, _precompiled.PrecompiledFallbackWarning)]
print(len(fallbacks))
print(fallbacks[0].message)
"""


def checkout(tmp_path: Path) -> Path:
    """A checkout of the example, readied as the README says for running from
    source with no install: `hatch-precompile init` writes the loader."""
    project = tmp_path / "example_project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("dist", "__pycache__", "_precompiled"))
    run([sys.executable, "-m", "hatch_precompile", "init", str(project / "src" / "example_pkg")])
    return project


def test_source_checkout_falls_back_to_eager_with_one_warning(torch_venv: Venv, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(checkout(tmp_path) / "src")}
    count, message = torch_venv.script(FALLBACK_CHECK, env=env).stdout.split("\n", 1)
    assert count == "1"
    assert "model 'encoder' runs eagerly (not compiled): no compiled artifacts" in message
    assert "Build and install a wheel with the hatch-precompile hook" in message


def test_source_checkout_with_fallback_error_raises(torch_venv: Venv, tmp_path: Path) -> None:
    project = checkout(tmp_path)
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('fallback = "eager"', 'fallback = "error"'))
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    code = "from example_pkg import load_compiled, _precompiled\ntry:\n    load_compiled('encoder')\nexcept _precompiled.PrecompiledModelError as e:\n    print(e)"
    out = torch_venv.script(code, env=env).stdout
    assert out.startswith("model 'encoder': no compiled artifacts next to")
    assert "Build and install a wheel with the hatch-precompile hook" in out


def test_unknown_model_name_lists_the_shipped_ones(deploy_venv: Venv) -> None:
    result = deploy_venv.script("from example_pkg import load_compiled\nload_compiled('decoder')", check=False)
    assert result.returncode == 1
    assert "no model named 'decoder'" in result.stderr and "(models: encoder)" in result.stderr


def test_editable_install_falls_back_to_eager(torch_venv: Venv, wheelhouse: Path, tmp_path: Path) -> None:
    """No `init`: the editable build writes the loader into the source tree."""
    # PYTHONPATH-based tests above take precedence over this .pth, so sharing the env is safe.
    project = tmp_path / "example_project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("dist", "__pycache__", "_precompiled"))
    torch_venv.pip("-e", str(project), env=with_find_links(wheelhouse))
    count, message = torch_venv.script(FALLBACK_CHECK, cwd=tmp_path).stdout.split("\n", 1)
    assert count == "1" and "no compiled artifacts next to" in message and str(project) in message


def test_the_wheel_passes_check_wheel_contents_and_twine_check(example_build: ExampleBuild) -> None:
    bin_dir = Path(sys.executable).parent
    contents = run([str(bin_dir / "check-wheel-contents"), str(example_build.wheel)], check=False)
    assert contents.returncode == 0, contents.stdout + contents.stderr
    assert "OK" in contents.stdout
    twine = run([str(bin_dir / "twine"), "check", "--strict", str(example_build.wheel), str(example_build.sdist)], check=False)
    assert twine.returncode == 0, twine.stdout + twine.stderr


def test_hatch_build_elsewhere_compiles_afresh_and_pip_from_the_sdist_gives_byte_identical_wheels(example_build: ExampleBuild, wheelhouse: Path, tmp_path: Path) -> None:
    """`hatch build` as its users run it, and reproducible wheels. hatch builds the
    project from another folder, in the build environment it makes (torch
    elsewhere than the session's), with the pinned torch, and compiles afresh
    (no artifact in its build cache) with the session's precompiled header and
    CPU probes: it finds the header the session's build made and builds the same
    kernels with it (the header is named by what decides its bytes, not by
    torch's folder). pip's build of the sdist then takes its artifacts from that
    cache, which is what its own compile would give; it runs without isolation,
    in this environment (its hatchling and this checkout's hook), where pip's own
    isolated environment would unpack torch again (45 CPU-s) for what hatch's
    already shows. Both wheels equal the session's sdist -> wheel build (python
    -m build, isolated) to the byte: no build path, temporary folder, frontend or
    compile time is recorded. Then a mistake in the table ends `hatch build` with
    the message alone."""
    hatch = shutil.which("hatch", path=str(Path(sys.executable).parent))
    if hatch is None:
        pytest.fail("the `hatch` CLI is missing: install the test extra (pip install -e '.[test]')")
    headers = session_compiler_outputs() / "headers"
    made = sorted(headers.glob("*.gch"))
    assert made, "the session's build kept no precompiled header in the build cache"
    cold = {**os.environ, "HATCH_PRECOMPILE_BUILD_CACHE": str(sharing_compiler_outputs(tmp_path / "empty-cache"))}
    project = tmp_path / "elsewhere" / "example_project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("dist", "__pycache__"))
    env = {**with_find_links(wheelhouse, base=cold), "HATCH_DATA_DIR": str(tmp_path / "hatch-data")}
    result = run([hatch, "build", "--target", "wheel"], cwd=project, env=env)
    (hatch_wheel,) = (project / "dist").glob("*.whl")
    with zipfile.ZipFile(hatch_wheel) as archive:
        manifest = json.loads(archive.read(PRECOMPILED + "manifest.json"))
        requires = _metadata(archive.read("example_pkg-0.1.0.dist-info/METADATA").decode())
    assert manifest["models"]["encoder"]["artifacts"][0]["built_with"]["torch"] == torch.__version__
    assert TORCH_PIN in requires
    assert "precompile: 1 model(s) in" in result.stderr + result.stdout and "(1 compiled)" in result.stderr + result.stdout
    assert sorted(headers.glob("*.gch")) == made, "hatch's build environment built a header of its own"
    assert not list(headers.glob("tmp*")), "scratch left in the header folder"
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(tmp_path / "pip"), str(example_build.sdist)],
        env=cold,
    )
    (pip_wheel,) = (tmp_path / "pip").glob("*.whl")
    for built_by, wheel in (("hatch", hatch_wheel), ("pip", pip_wheel)):
        with zipfile.ZipFile(wheel) as built, zipfile.ZipFile(example_build.wheel) as reference:
            assert built.namelist() == reference.namelist()
            differing = [name for name in reference.namelist() if built.read(name) != reference.read(name)]
        assert differing == [], (built_by, differing)
        assert wheel.read_bytes() == example_build.wheel.read_bytes(), built_by

    # A mistake in the table ends `hatch build` (in the build environment hatch just made) with the message alone.
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("[tool.hatch.build.hooks.precompile]", "[tool.hatch.build.hooks.precompile]\njobs = 0"))
    failed = run([hatch, "build", "--target", "wheel"], cwd=project, env=env, check=False)
    assert failed.returncode != 0
    assert "tool.hatch.build.hooks.precompile.jobs: expected an integer >= 1, found 0" in failed.stderr + failed.stdout
    assert_said_plainly(failed.stdout + failed.stderr)
