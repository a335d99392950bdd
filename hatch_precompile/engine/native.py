"""What the shipped kernels need from the machine they run on, and the wheel tag that says so.

The kernels are ELF shared objects built on the build machine. They need
versioned symbols from its C and C++ runtimes (glibc, libstdc++, libgcc) and link
libraries by name. The libraries that torch's wheel ships (`torch/lib/`:
libtorch_cpu, libgomp, ...) are already loaded by `import torch` and are not
the system's; everything else must be on the system. The wheel's platform tag
is the stricter of torch's own tag and the oldest manylinux policy that allows
every symbol version the kernels need from the system.

ELF files are read with pyelftools, and the manylinux policies (symbol versions
and the libraries a policy lets a wheel take from the system) come from
auditwheel's policy data: the same data `auditwheel show` uses, kept up to date
by the PyPA. Build side only: nothing here ships in wheels.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..runtime._schema import NativeNeeds

_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
_PYTHON_LIBRARY = re.compile(r"^libpython3\.\d+")
# The ELF dynamic loader, which every process has: auditwheel leaves it out of a
# policy's libraries and symbol versions alike (AOTInductor's libraries link it).
_DYNAMIC_LOADER = re.compile(r"^(ld-linux.*|ld64\.so\.[12])$")


@dataclass(frozen=True)
class KernelNeeds:
    """One kernel's dynamic dependencies, read from its ELF file."""

    name: str
    libraries: tuple[str, ...]  # DT_NEEDED
    versions: dict[str, tuple[str, ...]]  # library -> symbol versions it needs from it (GLIBC_2.14, ...)


def read_needs(path: Path) -> KernelNeeds:
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    libraries: list[str] = []
    versions: dict[str, tuple[str, ...]] = {}
    with path.open("rb") as stream:
        elf = ELFFile(stream)
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                libraries += [tag.needed for tag in section.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]  # type: ignore[attr-defined]  # set on DT_NEEDED tags
            elif isinstance(section, GNUVerNeedSection):
                for needed, auxiliaries in section.iter_versions():
                    versions[str(needed.name)] = tuple(sorted(str(aux.name) for aux in auxiliaries))
    return KernelNeeds(path.name, tuple(libraries), versions)


def torch_libraries() -> set[str]:
    """The shared libraries torch's wheel ships in torch/lib/ (from its RECORD, without importing torch)."""
    files = importlib.metadata.files("torch") or []
    return {Path(str(f)).name for f in files if str(f).startswith("torch/lib/") and ".so" in Path(str(f)).name}


@dataclass(frozen=True)
class SystemNeeds:
    """What a set of kernels needs from the system: the newest glibc and libstdc++
    symbol versions, the system libraries, and the oldest manylinux policy that
    allows all of it."""

    glibc: str  # "2.14", or "" if none
    glibcxx: str  # "3.4.21", or "" if none
    libraries: tuple[str, ...]
    policy: str  # e.g. "manylinux_2_24_x86_64"

    def manifest(self) -> NativeNeeds:
        return {"glibc": self.glibc, "glibcxx": self.glibcxx, "libraries": list(self.libraries), "policy": self.policy}


class UnprovidedLibraryError(ValueError):
    """A kernel links a library that neither torch's wheel nor the system provides."""


def system_needs(kernels: Iterable[KernelNeeds], provided_by_torch: set[str]) -> SystemNeeds:
    """Raises UnprovidedLibraryError naming the kernel and library when a kernel links
    a library that neither torch's wheel nor the manylinux policy provides."""
    from auditwheel.architecture import Architecture
    from auditwheel.libc import Libc
    from auditwheel.policy import WheelPolicies

    policies = WheelPolicies(libc=Libc.GLIBC, arch=Architecture.detect())
    allowed = policies.lowest.whitelist
    system: set[str] = set()
    versions: dict[str, set[str]] = {}
    for kernel in kernels:
        for library in kernel.libraries:
            if library in provided_by_torch or _PYTHON_LIBRARY.match(library) or _DYNAMIC_LOADER.match(library):
                continue
            if library not in allowed:
                raise UnprovidedLibraryError(
                    f"compiled kernel {kernel.name} links {library}, which neither torch's wheel "
                    f"nor the manylinux policy provides (allowed from the system: {', '.join(sorted(allowed))}); "
                    "check the inductor options (e.g. extra libraries) of this model"
                )
            system.add(library)
        for library, needed in kernel.versions.items():
            if library not in provided_by_torch and not _DYNAMIC_LOADER.match(library):
                versions.setdefault(library, set()).update(needed)
    policy = policies.versioned_symbols_policy(versions)
    return SystemNeeds(
        glibc=_newest(versions, "GLIBC_"),
        glibcxx=_newest(versions, "GLIBCXX_"),
        libraries=tuple(sorted(system)),
        policy=policy.name,
    )


def _newest(versions: dict[str, set[str]], prefix: str) -> str:
    numbers = [tuple(int(part) for part in name[len(prefix) :].split(".")) for names in versions.values() for name in names if name.startswith(prefix) and re.fullmatch(r"[\d.]+", name[len(prefix) :])]
    return ".".join(map(str, max(numbers))) if numbers else ""


def stricter_platform(torch_platform: str, kernels_policy: str) -> str:
    """The platform tag a wheel with these kernels can honestly claim: torch's own,
    unless the kernels need a newer glibc than torch's manylinux tag."""
    ours, theirs = _MANYLINUX.match(torch_platform), _MANYLINUX.match(kernels_policy)
    if ours is None or theirs is None:
        return torch_platform  # not a manylinux tag (a local torch build): nothing to compare
    if (int(theirs[1]), int(theirs[2])) > (int(ours[1]), int(ours[2])):
        return kernels_policy
    return torch_platform
