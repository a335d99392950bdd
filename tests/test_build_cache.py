"""Builds that scale: the build cache, parallel workers, and parts compiled apart.

One small project with two models is built several ways through a real frontend
(`python -m build`, no isolation, so the hook is this checkout's); every way must
give a `_precompiled/` byte-identical to a cold build that compiles everything in
one worker at a time.
"""

from __future__ import annotations

import os
import shutil
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from hatch_precompile.engine.assemble import RUNTIME_FILES

from conftest import run, sharing_compiler_outputs, write_project

pytestmark = [pytest.mark.e2e, pytest.mark.standalone]

MODELS = """
import torch
from torch import nn


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.linear(x)) + OFFSET


class Doubler(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 2


OFFSET = 0.5


def affine():
    return Affine()


def doubler():
    return Doubler()
"""

TABLE = """
[tool.hatch.build.hooks.precompile.models.affine]
factory = "twomodels.models:affine"
inputs = [{ shape = ["batch", 8] }]
dims = { batch = { min = 1, max = 16 } }

[tool.hatch.build.hooks.precompile.models.doubler]
factory = "twomodels.models:doubler"
inputs = [{ shape = ["batch", 8] }]
dims = { batch = { min = 1, max = 16 } }
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_project(tmp_path_factory.mktemp("two"), "twomodels", MODELS, TABLE)


@dataclass(frozen=True)
class ColdBuild:
    log: str
    files: dict[str, bytes]  # its _precompiled/
    home: Path  # its XDG_CACHE_HOME, where the build cache would default to


@pytest.fixture(scope="module")
def cold(project: Path, tmp_path_factory: pytest.TempPathFactory) -> ColdBuild:
    """A cold build with the cache off, one worker at a time: the reference."""
    home = tmp_path_factory.mktemp("xdg-cache")
    log, files = build(project, tmp_path_factory.mktemp("reference"), cache="off", extra={"XDG_CACHE_HOME": str(home)})
    return ColdBuild(log, files, home)


@pytest.fixture(scope="module")
def reference(cold: ColdBuild) -> dict[str, bytes]:
    return cold.files


def build(
    project: Path,
    out: Path,
    *,
    cache: Path | str,
    jobs: str = "1",
    parts: list[Path] = (),
    check: bool = True,
    extra: dict[str, str] | None = None,
) -> tuple[str, dict[str, bytes]]:
    """Build the project's wheel into `out`; (the build's output, its `_precompiled/` files)."""
    env = {
        **os.environ,
        "HATCH_PRECOMPILE_BUILD_CACHE": str(cache),
        "HATCH_PRECOMPILE_JOBS": jobs,
        "HATCH_PRECOMPILE_PARTS": os.pathsep.join(map(str, parts)),
        **(extra or {}),
    }
    result = run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(project)], env=env, check=check)
    log = result.stdout + result.stderr
    wheels = list(out.glob("*.whl"))
    if not wheels:
        return log, {}
    with zipfile.ZipFile(wheels[0]) as wheel:
        return log, {n: wheel.read(n) for n in wheel.namelist() if "/_precompiled/" in n}


def compile_part(project: Path, out: Path, *args: str, check: bool = True) -> str:
    """`compile-part` with a build cache of no artifacts (so it compiles them all) and the session's compiler outputs."""
    cache = sharing_compiler_outputs(out.parent / f"{out.name}-cache")
    result = run(
        [sys.executable, "-m", "hatch_precompile", "compile-part", "--out", str(out), *args, str(project)],
        env={**os.environ, "HATCH_PRECOMPILE_BUILD_CACHE": str(cache)},
        check=check,
    )
    return result.stdout + result.stderr


def origins(log: str) -> dict[str, str]:
    """Per model, how its artifact was obtained: compiled, cached or part <folder>."""
    found = {}
    for line in log.splitlines():
        if line.startswith("precompile: ") and ": avx2 (dynamic dims): " in line:
            model, rest = line.removeprefix("precompile: ").split(": avx2 (dynamic dims): ")
            found[model] = rest.split(",")[0].split(": cpu_")[0]
    return found


def test_a_project_that_never_ran_init_builds_and_keeps_git_clean(project: Path, reference: dict[str, bytes]) -> None:
    """Its models.py imports the package, whose __init__.py imports the loader that
    no one wrote: the build writes it first, and the README's .gitignore line keeps
    it out of git (and out of the sdist)."""
    assert "twomodels/_precompiled/manifest.json" in reference
    generated = project / "src/twomodels/_precompiled"
    assert sorted(p.name for p in generated.iterdir() if p.suffix == ".py") == sorted(RUNTIME_FILES)
    run(["git", "init", "-q"], cwd=project)
    status = run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=project).stdout
    assert "_precompiled" not in status and "src/twomodels/models.py" in status


@dataclass(frozen=True)
class CachedBuild:
    log: str
    files: dict[str, bytes]
    cache: Path  # the build cache it filled


