"""Shape buckets, weights bound four ways, and half-precision models (these in the
C++ form, `cpp-form = true`, beside the lean one), through one
wheel built with the real hook and called in fresh processes."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import Venv, build_wheel, no_compiler_env, write_project

pytestmark = [pytest.mark.e2e, pytest.mark.standalone]

MODELS = '''
import torch
from torch import nn


class Stateful(nn.Module):
    """Tied weights, buffers with running statistics, a tensor attribute and a
    constant made inside forward(): every kind of state a graph lifts."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.out = nn.Linear(8, 20, bias=False)
        self.out.weight = self.embed.weight  # tied
        self.norm = nn.BatchNorm1d(8)
        self.scale = torch.linspace(0.5, 1.5, 8)  # a plain tensor attribute

    def forward(self, ids):
        h = self.norm(self.embed(ids).mean(1)) * self.scale
        return self.out(h) + torch.tensor([0.25])


def stateful():
    torch.manual_seed(0)
    model = Stateful()
    with torch.no_grad():
        model.norm.running_mean.uniform_(-1, 1)
        model.norm.running_var.uniform_(0.5, 2)
    return model.eval()


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.layers = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.layers(x)


def mlp():
    return Mlp().eval()


class PassesThrough(Mlp):
    """Returns its input, a view of it, a buffer and a view of the buffer beside
    what it computes, as library modules return their features (a dict in, the
    same dict out with more in it)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.linspace(0, 1, 12).view(3, 4))

    def forward(self, features):
        x = features["x"]
        return {**features, "out": self.layers(x), "x_t": x.t(), "table": self.table, "row": self.table[1]}


def passes_through():
    return PassesThrough().eval()


def features():
    return ({"x": torch.randn(3, 16), "scale": torch.ones(3)},), {}


class HandsBack(Mlp):
    """Returns an input as it is, and a nested tuple of what it computes: what the
    C++ form can return (no view, no buffer)."""

    def forward(self, features):
        out = self.layers(features["x"])
        return {"x": features["x"], "out": out, "pair": (out.sum(-1), (features["scale"] * 2).to(torch.float64))}


def hands_back():
    return HandsBack().eval()


class ViewsAnIntermediate(Mlp):
    """Returns a result and a view of it: AOTAutograd's wrapper takes the view out
    of an extra output at run time, so the build ships only the artifact form."""

    def forward(self, x):
        y = self.layers(x)
        return y, y.view(-1)


def views_an_intermediate():
    return ViewsAnIntermediate().eval()


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, image):
        return torch.relu(self.conv(image)).mean((2, 3))


def conv():
    return Conv().eval()
'''

PRECOMPILE = """
fallback = "error"

[tool.hatch.build.hooks.precompile.models.embedded]
factory = "formpkg.models:stateful"
inputs = [{ shape = ["batch", 5], dtype = "int64", range = [0, 20] }]
dims = { batch = { min = 1, max = 16 } }
cpp-form = true

[tool.hatch.build.hooks.precompile.models.from_factory]
factory = "formpkg.models:stateful"
inputs = [{ shape = ["batch", 5], dtype = "int64", range = [0, 20] }]
dims = { batch = { min = 1, max = 16 } }
weights = "factory"
cpp-form = true

[tool.hatch.build.hooks.precompile.models.buckets]
factory = "formpkg.models:mlp"
inputs = [{ shape = ["batch", 16] }]
dims = { batch = [2, 4] }

[tool.hatch.build.hooks.precompile.models.buckets_and_range]
factory = "formpkg.models:mlp"
inputs = [{ shape = ["batch", 16] }]
dims = { batch = { min = 1, max = 8, buckets = [4] } }
cpp-form = true

[tool.hatch.build.hooks.precompile.models.half]
factory = "formpkg.models:mlp"
inputs = [{ shape = ["batch", 16], dtype = "bfloat16" }]
dims = { batch = { min = 1, max = 8 } }
dtype = "bfloat16"
cpp-form = true

[tool.hatch.build.hooks.precompile.models.passes_through]
factory = "formpkg.models:passes_through"
example-inputs = "formpkg.models:features"
dims = { batch = { max = 8, axes = ["0.x:0", "0.scale:0"] } }
cpp-form = true

