"""The NumPy path (`load_compiled(name, arrays="numpy")`) from the installed
example wheel, in fresh processes that never import torch: its outputs equal the
torch path's C++ form bit for bit, every array layout is taken, every bad input
gets an error naming it and the process lives on, outputs outlive their model
and threads, a child forked after a call runs, damaged files are refused before
use, and where torch is missing, another torch is installed or its library
cannot load, the error says what to do. Shape buckets, dict and nested outputs,
returned inputs and bfloat16: tests/test_model_forms.py; generation and state:
tests/test_state.py."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from conftest import ExampleBuild, Venv, deploy, make_venv, no_compiler_env

pytestmark = pytest.mark.e2e

PRELUDE = """
import json, sys
import numpy as np
import example_pkg
from example_pkg import load_compiled, _precompiled
report = {}
ids = (np.arange(8 * 64, dtype=np.int64) * 7 % 1000).reshape(8, 64)
"""
EPILOGUE = '\nreport["torch imported"] = "torch" in sys.modules\nprint(json.dumps(report))\n'


@pytest.fixture(scope="module")
def numpy_venv(tmp_path_factory: pytest.TempPathFactory, example_build: ExampleBuild) -> Venv:
    """The example wheel with what it requires (torch), and NumPy."""
    env = deploy(example_build.wheel, tmp_path_factory.mktemp("numpy") / "venv")
    env.pip("numpy")
    return env


def run(env: Venv, tmp_path: Path, code: str, *, pythonpath: Path | None = None, **extra: str) -> dict:
    """`code` after PRELUDE in a fresh interpreter with no compiler; its `report`."""
    environment = no_compiler_env(tmp_path, **extra, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {}))
    result = env.script(PRELUDE + textwrap.dedent(code) + EPILOGUE, env=environment, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.release
def test_outputs_equal_the_torch_paths_cpp_form_bit_for_bit_and_torch_is_never_imported(numpy_venv: Venv, tmp_path: Path) -> None:
    expected = tmp_path / "expected.npz"
    numpy_venv.script(
        PRELUDE + f"import torch\nout = load_compiled('encoder')(torch.from_numpy(ids))\nnp.savez({str(expected)!r}, **{{k: v.numpy() for k, v in out.items()}})\n",
        env=no_compiler_env(tmp_path),
    )
    report = run(
        numpy_venv,
        tmp_path,
        f"""
        report["after import"] = "torch" in sys.modules
        model = load_compiled("encoder", arrays="numpy")
        out = model(ids)
        expected = np.load({str(expected)!r})
        report["repr"] = repr(model)
        report["outputs"] = {{k: [v.dtype.name, list(v.shape), bool(np.array_equal(v, expected[k])), v.flags.owndata] for k, v in out.items()}}
        report["batch 1"] = bool(np.array_equal(model(ids[:1])["embedding"], out["embedding"][:1]))
        report["cached"] = load_compiled("encoder", arrays="numpy") is model
        report["explain"] = load_compiled.explain()
        """,
    )
    assert report["after import"] is False and report["torch imported"] is False
    assert report["repr"] == "<compiled model 'encoder' from encoder/cpu_avx2_cpp.so on NumPy arrays>"
    assert report["outputs"] == {"embedding": ["float32", [8, 64], True, False], "hidden_states": ["float32", [8, 64, 64], True, False]}  # views of the library's buffers
    assert report["batch 1"] and report["cached"]
    assert report["explain"].splitlines() == [
        "encoder: would load encoder/cpu_avx2_cpp.so (C++ form) for CPU target avx2",
        "  without torch (arrays='numpy'): yes, would load encoder/cpu_avx2_cpp.so (C++ form) for CPU target avx2",
    ]


def test_every_layout_and_a_lossless_dtype_is_taken_and_gives_the_same_numbers(numpy_venv: Venv, tmp_path: Path) -> None:
    report = run(
        numpy_venv,
        tmp_path,
        """
        model = load_compiled("encoder", arrays="numpy")
        want = model(ids)["embedding"]
        wide = np.zeros((8, 128), dtype=np.int64); wide[:, ::2] = ids
        unaligned = np.frombuffer(b"\\0" + ids.tobytes(), dtype=np.int64, count=ids.size, offset=1).reshape(8, 64)
        given = {
            "fortran order": np.asfortranarray(ids), "a strided view": wide[:, ::2], "big-endian": ids.astype(">i8"),
            "int32": ids.astype(np.int32), "uint16": ids.astype(np.uint16), "read-only": np.frombuffer(ids.tobytes(), dtype=np.int64).reshape(8, 64),
            "unaligned": unaligned,
        }
        report["same"] = {how: bool(np.array_equal(model(array)["embedding"], want)) for how, array in given.items()}
        report["unchanged"] = bool(np.array_equal(given["big-endian"], ids))
        """,
    )
    assert report["same"] == dict.fromkeys(["fortran order", "a strided view", "big-endian", "int32", "uint16", "read-only", "unaligned"], True)
    assert report["unchanged"]


def test_each_bad_input_is_refused_by_name_and_the_process_lives_on(numpy_venv: Venv, tmp_path: Path) -> None:
    report = run(
        numpy_venv,
        tmp_path,
        """
        model = load_compiled("encoder", arrays="numpy")
        cases = {
            "wrong dtype": lambda: model(ids.astype(np.float32)),
            "narrowing dtype": lambda: model(ids.astype(np.float64)),
            "rank": lambda: model(ids[None]),
            "shape": lambda: model(ids[:, :32]),
            "dim out of range": lambda: model(np.zeros((65, 64), dtype=np.int64)),
            "token ids past the vocabulary": lambda: model(ids + 1000),
            "negative token ids": lambda: model(ids - 1000),
            "a list": lambda: model(ids.tolist()),
            "a missing argument": lambda: model(),
            "an extra name": lambda: model(ids, extra=ids),
            "an unknown kind of array": lambda: load_compiled("encoder", arrays="jax"),
            "module= with NumPy arrays": lambda: load_compiled("encoder", arrays="numpy", module=object()),
        }
        for case, call in cases.items():
            try:
                call()
                report[case] = "accepted"
            except (ValueError, IndexError) as error:
                report[case] = f"{type(error).__name__}: {error}"
        report["still runs"] = list(model(ids)["embedding"].shape)
        """,
    )
    where = "ValueError: model 'encoder', input input_ids"
    assert report == {
        "wrong dtype": f"{where}: expected dtype int64 (or one that converts to it without loss), got float32",
        "narrowing dtype": f"{where}: expected dtype int64 (or one that converts to it without loss), got float64",
        "rank": f"{where}: expected 2 dimensions ['batch', 64], got shape [1, 8, 64]",
        "shape": f"{where}: expected size 64 at dim 1 (shape ['batch', 64]), got [8, 32]",
        "dim out of range": f"{where}: dim 'batch' (dim 0) must be in [1, 64], got 65",
        "token ids past the vocabulary": "IndexError: model 'encoder', input input_ids: holds 1000..1996, but the model indexes a size of 1000 with it, so its values must be in [0, 999] "
        "(a position past the cache's length, a token id past the vocabulary?)",
        "negative token ids": "IndexError: model 'encoder', input input_ids: holds -1000..-4, but the model indexes a size of 1000 with it, so its values must be in [0, 999] "
        "(a position past the cache's length, a token id past the vocabulary?)",
        "a list": f"{where}: expected a NumPy array, got list",
        "a missing argument": "ValueError: model 'encoder': expected 1 positional argument(s), got 0",
        "an extra name": "ValueError: model 'encoder': keyword arguments differ from the compiled signature: missing none, unexpected ['extra']",
        "an unknown kind of array": "ValueError: model 'encoder': arrays must be 'torch' or 'numpy', got 'jax'",
        "module= with NumPy arrays": "ValueError: model 'encoder': module= holds torch tensors; with arrays='numpy' pass state_dict= of NumPy arrays",
        "still runs": [8, 64],
        "torch imported": False,
    }


def test_outputs_outlive_their_model_and_threads_and_a_child_forked_after_a_call_runs(numpy_venv: Venv, tmp_path: Path) -> None:
    """Each output is freed once, when its last array goes (its library's buffer,
    viewed without a copy): arrays made by threads on a model whose every
    reference is then dropped still hold their numbers. A child forked after the
    model ran runs it too (on one thread: OpenMP's pool does not survive fork)."""
    report = run(
        numpy_venv,
        tmp_path,
        """
        import gc, os, threading, weakref
        from example_pkg._precompiled import _arrays, _manifest, _weights
        model = load_compiled("encoder", arrays="numpy")
        want = model(ids)["embedding"].copy()
        shipped = _weights.read_weights(_manifest.read_manifest()["models"]["encoder"]["weights"], _arrays.array_kind("numpy"))
        own = load_compiled("encoder", arrays="numpy", state_dict=shipped)  # a handle of its own: not kept by the loader
        report["own"] = own is not model
        kept, errors = [], []
        def work():
            try:
                for _ in range(20):
                    kept.append(own(ids)["embedding"][2:5])
            except Exception as error:
                errors.append(repr(error))
        threads = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        del own, threads
        gc.collect()
        report["kept"] = [len(kept), all(np.array_equal(a, want[2:5]) for a in kept), errors]
        del kept
        gc.collect()
        child = os.fork()
        if child == 0:
            out = model(ids)["embedding"]
            os._exit(0 if np.array_equal(out, want) and "torch" not in sys.modules else 3)
        _, status = os.waitpid(child, 0)
        report["child"] = os.waitstatus_to_exitcode(status)
        """,
    )
    assert report == {"own": True, "kept": [80, True, []], "child": 0, "torch imported": False}


def installed_package(env: Venv, tmp_path: Path) -> Path:
    """A private copy of the installed example package; returns its _precompiled/."""
    installed = env.script("import example_pkg, os; print(os.path.dirname(example_pkg.__file__))").stdout.strip()
    shutil.copytree(installed, tmp_path / "site" / "example_pkg")
    return tmp_path / "site" / "example_pkg" / "_precompiled"


@pytest.mark.parametrize("damaged", ["weights", "library"])
def test_a_damaged_file_is_refused_before_use(numpy_venv: Venv, tmp_path: Path, damaged: str) -> None:
    package = installed_package(numpy_venv, tmp_path)
    record = json.loads((package / "manifest.json").read_text())["models"]["encoder"]
    path = package / (record["weights"]["file"] if damaged == "weights" else record["artifacts"][0]["cpp"]["file"])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    code = PRELUDE + "load_compiled('encoder', arrays='numpy')\n"
    result = numpy_venv.script(code, env=no_compiler_env(tmp_path, PYTHONPATH=str(package.parent.parent)), check=False)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "PrecompiledIntegrityError" in last and str(path) in last and "does not match the manifest" in last, last


@pytest.fixture(scope="module")
def without_torch(tmp_path_factory: pytest.TempPathFactory, example_build: ExampleBuild) -> Venv:
    """The example wheel and NumPy, without what the wheel requires: no torch."""
    env = make_venv(tmp_path_factory.mktemp("no-torch") / "venv")
    env.pip("--no-deps", str(example_build.wheel))
    env.pip("numpy")
    return env


NO_TORCH_CASES = """
for fallback in ("eager", "error"):
    try:
        load_compiled("encoder", arrays="numpy", fallback=fallback)
        report[fallback] = "loaded"
    except _precompiled.PrecompiledModelError as error:
        report[fallback] = str(error)
report["explain"] = load_compiled.explain()
"""


def test_without_torch_the_error_says_what_to_install(without_torch: Venv, tmp_path: Path) -> None:
    report = run(without_torch, tmp_path, NO_TORCH_CASES)
    assert "torch is not installed: this package's compiled models run on torch 2.13.0's libraries (pip install torch==2.13.0)" in report["error"]
    assert "pip install torch==2.13.0" in report["eager"] and report["eager"].startswith("model 'encoder' cannot run on NumPy arrays here (torch is not installed")
    assert "without torch (arrays='numpy'): no: torch is not installed" in report["explain"]
    assert report["torch imported"] is False


def fake_torch(folder: Path, version: str, git: str, library: bytes | None) -> Path:
    """A torch package as the loader finds one on disk, without importing it: its
    version file and its libraries' folder (libtorch_cpu.so `library`)."""
    torch = folder / "torch"
    (torch / "lib").mkdir(parents=True)
    (torch / "__init__.py").write_text("raise ImportError('this torch is a stand-in: only its files are read')\n")
    (torch / "version.py").write_text(f"__version__ = '{version}'\ngit_version = '{git}'\n")
    if library is not None:
        (torch / "lib" / "libtorch_cpu.so").write_bytes(library)
    return folder


def test_another_torch_or_a_library_that_cannot_load_is_named(without_torch: Venv, numpy_venv: Venv, tmp_path: Path) -> None:
    real = Path(numpy_venv.script("import importlib.util; print(importlib.util.find_spec('torch').submodule_search_locations[0])").stdout.strip())
    built = json.loads((real.parent / "example_pkg" / "_precompiled" / "manifest.json").read_text())["models"]["encoder"]["artifacts"][0]["built_with"]
    other = fake_torch(tmp_path / "other", "2.14.1+cpu", "0" * 40, None)
    report = run(without_torch, tmp_path, NO_TORCH_CASES, pythonpath=other)
    assert "torch differs" in report["error"] and "running torch 2.14.1+cpu" in report["error"], report["error"]

    broken = fake_torch(tmp_path / "broken", built["torch"], built["torch_git"], b"not a library")
    shutil.copy(real / "lib" / "libc10.so", broken / "torch" / "lib" / "libc10.so")
    report = run(without_torch, tmp_path, NO_TORCH_CASES, pythonpath=broken)
    assert f"model 'encoder': torch 2.13.0+cpu's libtorch_cpu.so cannot be loaded from {broken / 'torch' / 'lib'}" in report["error"], report["error"]
    assert "file too short" in report["error"], report["error"]
    assert report["torch imported"] is False


def test_a_run_without_torch_needs_no_more_than_numpy_and_the_library(numpy_venv: Venv, tmp_path: Path) -> None:
    """What the process holds: none of torch's Python modules, torch's
    libtorch_cpu.so mapped, and not libtorch_python.so (torch's Python binding)."""
    report = run(
        numpy_venv,
        tmp_path,
        """
        load_compiled("encoder", arrays="numpy")(ids)
        maps = open("/proc/self/maps").read()
        report["libraries"] = sorted({name for name in ("libtorch_cpu.so", "libtorch_python.so", "libc10.so") if "/" + name in maps})
        report["torch modules"] = sorted(name for name in sys.modules if name.split(".")[0] == "torch")
        """,
    )
    assert report == {"libraries": ["libc10.so", "libtorch_cpu.so"], "torch modules": [], "torch imported": False}
