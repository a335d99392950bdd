"""Builds that must fail: through a real frontend (`python -m build`, no isolation,
so the hook under test is this checkout's), each checked for its message and for
leaving no wheel and no scratch files behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_said_plainly, run, write_project

pytestmark = pytest.mark.e2e

MODELS = """
import torch
from torch import nn


class Doubler(nn.Module):
    def forward(self, x):
        return x * 2


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # torch.export cannot capture a branch on tensor values
            return x + 1
        return x - 1


def doubler():
    return Doubler()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))


def data_dependent():
    return DataDependent()


def slow_doubler():
    import time

    time.sleep(120)  # long enough to be interrupted in the middle of the build, whatever the machine's load
    return Doubler()


def not_a_module():
    return "a string"


class WrongAtTheLargestBatch(nn.Module):
    def forward(self, x):
        # Eager alone triples a batch of 16, the dim's max: torch.export does not
        # take this branch, so the compiled graph doubles every size.
        if not torch.compiler.is_exporting() and x.shape[0] == 16:
            return x * 3
        return x * 2


def wrong_at_the_largest_batch():
    return WrongAtTheLargestBatch()


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        self.calls.add_(1)
        return self.linear(x) * self.calls


def counter():
    return Counter()
"""


def make_project(tmp_path: Path, precompile_toml: str) -> Path:
    """A src-layout project `mypkg` whose precompile table is `precompile_toml`."""
    return write_project(tmp_path, "mypkg", MODELS, precompile_toml)


def build(project: Path, **extra_env: str) -> tuple[int, str, Path]:
    """Build a wheel; return (status, output, the build's TMPDIR)."""
    scratch = project.parent / "tmp"
    scratch.mkdir(exist_ok=True)
    result = run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", str(project)],
        env={**os.environ, "TMPDIR": str(scratch), **extra_env},
        check=False,
    )
    output = result.stdout + result.stderr
    if result.returncode != 0:
        assert list((project / "dist").glob("*.whl")) == []
        assert_said_plainly(output)
    return result.returncode, output, scratch


def assert_left_nothing(scratch: Path) -> None:
    assert [p.name for p in scratch.iterdir() if p.name.startswith("hatch-precompile")] == []


def test_pip_wheel_ends_an_expected_failure_with_the_message_alone(tmp_path: Path) -> None:
    """pip runs the backend as `python -m build` does; its error block holds the
    plugin's message and none of the frontend's frames (hatch build: in
    test_example_wheel.py, which has hatch's build environment ready)."""
    project = make_project(tmp_path, MODEL.format(factory="mypkg.models:doubler") + 'dtype = "float8"\n')
    result = run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(tmp_path / "out"), str(project)], check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "tool.hatch.build.hooks.precompile.models.m.dtype: expected one of 'float32', 'bfloat16', 'float16', found a string 'float8'" in output
    assert_said_plainly(output)


def test_all_configuration_errors_are_reported_at_once(tmp_path: Path) -> None:
    project = make_project(
        tmp_path,
        """
        fallbak = "eager"

        [tool.hatch.build.hooks.precompile.models.m]
        factory = "mypkg.models:doubler"
        inputs = [{ shape = ["batch", "seq"], dtype = "float33" }]
        dims = { batch = { min = 1, max = "64" } }
        weights = 3
        options = { freezing = true }
        """,
    )
    status, output, scratch = build(project)
    assert status != 0
    prefix = "tool.hatch.build.hooks.precompile"
    for expected in (
        "invalid configuration (6 problem(s))",
        f"{prefix}.fallbak: unknown key; did you mean `fallback`?",
        f"{prefix}.models.m.inputs[0].dtype: expected one of 'float32'",
        "found a string 'float33' (did you mean 'float32'?)",
        f"{prefix}.models.m.dims.batch.max: expected an integer >= 2, found a string '64'",
        f"{prefix}.models.m.inputs[0].shape: uses dim 'seq', which is not declared in {prefix}.models.m.dims",
        f"{prefix}.models.m.weights: expected one of 'embed', 'factory', found an integer 3",
        f"{prefix}.models.m.options.freezing: not supported: the graph takes its weights as inputs, so inductor's freezing would freeze nothing",
    ):
        assert expected in output, expected
    assert_left_nothing(scratch)


