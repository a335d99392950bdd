"""Reading the manifest, verifying shipped files, and choosing what to load here.

Everything in this module decides from the manifest alone: nothing is unpickled
and no native code is loaded for an artifact that does not fit this process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import PrecompiledIntegrityError, PrecompiledModelError
from ._layout import BUILD_MODULE, MANIFEST_FILE
from ._schema import ArtifactEntry, BuiltWith, Manifest, ModelEntry, NativeNeeds, SourceModel, TorchAndPython, has_cpp_form, has_lean_form, is_lean_only

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / MANIFEST_FILE
MANIFEST_FORMAT = 7  # 4: weights carry per-chunk checksums of row sums; 5: kernels are stable-ABI extensions; 6: int8 variants; 7: state
CONFIG_TABLE = ("tool", "hatch", "build", "hooks", "precompile")  # where pyproject.toml declares the models

CPU_TARGET_VARIABLE = "HATCH_PRECOMPILE_CPU_TARGET"  # force one CPU target (if the CPU can run it)
FALLBACK_VARIABLE = "HATCH_PRECOMPILE_FALLBACK"  # "eager" or "error" for the whole process
FORM_VARIABLE = "HATCH_PRECOMPILE_FORM"  # "auto" (default), "cpp", "lean" or "artifact"
FORMS = ("auto", "cpp", "lean", "artifact")

# torch.backends.cpu.get_cpu_capability() levels, lowest first; it honours a user's
# ATEN_CPU_CAPABILITY downgrade, so a variant above it is never picked.
ATEN_LEVELS = ("DEFAULT", "AVX2", "AVX512")


@dataclass(frozen=True)
class Choice:
    """One shipped shape variant and the form it loads in: "cpp" (AOTInductor's
    model container library), "lean" (the inductor output module and its
    kernels; neither imports the compiler) or "artifact" (the
    AOTCompiledArtifact, through torch._inductor)."""

    artifact: ArtifactEntry
    form: str

    @property
    def file(self) -> str:
        record: Any = {"cpp": self.artifact.get("cpp"), "lean": self.artifact["lean"]}.get(self.form, self.artifact)
        file: str = record["file"]
        return file


@dataclass(frozen=True)
class Plan:
    """What loading a model would do: the variants to load (one CPU target, every
    shape variant), or none and the reason."""

    model: SourceModel  # what a fallback needs: the manifest entry, or pyproject.toml's table in a source checkout
    entry: ModelEntry | None  # the manifest entry; None without a manifest
    choices: list[Choice]
    reason: str


def plan(name: str, manifest: Manifest | None = None) -> Plan:
    manifest = manifest or read_manifest()
    if manifest is None:
        reason = f"no compiled artifacts next to {HERE} (a source checkout, an editable install, or a wheel built without the precompile hook)"
        return Plan(_model_from_source_config(name), None, [], reason)
    model = manifest["models"].get(name)
    if model is None:
        known = ", ".join(sorted(manifest["models"])) or "none"
        raise KeyError(f"no model named {name!r} in {MANIFEST} (models: {known})")
    choices, reason = _choose(model)
    return Plan(model, model, choices, reason)


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


def torch_and_python() -> TorchAndPython:
    """This process's torch build and Python, in the form an artifact's `built_with`
    records them: the build calls this too (worker/key.py), so that the two sides
    compare the same strings."""
    import torch

    return {
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "platform": sysconfig.get_platform(),
    }


def cpu_features() -> frozenset[str]:
    """The features this process's CPU has, by torch's names ("avx512_vnni", ...):
    what an artifact's `cpu_features` are compared with (the build asks this too)."""
    import torch

    return frozenset(name for name, present in torch.cpu.get_capabilities().items() if present is True)


class RunningEnvironment(TorchAndPython):
    """What the loader compares a variant with: this process's torch and Python, and its CPU."""

    cpu_features: frozenset[str]
    aten_capability: str  # the level of the ATen kernels torch runs here ("AVX512", ...)


