"""The architecture battery and the options battery, through two wheels.

Every architecture in `battery/architectures.py`, and the small vision net once
per supported inductor option, is a model of a project built by the real hook
(parallel workers), installed in a fresh environment and loaded in a fresh
process with no compiler: each is compared with eager at each dim's min, max and
a size between, in the form `load_compiled` picks and in the artifact form.
The models that load lean make one project, whose wheel is tagged `abi3` and is
also loaded on another CPython under PyPI's (CUDA) build of the same torch
release; the few that load only as artifacts make another, tagged for this
Python alone. The two build at once, sharing the session's build cache.
Architectures torch cannot capture are built alone and must fail with their
recorded reason. `docs/battery.md` is generated from these results
(`HATCH_PRECOMPILE_UPDATE_DOCS=1`), and the test fails when its table no longer
says what the battery found.

The tests of the two wheels are marked `battery`: `./dev.sh battery` runs them,
CI's `./dev.sh test` does not (their builds were half of one of its three lines,
and CI's budget is 20 minutes); the refusals run in CI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, Venv, no_compiler_env, pypi_venv, run, write_project

sys.path.insert(0, str(Path(__file__).parent / "battery"))
from architectures import ARCHITECTURES, OPTIONS, Architecture, sizes, table
from report import STATE_SECTION, render, summary_rows

BATTERY_DIR = Path(__file__).parent / "battery"  # inputs.py, which the processes running the wheels import

pytestmark = [pytest.mark.e2e, pytest.mark.standalone]

MODELS = (Path(__file__).parent / "battery" / "models.py").read_text()
DOCS = REPO / "docs" / "battery.md"
BUILT = [a for a in [*ARCHITECTURES, *OPTIONS] if a.refused is None]
# package -> the architectures its project declares: one wheel of lean forms, one of artifacts
PACKAGES = {"battery": [a for a in BUILT if a.form == "lean"], "battery_artifacts": [a for a in BUILT if a.form == "artifact"]}
PACKAGE_OF = {a.name: package for package, architectures in PACKAGES.items() for a in architectures}
ELSEWHERE_PYTHON = "3.13"  # where the lean wheel is loaded again, under PyPI's torch

# Compares every model with eager in one fresh process; prints a JSON report.
COMPARE = r'''
import importlib, json, sys, torch

def figures(got, want):
    """Relative error and cosine similarity against the float32 output."""
    g, w = got.double().flatten(), want.double().flatten()
    return ((g - w).norm() / w.norm()).item(), torch.nn.functional.cosine_similarity(g, w, dim=0).item()

sys.path.insert(0, sys.argv[2])  # tests/battery: inputs.py
from inputs import leaves, make

report = {}
for case in json.loads(sys.argv[1]):
    name, factory = case["name"], case["factory"]
    try:
        compiled = importlib.import_module(case["package"]).load_compiled(name)
        eager = getattr(importlib.import_module(case["package"] + ".models"), factory)()
        low_precision = getattr(torch, case["dtype"]) if case["dtype"] else None
        figured = low_precision or case["quantize"]  # held to float32 by relative error and cosine
        # int8's default bounds, and bfloat16's fixed ones (accuracy.WITHOUT_FLOAT32_BOUNDS), which these small models stay within
        max_error, min_cosine = (0.2, 0.98) if case["quantize"] else (0.04, 0.999)
        worst, worst_error, worst_cosine = 0.0, 0.0, 1.0
        for index, size in enumerate(case["sizes"]):
            generator = torch.Generator().manual_seed(index)
            args = [make(spec, size, generator) for spec in case["inputs"]]
            kwargs = {key: make(spec, size, generator) for key, spec in case["kwargs"].items()}
            lower = lambda t: t.to(low_precision) if low_precision and t.is_floating_point() else t
            got = leaves(compiled(*map(lower, args), **{k: lower(v) for k, v in kwargs.items()}))
            with torch.no_grad():
                want = leaves(eager(*args, **kwargs))  # float32, also for a bfloat16 model
            assert len(got) == len(want), f"{len(got)} outputs, eager has {len(want)}"
            for g, w in zip(got, want):
                if figured and g.is_floating_point():
                    error, cosine = figures(g, w)
                    assert error <= max_error and cosine >= min_cosine, f"relative error {error:.3g}, cosine {cosine:.6g}"
                    worst_error, worst_cosine = max(worst_error, error), min(worst_cosine, cosine)
                    continue
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)
                if g.numel():
                    worst = max(worst, (g.double() - w.double()).abs().nan_to_num().max().item())
        report[name] = {"loaded": repr(compiled), "max_difference": worst}
        if figured:
            report[name].update(relative_error=worst_error, cosine=worst_cosine)
    except Exception as error:
        report[name] = {"error": f"{type(error).__name__}: {error}"[:2000]}
report["compiler modules imported"] = sorted(m for m in ("torch._inductor", "torch._dynamo") if m in sys.modules)
print(json.dumps(report))
'''


@dataclass
class Battery:
    env: Venv
    wheels: dict[str, Path]  # package -> its wheel
    build_seconds: dict[str, float]  # model -> the hook's "done in" time
    logs: dict[str, str]  # package -> its build's output


@pytest.fixture(scope="module")
def battery(tmp_path_factory: pytest.TempPathFactory, torch_venv: Venv) -> Battery:
    import transformers

    root = tmp_path_factory.mktemp("battery")
    builds = {}
    for package, architectures in PACKAGES.items():
        project = write_project(root / package, package, MODELS, table(architectures, package), jobs=2 if len(architectures) > 1 else 1)
        command = [sys.executable, "-m", "build", "--wheel", "--no-isolation", str(project)]
        builds[package] = (project, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = {package: process.communicate()[0] for package, (_, process) in builds.items()}  # both finish before any is judged
    wheels, seconds = {}, {}
    for package, (project, process) in builds.items():
        log = logs[package]
        assert process.returncode == 0, f"the {package} project failed to build:\n{log[-5000:]}"
        seconds.update({m: float(s) for m, s in re.findall(r"precompile: (\w+): done in ([\d.]+) s", log)})
        (wheels[package],) = (project / "dist").glob("*.whl")
        torch_venv.pip("--no-deps", "--reinstall", str(wheels[package]))
    torch_venv.pip(f"transformers=={transformers.__version__}")  # the eager models, and the output classes
    return Battery(torch_venv, wheels, seconds, logs)


def compare(env: Venv, tmp_path: Path, architectures: list[Architecture], **variables: str) -> dict:
    cases = [
        {"name": a.name, "package": PACKAGE_OF[a.name], "factory": a.factory, "inputs": a.inputs, "kwargs": a.kwargs, "sizes": sizes(a), "dtype": a.dtype, "quantize": a.quantize}
        for a in architectures
    ]
    result = run([env.python, "-c", COMPARE, json.dumps(cases), str(BATTERY_DIR)], env=no_compiler_env(tmp_path, **variables), check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / "compiler-used").exists()
    return json.loads(result.stdout.strip().splitlines()[-1])


def form(loaded: str) -> str:
    """'lean', 'cpp' or 'artifact', from the loaded model's repr (its file's name)."""
    return "lean" if loaded.endswith(".py>") else "cpp" if loaded.endswith(".so>") else "artifact"


@pytest.mark.battery
def test_every_architecture_and_option_matches_eager_in_the_form_it_loads_in(battery: Battery, tmp_path: Path) -> None:
    report = compare(battery.env, tmp_path, BUILT)
    imported = report.pop("compiler modules imported")
    failures = {name: entry["error"] for name, entry in report.items() if "error" in entry}
    assert failures == {}
    forms = {name: form(entry["loaded"]) for name, entry in report.items()}
    assert forms == {a.name: a.form for a in BUILT}
    assert imported == ([] if all(a.form == "lean" for a in BUILT) else ["torch._dynamo", "torch._inductor"])
    results = {a.name: {"status": "builds", "form": forms[a.name], "build_seconds": battery.build_seconds.get(a.name), **report[a.name]} for a in BUILT}
    results.update({a.name: {"status": "refused", "reason": a.refused} for a in [*ARCHITECTURES, *OPTIONS] if a.refused})
    if os.environ.get("HATCH_PRECOMPILE_UPDATE_DOCS"):
        state_section = DOCS.read_text(encoding="utf-8").partition(STATE_SECTION)[2]
        DOCS.write_text(render(results) + STATE_SECTION + state_section, encoding="utf-8")
    assert summary_rows(DOCS.read_text(encoding="utf-8")) == summary_rows(render(results)), "docs/battery.md no longer says what the battery found: rerun with HATCH_PRECOMPILE_UPDATE_DOCS=1"


@pytest.mark.battery
def test_a_model_whose_cpp_form_is_refused_ships_lean_and_the_build_says_why_once(battery: Battery) -> None:
    """A graph calling a Python custom op (mixtral): each variant's manifest entry
    says why, the build log says it once per model, and the model loads lean (the
    test above). A library holding a constant that is not a weight is refused in
    test_model_forms.py, where the autotuner's choice is fixed."""
    declared = [a for a in BUILT if a.cpp_refused]
    assert declared
    for a in declared:
        package = PACKAGE_OF[a.name]
        with zipfile.ZipFile(battery.wheels[package]) as wheel:
            manifest = json.loads(wheel.read(f"{package}/_precompiled/manifest.json"))
        reasons = [artifact["cpp"]["refused"] for artifact in manifest["models"][a.name]["artifacts"]]
        assert reasons and all(a.cpp_refused in reason for reason in reasons), reasons
        said = [line for line in battery.logs[package].splitlines() if line.startswith(f"precompile: {a.name}: no C++ form")]
        assert len(said) == 1 and a.cpp_refused in said[0], said