@pytest.fixture(scope="module")
def cached(project: Path, tmp_path_factory: pytest.TempPathFactory) -> CachedBuild:
    """A cold build into an empty build cache, two workers: the cache the tests
    below start from (each works on a copy of it)."""
    cache = sharing_compiler_outputs(tmp_path_factory.mktemp("filled") / "cache")
    log, files = build(project, tmp_path_factory.mktemp("cached-build"), cache=cache, jobs="2")
    return CachedBuild(log, files, cache)


def test_a_rebuild_recompiles_nothing_and_gives_the_same_files(project: Path, cached: CachedBuild, reference: dict[str, bytes], tmp_path: Path) -> None:
    assert origins(cached.log) == {"affine": "compiled", "doubler": "compiled"}
    assert cached.files == reference
    cache = tmp_path / "cache"
    shutil.copytree(cached.cache, cache, symlinks=True)  # the compiler outputs stay shared
    log, files = build(project, tmp_path / "warm", cache=cache)
    assert origins(log) == {"affine": "cached", "doubler": "cached"}
    assert "checked against eager" in log and "cpu_avx2.bin: lean form" in log  # still captured and checked
    assert files == reference

    # A damaged entry is a miss: compiled again, never shipped.
    (damaged,) = [p for p in cache.rglob("cpu_avx2.bin") if "tanh" in p.with_suffix(".py").read_text()]
    damaged.write_bytes(damaged.read_bytes()[:-10] + b"0123456789")
    log, files = build(project, tmp_path / "damaged", cache=cache)
    assert origins(log) == {"affine": "cached", "doubler": "compiled"}
    assert files == reference


def test_changing_one_model_recompiles_only_that_model(project: Path, cached: CachedBuild, tmp_path: Path) -> None:
    """In another folder, too: the cache keys hold no path of the project."""
    changed = tmp_path / "changed"
    shutil.copytree(project, changed)
    cache = tmp_path / "cache"
    shutil.copytree(cached.cache, cache, symlinks=True)  # the compiler outputs stay shared
    models = changed / "src/twomodels/models.py"
    models.write_text(models.read_text().replace("torch.tanh(x) * 2", "torch.sigmoid(x) * 2"))
    log, _ = build(changed, tmp_path / "second", cache=cache)
    assert origins(log) == {"affine": "cached", "doubler": "compiled"}


def test_the_cache_can_be_turned_off(cold: ColdBuild) -> None:
    assert origins(cold.log) == {"affine": "compiled", "doubler": "compiled"}
    assert list(cold.home.iterdir()) == []  # nothing written where the cache would be


@pytest.fixture(scope="module")
def parts(project: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """One part per model, each compiled by `compile-part` in its own folder."""
    root = tmp_path_factory.mktemp("parts")
    compile_part(project, root / "part-affine", "--models", "affine")
    compile_part(project, root / "part-doubler", "--models", "doubler", "--cpu-targets", "avx2")
    return [root / "part-affine", root / "part-doubler"]


def test_parts_compiled_apart_assemble_into_the_same_wheel(project: Path, parts: list[Path], reference: dict[str, bytes], tmp_path: Path) -> None:
    log, files = build(project, tmp_path / "out", cache="off", parts=parts)
    assert origins(log) == {"affine": f"part {parts[0]}", "doubler": f"part {parts[1]}"}
    assert files == reference

    # A part that holds only some models: the build compiles the rest.
    log, files = build(project, tmp_path / "partial", cache=sharing_compiler_outputs(tmp_path / "partial-cache"), parts=parts[:1])
    assert origins(log) == {"affine": f"part {parts[0]}", "doubler": "compiled"}
    assert files == reference


def test_a_part_from_another_model_or_configuration_is_refused(project: Path, parts: list[Path], tmp_path: Path) -> None:
    part = parts[0]  # affine's, for every target
    other = tmp_path / "other"
    shutil.copytree(project, other)

    models = other / "src/twomodels/models.py"
    models.write_text(models.read_text().replace("torch.relu(self.linear(x))", "torch.relu(self.linear(x) * 3)"))
    log, files = build(other, tmp_path / "changed-code", cache="off", parts=[part], check=False)
    assert files == {}
    assert "model 'affine' failed while taking cpu_avx2.bin from a part" in log
    assert f"part {part} holds cpu_avx2.bin, but the model this build captured differs from the one the part compiled" in log

    pyproject = other / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("min = 1, max = 16", "min = 2, max = 16"))
    log, files = build(other, tmp_path / "changed-config", cache="off", parts=[part], check=False)
    assert files == {}
    assert f"part {part}: model 'affine' was compiled from another configuration (tool.hatch.build.hooks.precompile.models.affine.dims differ)" in log


def test_compile_part_names_unknown_models_and_targets(project: Path, tmp_path: Path) -> None:
    result = run(
        [sys.executable, "-m", "hatch_precompile", "compile-part", "--out", str(tmp_path / "p"), "--models", "nope", "--cpu-targets", "sse9", str(project)],
        check=False,
    )
    assert result.returncode != 0
    assert "--models: 'nope' is not declared" in result.stderr
    assert not (tmp_path / "p").exists()