[tool.hatch.build.hooks.precompile.models.hands_back]
factory = "formpkg.models:hands_back"
example-inputs = "formpkg.models:features"
dims = { batch = { max = 8, axes = ["0.x:0", "0.scale:0"] } }
cpp-form = true

[tool.hatch.build.hooks.precompile.models.views_an_intermediate]
factory = "formpkg.models:views_an_intermediate"
inputs = [{ shape = ["batch", 16] }]
dims = { batch = { min = 1, max = 8 } }

[tool.hatch.build.hooks.precompile.models.conv]
factory = "formpkg.models:conv"
inputs = [{ shape = ["batch", 3, 8, 8] }]
dims = { batch = { min = 1, max = 8 } }
"""


@pytest.fixture(scope="module")
def forms_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(write_project(tmp_path_factory.mktemp("forms"), "formpkg", MODELS, PRECOMPILE))


@pytest.fixture(scope="module")
def forms(forms_wheel: Path, torch_venv: Venv) -> Venv:
    torch_venv.pip("--no-deps", "--reinstall", str(forms_wheel))
    return torch_venv


def call(env: Venv, tmp_path: Path, code: str, **extra: str) -> dict:
    prelude = "import json, torch\nfrom formpkg import load_compiled\nfrom formpkg import models\nreport = {}\n"
    environment = no_compiler_env(tmp_path, **extra)
    result = env.script(prelude + textwrap.dedent(code) + "\nprint(json.dumps(report))", env=environment, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_buckets_dispatch_on_the_exact_size_and_refuse_others(forms: Venv, tmp_path: Path) -> None:
    report = call(
        forms,
        tmp_path,
        """
        model, eager = load_compiled("buckets"), models.mlp()
        for batch in (2, 4):
            x = torch.randn(batch, 16)
            with torch.no_grad():
                torch.testing.assert_close(model(x), eager(x), rtol=1e-4, atol=1e-5)
            report[batch] = model.artifact_for(x)
        try:
            model(torch.randn(3, 16))
        except ValueError as error:
            report["3"] = str(error)
    """,
    )
    assert report == {
        "2": "buckets/cpu_avx2_batch2.py",
        "4": "buckets/cpu_avx2_batch4.py",
        "3": "model 'buckets': dim 'batch' is 3, but it was compiled only for the sizes [2, 4]",
    }


def test_buckets_with_a_range_use_the_dynamic_artifact_between_buckets(forms: Venv, tmp_path: Path) -> None:
    report = call(
        forms,
        tmp_path,
        """
        model, eager = load_compiled("buckets_and_range"), models.mlp()
        for batch in (1, 3, 4, 8):
            x = torch.randn(batch, 16)
            with torch.no_grad():
                torch.testing.assert_close(model(x), eager(x), rtol=1e-4, atol=1e-5)
            report[batch] = model.artifact_for(x)
        try:
            model(torch.randn(9, 16))
        except ValueError as error:
            report["9"] = str(error)
    """,
    )
    dynamic, bucket = "buckets_and_range/cpu_avx2_cpp.so", "buckets_and_range/cpu_avx2_batch4_cpp.so"  # its C++ form
    assert report == {
        "1": dynamic,
        "3": dynamic,
        "4": bucket,
        "8": dynamic,
        "9": "model 'buckets_and_range', input x: dim 'batch' (dim 0) must be in [1, 8], got 9",
    }


def test_weights_bound_four_ways_give_identical_results(forms: Venv, tmp_path: Path) -> None:
    report = call(
        forms,
        tmp_path,
        """
        ids = torch.randint(0, 20, (6, 5), generator=torch.Generator().manual_seed(3))
        eager = models.stateful()
        with torch.no_grad():
            expected = eager(ids)
        ways = {
            "shipped": load_compiled("embedded"),
            "factory": load_compiled("from_factory"),
            "state_dict": load_compiled("embedded", state_dict=eager.state_dict()),
            "module": load_compiled("from_factory", module=eager),
        }
        report["equal"] = {way: bool(torch.equal(model(ids), ways["shipped"](ids))) for way, model in ways.items()}
        report["loaded"] = sorted({repr(model) for model in ways.values()})
        torch.testing.assert_close(ways["shipped"](ids), expected, rtol=1e-4, atol=1e-5)
        report["cached"] = load_compiled("embedded") is ways["shipped"]

        tuned = models.stateful()
        with torch.no_grad():
            tuned.embed.weight.mul_(2)  # fine-tuned: the tied output layer follows
            expected = tuned(ids)
        torch.testing.assert_close(load_compiled("embedded", module=tuned)(ids), expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(load_compiled("from_factory", state_dict=tuned.state_dict())(ids), expected, rtol=1e-4, atol=1e-5)

        wrong = dict(eager.state_dict())
        wrong["embed.weight"] = torch.zeros(21, 8)
        del wrong["norm.running_var"]
        try:
            load_compiled("embedded", state_dict=wrong)
        except ValueError as error:
            report["mismatch"] = str(error)
        try:
            load_compiled("embedded", state_dict=eager.state_dict(), module=eager)
        except ValueError as error:
            report["both"] = str(error)
    """,
    )
    assert report["equal"] == {"shipped": True, "factory": True, "state_dict": True, "module": True}
    # The C++ form: its uniform and one-element constants (BatchNorm's ones and zeros, the
    # step count, torch.tensor([0.25])) are read from the weights bound, so tuned ones count.
    assert report["loaded"] == ["<compiled model 'embedded' from embedded/cpu_avx2_cpp.so>", "<compiled model 'from_factory' from from_factory/cpu_avx2_cpp.so>"]
    assert report["cached"] is True
    assert report["both"] == "model 'embedded': pass state_dict= or module=, not both"
    assert report["mismatch"] == (
        "model 'embedded': the state_dict given does not fit the compiled model: embed.weight is float32[21, 8] on cpu, expected float32[20, 8] on cpu; norm.running_var is missing"
    )


def test_factory_weights_ship_only_constants(forms: Venv) -> None:
    folder = forms.script("import formpkg, os; print(os.path.dirname(formpkg.__file__))").stdout.strip()
    manifest = json.loads((Path(folder) / "_precompiled" / "manifest.json").read_text())["models"]
    embedded, factory = manifest["embedded"]["weights"], manifest["from_factory"]["weights"]
    assert embedded["mode"] == "embed" and factory["mode"] == "factory"
    kinds = {spec["kind"] for spec in factory["specs"].values()}
    assert kinds == {"PARAMETER", "BUFFER", "CONSTANT_TENSOR"}
    assert embedded["size"] > factory["size"]  # the factory's file holds constants only
    assert embedded["aliases"] == {"out.weight": "embed.weight"}  # tied: lifted under both names, stored once


def test_a_bfloat16_model_takes_and_returns_bfloat16(forms: Venv, tmp_path: Path) -> None:
    report = call(
        forms,
        tmp_path,
        """
        model = load_compiled("half")
        x = torch.randn(3, 16).to(torch.bfloat16)
        with torch.no_grad():
            expected = models.mlp().to(torch.bfloat16)(x)
        out = model(x)
        torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
        report["dtype"] = str(out.dtype)
        try:
            model(torch.randn(3, 16))
        except ValueError as error:
            report["float32"] = str(error)
        report["loaded"] = repr(model)
    """,
    )
    assert report == {"dtype": "torch.bfloat16", "float32": "model 'half', input x: expected dtype bfloat16, got float32", "loaded": "<compiled model 'half' from half/cpu_avx2_cpp.so>"}


@pytest.mark.parametrize("form", ["auto", "artifact"])
def test_images_in_any_layout_give_eagers_result_in_both_forms(forms: Venv, tmp_path: Path, form: str) -> None:
    report = call(
        forms,
        tmp_path,
        """
        model, eager = load_compiled("conv"), models.conv()
        image = torch.randn(2, 3, 8, 8)
        images = {
            "contiguous": image,
            "channels_last": image.to(memory_format=torch.channels_last),
            "strided": torch.randn(2, 3, 16, 16)[:, :, ::2, ::2],
            "expanded": torch.randn(1, 3, 8, 8).expand(4, 3, 8, 8),
            "permuted": torch.randn(8, 8, 2, 3).permute(2, 3, 0, 1),
        }
        for case, x in images.items():
            with torch.no_grad():
                torch.testing.assert_close(model(x), eager(x), rtol=1e-4, atol=1e-5)
            report[case] = list(model(x).shape)
        report["loaded"] = repr(model)
    """,
        HATCH_PRECOMPILE_FORM=form,
    )
    suffix = "bin" if form == "artifact" else "py"
    assert report.pop("loaded") == f"<compiled model 'conv' from conv/cpu_avx2.{suffix}>"
    assert report == {"contiguous": [2, 8], "channels_last": [2, 8], "strided": [2, 8], "expanded": [4, 8], "permuted": [2, 8]}


def test_outputs_that_are_inputs_weights_or_views_of_them_load_lean(forms: Venv, tmp_path: Path) -> None:
    report = call(
        forms,
        tmp_path,
        """
        model, eager = load_compiled("passes_through"), models.passes_through()
        for batch in (1, 5, 8):
            features = {"x": torch.randn(batch, 16), "scale": torch.rand(batch)}
            out = model(features)
            with torch.no_grad():
                expected = eager(features)
            assert sorted(out) == sorted(expected)
            for key, value in expected.items():
                torch.testing.assert_close(out[key], value, rtol=1e-4, atol=1e-5)
            report.setdefault("given back", []).append([out["x"] is features["x"], out["scale"] is features["scale"]])
            report.setdefault("views", []).append(out["x_t"].data_ptr() == features["x"].data_ptr())
        transposed = {"x": torch.randn(16, 4).t(), "scale": torch.rand(4)}  # copied into the compiled layout first
        report["given back, laid out anew"] = model(transposed)["x"] is transposed["x"]
        try:
            model({"x": torch.randn(9, 16), "scale": torch.rand(9)})
        except ValueError as error:
            report["too big"] = str(error)
        report["explain"] = load_compiled.explain("passes_through").splitlines()[0]
    """,
    )
    assert report == {
        "given back": [[True, True]] * 3,
        "views": [True] * 3,
        "given back, laid out anew": True,
        "too big": report["too big"],
        "explain": (
            "passes_through: would load passes_through/cpu_avx2.py (lean form; the build refused the C++ form: "
            "output 3 is a weight or a buffer, or a view of one or of an input, and the container would return a copy) for CPU target avx2"
        ),
    }
    assert report["too big"] == "model 'passes_through', input features['x']: dim 'batch' (dim 0) must be in [1, 8], got 9"


def test_a_graph_returning_a_view_of_an_intermediate_ships_the_artifact_form_and_says_why(forms: Venv, forms_wheel: Path, tmp_path: Path) -> None:
    report = call(
        forms,
        tmp_path,
        """
        model, eager = load_compiled("views_an_intermediate"), models.views_an_intermediate()
        x = torch.randn(3, 16)
        with torch.no_grad():
            for got, want in zip(model(x), eager(x)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        report["explain"] = load_compiled.explain("views_an_intermediate").splitlines()[0]
    """,
    )
    refused = "output 1 is a view of another output"
    assert report["explain"] == (f"views_an_intermediate: would load views_an_intermediate/cpu_avx2.bin (artifact form; the build refused the lean form: {refused}) for CPU target avx2")
    lean_only = forms.script(
        "from formpkg import load_compiled\nload_compiled('views_an_intermediate')",
        env=no_compiler_env(tmp_path, HATCH_PRECOMPILE_FORM="lean"),
        check=False,
    )
    assert "PrecompiledModelError: model 'views_an_intermediate': no shipped artifact fits this process" in lean_only.stderr
    assert (f"the lean form: the build refused it for views_an_intermediate/cpu_avx2.bin: {refused}; the artifact form: HATCH_PRECOMPILE_FORM=lean") in lean_only.stderr
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert f"-{python}-{python}-" in forms_wheel.name  # an artifact runs on this Python alone: no abi3 tag


def test_a_library_holding_a_constant_that_is_not_a_weight_is_refused_and_removed(tmp_path: Path) -> None:
    """The autotuner's C++ GEMM template packs a Linear's weight into a constant of
    its own, which the wheel's weights file cannot bind: the variant gets no C++
    form, its manifest entry says why, and no file of it is left. (`max_autotune`
    alone picks that template or ATen's by timing, so the battery cannot rely on it.)"""
    import torch

    from hatch_precompile.worker.cpp_form import compile_library

    exported = torch.export.export(torch.nn.Linear(64, 32).eval(), (torch.randn(4, 64),))
    config = {"max_autotune": True, "max_autotune_gemm_backends": "CPP"}
    record = compile_library(exported, config, "cpu_avx2.bin", tmp_path, list(exported.state_dict))
    assert record.keys() == {"refused"} and record["refused"].startswith("the library holds constants that are not the graph's weights: constant"), record
    assert list(tmp_path.iterdir()) == []


def test_a_library_linking_what_the_manylinux_policy_does_not_provide_is_refused_naming_it(tmp_path: Path) -> None:
    """A C++ library that passed its check but links a library neither torch's wheel
    nor the manylinux policy provides (an extra library from the build machine's
    compiler setup) cannot ship: the reason names both, and the variant's needs
    are left as its kernels made them. A real ELF file, linked by the system's C compiler."""
    import subprocess

    from hatch_precompile.worker.cpp_form import _count_native_needs
    from hatch_precompile.worker.form import Pending

    (tmp_path / "extra.c").write_text("int extra(void) { return 1; }\n")
    (tmp_path / "model.c").write_text("int extra(void);\nint run(void) { return extra(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", tmp_path / "libhatchextra.so", tmp_path / "extra.c"], check=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", tmp_path / "cpu_avx2_cpp.so", tmp_path / "model.c", f"-L{tmp_path}", "-lhatchextra"], check=True)
    kernels_needs = {"glibc": "2.2.5", "glibcxx": "", "libraries": ["libc.so.6"], "policy": "manylinux_2_5_x86_64"}
    entry = {"file": "cpu_avx2.bin", "kernels": [], "cpp": {"file": "cpu_avx2_cpp.so", "constants": {}}, "native": dict(kernels_needs)}
    variant = Pending(None, {}, entry, tmp_path, True, tmp_path / "data.pt", [], [], None)  # type: ignore[arg-type]
    reason = _count_native_needs(variant)
    assert reason.startswith("compiled kernel cpu_avx2_cpp.so links libhatchextra.so, which neither torch's wheel nor the manylinux policy provides"), reason
    assert entry["native"] == kernels_needs


# The same models from NumPy arrays (`arrays="numpy"`), in processes that never
# import torch, against the torch path's C++ form; and what cannot run so, said.
NUMPY_CALLS = """
import json, sys, warnings
import numpy as np
from formpkg import load_compiled, _precompiled
report = {}
rng = np.random.default_rng(0)
x = {batch: rng.standard_normal((batch, 16), dtype=np.float32) for batch in (1, 3, 4, 8)}
features = {"x": rng.standard_normal((5, 16), dtype=np.float32), "scale": rng.random(5, dtype=np.float32)}
"""


def _torch_path_outputs(forms: Venv, tmp_path: Path) -> Path:
    saved = tmp_path / "torch.npz"
    call(
        forms,
        tmp_path,
        NUMPY_CALLS.replace("report = {}", "")
        + textwrap.dedent(f"""
        out = {{f"buckets_and_range {{b}}": load_compiled("buckets_and_range")(torch.from_numpy(a)).numpy() for b, a in x.items()}}
        back = load_compiled("hands_back")({{k: torch.from_numpy(v) for k, v in features.items()}})
        out.update(hands_back_out=back["out"].numpy(), hands_back_sum=back["pair"][0].numpy(), hands_back_scale=back["pair"][1].numpy())
        out["half"] = load_compiled("half")(torch.from_numpy(x[3]).to(torch.bfloat16)).float().numpy()
        out["from_factory"] = load_compiled("from_factory")(torch.arange(15).reshape(3, 5) % 20).numpy()
        np.savez({str(saved)!r}, **out)
        """),
    )
    return saved


def test_numpy_arrays_in_and_out_without_torch_and_what_cannot_run_so_says_why(forms: Venv, tmp_path: Path) -> None:
    forms.pip("numpy")
    saved = _torch_path_outputs(forms, tmp_path)
    code = (
        NUMPY_CALLS
        + f"""
expected = np.load({str(saved)!r})
model = load_compiled("buckets_and_range", arrays="numpy")
report["buckets"] = {{b: [model.artifact_for(a), bool(np.array_equal(model(a), expected[f"buckets_and_range {{b}}"]))] for b, a in x.items()}}
back = load_compiled("hands_back", arrays="numpy")(features)
report["hands back"] = [sorted(back), back["x"] is features["x"], type(back["pair"]).__name__, back["pair"][1].dtype.name,
    bool(np.array_equal(back["out"], expected["hands_back_out"])), bool(np.array_equal(back["pair"][0], expected["hands_back_sum"])),
    bool(np.array_equal(back["pair"][1], expected["hands_back_scale"]))]
for name in ("buckets", "half", "from_factory"):
    try:
        load_compiled(name, arrays="numpy", fallback="error")
    except _precompiled.PrecompiledModelError as error:
        report[f"refused {{name}}"] = str(error).split(": ", 1)[1]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    factory = load_compiled("from_factory", arrays="numpy", fallback="eager")  # the project says "error"
report["fallback"] = [repr(factory).startswith("<<compiled model 'from_factory' from from_factory/cpu_avx2_cpp.so> behind NumPy arrays"), [w.category.__name__ for w in caught]]
report["fallback output"] = bool(np.array_equal(factory(np.arange(15).reshape(3, 5) % 20), expected["from_factory"]))
report["explain half"] = load_compiled.explain("half").splitlines()[1]
try:
    load_compiled("half", arrays="numpy", fallback="eager")
except _precompiled.PrecompiledModelError as error:
    report["half on torch"] = str(error)
report["torch imported"] = "torch" in sys.modules
print(json.dumps(report))
"""
    )
    report = json.loads(forms.script(code, env=no_compiler_env(tmp_path)).stdout.strip().splitlines()[-1])
    dynamic, bucket = "buckets_and_range/cpu_avx2_cpp.so", "buckets_and_range/cpu_avx2_batch4_cpp.so"
    assert report["buckets"] == {"1": [dynamic, True], "3": [dynamic, True], "4": [bucket, True], "8": [dynamic, True]}
    assert report["hands back"] == [["out", "pair", "x"], True, "tuple", "float64", True, True, True]
    assert "the C++ form: none was built (cpp-form = false); the lean form: it runs on torch tensors" in report["refused buckets"], report["refused buckets"]
    assert "its input x is bfloat16: NumPy has no bfloat16 dtype: install ml_dtypes" in report["refused half"], report["refused half"]
    assert 'its weights come from its factory (weights = "factory"), which only torch can run' in report["refused from_factory"], report["refused from_factory"]
    assert report["fallback"] == [True, ["PrecompiledFallbackWarning"]] and report["fallback output"]
    assert report["explain half"].startswith("  without torch (arrays='numpy'): no: ") and "install ml_dtypes" in report["explain half"]
    assert report["half on torch"] == (
        "model 'half' cannot take and return NumPy arrays here, on any form: its input x is bfloat16: "
        "NumPy has no bfloat16 dtype: install ml_dtypes (`pip install ml_dtypes`), which defines the one JAX and ONNX use"
    )
    assert report["torch imported"] is True  # the fallback imported it, after the rest ran without it

    forms.pip("ml_dtypes")
    half = f"""
import json, sys
import numpy as np, ml_dtypes
from formpkg import load_compiled
rng = np.random.default_rng(0)
rng.standard_normal((1, 16), dtype=np.float32)
x = rng.standard_normal((3, 16), dtype=np.float32)  # NUMPY_CALLS' x[3], its generator's second draw
out = load_compiled("half", arrays="numpy")(x.astype(ml_dtypes.bfloat16))
print(json.dumps([out.dtype.name, bool(np.array_equal(out.astype(np.float32), np.load({str(saved)!r})["half"])), "torch" in sys.modules]))
"""
    assert json.loads(forms.script(half, env=no_compiler_env(tmp_path)).stdout.strip().splitlines()[-1]) == ["bfloat16", True, False]
