"""The loader refuses what it should, says why, and never crashes the process.

Each test copies the installed example package out of the deployed wheel's
environment, damages or edits the copy the way a real fault would, and loads it
(via PYTHONPATH, which shadows the installed one) in a fresh process."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import torch

from hatch_precompile.runtime import MANIFEST_FORMAT

from conftest import Venv, no_compiler_env, reseal

pytestmark = pytest.mark.e2e

LOAD = """
import torch
from example_pkg import load_compiled
model = load_compiled("encoder")
print(repr(model), model(torch.zeros(2, 64, dtype=torch.long))["embedding"].shape)
"""


@pytest.fixture
def package(deploy_venv: Venv, tmp_path: Path) -> Path:
    """A private copy of the installed example package; returns its _precompiled/."""
    installed = deploy_venv.script("import example_pkg, os; print(os.path.dirname(example_pkg.__file__))").stdout.strip()
    shutil.copytree(installed, tmp_path / "site" / "example_pkg")
    return tmp_path / "site" / "example_pkg" / "_precompiled"


def run_copy(env: Venv, package: Path, code: str = LOAD, options: tuple[str, ...] = (), **extra: str) -> subprocess.CompletedProcess[str]:
    tmp = package.parent.parent.parent
    return env.script(code, env=no_compiler_env(tmp, PYTHONPATH=str(package.parent.parent), **extra), check=False, options=options)


def manifest_of(package: Path) -> dict:
    return json.loads((package / "manifest.json").read_text())


def encoder_files(package: Path) -> dict[str, str]:
    model = manifest_of(package)["models"]["encoder"]
    (artifact,) = model["artifacts"]
    return {
        "artifact": artifact["file"],
        "lean module": artifact["lean"]["file"],
        "C++ library": artifact["cpp"]["file"],
        "weights": model["weights"]["file"],
        "kernel": model["kernels"][artifact["kernels"][0]]["file"],
    }


# Asks for the encoder with fallback="error", then with the default (eager), then
# for explain(): one line each.
FALLS_BACK = """
import warnings, torch
from example_pkg import load_compiled, _precompiled
try:
    load_compiled("encoder", fallback="error")
except _precompiled.PrecompiledModelError as error:
    print("ERROR", error)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = load_compiled("encoder")