def running_environment() -> RunningEnvironment:
    """This process, as the loader sees it (`hatch-precompile inspect` shows it too)."""
    import torch

    return {**torch_and_python(), "cpu_features": cpu_features(), "aten_capability": torch.backends.cpu.get_cpu_capability()}


def why_form(choice: Choice) -> str:
    """Why a variant loads in a form other than the C++ one, where a model may
    have that, as `explain()` and `hatch-precompile inspect` say it: "" for the
    C++ form, and for a model built without it (`cpp-form` unset)."""
    if choice.form == "cpp" or ("cpp" not in choice.artifact and choice.form == "lean"):
        return ""
    requested = requested_form()
    if requested != "auto":
        return f"; {FORM_VARIABLE}={requested}"
    reasons = []
    if "cpp" in choice.artifact:
        reasons.append(f"the build refused the C++ form: {choice.artifact['cpp']['refused']}" if "refused" in choice.artifact["cpp"] else "the C++ form does not fit here")
    if choice.form == "artifact":
        reasons.append(f"the build refused the lean form: {choice.artifact['lean'].get('refused')}")
    return "; " + "; ".join(reasons)


def requested_form() -> str:
    form = os.environ.get(FORM_VARIABLE) or "auto"
    if form not in FORMS:
        raise ValueError(f"{FORM_VARIABLE} must be one of {', '.join(FORMS)}, got {form!r}")
    return form


def _choose(model: ModelEntry) -> tuple[list[Choice], str]:
    """The variants (every shape) of the best CPU target this process can run, each
    in the form to load, or none and why none fits.

    The two forms need different things of the process (`form_problems`). The
    torch build is compared by version and git revision: the artifact's exact
    key, torch_key(), hashes every torch source file and costs a second to compute."""
    here = running_environment()
    form = requested_form()
    targets: dict[str, list[ArtifactEntry]] = {}
    for artifact in sorted(model["artifacts"], key=lambda a: _aten_level(a["aten_capability"]), reverse=True):
        targets.setdefault(artifact["cpu_target"], []).append(artifact)
    forced = os.environ.get(CPU_TARGET_VARIABLE)
    if forced:
        if forced not in targets:
            return [], f"{CPU_TARGET_VARIABLE}={forced} but the shipped CPU targets are: {', '.join(targets)}"
        targets = {forced: targets[forced]}
    reasons = []
    for target, artifacts in targets.items():
        first = artifacts[0]  # the variants of one target share their requirements
        built = first["built_with"]
        problems = ["platform differs"] if built["platform"] != here["platform"] else []
        missing = sorted(set(first["cpu_features"]) - here["cpu_features"])
        if missing:
            problems.append(f"CPU lacks {', '.join(missing)}")
        if _aten_level(first["aten_capability"]) > _aten_level(here["aten_capability"]):
            problems.append(f"torch runs {here['aten_capability']} kernels here, not {first['aten_capability']} (see ATEN_CPU_CAPABILITY)")
        problems += native_problems(first["native"])
        if not problems:
            forms = form_problems(built, here, form)
            chosen = [_form_for(artifact, forms) for artifact in artifacts]
            choices = [Choice(artifact, how) for artifact, how in zip(artifacts, chosen) if how is not None]
            if len(choices) == len(artifacts):
                return choices, ""
            unfit = artifacts[chosen.index(None)]
            refused = unfit["lean"].get("refused")
            lean = forms["lean"] or [f"the build refused it for {unfit['file']}: {refused}"]
            artifact_form = ["an int8 variant has none"] if "constants" in unfit else forms["artifact"]
            problems.append(f"the lean form: {', '.join(lean)}; the artifact form: {', '.join(artifact_form)}")
        reasons.append(
            f"{first['file']} was built with torch {built['torch']} ({built['torch_git'][:12]}) on cp{built['python'].replace('.', '')} {built['platform']} for {target}: " + ", ".join(problems)
        )
    found = ", ".join(sorted(here["cpu_features"])) or "none"
    running = f"running torch {here['torch']} ({here['torch_git'][:12]}) on cp{here['python'].replace('.', '')} {here['platform']} with {here['aten_capability']} kernels and CPU features: {found}"
    return [], f"no shipped artifact fits this process: {'; '.join(reasons)}; {running}"


