"""Reading and verifying the manifest, and what this process is: its torch,
Python, CPU and C/C++ runtimes, as the manifest's records are compared with
(`_choice.py` chooses what to load from these).

Nothing here loads native code or unpickles anything.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import platform
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import PrecompiledIntegrityError, PrecompiledModelError
from ._layout import BUILD_MODULE, MANIFEST_FILE
from ._schema import BuiltWith, Manifest, NativeNeeds, SourceModel, TorchAndPython

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / MANIFEST_FILE
MANIFEST_FORMAT = 7  # 4: weights carry per-chunk checksums of row sums; 5: kernels are stable-ABI extensions; 6: int8 variants; 7: state
CONFIG_TABLE = ("tool", "hatch", "build", "hooks", "precompile")  # where pyproject.toml declares the models

CPU_TARGET_VARIABLE = "HATCH_PRECOMPILE_CPU_TARGET"  # force one CPU target (if the CPU can run it)
FALLBACK_VARIABLE = "HATCH_PRECOMPILE_FALLBACK"  # "eager" or "error" for the whole process

# torch.backends.cpu.get_cpu_capability() levels, lowest first; it honours a user's
# ATEN_CPU_CAPABILITY downgrade, so a variant above it is never picked.
ATEN_LEVELS = ("DEFAULT", "AVX2", "AVX512")


def fallback_policy(requested: str | None, model: SourceModel) -> str:
    policy = requested or os.environ.get(FALLBACK_VARIABLE) or model["fallback"]
    if policy not in ("eager", "error"):
        source = "the fallback argument" if requested else FALLBACK_VARIABLE
        raise ValueError(f"{source} must be 'eager' or 'error', got {policy!r}")
    return policy


def unavailable(name: str, reason: str) -> str:
    return f"model {name!r}: {reason}. Build and install a wheel with the hatch-precompile hook (`hatch build`, `python -m build`, `pip wheel .`) using the torch and Python you deploy with."


def read_manifest() -> Manifest | None:
    """The manifest, checked against the digest in the generated `_build` module."""
    try:
        data = MANIFEST.read_bytes()
    except FileNotFoundError:
        return None
    try:
        from ._build import MANIFEST_SHA256
    except ImportError:
        raise PrecompiledIntegrityError(f"{MANIFEST} is present but {HERE / BUILD_MODULE} is not: the install is damaged") from None
    return checked_manifest(data, MANIFEST_SHA256, MANIFEST)


def checked_manifest(data: bytes, expected_sha256: str, where: Path | str) -> Manifest:
    """A manifest's bytes, parsed after checking them against the digest the build
    recorded and checking their format. (`hatch-precompile verify` calls this on a
    wheel's manifest; `where` names the file in messages.)"""
    if hashlib.sha256(data).hexdigest() != expected_sha256:
        raise PrecompiledIntegrityError(f"{where} does not match the digest the build recorded: it was modified")
    manifest: Manifest = json.loads(data)
    if manifest.get("format") != MANIFEST_FORMAT:
        raise PrecompiledModelError(f"{where} has format {manifest.get('format')!r}; this loader reads format {MANIFEST_FORMAT}")
    return manifest


@dataclass(frozen=True)
class InstalledTorch:
    """The torch `import torch` would import here, read from its files alone."""

    version: str  # "2.13.0+cpu"
    git_version: str
    libraries: Path  # its lib/ folder: libtorch_cpu.so and the rest


class TorchMissing(ImportError):
    """No torch is installed where this Python imports from."""


@functools.cache
def installed_torch() -> InstalledTorch:
    """The installed torch's version and git revision, from its `version.py`, and
    its libraries' folder, without importing it: where torch is imported this
    reads the same file its `torch.version` came from."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise TorchMissing("torch is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    try:
        source = (folder / "version.py").read_text(encoding="utf-8")
    except OSError as error:
        raise TorchMissing(f"torch at {folder} has no readable version.py ({error})") from None
    found = dict(re.findall(r"^(__version__|git_version)(?:: *str)? *= *'([^']*)'", source, re.MULTILINE))
    if len(found) != 2:
        raise TorchMissing(f"torch at {folder}: its version.py does not say __version__ and git_version")
    return InstalledTorch(found["__version__"], found["git_version"], folder / "lib")


def torch_and_python() -> TorchAndPython:
    """This process's torch build and Python, in the form an artifact's `built_with`
    records them: the build calls this too (worker/key.py), so that the two sides
    compare the same strings."""
    torch = installed_torch()
    return {
        "torch": torch.version,
        "torch_git": torch.git_version,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "platform": sysconfig.get_platform(),
    }


# /proc/cpuinfo's flag for each feature name torch.cpu.get_capabilities() gives,
# for the names a CPU target or a variant can need (tests/test_torch_assumptions.py
# holds the two equal on the machine that runs it).
CPUINFO_FLAGS = {
    "avx": "avx", "avx2": "avx2", "bmi": "bmi1", "bmi2": "bmi2", "f16c": "f16c", "fma3": "fma", "lzcnt": "abm",
    "avx512_f": "avx512f", "avx512_bw": "avx512bw", "avx512_cd": "avx512cd", "avx512_dq": "avx512dq", "avx512_vl": "avx512vl",
    "avx512_vnni": "avx512_vnni", "avx512_bf16": "avx512_bf16", "avx512_fp16": "avx512_fp16", "avx_vnni": "avx_vnni",
    "amx_tile": "amx_tile", "amx_bf16": "amx_bf16", "amx_int8": "amx_int8", "amx_fp16": "amx_fp16",
}  # fmt: skip


@functools.cache
def cpu_features() -> frozenset[str]:
    """The features this process's CPU has, by torch's names ("avx512_vnni", ...):
    what an artifact's `cpu_features` are compared with (the build asks this too).
    On x86-64 Linux read from /proc/cpuinfo, without importing torch; elsewhere
    torch's own `torch.cpu.get_capabilities()`."""
    flags = _cpuinfo_flags()
    if flags is not None:
        return frozenset(name for name, flag in CPUINFO_FLAGS.items() if flag in flags)
    import torch

    return frozenset(name for name, present in torch.cpu.get_capabilities().items() if present is True)


def _cpuinfo_flags() -> set[str] | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((line for line in info.splitlines() if line.startswith("flags")), None)
    return None if line is None else set(line.partition(":")[2].split())


def aten_capability(features: frozenset[str]) -> str:
    """The level of ATen kernels torch runs on this CPU, by torch's own rule
    (aten/src/ATen/native/DispatchStub.cpp, `compute_cpu_capability`):
    $ATEN_CPU_CAPABILITY where set, else AVX512 with AVX512-VL, -BW, -DQ and FMA,
    AVX2 with AVX2 and FMA, else DEFAULT. Read without importing torch
    (tests/test_torch_assumptions.py holds it equal to torch's answer)."""
    forced = {"default": "DEFAULT", "avx2": "AVX2", "avx512": "AVX512"}.get(os.environ.get("ATEN_CPU_CAPABILITY", ""))
    if forced is not None:
        return forced
    if {"avx512_vl", "avx512_bw", "avx512_dq", "fma3"} <= features:
        return "AVX512"
    if {"avx2", "fma3"} <= features:
        return "AVX2"
    return "DEFAULT"


# The features with which oneDNN multiplies int8 without saturating: without them it
# adds pairs of uint8 x int8 products into 16 bits (vpmaddubsw), which saturate.
VNNI = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


class RunningEnvironment(TorchAndPython):
    """What the loader compares a variant with: this process's torch and Python, and its CPU."""

    cpu_features: frozenset[str]
    aten_capability: str  # the level of the ATen kernels torch runs here ("AVX512", ...)


def running_environment() -> RunningEnvironment:
    """This process, as the loader sees it (`hatch-precompile verify` shows it
    too), read without importing torch."""
    features = cpu_features()
    return {**process_torch_and_python(), "cpu_features": features, "aten_capability": aten_capability(features)}


def process_torch_and_python() -> TorchAndPython:
    """`torch_and_python()`, with torch "" where none is installed: a torch-free
    form runs there, and every other form says that torch is missing."""
    try:
        return torch_and_python()
    except TorchMissing:
        return {"torch": "", "torch_git": "", "python": f"{sys.version_info.major}.{sys.version_info.minor}", "platform": sysconfig.get_platform()}


def native_problems(native: NativeNeeds) -> list[str]:
    """What the kernels need from the system (recorded by the build from their ELF
    files) that this system lacks: a newer glibc, or a libstdc++ without a symbol
    version they use. Decided before any kernel is loaded."""
    problems = []
    glibc = running_glibc()
    if native["glibc"] and (glibc is None or version_numbers(glibc) < version_numbers(native["glibc"])):
        problems.append(f"its kernels need glibc {native['glibc']}, this system has {glibc or 'no glibc'}")
    lacking = _libstdcxx_lacking(native["glibcxx"]) if native["glibcxx"] else None
    if lacking is not None:
        problems.append(f"its kernels need libstdc++ with GLIBCXX_{native['glibcxx']}, the loaded {lacking} lacks it")
    return problems


@functools.cache
def _libstdcxx_lacking(version: str) -> Path | None:
    """The loaded libstdc++ if it does not define GLIBCXX_<version>, else None (also
    when none is found). Cached: every model and CPU target asks, and the library
    a process has loaded does not change."""
    library = _loaded_libstdcxx()
    if library is not None and f"GLIBCXX_{version}\0".encode() not in library.read_bytes():
        return library
    return None


def same_torch_release(built: BuiltWith, here: TorchAndPython) -> list[str]:
    """How this torch differs from the one a variant was built with, where code
    linked against its libtorch needs the same release and git revision (aten's
    op signatures and C shim) and runs under any build of it (+cpu, CUDA: the
    local label)."""
    if not here["torch"]:
        return [f"torch is not installed (pip install torch=={release(built['torch'])})"]
    found = [] if release(built["torch"]) == release(here["torch"]) else ["torch differs"]
    if built["torch_git"] != here["torch_git"]:
        found.append("torch_git differs")
    return found


def release(torch_version: str) -> str:
    """A torch version without its local label: '2.13.0+cpu' -> '2.13.0'."""
    return torch_version.split("+")[0]


def version_numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def running_glibc() -> str | None:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")[2] or None  # "glibc 2.36"
    except (ValueError, OSError):
        return None


def _loaded_libstdcxx() -> Path | None:
    """The libstdc++ this process has loaded (torch loads it), from /proc/self/maps;
    where none is loaded yet (a process that has not loaded torch's libraries),
    the one the dynamic loader gives torch's, loaded now."""
    found = _mapped_libstdcxx()
    if found is None:
        import ctypes

        try:
            ctypes.CDLL("libstdc++.so.6")
        except OSError:
            return None
        found = _mapped_libstdcxx()
    return found


def _mapped_libstdcxx() -> Path | None:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1]
        if "/libstdc++.so" in path:
            return Path(path)
    return None


def aten_level(capability: str) -> int:
    return ATEN_LEVELS.index(capability) if capability in ATEN_LEVELS else 0


def model_from_source_config(name: str) -> SourceModel:
    """In a source checkout: the model's factory, dtype and fallback, read from the
    pyproject.toml above this file (an eager fallback returns the module's own outputs)."""
    for directory in HERE.parents:
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file():
            import tomllib

            table: Any = tomllib.loads(pyproject.read_text(encoding="utf-8"))
            for key in CONFIG_TABLE:
                table = table.get(key, {})
            models = table.get("models", {})
            if not models:
                break  # the nearest project is not one that uses hatch-precompile
            if name not in models:
                known = ", ".join(sorted(models)) or "none"
                raise KeyError(f"no model named {name!r} in {pyproject} (models: {known})")
            config = models[name]
            return {
                "factory": config["factory"],
                "dtype": config.get("dtype"),
                "fallback": config.get("fallback", table.get("fallback", "eager")),
            }
    raise PrecompiledModelError(f"model {name!r}: no manifest.json next to {HERE} and no pyproject.toml above it: this package was built without the hatch-precompile hook")