@pytest.mark.battery
def test_every_architecture_and_option_matches_eager_in_the_artifact_form(battery: Battery, tmp_path: Path) -> None:
    """Every model but the int8 ones, which have no artifact form (test_int8.py checks they fall back)."""
    with_artifacts = [a for a in BUILT if not a.quantize]
    report = compare(battery.env, tmp_path, with_artifacts, HATCH_PRECOMPILE_FORM="artifact")
    report.pop("compiler modules imported")
    assert {name: entry.get("error") for name, entry in report.items()} == {a.name: None for a in with_artifacts}
    assert {form(entry["loaded"]) for entry in report.values()} == {"artifact"}


@pytest.mark.battery
def test_the_lean_wheel_is_abi3_and_loads_lean_on_another_python_under_pypis_build_of_the_release(battery: Battery, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """The same wheel file, installed by uv on CPython 3.13 with the `torch==X` its
    metadata pins resolved from PyPI (the CUDA build), runs every lean model with
    no compiler, as it does here. The artifacts' wheel names this Python alone."""
    import transformers

    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"-{python}-abi3-" in battery.wheels["battery"].name
    assert f"-{python}-{python}-" in battery.wheels["battery_artifacts"].name
    elsewhere = pypi_venv(tmp_path_factory.mktemp("battery-elsewhere") / "venv", ELSEWHERE_PYTHON)
    elsewhere.pip(str(battery.wheels["battery"]), f"transformers=={transformers.__version__}")
    found = elsewhere.script("import sys, torch; print(sys.version_info[:2], torch.version.cuda is not None)").stdout.strip()
    assert found == f"({ELSEWHERE_PYTHON.replace('.', ', ')}) True", found
    report = compare(elsewhere, tmp_path, PACKAGES["battery"])  # no compiler called: compare() checks the traps
    report.pop("compiler modules imported")  # transformers' own `integrations.moe` (mixtral's op library) imports torch._dynamo
    assert {name: entry.get("error") for name, entry in report.items()} == {a.name: None for a in PACKAGES["battery"]}
    assert {form(entry["loaded"]) for entry in report.values()} == {"lean"}


@pytest.mark.parametrize("architecture", [a for a in ARCHITECTURES if a.refused], ids=lambda a: a.name)
def test_an_architecture_torch_cannot_capture_is_refused_in_the_configurations_terms(tmp_path: Path, architecture: Architecture) -> None:
    project = write_project(tmp_path, "battery", MODELS, table([architecture], "battery"))
    result = run([sys.executable, "-m", "build", "--wheel", "--no-isolation", str(project)], check=False)
    assert result.returncode != 0
    assert architecture.refused in result.stdout + result.stderr