print("EAGER", repr(model), len(caught), caught[0].category.__name__)
print("EXPLAIN", load_compiled.explain("encoder").splitlines()[0])  # the torch path's line
"""

ARTIFACT_FORM = {"HATCH_PRECOMPILE_FORM": "artifact"}  # for what only the artifact form reads or writes


def assert_refused(result: subprocess.CompletedProcess[str], *phrases: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr[-2000:])  # an exception, not a crash
    last = result.stderr.strip().splitlines()[-1]
    for phrase in phrases:
        assert phrase in last, last


@pytest.mark.parametrize("form", ["cpp", "lean", "artifact"])
def test_the_copy_loads_when_untouched(deploy_venv: Venv, package: Path, form: str) -> None:
    result = run_copy(deploy_venv, package, HATCH_PRECOMPILE_FORM=form)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = {"cpp": "encoder/cpu_avx2_cpp.so", "lean": "encoder/cpu_avx2.py", "artifact": "encoder/cpu_avx2.bin"}[form]
    assert f"<compiled model 'encoder' from {loaded}>" in result.stdout


@pytest.mark.parametrize(
    ("which", "form"), [("C++ library", "cpp"), ("weights", "cpp"), ("lean module", "lean"), ("artifact", "artifact"), ("weights", "lean"), ("kernel", "lean"), ("kernel", "artifact")]
)
@pytest.mark.parametrize("damage", ["flip a byte", "truncate"])
def test_a_damaged_file_is_refused_by_name_before_use(deploy_venv: Venv, package: Path, which: str, form: str, damage: str) -> None:
    path = package / encoder_files(package)[which]
    data = bytearray(path.read_bytes())
    if damage == "flip a byte":
        data[len(data) // 2] ^= 0xFF
    else:
        del data[len(data) // 3 :]
    path.write_bytes(bytes(data))
    result = run_copy(deploy_venv, package, HATCH_PRECOMPILE_FORM=form)
    assert_refused(result, "PrecompiledIntegrityError", str(path), "does not match the manifest")


def test_a_missing_file_is_refused_by_name(deploy_venv: Venv, package: Path) -> None:
    for which, form in (("kernel", "lean"), ("C++ library", "cpp")):
        path = package / encoder_files(package)[which]
        path.unlink()
        assert_refused(run_copy(deploy_venv, package, HATCH_PRECOMPILE_FORM=form), "PrecompiledIntegrityError", f"{path} is missing")


def test_an_edited_manifest_is_refused(deploy_venv: Venv, package: Path) -> None:
    manifest = manifest_of(package)
    manifest["models"]["encoder"]["dims"]["batch"]["max"] = 10_000
    (package / "manifest.json").write_text(json.dumps(manifest))
    assert_refused(run_copy(deploy_venv, package), "PrecompiledIntegrityError", "does not match the digest the build recorded")


def test_a_manifest_of_another_format_is_refused(deploy_venv: Venv, package: Path) -> None:
    manifest = manifest_of(package)
    manifest["format"] = 1
    reseal(package / "manifest.json", manifest)
    assert_refused(run_copy(deploy_venv, package), "PrecompiledModelError", f"has format 1; this loader reads format {MANIFEST_FORMAT}")


def test_a_manifest_without_its_digest_module_is_refused(deploy_venv: Venv, package: Path) -> None:
    (package / "_build.py").unlink()
    assert_refused(run_copy(deploy_venv, package), "PrecompiledIntegrityError", "_build.py is not: the install is damaged")


def test_an_artifact_from_another_torch_build_is_refused(deploy_venv: Venv, package: Path) -> None:
    manifest = manifest_of(package)
    manifest["models"]["encoder"]["artifacts"][0]["built_with"]["torch_key"] = "ab" * 32
    reseal(package / "manifest.json", manifest)
    result = run_copy(deploy_venv, package, **ARTIFACT_FORM)
    assert_refused(result, "PrecompiledIntegrityError", "was written by another torch build than the manifest says")


@pytest.mark.parametrize(
    ("field", "value", "built", "running"),
    [
        ("torch", "2.14.1", "built with torch 2.14.1", f"running torch {torch.__version__}"),
        ("python", "3.12", "on cp312", "on cp311"),
        ("torch_git", "0" * 40, "(000000000000)", f"({torch.version.git_version[:12]})"),
    ],
)
def test_another_torch_or_python_is_never_loaded_and_both_sides_are_named(deploy_venv: Venv, package: Path, field: str, value: str, built: str, running: str) -> None:
    manifest = manifest_of(package)
    manifest["models"]["encoder"]["artifacts"][0]["built_with"][field] = value
    reseal(package / "manifest.json", manifest)
    result = run_copy(deploy_venv, package, FALLS_BACK)
    assert result.returncode == 0, result.stderr[-2000:]
    error, eager, explained = result.stdout.strip().splitlines()
    for line in (error, explained):
        assert "no shipped artifact fits this process" in line and built in line and running in line, line
    assert f"{field} differs" in error
    assert eager == "EAGER <eager fallback TextEncoder> 1 PrecompiledFallbackWarning"
    assert explained.endswith("; fallback: eager")


@pytest.mark.parametrize(
    ("field", "value", "artifact_refusal"),
    [
        ("python", "3.10", "python differs: it needs that exact Python"),
        ("torch", f"{torch.__version__.split('+')[0]}+cu130", "torch differs: it needs that exact build"),
    ],
)
def test_the_cpp_and_lean_forms_run_under_a_later_python_and_another_build_of_the_release_and_the_artifact_form_does_not(
    deploy_venv: Venv, package: Path, field: str, value: str, artifact_refusal: str
) -> None:
    """What a wheel built on an older CPython, or with another build of the same
    torch release (CPU against CUDA), looks like to this process: the C++ form's
    library (linked against that release's libtorch, no Python symbol) and the lean
    form's stable-ABI kernels and output module run here, the artifact's pickle does not.
    (tests/test_other_pythons.py loads a real wheel on real other Pythons and builds.)"""
    manifest = manifest_of(package)
    manifest["models"]["encoder"]["artifacts"][0]["built_with"][field] = value
    reseal(package / "manifest.json", manifest)
    for form, file in (("auto", "cpu_avx2_cpp.so"), ("lean", "cpu_avx2.py")):
        loaded = run_copy(deploy_venv, package, HATCH_PRECOMPILE_FORM=form)
        assert loaded.returncode == 0, loaded.stderr[-2000:]
        assert f"<compiled model 'encoder' from encoder/{file}>" in loaded.stdout
    refused = run_copy(deploy_venv, package, FALLS_BACK, **ARTIFACT_FORM)
    error = refused.stdout.strip().splitlines()[0]
    assert "the lean form: HATCH_PRECOMPILE_FORM=artifact; the artifact form: " + artifact_refusal in error, error


def test_fallback_policy_comes_from_the_call_then_the_environment_then_the_config(deploy_venv: Venv, package: Path) -> None:
    manifest = manifest_of(package)
    manifest["models"]["encoder"]["artifacts"][0]["built_with"]["torch"] = "2.14.1"
    reseal(package / "manifest.json", manifest)
    code = """
from example_pkg import load_compiled, _precompiled
try:
    load_compiled("encoder")
except _precompiled.PrecompiledModelError:
    print("error from the environment")
print(repr(load_compiled("encoder", fallback="eager")))
try:
    load_compiled("encoder", fallback="error")
except _precompiled.PrecompiledModelError:
    print("error once eager was loaded, when asked")
"""
    result = run_copy(deploy_venv, package, code, HATCH_PRECOMPILE_FALLBACK="error")
    assert result.stdout.strip().splitlines() == [
        "error from the environment",
        "<eager fallback TextEncoder>",
        "error once eager was loaded, when asked",
    ], result.stderr[-2000:]
    bad = run_copy(deploy_venv, package, HATCH_PRECOMPILE_FALLBACK="sometimes")
    assert_refused(bad, "ValueError: HATCH_PRECOMPILE_FALLBACK must be 'eager' or 'error', got 'sometimes'")


def test_explain_names_the_variant_and_form_that_would_load(deploy_venv: Venv, package: Path) -> None:
    code = "from example_pkg import load_compiled\nprint(load_compiled.explain())"
    assert run_copy(deploy_venv, package, code).stdout.strip().splitlines() == [
        "encoder: would load encoder/cpu_avx2_cpp.so (C++ form) for CPU target avx2",
        "  without torch (arrays='numpy'): no: NumPy is not installed (pip install numpy)",  # this environment has torch alone
    ]
    lean = run_copy(deploy_venv, package, code, HATCH_PRECOMPILE_FORM="lean").stdout.strip().splitlines()[0]
    assert lean == "encoder: would load encoder/cpu_avx2.py (lean form; HATCH_PRECOMPILE_FORM=lean) for CPU target avx2"
    artifact = run_copy(deploy_venv, package, code, **ARTIFACT_FORM).stdout.strip().splitlines()[0]
    assert artifact == "encoder: would load encoder/cpu_avx2.bin (artifact form; HATCH_PRECOMPILE_FORM=artifact) for CPU target avx2"


@pytest.mark.parametrize("form", ["lean", "artifact"])
def test_loading_works_under_python_dash_o(deploy_venv: Venv, package: Path, form: str) -> None:
    result = run_copy(deploy_venv, package, options=("-O",), HATCH_PRECOMPILE_FORM=form)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"<compiled model 'encoder' from encoder/cpu_avx2.{'py' if form == 'lean' else 'bin'}> torch.Size([2, 64])" in result.stdout


@pytest.mark.parametrize("form", ["lean", "artifact"])
def test_a_read_only_install_loads_and_is_not_written_to(deploy_venv: Venv, package: Path, form: str) -> None:
    site = package.parent.parent

    def snapshot() -> dict[str, tuple[int, int]]:
        return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in site.rglob("*")}

    before = snapshot()
    for path in [site, *site.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        result = run_copy(deploy_venv, package, PYTHONDONTWRITEBYTECODE="1", HATCH_PRECOMPILE_FORM=form)
    finally:
        for path in [site, *site.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    assert result.returncode == 0, result.stderr[-2000:]
    assert snapshot() == before
    assert stamps(package), "the weights' stamp belongs in the private cache"


def test_a_cache_directory_others_can_write_is_refused(deploy_venv: Venv, package: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    shared.chmod(0o777)
    result = run_copy(deploy_venv, package, HATCH_PRECOMPILE_CACHE_DIR=str(shared), **ARTIFACT_FORM)
    assert_refused(result, f"refusing cache directory {shared}", "found owner uid", "mode 0o777")


def test_without_a_writable_home_loading_uses_a_private_temporary_cache(deploy_venv: Venv, package: Path) -> None:
    env = {**no_compiler_env(package.parent.parent.parent, PYTHONPATH=str(package.parent.parent), **ARTIFACT_FORM), "HOME": "/proc/no-home"}
    del env["HATCH_PRECOMPILE_CACHE_DIR"]
    code = LOAD + "from example_pkg._precompiled import _cache\nprint(oct(_cache.private_cache_dir().stat().st_mode & 0o777))"
    result = deploy_venv.script(code, env=env, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("0o700")


# LOAD, printing how many times the weights were checked.
COUNTS_HASHES = (
    """
from example_pkg._precompiled import _integrity
hashed = []
original = _integrity.chunk_checksums
_integrity.chunk_checksums = lambda *args: hashed.append(args) or original(*args)
"""
    + LOAD
    + """
print("HASHED", len(hashed))
"""
)


def stamps(package: Path) -> list[Path]:
    """The weights' verification stamps in the private cache `run_copy` gives."""
    return sorted((package.parent.parent.parent / "cache" / "verified").glob("*"))


def test_weights_are_hashed_on_the_first_load_only(deploy_venv: Venv, package: Path) -> None:
    first, second = (run_copy(deploy_venv, package, COUNTS_HASHES) for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, (first.stderr[-2000:], second.stderr[-2000:])
    assert "HASHED 1" in first.stdout and "HASHED 0" in second.stdout
    assert len(stamps(package)) == 1 and stamps(package)[0].stat().st_size == 0


def _flip_in_place_keeping_the_times(path: Path) -> None:
    times = path.stat()
    with path.open("r+b") as stream:
        stream.seek(times.st_size // 2)
        byte = stream.read(1)
        stream.seek(times.st_size // 2)
        stream.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))  # the change time moves all the same


def _replace_with_same_size(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    swapped = path.with_name("swapped")
    swapped.write_bytes(bytes(data))
    os.replace(swapped, path)  # another file (inode) of the same size


def _truncate(path: Path) -> None:
    with path.open("r+b") as stream:
        stream.truncate(path.stat().st_size // 3)


@pytest.mark.parametrize("change", [_flip_in_place_keeping_the_times, _replace_with_same_size, _truncate])
def test_weights_changed_after_a_stamp_was_left_are_refused(deploy_venv: Venv, package: Path, change) -> None:
    assert run_copy(deploy_venv, package).returncode == 0 and stamps(package)
    path = package / encoder_files(package)["weights"]
    change(path)
    result = run_copy(deploy_venv, package)
    assert_refused(result, "PrecompiledIntegrityError", str(path), "does not match the manifest")


def test_with_a_cache_that_cannot_be_written_weights_are_hashed_every_time(deploy_venv: Venv, package: Path) -> None:
    unwritable = {"HATCH_PRECOMPILE_CACHE_DIR": "/proc/hatch-precompile-cache"}  # mkdir fails, even for root
    for _ in range(2):
        result = run_copy(deploy_venv, package, COUNTS_HASHES, **unwritable)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "<compiled model 'encoder' from encoder/cpu_avx2_cpp.so>" in result.stdout and "HASHED 1" in result.stdout
    path = package / encoder_files(package)["weights"]
    _flip_in_place_keeping_the_times(path)
    assert_refused(run_copy(deploy_venv, package, **unwritable), "PrecompiledIntegrityError", str(path))


@pytest.mark.parametrize("form", ["lean", "artifact"])
def test_processes_loading_at_once_with_a_shared_empty_cache_all_succeed(deploy_venv: Venv, package: Path, tmp_path: Path, form: str) -> None:
    """Inductor's cache (artifact form) and the weights' stamp (both forms) are
    written by all four at once; each loads, and the cache holds whole files only."""
    shared = tmp_path / "shared"
    env = {**no_compiler_env(tmp_path, PYTHONPATH=str(package.parent.parent), HATCH_PRECOMPILE_FORM=form), "HATCH_PRECOMPILE_CACHE_DIR": str(shared)}
    processes = [subprocess.Popen([deploy_venv.python, "-c", LOAD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0, 0], [err[-1000:] for _, err in outputs]
    assert all("torch.Size([2, 64])" in out for out, _ in outputs)
    (stamp,) = (shared / "verified").iterdir()
    assert stamp.stat().st_size == 0


def test_kernels_needing_a_newer_glibc_fall_back_before_any_native_code_loads(deploy_venv: Venv, package: Path) -> None:
    manifest = manifest_of(package)
    (artifact,) = manifest["models"]["encoder"]["artifacts"]
    artifact["native"]["glibc"] = "2.99"
    reseal(package / "manifest.json", manifest)
    for record in manifest["models"]["encoder"]["kernels"].values():  # never opened: a wreck proves it
        (package / record["file"]).write_bytes(b"not a kernel")
    result = run_copy(deploy_venv, package, LOAD + "from example_pkg import load_compiled\nprint(load_compiled.explain())")
    assert result.returncode == 0, result.stderr[-2000:]
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    assert "<eager fallback TextEncoder>" in result.stdout
    assert f"for avx2: its kernels need glibc 2.99, this system has {glibc}" in result.stdout
    assert "PrecompiledFallbackWarning" in result.stderr and "its kernels need glibc 2.99" in result.stderr


# The C++ form's library holds its own kernels: what the lean form loads is read in the lean form.
LEAN_FORM = {"HATCH_PRECOMPILE_FORM": "lean"}


def test_a_cpp_library_the_dynamic_loader_refuses_falls_back_to_the_lean_form_or_raises_per_policy(deploy_venv: Venv, package: Path) -> None:
    """A library that passes its hash but cannot be loaded (a missing symbol, a
    damaged system library) loads the lean form instead, and explain() says why;
    with fallback "error" that is an error naming the model, the file and the cause."""
    manifest = manifest_of(package)
    record = manifest["models"]["encoder"]["artifacts"][0]["cpp"]
    (package / record["file"]).write_bytes(b"not a library")
    record.update(size=13, sha256=hashlib.sha256(b"not a library").hexdigest())
    reseal(package / "manifest.json", manifest)
    code = LOAD + "print(load_compiled.explain('encoder'))\n"
    lean = run_copy(deploy_venv, package, code)
    assert lean.returncode == 0, lean.stderr[-2000:]
    assert "<compiled model 'encoder' from encoder/cpu_avx2.py>" in lean.stdout
    library = package / record["file"]
    assert f"(C++ form) for CPU target avx2; loaded encoder/cpu_avx2.py instead: {library} cannot be loaded here: " in lean.stdout
    assert "Error in dlopen" in lean.stdout and "file too short" in lean.stdout
    refused = run_copy(deploy_venv, package, HATCH_PRECOMPILE_FALLBACK="error")
    assert_refused(refused, "PrecompiledModelError", "model 'encoder'", str(library), "file too short", "HATCH_PRECOMPILE_FORM=lean")
    # Where the C++ form is the only one allowed, the model's fallback applies, saying why.
    eager = run_copy(deploy_venv, package, HATCH_PRECOMPILE_FORM="cpp")
    assert eager.returncode == 0, eager.stderr[-2000:]
    assert "<eager fallback TextEncoder>" in eager.stdout
    assert f"{library} cannot be loaded here: " in eager.stderr and "no other form of encoder/cpu_avx2.bin fits here" in eager.stderr


def test_a_cpp_library_whose_constants_the_manifest_does_not_all_name_is_refused_by_name(deploy_venv: Venv, package: Path) -> None:
    """The library reads every constant from a tensor bound by name at load: one
    left unnamed (a manifest out of step with its library) is an error naming the
    library and the constant, never a call reading unbound memory."""
    manifest = manifest_of(package)
    record = manifest["models"]["encoder"]["artifacts"][0]["cpp"]
    unnamed = sorted(record["constants"])[0]
    del record["constants"][unnamed]
    reseal(package / "manifest.json", manifest)
    refused = run_copy(deploy_venv, package)
    assert_refused(refused, "PrecompiledIntegrityError", str(package / record["file"]), f"the manifest binds none of its constants {unnamed}")


def test_a_kernel_the_dynamic_loader_refuses_falls_back_per_policy(deploy_venv: Venv, package: Path) -> None:
    """A kernel that passes its hash but cannot be loaded (here: not an ELF file,
    as a damaged system library would make it) is a fallback, never a crash."""
    manifest = manifest_of(package)
    model = manifest["models"]["encoder"]
    record = model["kernels"][model["artifacts"][0]["kernels"][0]]
    (package / record["file"]).write_bytes(b"not a kernel")
    record.update(size=12, sha256=hashlib.sha256(b"not a kernel").hexdigest())
    reseal(package / "manifest.json", manifest)
    eager = run_copy(deploy_venv, package, **LEAN_FORM)
    assert eager.returncode == 0, eager.stderr[-2000:]
    assert "<eager fallback TextEncoder>" in eager.stdout
    assert "a shipped kernel could not be loaded here" in eager.stderr
    refused = run_copy(deploy_venv, package, HATCH_PRECOMPILE_FALLBACK="error", **LEAN_FORM)
    assert_refused(refused, "PrecompiledModelError", "a shipped kernel could not be loaded here")


@pytest.mark.parametrize("form", ["lean", "artifact"])
def test_a_custom_ops_library_that_cannot_be_imported_is_named_and_the_fallback_applies(deploy_venv: Venv, package: Path, form: str) -> None:
    manifest = manifest_of(package)
    manifest["models"]["encoder"]["op_libraries"] = {"mylib::gather_experts": "mylib.ops"}
    reseal(package / "manifest.json", manifest)
    result = run_copy(deploy_venv, package, FALLS_BACK, HATCH_PRECOMPILE_FORM=form)
    assert result.returncode == 0, result.stderr[-2000:]
    error, eager, explained = result.stdout.strip().splitlines()
    assert error.startswith(
        "ERROR model 'encoder': the compiled graph calls the custom op mylib::gather_experts, which mylib.ops defines, "
        "and importing it failed (No module named 'mylib'); install the package that provides mylib.ops."
    ), error
    assert eager == "EAGER <eager fallback TextEncoder> 1 PrecompiledFallbackWarning"
    assert explained.endswith(", after importing mylib.ops (custom ops mylib::gather_experts)"), explained
