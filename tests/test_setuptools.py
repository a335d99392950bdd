"""Setuptools projects: hatch-precompile's PEP 517 backend (backend/setuptools_backend.py).

End to end (e2e): the setuptools example (example_setuptools/) gets the wheel the
hatch hook makes, with the same tag, pins, loader and `_precompiled/` layout; built
with a real frontend and build isolation, installed in a fresh environment, and
loaded in a fresh process with no compiler. Fast: the wheel and metadata rewrite
on hand-made inputs."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tarfile
import zipfile
from email.parser import Parser
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version

from hatch_precompile.backend.distfiles import rewrite_wheel, with_requirements
from hatch_precompile.engine.assemble import RUNTIME_FILES, wheel_tag

from conftest import REPO, ExampleBuild, Venv, assert_said_plainly, build_sdist_and_wheel, deploy, no_compiler_env, pin_build_torch, run

EXAMPLE_ST = REPO / "example_setuptools"
PRECOMPILED = "example_st/_precompiled/"
DIST_INFO = "example_st-0.1.0.dist-info"
TORCH_PIN = f"torch=={Version(version('torch')).public}"  # what the backend pins: the release, no local label


def copy_example(folder: Path) -> Path:
    """A copy of the example with none of a local build's leftovers, its torch pin set to the torch under test."""
    project = folder / "example_setuptools"
    shutil.copytree(EXAMPLE_ST, project, ignore=shutil.ignore_patterns("dist", "build", "*.egg-info", "__pycache__", "_precompiled"))
    pin_build_torch(project / "pyproject.toml")
    return project


