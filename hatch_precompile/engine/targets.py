"""CPU targets: how each is compiled, and what it needs from the CPU that runs it.

Inductor writes the vector width into the generated C++ and adds ISA flags to
the compiler command, by default for the build machine (`-march=native`). A
target pins both, so the kernels run on every CPU with the target's features and
the loader can check those features before it loads any native code.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

from ..runtime._manifest import ATEN_LEVELS

_DEFAULT, _AVX2, _AVX512 = ATEN_LEVELS  # what the loader compares a target's level with

# torch.cpu.get_capabilities() names for x86-64-v3 (AVX2 level).
_X86_64_V3 = ("avx", "avx2", "bmi", "bmi2", "f16c", "fma3", "lzcnt")
_X86_64_V4 = (*_X86_64_V3, "avx512_f", "avx512_bw", "avx512_cd", "avx512_dq", "avx512_vl")

# Compiler flags inductor may add for the build machine, and the feature each needs.
_FLAG_FEATURES = {
    "-mavx512vnni": "avx512_vnni",
    "-mavx512bf16": "avx512_bf16",
    "-mavx512fp16": "avx512_fp16",
    "-mamx-tile": "amx_tile",
    "-mamx-bf16": "amx_bf16",
    "-mamx-int8": "amx_int8",
    "-mamx-fp16": "amx_fp16",
}


@dataclass(frozen=True)
class CpuTarget:
    name: str
    simdlen: int
    march: str
    features: tuple[str, ...]
    aten_capability: str  # the torch.backends.cpu.get_cpu_capability() it needs

    def inductor_config(self) -> dict[str, Any]:
        # dynamic_threads: size reduction scratch space by the running thread count,
        # not the build machine's (more threads than at build time overran it).
        return {"cpp.simdlen": self.simdlen, "cpp.march": self.march, "cpp.dynamic_threads": True}


CPU_TARGETS = {
    "avx2": CpuTarget("avx2", 256, "x86-64-v3", _X86_64_V3, _AVX2),
    "avx512": CpuTarget("avx512", 512, "x86-64-v4", _X86_64_V4, _AVX512),
}
DEFAULT_CPU_TARGETS = ("avx2",)


def host_target(features: tuple[str, ...]) -> CpuTarget:
    """Off x86-64: one target for the build machine's CPU, at torch's default kernel level."""
    return CpuTarget("host", simdlen=0, march="", features=features, aten_capability=_DEFAULT)


def is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def features_from_flags(flags: str) -> list[str]:
    """The CPU features that the extra flags inductor added for this machine require."""
    return [feature for flag, feature in _FLAG_FEATURES.items() if flag in flags.split()]
