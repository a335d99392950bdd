"""Wheel assembly: the `_precompiled/` folder, the manifest, the tag and the pins.

Nothing here imports torch: what the build environment holds is read from
installed distributions' metadata, which is cheap and is also what pip sees.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import mmap
import shutil
from pathlib import Path
from typing import Any

from packaging.tags import sys_tags
from packaging.version import Version

from .. import __version__
from ..runtime import MANIFEST_FORMAT
from ..runtime._integrity import CHUNK_SIZE, chunk_checksums, file_sha256, numpy_row_sums
from ..runtime._layout import BUILD_MODULE, KERNELS_DIR, MANIFEST_FILE, OPENMP_FILE, PRECOMPILED_DIR, SHIM_FILE, kernel_file
from ..runtime._schema import ArtifactEntry, FileDigest, ModelEntry, has_cpp_form, has_lean_form, is_lean_only, is_torch_free
from ..shim.build import compile_shim, openmp_runtime
from .native import stricter_platform

RUNTIME_DIR = Path(__file__).parent.parent / "runtime"
# The files of `runtime/` that go into every wheel, as `<package>/_precompiled/<name>`.
RUNTIME_FILES = tuple(sorted(path.name for path in RUNTIME_DIR.glob("*.py")))


def torch_version() -> str:
    """The full version of the torch in the build environment, e.g. '2.13.0+cpu'."""
    return importlib.metadata.version("torch")


def runtime_requirements(torch_free: bool = False) -> list[str]:
    """Requires-Dist lines: the exact torch release built with (no local label).
    The loader needs nothing else: it reads the shipped safetensors file itself.
    A wheel whose every model is torch-free needs NumPy instead (its arrays, and
    its BLAS for the shim's matrix products)."""
    return [NUMPY_REQUIREMENT] if torch_free else [f"torch=={Version(torch_version()).public}"]


NUMPY_REQUIREMENT = "numpy>=1.26"  # the oldest whose wheels' OpenBLAS the shim was seen to use (`runtime/_shim._SGEMM`)


def wheel_tag(kernel_policies: list[str], stable_abi: bool) -> str:
    """This interpreter's tag with the stricter of torch's platform tag and what the
    kernels need from the system (their manylinux policies, see native.py).

    With `stable_abi` (every shipped variant has a lean form, whose kernels are
    stable-ABI extensions), the ABI is `abi3`: `cp311-abi3` installs on CPython 3.11
    and later. Otherwise some model loads only as an artifact, a pickle of this
    Python's inductor objects, and the tag names this Python's ABI alone."""
    interpreter = next(iter(sys_tags()))
    platform = _torch_platform_tag() or interpreter.platform
    for policy in kernel_policies:
        platform = stricter_platform(platform, policy)
    return f"{interpreter.interpreter}-{'abi3' if stable_abi else interpreter.abi}-{platform}"


def _torch_platform_tag() -> str | None:
    wheel_file = importlib.metadata.distribution("torch").read_text("WHEEL") or ""
    for line in wheel_file.splitlines():
        if line.startswith("Tag:"):
            return line.split(":", 1)[1].strip().split("-")[-1]
    return None  # torch built from source: no wheel tag to follow


def file_record(path: Path) -> FileDigest:
    return {"size": path.stat().st_size, "sha256": file_sha256(path)}


def weights_checksums(data: Any, chunk_size: int = CHUNK_SIZE) -> list[int]:
    """What the loader checks a weights file's chunks against (`runtime/_integrity.py`),
    computed with numpy, which gives the same integer sums as the loader's torch."""
    return chunk_checksums(data, chunk_size, numpy_row_sums)


def _weights_checksums(path: Path) -> list[int]:
    with path.open("rb") as stream, mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
        return weights_checksums(mapping)


def assemble(staging: Path, package: str, entries: dict[str, ModelEntry]) -> dict[str, str]:
    """Complete `staging` (one sub-folder of files per model, already written by the
    workers) with the loader and the manifest. Returns force_include's mapping of
    source file to path in the wheel."""
    for name in RUNTIME_FILES:
        shutil.copyfile(RUNTIME_DIR / name, staging / name)

    models = {}
    for model, compiled in entries.items():
        model_dir = staging / model
        entry = ModelEntry(**compiled)
        if "file" in entry["weights"]:
            weights = staging / model / entry["weights"]["file"]
            entry["weights"] = {
                **entry["weights"],
                "file": f"{model}/{entry['weights']['file']}",
                **file_record(weights),
                "chunk_size": CHUNK_SIZE,
                "chunk_checksums": _weights_checksums(weights),
            }
        entry["artifacts"] = _share_identical_constants([_artifact_record(model, model_dir, a) for a in entry["artifacts"]])
        kernel_keys = sorted({key for a in entry["artifacts"] for key in a["kernels"]})
        entry["kernels"] = {key: {"file": f"{model}/{KERNELS_DIR}/{kernel_file(key)}", **file_record(model_dir / KERNELS_DIR / kernel_file(key))} for key in kernel_keys}
        models[model] = entry
    manifest: dict[str, Any] = {"format": MANIFEST_FORMAT, "built_by": f"hatch-precompile {__version__}", "package": package, "models": models}
    references = {symbol for entry in models.values() for a in entry["artifacts"] if is_torch_free(a) for symbol in a["cpp"]["references"]}
    if references:
        compile_shim(references, staging / SHIM_FILE)
        shutil.copyfile(openmp_runtime(), staging / OPENMP_FILE)
        manifest["shim"] = {"file": SHIM_FILE, **file_record(staging / SHIM_FILE)}
        manifest["openmp"] = {"file": OPENMP_FILE, **file_record(staging / OPENMP_FILE)}
    manifest_bytes = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    (staging / MANIFEST_FILE).write_bytes(manifest_bytes)
    # The loader checks the manifest against this digest; the wheel's RECORD covers this file.
    (staging / BUILD_MODULE).write_text(
        f'"""Written by hatch-precompile {__version__} at build time."""\n\nMANIFEST_SHA256 = "{hashlib.sha256(manifest_bytes).hexdigest()}"\n',
        encoding="utf-8",
    )

    shipped = [staging / MANIFEST_FILE, staging / BUILD_MODULE, *(staging / n for n in RUNTIME_FILES)]
    shipped += [staging / manifest[key]["file"] for key in ("shim", "openmp") if key in manifest]
    for entry in models.values():
        if "file" in entry["weights"]:
            shipped.append(staging / entry["weights"]["file"])
        shipped.extend(staging / a["file"] for a in entry["artifacts"])
        shipped.extend(staging / a["lean"]["file"] for a in entry["artifacts"] if has_lean_form(a))
        shipped.extend(staging / a["cpp"]["file"] for a in entry["artifacts"] if has_cpp_form(a))
        shipped.extend(staging / a["cpp"]["ops"]["file"] for a in entry["artifacts"] if "ops" in a.get("cpp", {}))
        shipped.extend(staging / k["file"] for k in entry["kernels"].values())
    return {str(path): f"{package}/{PRECOMPILED_DIR}/{path.relative_to(staging).as_posix()}" for path in dict.fromkeys(shipped)}


def _artifact_record(model: str, model_dir: Path, artifact: ArtifactEntry) -> ArtifactEntry:
    """An artifact's manifest entry with its files' paths in the wheel, sizes and sha256."""

    def placed(entry: Any) -> Any:  # the entry with its file's path in the wheel, size and sha256
        return {**entry, "file": f"{model}/{entry['file']}", **file_record(model_dir / entry["file"])}

    record: ArtifactEntry = placed(artifact)
    if has_lean_form(artifact):
        record["lean"] = placed(artifact["lean"])
    if has_cpp_form(artifact):
        record["cpp"] = placed(artifact["cpp"])
        if "ops" in artifact["cpp"]:
            record["cpp"]["ops"] = placed(artifact["cpp"]["ops"])
    return record


def _share_identical_constants(artifacts: list[ArtifactEntry]) -> list[ArtifactEntry]:
    """Point int8 variants whose constants files hold the same bytes at the first
    one's file, so that the wheel carries it once. The constants are the plain
    weights and scales, which no CPU target changes (each CPU's packed layout is
    made at load), so an int8 model's targets usually share one file."""
    first: dict[str, str] = {}  # sha256 -> the file that ships those bytes
    for artifact in artifacts:
        if is_lean_only(artifact):
            artifact["file"] = first.setdefault(artifact["sha256"], artifact["file"])
    return artifacts
