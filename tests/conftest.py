"""Shared fixtures: the plugin's wheel, the example project's wheel and sdist
(built once per session with the real hook), and fresh virtual environments.

Environments get torch the way a user's would: by resolving the wheel's
`torch==X` pin, with uv as the installer (for fresh environments and for
`python -m build --installer=uv`'s isolated builds). uv links torch from its
cache, where pip unpacks its gigabytes again for every environment; it is told
the wheel folders pip's environment names (`PIP_FIND_LINKS` as `UV_FIND_LINKS`:
this machine's local CPU build of torch). Nothing here mocks torch or hatchling.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from uv import find_uv_bin

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "example_project"


UV = find_uv_bin()


def pytest_configure(config: pytest.Config) -> None:
    """Builds in this session share a build cache of their own, never the user's;
    tests that need cold compiles turn it off. uv finds what pip would."""
    if os.environ.get("PIP_FIND_LINKS") and "UV_FIND_LINKS" not in os.environ:
        os.environ["UV_FIND_LINKS"] = ",".join(os.environ["PIP_FIND_LINKS"].split())
    if "HATCH_PRECOMPILE_BUILD_CACHE" not in os.environ:
        os.environ["HATCH_PRECOMPILE_BUILD_CACHE"] = tempfile.mkdtemp(prefix="hatch-precompile-test-cache-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop("HATCH_PRECOMPILE_BUILD_CACHE"), ignore_errors=True))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=0,
        metavar="N",
        help="list the N tests that used the most CPU (this process and the ones it waited for): CI runs three pytest processes on two cores, where wall-clock durations say more about the neighbours",
    )


CPU_SPENT = pytest.StashKey[dict[str, float]]()


def _cpu_seconds() -> float:
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown together: a module fixture's cost lands on its first test."""
    start = _cpu_seconds()
    yield
    item.config.stash.setdefault(CPU_SPENT, {})[item.nodeid] = _cpu_seconds() - start


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    count = config.getoption("--cpu-durations")
    spent = config.stash.get(CPU_SPENT, {})
    if not count or not spent:
        return
    terminalreporter.section(f"most CPU: {count} tests of {sum(spent.values()) / 60:.1f} CPU-minutes in all")
    for nodeid, seconds in sorted(spent.items(), key=lambda kv: -kv[1])[:count]:
        terminalreporter.write_line(f"{seconds:8.1f}s {nodeid}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The architecture battery last, where one process runs it with the rest
    (`./dev.sh test ARGS`): it keeps both cores busy on its own. (`./dev.sh test`
    runs it, with the tests that build projects of their own, in a second
    process beside the rest and the release legs.)"""
    items.sort(key=lambda item: item.path.name == "test_battery.py")


def run(command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{command} exited {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")
    return result


def with_find_links(*folders: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment with extra wheel folders for pip (PIP_FIND_LINKS) and uv (UV_FIND_LINKS)."""
    env = dict(base or os.environ)
    pip_links = " ".join([*map(str, folders), env.get("PIP_FIND_LINKS", "")]).strip()
    env["PIP_FIND_LINKS"] = pip_links
    env["UV_FIND_LINKS"] = ",".join(pip_links.split())
    return env


def session_compiler_outputs() -> Path:
    """The session build cache's C++ compiler outputs (the precompiled header,
    inductor's vector-ISA probes: one set per torch and compiler, about 20 s of
    CPU to make), which the session's builds make once and keep."""
    shared = Path(os.environ["HATCH_PRECOMPILE_BUILD_CACHE"]) / "compiler"
    shared.mkdir(parents=True, exist_ok=True)
    return shared


def sharing_compiler_outputs(cache: Path) -> Path:
    """`cache`, a new build cache whose artifacts start empty but whose compiler
    outputs are the session cache's: for tests about artifacts, which need not
    build those again."""
    shared = session_compiler_outputs()
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "compiler").symlink_to(shared, target_is_directory=True)
    return cache