MODEL = """
[tool.hatch.build.hooks.precompile.models.m]
factory = "{factory}"
inputs = [{{ shape = ["batch", 8] }}]
dims = {{ batch = {{ min = 1, max = 16 }} }}
"""


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (
            "mypkg.missing:doubler",
            "model 'm' failed while importing factory = 'mypkg.missing:doubler': cannot import module 'mypkg.missing': ModuleNotFoundError: No module named 'mypkg.missing'",
        ),
        ("mypkg.models:nothing", "model 'm' failed while importing factory = 'mypkg.models:nothing': 'mypkg.models' has no attribute 'nothing'"),
        (
            "mypkg.models:not_a_module",
            "model 'm' failed while calling factory 'mypkg.models:not_a_module': expected it to return a torch.nn.Module, got builtins.str",
        ),
        ("mypkg.models:data_dependent", "model 'm' failed while capturing with torch.export: "),
    ],
)
def test_a_model_that_cannot_be_built_names_itself_and_the_cause(tmp_path: Path, factory: str, expected: str) -> None:
    status, output, scratch = build(make_project(tmp_path, MODEL.format(factory=factory)))
    assert status != 0
    assert expected in output, output[-3000:]
    assert_left_nothing(scratch)


def test_an_int8_model_with_state_is_refused_by_name(tmp_path: Path) -> None:
    status, output, scratch = build(make_project(tmp_path, MODEL.format(factory="mypkg.models:counter") + 'quantize = "int8"\n'))
    assert status != 0
    assert ("model 'm' failed while quantizing to int8: the model updates buffers (calls), and int8 graphs are compiled with their buffers frozen in; build it in float32 or bfloat16") in output, (
        output[-3000:]
    )
    assert_left_nothing(scratch)


def test_a_model_that_fails_to_compile_names_itself_and_torchs_error(tmp_path: Path) -> None:
    project = make_project(tmp_path, MODEL.format(factory="mypkg.models:doubler"))
    status, output, scratch = build(project, CXX="false", HATCH_PRECOMPILE_BUILD_CACHE="off")  # no compiler that works
    assert status != 0
    assert "model 'm' failed while compiling for CPU target 'avx2': " in output
    assert "InvalidCxxCompiler: No working C++ compiler found" in output  # torch's words
    assert_left_nothing(scratch)


def test_a_model_that_misses_its_accuracy_bound_says_by_how_much(tmp_path: Path) -> None:
    toml = MODEL.format(factory="mypkg.models:mlp").replace('shape = ["batch", 8]', 'shape = ["batch", 8], dtype = "bfloat16"')
    toml += 'dtype = "bfloat16"\naccuracy = { max-relative-error = 1e-6 }\n'
    status, output, scratch = build(make_project(tmp_path, toml))
    assert status != 0
    assert "model 'm' failed while checking accuracy: output 0 against float32 eager on the example inputs: relative error " in output
    assert "> max-relative-error 1e-06. If this precision is acceptable for the model, loosen `accuracy` in [tool.hatch.build.hooks.precompile.models." in output
    assert_left_nothing(scratch)


def test_a_model_wrong_only_at_a_dims_max_is_refused_naming_the_sizes(tmp_path: Path) -> None:
    """The example inputs (batch 2) pass; the build's calls at the dims' min, a
    size between and max find the difference, and the message says at which."""
    status, output, scratch = build(make_project(tmp_path, MODEL.format(factory="mypkg.models:wrong_at_the_largest_batch")))
    assert status != 0
    assert "model 'm' failed while checking accuracy: output 0 against eager at batch=16 (the dims' min, a size between and max): " in output, output[-3000:]
    assert_left_nothing(scratch)


def test_weight_only_layers_that_cannot_be_quantized_are_named_and_a_miss_says_what_to_try(tmp_path: Path) -> None:
    """int4 at group size 64 on 8- and 32-input layers: each named, with why; int8
    weights missing a bound: by how much, and int8's advice (the second layer
    only: the first's 8 inputs are too few for the int8 kernel)."""
    toml = MODEL.format(factory="mypkg.models:mlp").replace('shape = ["batch", 8]', 'shape = ["batch", 8], dtype = "bfloat16"')
    int4 = toml + 'dtype = "bfloat16"\nquantize = "int4-weight-only"\ngroup-size = 64\n'
    status, output, scratch = build(make_project(tmp_path / "int4", int4))
    assert status != 0
    assert (
        "model 'm' failed while quantizing the weights (int4-weight-only): the module has no linear layer (nn.Linear, or transformers' Conv1D) to quantize; "
        "left in bfloat16: {'0': 'its 8 inputs are not a multiple of group-size 64', '2': 'its 32 inputs are not a multiple of group-size 64'}; remove `quantize`"
    ) in output, output[-3000:]
    assert_left_nothing(scratch)
    int8 = toml + 'dtype = "bfloat16"\nquantize = "int8-weight-only"\naccuracy = { max-relative-error = 1e-6 }\n'
    status, output, scratch = build(make_project(tmp_path / "int8", int8))
    assert status != 0
    assert "model 'm' failed while checking accuracy: output 0 against float32 eager on the example inputs: relative error " in output, output[-3000:]
    assert '; otherwise build it in float32, or build it with dtype = "bfloat16" alone' in output
    assert_left_nothing(scratch)


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ("package = 'other'\n", "tool.hatch.build.hooks.precompile.package: no package 'other' at src/other/ or other/"),
        (
            "",  # a second top-level package makes the default ambiguous
            "tool.hatch.build.hooks.precompile.package: missing; set it to the import package that receives the models (found: mypkg, second)",
        ),
    ],
)
def test_the_receiving_package_must_be_found(tmp_path: Path, table: str, expected: str) -> None:
    project = make_project(tmp_path, table + MODEL.format(factory="mypkg.models:doubler"))
    if not table:
        (project / "src" / "second").mkdir()
        (project / "src" / "second" / "__init__.py").write_text("")
    status, output, scratch = build(project)
    assert status != 0 and expected in output
    assert_left_nothing(scratch)