@pytest.fixture(scope="module")
def st_build(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> ExampleBuild:
    """`python -m build` of the setuptools example, with build isolation: sdist, then wheel from the sdist."""
    return build_sdist_and_wheel(copy_example(tmp_path_factory.mktemp("setuptools-example")), wheelhouse)


@pytest.fixture(scope="module")
def st_venv(tmp_path_factory: pytest.TempPathFactory, st_build: ExampleBuild) -> Venv:
    """A fresh environment with only the example's wheel and what its metadata requires."""
    return deploy(st_build.wheel, tmp_path_factory.mktemp("setuptools-deploy") / "venv")


def _tag(wheel: Path) -> str:
    return wheel.name.removesuffix(".whl").split("-", 2)[2]


def _requires(metadata: bytes) -> list[str]:
    return sorted(Parser().parsestr(metadata.decode()).get_all("Requires-Dist") or [])


def _precompiled_layout(wheel: Path, package: str) -> set[tuple[str, int]]:
    """The `_precompiled/` files of a wheel, the model folder and kernel keys made
    generic, with their modes: what both backends must lay out the same way."""
    prefix = f"{package}/_precompiled/"
    with zipfile.ZipFile(wheel) as archive:
        models = json.loads(archive.read(prefix + "manifest.json"))["models"]
        layout = set()
        for info in archive.infolist():
            if info.filename.startswith(prefix):
                path = info.filename.removeprefix(prefix)
                for model in models:
                    path = re.sub(rf"^{model}/", "MODEL/", path)
                layout.add((re.sub(r"k_[0-9a-f]+\.so$", "k_KEY.so", path), info.external_attr >> 16))
    return layout


@pytest.mark.e2e
def test_wheel_has_the_hatch_wheels_tag_pins_and_precompiled_layout(st_build: ExampleBuild, example_build: ExampleBuild) -> None:
    """The tag is the hatch wheel's, as the same assembly makes it from each wheel's
    own libraries (the hatch example's encoder has a C++ form, whose library may
    need a newer platform; this example's model has none)."""
    with zipfile.ZipFile(st_build.wheel) as wheel:
        policies = [a["native"]["policy"] for m in json.loads(wheel.read(PRECOMPILED + "manifest.json"))["models"].values() for a in m["artifacts"]]
    expected = wheel_tag(policies, stable_abi=True)
    assert expected.split("-")[:2] == _tag(example_build.wheel).split("-")[:2]
    assert st_build.wheel.name == f"example_st-0.1.0-{expected}.whl"
    with zipfile.ZipFile(st_build.wheel) as wheel, zipfile.ZipFile(example_build.wheel) as hatch_wheel:
        requires = _requires(wheel.read(f"{DIST_INFO}/METADATA"))
        assert requires == _requires(hatch_wheel.read("example_pkg-0.1.0.dist-info/METADATA")) and TORCH_PIN in requires
        wheel_file = wheel.read(f"{DIST_INFO}/WHEEL").decode().splitlines()
        assert "Root-Is-Purelib: false" in wheel_file
        assert [line for line in wheel_file if line.startswith("Tag:")] == [f"Tag: {expected}"]

        # _precompiled/ is exactly what the build staged: the loader, _build.py, the
        # manifest and every file it lists, each verified; no more, no less.
        manifest = json.loads(wheel.read(PRECOMPILED + "manifest.json"))
        (model,) = manifest["models"].values()
        listed = [model["weights"], *model["artifacts"], *(a["lean"] for a in model["artifacts"]), *(a["cpp"] for a in model["artifacts"]), *model["kernels"].values()]
        for record in listed:
            data = wheel.read(PRECOMPILED + record["file"])
            assert (len(data), hashlib.sha256(data).hexdigest()) == (record["size"], record["sha256"]), record["file"]
        shipped = {name.removeprefix(PRECOMPILED) for name in wheel.namelist() if name.startswith(PRECOMPILED)}
        assert shipped == {*RUNTIME_FILES, "_build.py", "manifest.json", *(record["file"] for record in listed)}
        for name in RUNTIME_FILES:
            assert wheel.read(PRECOMPILED + name) == (REPO / "hatch_precompile/runtime" / name).read_bytes(), name
        assert {n for n in wheel.namelist() if not n.startswith(PRECOMPILED)} == {
            "example_st/__init__.py",
            "example_st/model.py",
            f"{DIST_INFO}/METADATA",
            f"{DIST_INFO}/WHEEL",
            f"{DIST_INFO}/top_level.txt",
            f"{DIST_INFO}/RECORD",
        }
    (artifact,) = model["artifacts"]
    assert artifact["file"] == "mlp/cpu_avx2.bin" and artifact["lean"]["file"] == "mlp/cpu_avx2.py"
    assert _precompiled_layout(st_build.wheel, "example_st") == _precompiled_layout(example_build.wheel, "example_pkg")


@pytest.mark.e2e
def test_record_verifies_and_the_checkers_pass(st_build: ExampleBuild) -> None:
    with zipfile.ZipFile(st_build.wheel) as wheel:
        rows = list(csv.reader(io.StringIO(wheel.read(f"{DIST_INFO}/RECORD").decode())))
        assert [row[0] for row in rows] == wheel.namelist()  # every entry once, RECORD last
        assert rows[-1] == [f"{DIST_INFO}/RECORD", "", ""]
        for path, digest, size in rows[:-1]:
            data = wheel.read(path)
            expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (expected, len(data)), path
    bin_dir = Path(sys.executable).parent
    contents = run([str(bin_dir / "check-wheel-contents"), str(st_build.wheel)], check=False)
    assert contents.returncode == 0 and "OK" in contents.stdout, contents.stdout + contents.stderr
    twine = run([str(bin_dir / "twine"), "check", "--strict", str(st_build.wheel), str(st_build.sdist)], check=False)
    assert twine.returncode == 0, twine.stdout + twine.stderr


@pytest.mark.e2e
def test_sdist_carries_the_pins_and_no_precompiled_files(st_build: ExampleBuild) -> None:
    with zipfile.ZipFile(st_build.wheel) as wheel:
        wheel_requires = _requires(wheel.read(f"{DIST_INFO}/METADATA"))
    with tarfile.open(st_build.sdist) as sdist:
        pkg_info = sdist.extractfile("example_st-0.1.0/PKG-INFO").read()
        egg_info = sdist.extractfile("example_st-0.1.0/src/example_st.egg-info/PKG-INFO").read()
        names = sdist.getnames()
    assert _requires(pkg_info) == wheel_requires and wheel_requires == [TORCH_PIN]
    assert egg_info == pkg_info
    assert [n for n in names if "_precompiled" in n or n.endswith((".bin", ".so", ".safetensors"))] == []
    assert "precompile: mlp: done in" in st_build.log


# Runs in a fresh process: the compiled MLP against the eager module from the same
# factory at several batch sizes; a fallback to eager is an error.
COMPARE_WITH_EAGER = """
import json, sys, warnings, torch
from example_st import load_compiled, _precompiled
warnings.simplefilter("error", _precompiled.PrecompiledFallbackWarning)
mlp = load_compiled("mlp")
from example_st.model import build_mlp
eager = build_mlp()
generator = torch.Generator().manual_seed(0)
shapes = {}
for batch in (1, 7, 64):
    features = torch.randn(batch, 32, generator=generator)
    out = mlp(features)
    with torch.no_grad():
        torch.testing.assert_close(out, eager(features), rtol=1e-4, atol=1e-5)
    shapes[batch] = list(out.shape)
compiler = sorted(m for m in ("torch._inductor", "torch._dynamo") if m in sys.modules)
print(json.dumps({"repr": repr(mlp), "shapes": shapes, "compiler": compiler}))
"""


@pytest.mark.e2e
@pytest.mark.parametrize(("form", "loaded"), [("auto", "mlp/cpu_avx2_cpp.so"), ("lean", "mlp/cpu_avx2.py"), ("artifact", "mlp/cpu_avx2.bin")])
def test_installed_wheel_loads_the_compiled_mlp_with_no_compiler(st_venv: Venv, tmp_path: Path, form: str, loaded: str) -> None:
    report = json.loads(st_venv.script(COMPARE_WITH_EAGER, env=no_compiler_env(tmp_path, HATCH_PRECOMPILE_FORM=form)).stdout)
    assert not (tmp_path / "compiler-used").exists()
    assert report["repr"] == f"<compiled model 'mlp' from {loaded}>"
    assert report["shapes"] == {"1": [1, 8], "7": [7, 8], "64": [64, 8]}
    if form != "artifact":
        assert report["compiler"] == []


# The hooks a frontend calls, in a subprocess of this environment (no isolation):
# pip's order, prepared metadata first, then the wheel with that metadata.
HOOKS = """
import os, sys
from pyproject_hooks import BuildBackendHookCaller
project, out, hook = sys.argv[1:4]
hooks = BuildBackendHookCaller(project, "hatch_precompile.setuptools_backend")
if hook == "wheel":
    os.makedirs(out + "/metadata")
    name = hooks.prepare_metadata_for_build_wheel(out + "/metadata")
    print(hooks.build_wheel(out, metadata_directory=f"{out}/metadata/{name}"))
else:
    print(hooks.build_editable(out))
"""


@pytest.mark.e2e
def test_direct_build_without_isolation_and_with_prepared_metadata_is_byte_identical(st_build: ExampleBuild, tmp_path: Path) -> None:
    """The project built in place, in this environment, the way pip calls the
    hooks, equals the isolated sdist -> wheel build to the byte. Both use the same
    setuptools (what the isolated build installed), so that WHEEL's Generator
    line agrees; the build cache this session shares gives the same artifacts."""
    with zipfile.ZipFile(st_build.wheel) as wheel:
        generator = next(line for line in wheel.read(f"{DIST_INFO}/WHEEL").decode().splitlines() if line.startswith("Generator:"))
    isolated_setuptools = re.fullmatch(r"Generator: setuptools \((.+)\)", generator).group(1)
    env = dict(os.environ)
    if isolated_setuptools != version("setuptools"):
        target = tmp_path / "setuptools"
        run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), f"setuptools=={isolated_setuptools}"])
        env["PYTHONPATH"] = str(target)
    project = copy_example(tmp_path / "elsewhere")
    out = tmp_path / "out"
    name = run([sys.executable, "-c", HOOKS, str(project), str(out), "wheel"], env=env).stdout.split()[-1]
    wheel = out / name
    assert name == st_build.wheel.name
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(f"{DIST_INFO}/METADATA") == (out / "metadata" / DIST_INFO / "METADATA").read_bytes()
        with zipfile.ZipFile(st_build.wheel) as reference:
            assert archive.namelist() == reference.namelist()
            assert [n for n in reference.namelist() if archive.read(n) != reference.read(n)] == []
    assert wheel.read_bytes() == st_build.wheel.read_bytes()