def no_compiler_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No C++ compiler reachable (every name is a trap that records its use), and
    empty private and inductor caches."""
    traps = tmp_path / "traps"
    traps.mkdir(exist_ok=True)
    for name in ("g++", "gcc", "c++", "cc", "clang", "clang++"):
        trap = traps / name
        trap.write_text(f"#!/bin/sh\necho {name} >> {tmp_path / 'compiler-used'}\nexit 1\n")
        trap.chmod(0o755)
    env = {
        "PATH": f"{traps}:/usr/bin:/bin",
        "CXX": str(traps / "c++"),
        "CC": str(traps / "cc"),
        "HOME": str(tmp_path / "home"),
        "HATCH_PRECOMPILE_CACHE_DIR": str(tmp_path / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    return {**env, **extra}


def write_project(root: Path, package: str, models: str, precompile_toml: str, *, jobs: int = 1, cpp_form: bool = False) -> Path:
    """A src-layout project distributing `package`, whose `models.py` is `models` and
    whose pyproject.toml ends with the precompile table's body `precompile_toml`.
    Set up as the README recommends: `__init__.py` imports the loader, which no
    one has written (the build writes it), and `.gitignore` keeps it out of git.

    Its models build no C++ form unless they say `cpp-form = true` (or the
    test passes `cpp_form`): the table's `cpp-form = false`, since AOTInductor's
    compile costs 6-25 s of CI's two cores per variant, and the tests of the
    C++ form and the NumPy path ask for it where they need it.

    It builds with `jobs` workers, one unless a test is about parallel builds:
    each worker spends about 4 s of CPU importing torch and inductor before its
    first model (with Python's bytecode cache, which dev.sh keeps on), which on
    CI's two cores costs more than it saves."""
    project = root / "project"
    source = project / "src" / package
    source.mkdir(parents=True)
    (source / "__init__.py").write_text("from ._precompiled import load_compiled\n")
    (source / "models.py").write_text(models)
    header = (
        f'[build-system]\nrequires = ["hatchling", "hatch-precompile"]\nbuild-backend = "hatchling.build"\n\n[project]\nname = "{package}"\nversion = "1.0"\n\n'
        f"[tool.hatch.build.hooks.precompile]\njobs = {jobs}\ncpp-form = {str(cpp_form).lower()}\n"
    )
    (project / "pyproject.toml").write_text(header + textwrap.dedent(precompile_toml))
    (project / ".gitignore").write_text("_precompiled/\n")
    return project


def build_wheel(project: Path) -> Path:
    """`python -m build --wheel` without isolation: the hook is this checkout's."""
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", str(project)])
    (wheel,) = (project / "dist").glob("*.whl")
    return wheel


def reseal(manifest_path: Path, manifest: dict) -> None:
    """Rewrite an installed manifest and the digest the loader checks it against,
    as a consistent (if wrong) build would have written them."""
    data = json.dumps(manifest).encode()
    manifest_path.write_bytes(data)
    (manifest_path.parent / "_build.py").write_text(f'MANIFEST_SHA256 = "{hashlib.sha256(data).hexdigest()}"\n')


DEFAULT_RELEASE = "2.13.0"  # this repository's default torch (dev.sh's DEFAULT_TORCH), which the example pins


def release_under_test() -> str:
    import torch

    return torch.__version__.split("+")[0]


def on_a_release_leg() -> bool:
    """Whether this session runs under another supported torch release than the
    default (`./dev.sh leg RELEASE`), where only the release-marked tests run."""
    return release_under_test() != DEFAULT_RELEASE


def pin_build_torch(pyproject: Path) -> None:
    """Pin the example's build requirement to the torch release under test (the
    example pins the default release; a release leg runs another)."""
    text = pyproject.read_text()
    assert f'"torch=={DEFAULT_RELEASE}"' in text, "the example's build requirement changed: update pin_build_torch"
    pyproject.write_text(text.replace(f'"torch=={DEFAULT_RELEASE}"', f'"torch=={release_under_test()}"'))


@dataclass
class Venv:
    path: Path
    install_env: dict[str, str] | None = None  # the environment installs run in (None: this process's)

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def pip(self, *args: str, env: dict[str, str] | None = None) -> None:
        """`pip install ARGS` into this environment, done by uv (`uv pip install`)."""
        run([UV, "pip", "install", "--quiet", "--python", self.python, *args], env=env or self.install_env)

    def script(self, code: str, *, cwd: Path | None = None, env: dict[str, str] | None = None, check: bool = True, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        """Run `code` in a fresh interpreter of this environment."""
        return run([self.python, *options, "-c", code], cwd=cwd or self.path, env=env, check=check)


def make_venv(path: Path) -> Venv:
    run([UV, "venv", "--quiet", "--python", sys.executable, str(path)])
    return Venv(path)


def find_python(version: str) -> str:
    """An interpreter of CPython `version` ("3.13"): pyenv's (whose shims answer
    only for the versions a project selects), else the one uv finds or fetches."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    installed = sorted(root.glob(f"versions/{version}.*/bin/python{version}"))
    return str(installed[-1]) if installed else version


def pypi_venv(path: Path, python: str) -> Venv:
    """A fresh environment of CPython `python` ("3.13", see `find_python`) whose
    installs come from PyPI alone: not from this machine's wheel folders
    (PIP_FIND_LINKS), whose CPU build of torch is for one Python. So a
    `torch==X` pin resolves as on a user's Linux machine, to PyPI's CUDA build."""
    run([UV, "venv", "--quiet", "--python", find_python(python), str(path)])
    return Venv(path, {name: value for name, value in os.environ.items() if name not in ("PIP_FIND_LINKS", "UV_FIND_LINKS")})


def isolated_build(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m build ARGS` with build isolation, as a user would, uv installing
    the build environment."""
    return run([sys.executable, "-m", "build", "--installer=uv", *args], env=env)


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding this checkout's hatch-precompile wheel, for build frontends to find.
    Its path is new to every session: uv caches a find-links folder's wheels under
    the folder's path, so a path an earlier session used (pytest numbers its
    folders from 0 again once they are removed) gave builds that session's plugin."""
    folder = Path(tempfile.mkdtemp(prefix="wheelhouse-", dir=tmp_path_factory.getbasetemp()))
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(folder), str(REPO)])
    return folder