def form_problems(built: BuiltWith, here: TorchAndPython, requested: str) -> dict[str, list[str]]:
    """Why each form ("lean", "artifact") cannot run here, given the torch and
    Python the variants were built with; an empty list where it can.

    The lean form runs inductor's output module (Python source) with kernels that
    are stable-ABI extensions of the Python they were built with: it needs the
    same torch release and git revision (aten's op signatures, the output
    module's helpers) and that Python or a later one, and it runs under any build
    of that release (+cpu, CUDA: the local label). The artifact form unpickles
    inductor's objects, so it needs exactly the torch build and Python it was made with."""
    same_release = _release(built["torch"]) == _release(here["torch"])
    cpp, lean, artifact = [], [], []
    if requested in ("lean", "artifact"):
        cpp.append(f"{FORM_VARIABLE}={requested}")
    if requested == "artifact":
        lean.append(f"{FORM_VARIABLE}=artifact")
    for same_torch in (cpp, lean):  # a library linked against that release's libtorch
        if not same_release:
            same_torch.append("torch differs")
        if built["torch_git"] != here["torch_git"]:
            same_torch.append("torch_git differs")
    if _numbers(here["python"]) < _numbers(built["python"]):
        lean.append(f"python differs: its kernels need CPython {built['python']} or later")
        cpp.append(f"python differs: the wheel is for CPython {built['python']} or later")
    if requested in ("cpp", "lean"):
        artifact.append(f"{FORM_VARIABLE}={requested}")
    if requested == "cpp":
        lean.append(f"{FORM_VARIABLE}=cpp")
    if built["torch"] != here["torch"]:
        artifact.append("torch differs" + (": it needs that exact build" if same_release else ""))
    if built["torch_git"] != here["torch_git"]:
        artifact.append("torch_git differs")
    if built["python"] != here["python"]:
        artifact.append("python differs: it needs that exact Python")
    return {"cpp": cpp, "lean": lean, "artifact": artifact}


def _form_for(artifact: ArtifactEntry, forms: dict[str, list[str]]) -> str | None:
    """The form one variant loads in: C++ where the build shipped it and it fits,
    else lean where that was shipped and fits, else the artifact if that fits (an
    int8 variant has none)."""
    if has_cpp_form(artifact) and not forms["cpp"]:
        return "cpp"
    if has_lean_form(artifact) and not forms["lean"]:
        return "lean"
    return "artifact" if not forms["artifact"] and not is_lean_only(artifact) else None


def without_cpp(choice: Choice) -> Choice | None:
    """The form a variant loads in when its C++ form failed to load here."""
    forms = form_problems(choice.artifact["built_with"], torch_and_python(), requested_form())
    form = _form_for(choice.artifact, {**forms, "cpp": ["it failed to load"]})
    return None if form is None else Choice(choice.artifact, form)


def native_problems(native: NativeNeeds) -> list[str]:
    """What the kernels need from the system (recorded by the build from their ELF
    files) that this system lacks: a newer glibc, or a libstdc++ without a symbol
    version they use. Decided before any kernel is loaded."""
    problems = []
    glibc = running_glibc()
    if native["glibc"] and (glibc is None or _numbers(glibc) < _numbers(native["glibc"])):
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


def _release(torch_version: str) -> str:
    """A torch version without its local label: '2.13.0+cpu' -> '2.13.0'."""
    return torch_version.split("+")[0]


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def running_glibc() -> str | None:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")[2] or None  # "glibc 2.36"
    except (ValueError, OSError):
        return None


def _loaded_libstdcxx() -> Path | None:
    """The libstdc++ this process has loaded (torch loads it), from /proc/self/maps."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1]
        if "/libstdc++.so" in path:
            return Path(path)
    return None


def _aten_level(capability: str) -> int:
    return ATEN_LEVELS.index(capability) if capability in ATEN_LEVELS else 0


def _model_from_source_config(name: str) -> SourceModel:
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