FALLBACK_CHECK = """
import warnings, torch
from example_st import load_compiled, _precompiled
from example_st.model import build_mlp
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mlp = load_compiled("mlp")
features = torch.randn(3, 32)
with torch.no_grad():
    torch.testing.assert_close(mlp(features), build_mlp()(features))
fallbacks = [w for w in caught if issubclass(w.category, _precompiled.PrecompiledFallbackWarning)]
print(len(fallbacks))
print(fallbacks[0].message)
"""


@pytest.mark.e2e
def test_a_configuration_error_ends_the_build_with_the_message_alone(tmp_path: Path) -> None:
    project = copy_example(tmp_path)
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('fallback = "eager"', 'fallback = "eager"\njobs = 0'))
    result = run([sys.executable, "-m", "build", "--wheel", "--no-isolation", str(project)], check=False)
    assert result.returncode != 0
    assert "tool.hatch.build.hooks.precompile.jobs: expected an integer >= 1, found 0" in result.stderr + result.stdout
    assert_said_plainly(result.stdout + result.stderr)


@pytest.mark.e2e
def test_editable_install_writes_the_loader_and_falls_back(torch_venv: Venv, tmp_path: Path) -> None:
    project = copy_example(tmp_path)
    out = tmp_path / "out"
    name = run([sys.executable, "-c", HOOKS, str(project), str(out), "editable"]).stdout.split()[-1]
    assert sorted(p.name for p in (project / "src/example_st/_precompiled").iterdir()) == sorted(RUNTIME_FILES)
    with zipfile.ZipFile(out / name) as editable:
        assert not any("_precompiled" in n for n in editable.namelist())
        requires = _requires(editable.read(f"{DIST_INFO}/METADATA"))
    assert requires == [TORCH_PIN]
    torch_venv.pip("--no-deps", str(out / name))
    count, message = torch_venv.script(FALLBACK_CHECK, cwd=tmp_path).stdout.split("\n", 1)
    assert count == "1" and "no compiled artifacts next to" in message and str(project) in message


