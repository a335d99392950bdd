"""One wheel for every CPython from the one it was built with, under every build
of its torch release.

The example wheel is built here, on this CPython with this machine's CPU build of
torch (`2.13.0+cpu`), and tagged `cp3X-abi3`. uv installs that same file into
environments of CPython 3.12 and 3.13 whose `torch==X` pin resolves from PyPI,
as on a user's Linux machine: to the CUDA build of the release, which runs on a
machine without a GPU. There `load_compiled` must pick the lean form (stable-ABI
kernels, the output module's source), import no compiler module, call no
compiler, and match eager; the artifact form, a pickle of inductor objects, must
be refused with both sides named.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from conftest import ExampleBuild, Venv, no_compiler_env, pypi_venv, run
from test_example_wheel import COMPARE_WITH_EAGER

pytestmark = pytest.mark.e2e

OTHER_PYTHONS = [f"3.{minor}" for minor in (12, 13) if minor > sys.version_info.minor]

ENVIRONMENT = """
import json, sys, torch
print(json.dumps({"python": f"{sys.version_info.major}.{sys.version_info.minor}", "torch": torch.__version__, "git": torch.version.git_version, "cuda": torch.version.cuda}))
"""


@pytest.fixture(scope="module", params=OTHER_PYTHONS)
def elsewhere(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, example_build: ExampleBuild) -> Venv:
    """The example wheel installed, with what its metadata requires from PyPI, on another CPython."""
    env = pypi_venv(tmp_path_factory.mktemp(f"python-{request.param}") / "venv", request.param)
    env.pip(str(example_build.wheel))
    return env


def test_it_runs_another_python_and_another_build_of_the_same_torch_release(elsewhere: Venv) -> None:
    """What the other tests here stand on: the environment differs in both ways."""
    found = json.loads(elsewhere.script(ENVIRONMENT).stdout)
    assert found["python"] != f"{sys.version_info.major}.{sys.version_info.minor}"
    assert found["git"] == torch.version.git_version and found["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert found["torch"] != torch.__version__ and found["cuda"] is not None, found


@pytest.mark.parametrize(("form", "loaded"), [("auto", "encoder/cpu_avx2_cpp.so"), ("lean", "encoder/cpu_avx2.py")])
def test_the_same_wheel_loads_in_the_cpp_and_lean_forms_with_no_compiler_and_matches_eager(elsewhere: Venv, tmp_path: Path, form: str, loaded: str) -> None:
    result = elsewhere.script(COMPARE_WITH_EAGER, env=no_compiler_env(tmp_path, HATCH_PRECOMPILE_FORM=form), check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["repr"] == f"<compiled model 'encoder' from {loaded}>"
    assert report["compiler"] == []
    assert not (tmp_path / "compiler-used").exists()


def test_the_artifact_form_is_refused_there_naming_both_sides(elsewhere: Venv, tmp_path: Path) -> None:
    code = "from example_pkg import load_compiled; print(load_compiled.explain('encoder'))"
    explained = elsewhere.script(code, env=no_compiler_env(tmp_path, HATCH_PRECOMPILE_FORM="artifact")).stdout.strip()
    built = f"built with torch {torch.__version__} ({torch.version.git_version[:12]}) on cp{sys.version_info.major}{sys.version_info.minor}"
    assert built in explained and "python differs: it needs that exact Python" in explained, explained
    assert "torch differs: it needs that exact build" in explained and "running torch " in explained, explained
    assert elsewhere.script(code, env=no_compiler_env(tmp_path)).stdout.strip().startswith("encoder: would load encoder/cpu_avx2_cpp.so (C++ form) for CPU target avx2")


OLDER_PYTHON = f"3.{sys.version_info.minor - 1}"


@pytest.mark.parametrize("python", [OLDER_PYTHON, *OTHER_PYTHONS])
def test_pip_takes_the_wheel_for_this_python_and_later_ones_by_its_tag(example_build: ExampleBuild, tmp_path: Path, python: str) -> None:
    """pip's own tag matching (not uv's), for CPython `python` on this platform:
    a later CPython takes the abi3 wheel, an older one refuses it."""
    platform = example_build.wheel.name.removesuffix(".whl").split("-")[-1]
    abi = f"cp{python.replace('.', '')}"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--only-binary=:all:", "--target", str(tmp_path / "target")]
    command += ["--python-version", python, "--implementation", "cp", "--abi", abi, "--platform", platform, str(example_build.wheel)]
    result = run(command, check=False)
    if python == OLDER_PYTHON:
        assert result.returncode != 0 and "is not a supported wheel on this platform" in result.stderr, result.stderr[-2000:]
    else:
        assert result.returncode == 0, result.stderr[-2000:]
        assert "Would install example-pkg-0.1.0" in result.stdout, result.stdout