def test_declared_inputs_that_do_not_fit_forward_are_named(tmp_path: Path) -> None:
    toml = MODEL.format(factory="mypkg.models:doubler").replace('inputs = [{ shape = ["batch", 8] }]', 'inputs = [{ shape = ["batch", 8] }, { shape = [2] }]')
    status, output, scratch = build(make_project(tmp_path, toml))
    assert status != 0
    assert "model 'm' failed while matching inputs to forward(): the declared inputs do not fit forward(): too many positional arguments" in output
    assert_left_nothing(scratch)


def test_src_and_flat_layout_projects_both_build(tmp_path: Path) -> None:
    project = make_project(tmp_path, MODEL.format(factory="mypkg.models:doubler"))
    status, output, scratch = build(project)
    assert status == 0, output[-3000:]
    (project / "src" / "mypkg").rename(project / "mypkg")
    for wheel in (project / "dist").glob("*.whl"):
        wheel.unlink()
    status, output, scratch = build(project)
    assert status == 0, output[-3000:]
    assert len(list((project / "dist").glob("mypkg-1.0-cp3*.whl"))) == 1
    assert_left_nothing(scratch)


def test_a_wheel_from_an_sdist_made_with_another_torch_is_refused(tmp_path: Path) -> None:
    project = make_project(tmp_path, MODEL.format(factory="mypkg.models:doubler"))
    (project / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: mypkg\nVersion: 1.0\nRequires-Dist: torch==1.0.0\n")
    status, output, _ = build(project)
    assert status != 0
    assert "this sdist was made with torch==1.0.0 but the build environment has torch 2." in output


def _processes(*needles: str, within: Path) -> set[int]:
    """Pids whose command line mentions any of `needles` and the folder `within`
    (a build's TMPDIR, where its requests lie): not the workers of the builds
    other test processes run at the same time."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and any(n in command for n in needles) and str(within) in command:
            found.add(int(entry.name))
    return found


def test_interrupting_a_build_leaves_no_child_processes_and_no_scratch(tmp_path: Path) -> None:
    """Two models compiling at once, both stopped."""
    second = MODEL.replace("models.m]", "models.m2]")
    project = make_project(tmp_path, (MODEL + second).format(factory="mypkg.models:slow_doubler"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    children = ("hatch_precompile.worker", "compile_worker")
    build = subprocess.Popen(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", str(project)],
        env={**os.environ, "TMPDIR": str(scratch), "HATCH_PRECOMPILE_JOBS": "2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as a terminal's Ctrl-C would reach
        # A terminal's Ctrl-C: SIGINT as a shell started in the background (CI's, say)
        # would otherwise pass it on, ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509  # the test runs no threads when it starts the build
    )
    deadline = time.monotonic() + 120
    while len(_processes("hatch_precompile.worker", within=scratch)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_processes("hatch_precompile.worker", within=scratch)) == 2, "the two compile workers never started"
    (staging,) = [p for p in scratch.iterdir() if p.name.startswith("hatch-precompile-")]
    assert staging.stat().st_mode & 0o777 == 0o700  # private, with an unpredictable name
    time.sleep(2)  # let it get into torch and the factory
    os.killpg(build.pid, signal.SIGINT)
    assert build.wait(timeout=60) != 0
    deadline = time.monotonic() + 15
    while _processes(*children, within=scratch) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes(*children, within=scratch) == set()
    assert_left_nothing(scratch)
    assert list((project / "dist").glob("*.whl")) == []