# --- fast: the rewrite on hand-made inputs -----------------------------------------

PINS = ["torch==2.13.0", "safetensors>=0.4"]


def test_metadata_gets_each_pin_once_among_the_unconditional_requirements() -> None:
    with_extras = b'Metadata-Version: 2.4\nName: p\nVersion: 1\nRequires-Dist: numpy\nProvides-Extra: dev\nRequires-Dist: pytest; extra == "dev"\n\n# p\n\nText.\n'
    assert with_requirements(with_extras, PINS) == (
        b"Metadata-Version: 2.4\nName: p\nVersion: 1\nRequires-Dist: numpy\nRequires-Dist: torch==2.13.0\n"
        b'Requires-Dist: safetensors>=0.4\nProvides-Extra: dev\nRequires-Dist: pytest; extra == "dev"\n\n# p\n\nText.\n'
    )
    no_description = b"Metadata-Version: 2.4\nName: p\nVersion: 1\nRequires-Dist: safetensors >= 0.4\n"
    once = with_requirements(no_description, PINS)
    assert once == no_description + b"Requires-Dist: torch==2.13.0\n"
    assert with_requirements(once, PINS) == once


def _fake_setuptools_wheel(folder: Path) -> Path:
    """What setuptools makes of a project whose source tree holds a loader and a stale compiled file."""
    folder.mkdir()
    wheel = folder / "p-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("p/__init__.py", "from ._precompiled import load_compiled\n")
        archive.writestr("p/_precompiled/__init__.py", "# an older loader\n")
        archive.writestr("p/_precompiled/manifest.json", "{}")  # left by something else: must not ship
        archive.writestr("p-1.0.dist-info/METADATA", "Metadata-Version: 2.4\nName: p\nVersion: 1.0\n")
        archive.writestr("p-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: setuptools (84.0.0)\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr("p-1.0.dist-info/RECORD", "stale\n")
    return wheel


def test_rewritten_wheel_holds_exactly_the_staged_precompiled_files_and_is_reproducible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    staged = tmp_path / "staged"
    (staged / "m" / "kernels").mkdir(parents=True)
    files = {}
    for name, data in {"__init__.py": b"# the loader\n", "manifest.json": b'{"models": {}}\n', "m/kernels/k_1.so": b"\x7fELF"}.items():
        (staged / name).write_bytes(data)
        files[str(staged / name)] = f"p/_precompiled/{name}"
    tag = "cp311-cp311-manylinux_2_28_x86_64"
    names = []
    for i in (1, 2):
        for path in files:  # other times on disk, same wheel
            os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
        built = _fake_setuptools_wheel(tmp_path / f"built{i}")
        names.append(rewrite_wheel(built, tmp_path / f"out{i}", PINS, replace="p/_precompiled/", files=files, tag=tag))
    assert names == [f"p-1.0-{tag}.whl"] * 2
    first, second = tmp_path / "out1" / names[0], tmp_path / "out2" / names[1]
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as wheel:
        assert wheel.namelist() == [
            "p/__init__.py",
            "p/_precompiled/__init__.py",
            "p/_precompiled/m/kernels/k_1.so",
            "p/_precompiled/manifest.json",
            "p-1.0.dist-info/METADATA",
            "p-1.0.dist-info/WHEEL",
            "p-1.0.dist-info/RECORD",
        ]
        assert wheel.read("p/_precompiled/__init__.py") == b"# the loader\n"
        assert wheel.read("p-1.0.dist-info/WHEEL").decode().splitlines()[2:] == ["Root-Is-Purelib: false", f"Tag: {tag}"]
        assert _requires(wheel.read("p-1.0.dist-info/METADATA")) == sorted(PINS)
        assert {info.date_time for info in wheel.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        assert {info.external_attr >> 16 for info in wheel.infolist()} == {0o100644}
        rows = list(csv.reader(io.StringIO(wheel.read("p-1.0.dist-info/RECORD").decode())))
        assert [row[0] for row in rows] == wheel.namelist()
        for path, digest, size in rows[:-1]:
            data = wheel.read(path)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)


def test_the_tables_hatchling_keys_become_build_requirements(tmp_path: Path) -> None:
    from hatch_precompile.backend.setuptools_backend import _table_build_requirements
    from hatch_precompile.engine.config import ConfigError

    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "p"\nversion = "1"\ndependencies = ["transformers>=4"]\n'
        '[project.optional-dependencies]\nfast = ["accelerate"]\n'
        '[tool.hatch.build.hooks.precompile]\ndependencies = ["numpy"]\n'
        'require-runtime-dependencies = true\nrequire-runtime-features = ["fast"]\n'
    )
    assert _table_build_requirements(tmp_path) == ["numpy", "transformers>=4", "accelerate"]
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "p"\nversion = "1"\ndynamic = ["dependencies"]\n[tool.hatch.build.hooks.precompile]\nrequire-runtime-dependencies = true\nrequire-runtime-features = ["gpu"]\n'
    )
    with pytest.raises(ConfigError) as error:
        _table_build_requirements(tmp_path)
    assert len(error.value.problems) == 2 and "dependencies are dynamic" in error.value.problems[0] and "'gpu'" in error.value.problems[1]