@dataclass
class ExampleBuild:
    sdist: Path
    wheel: Path
    log: str


@pytest.fixture(scope="session")
def example_build(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> ExampleBuild:
    """`python -m build` of the example project, with build isolation: sdist, then wheel from the sdist."""
    project = tmp_path_factory.mktemp("example") / "example_project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("dist", "__pycache__"))
    pin_build_torch(project / "pyproject.toml")
    return build_sdist_and_wheel(project, wheelhouse)


def build_sdist_and_wheel(project: Path, wheelhouse: Path) -> ExampleBuild:
    """`python -m build` with isolation, as a user would: the sdist, then the wheel
    from it; this checkout's hatch-precompile comes from `wheelhouse`."""
    result = isolated_build(str(project), env=with_find_links(wheelhouse))
    (sdist,) = (project / "dist").glob("*.tar.gz")
    (wheel,) = (project / "dist").glob("*.whl")
    return ExampleBuild(sdist, wheel, result.stdout + result.stderr)


def deploy(wheel: Path, folder: Path) -> Venv:
    """A fresh environment at `folder` with only `wheel` and what its metadata requires."""
    env = make_venv(folder)
    env.pip(str(wheel))
    return env


@pytest.fixture(scope="session")
def deploy_venv(tmp_path_factory: pytest.TempPathFactory, example_build: ExampleBuild) -> Venv:
    """A fresh environment with only the example wheel and what its metadata requires."""
    return deploy(example_build.wheel, tmp_path_factory.mktemp("deploy") / "venv")


@pytest.fixture(scope="session")
def torch_venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh environment with the dev environment's torch and nothing of ours."""
    import torch

    env = make_venv(tmp_path_factory.mktemp("torch-only") / "venv")
    env.pip(f"torch=={torch.__version__.split('+')[0]}", "safetensors")
    return env


# What a frontend prints when a backend raises: the stack of its own machinery.
FRONTEND_FRAMES = ("_in_process.py", "hatchling/builders", "site-packages/setuptools/build_meta.py", "hatch_precompile/backend/")


def assert_said_plainly(output: str) -> None:
    """An expected failure shows the plugin's message, not the frames of the
    frontend, hatchling and the plugin's backend above it."""
    assert not [frame for frame in FRONTEND_FRAMES if frame in output], output[-3000:]
    assert "hatch-precompile: " in output and "an unexpected error" not in output
