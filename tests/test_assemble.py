"""Wheel assembly without a build: pins, tag, and the loader copies in the examples."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from hatch_precompile.engine.assemble import RUNTIME_FILES, assemble, runtime_requirements, wheel_tag
from hatch_precompile.runtime._layout import BUILD_MODULE


def test_the_wheel_pins_the_build_torch_release_without_its_local_label() -> None:
    assert runtime_requirements() == [f"torch=={torch.__version__.split('+')[0]}"]


def test_the_tag_is_this_interpreter_with_the_stricter_of_torchs_platform_and_the_kernels() -> None:
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    interpreter, abi, platform = wheel_tag([], stable_abi=False).split("-")
    assert (interpreter, abi) == (python, python)
    assert platform.endswith("x86_64") or platform.endswith("aarch64")
    assert wheel_tag(["manylinux_2_17_x86_64"], stable_abi=False) == wheel_tag([], stable_abi=False)
    if platform.startswith("manylinux_2_28_"):
        assert wheel_tag(["manylinux_2_17_x86_64", "manylinux_2_38_x86_64"], stable_abi=False).endswith("-manylinux_2_38_x86_64")


def test_a_wheel_whose_every_variant_has_a_lean_form_is_tagged_for_the_stable_abi() -> None:
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert wheel_tag([], stable_abi=True) == wheel_tag([], stable_abi=False).replace(f"{python}-{python}-", f"{python}-abi3-")


def test_assembly_records_sizes_hashes_and_the_manifest_digest(tmp_path: Path) -> None:
    (tmp_path / "m" / "kernels").mkdir(parents=True)
    files = {"m/cpu_avx2.bin": b"artifact", "m/cpu_avx2.py": b"lean", "m/weights.safetensors": b"weights", "m/kernels/k_k1.so": b"kernel"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    entry = {
        "fallback": "eager",
        "weights": {"file": "weights.safetensors", "order": []},
        "artifacts": [{"file": "cpu_avx2.bin", "kernels": ["k1"], "lean": {"file": "cpu_avx2.py", "extern_kernels": []}}],
    }
    shipped = assemble(tmp_path, "pkg", {"m": entry})
    manifest_bytes = (tmp_path / "manifest.json").read_bytes()
    manifest = json.loads(manifest_bytes)["models"]["m"]
    assert manifest["fallback"] == "eager"
    assert manifest["artifacts"][0]["sha256"] == hashlib.sha256(b"artifact").hexdigest()
    assert manifest["artifacts"][0]["lean"] == {"file": "m/cpu_avx2.py", "extern_kernels": [], "size": 4, "sha256": hashlib.sha256(b"lean").hexdigest()}
    assert manifest["kernels"]["k1"] == {"file": "m/kernels/k_k1.so", "size": 6, "sha256": hashlib.sha256(b"kernel").hexdigest()}
    assert manifest["weights"]["size"] == len(b"weights")
    digest = hashlib.sha256(manifest_bytes).hexdigest()
    assert f'MANIFEST_SHA256 = "{digest}"' in (tmp_path / BUILD_MODULE).read_text()
    assert sorted(shipped.values()) == sorted(f"pkg/_precompiled/{n}" for n in [*files, "manifest.json", BUILD_MODULE, *RUNTIME_FILES])


def test_int8_variants_with_the_same_constants_ship_one_file(tmp_path: Path) -> None:
    """Two CPU targets' constants with the same bytes: one file in the wheel, both
    variants pointing at it; different bytes stay two files."""
    (tmp_path / "m" / "kernels").mkdir(parents=True)
    files = {
        "m/cpu_avx2_constants.safetensors": b"constants",
        "m/cpu_avx512_constants.safetensors": b"constants",
        "m/cpu_avx2_batch8_constants.safetensors": b"other constants",
        "m/cpu_avx2.py": b"lean",
        "m/cpu_avx512.py": b"lean 512",
        "m/cpu_avx2_batch8.py": b"lean 8",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    variants = [
        {"file": f"{stem}_constants.safetensors", "kernels": [], "constants": {}, "lean": {"file": f"{stem}.py", "extern_kernels": []}} for stem in ("cpu_avx2", "cpu_avx512", "cpu_avx2_batch8")
    ]
    shipped = assemble(tmp_path, "pkg", {"m": {"fallback": "eager", "weights": {"order": []}, "artifacts": variants}})
    manifest = json.loads((tmp_path / "manifest.json").read_text())["models"]["m"]
    assert [a["file"] for a in manifest["artifacts"]] == ["m/cpu_avx2_constants.safetensors", "m/cpu_avx2_constants.safetensors", "m/cpu_avx2_batch8_constants.safetensors"]
    assert [a["lean"]["file"] for a in manifest["artifacts"]] == ["m/cpu_avx2.py", "m/cpu_avx512.py", "m/cpu_avx2_batch8.py"]
    assert "pkg/_precompiled/m/cpu_avx512_constants.safetensors" not in shipped.values()
    assert len(shipped) == len(set(shipped.values())) == len(files) - 1 + 2 + len(RUNTIME_FILES)
