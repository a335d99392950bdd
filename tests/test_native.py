"""The wheel's platform tag and the manifest's native requirements, computed from
the compiled kernels' ELF files: on the example's real kernels, and on made-up
needs above torch's own tag."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest

from hatch_precompile.engine.native import KernelNeeds, UnprovidedLibraryError, read_needs, stricter_platform, system_needs, torch_libraries

from conftest import ExampleBuild

C_RUNTIMES = {"libc.so.6", "libm.so.6", "libgcc_s.so.1", "libstdc++.so.6"}


def test_torch_ships_the_libraries_the_kernels_link_besides_the_c_runtimes() -> None:
    assert {"libtorch_cpu.so", "libc10.so", "libgomp.so.1"} <= torch_libraries()


@pytest.mark.e2e
@pytest.mark.release
def test_the_example_kernels_need_old_runtimes_and_its_cpp_library_counts_in_the_tag(example_build: ExampleBuild, tmp_path: Path) -> None:
    """The kernels are C: they need old runtimes and keep torch's tag. The C++
    form's library (AOTInductor's container: C++ with threads) needs what the
    build machine's glibc and libstdc++ gave it, and that counts in the tag."""
    with zipfile.ZipFile(example_build.wheel) as wheel:
        manifest = json.loads(wheel.read("example_pkg/_precompiled/manifest.json"))
        (artifact,) = manifest["models"]["encoder"]["artifacts"]
        kernels = []
        for key in artifact["kernels"]:
            path = tmp_path / f"{key}.so"
            path.write_bytes(wheel.read("example_pkg/_precompiled/" + manifest["models"]["encoder"]["kernels"][key]["file"]))
            kernels.append(read_needs(path))
        library = tmp_path / "library.so"
        library.write_bytes(wheel.read("example_pkg/_precompiled/" + artifact["cpp"]["file"]))
    linked = {name for kernel in kernels for name in kernel.libraries}
    assert {"libtorch_cpu.so", "libgomp.so.1"} <= linked
    assert linked - torch_libraries() <= C_RUNTIMES
    needs = system_needs(kernels, torch_libraries())
    assert set(needs.libraries) <= C_RUNTIMES and "libgomp.so.1" not in needs.libraries  # torch's copy is used
    glibc = tuple(int(p) for p in needs.glibc.split("."))
    assert (2, 2) < glibc <= (2, 28), needs
    cpp = read_needs(library)
    assert {"libtorch_cpu.so", "libgomp.so.1"} <= set(cpp.libraries) and not any(name.startswith("libpython") for name in cpp.libraries)
    with_library = system_needs([*kernels, cpp], torch_libraries())
    assert artifact["native"] == with_library.manifest()
    platform = example_build.wheel.name.removesuffix(".whl").split("-")[-1]
    assert platform == stricter_platform(platform, with_library.policy)  # the wheel's tag allows what the library needs


def made_up(**versions: tuple[str, ...]) -> KernelNeeds:
    libraries = {"glibc": "libc.so.6", "cxx": "libstdc++.so.6", "gomp": "libgomp.so.1"}
    return KernelNeeds("k.so", ("libtorch_cpu.so", *(libraries[k] for k in versions)), {libraries[k]: v for k, v in versions.items()})


def test_a_kernel_built_against_a_newer_glibc_raises_the_tag_above_torchs() -> None:
    """strtoull binds to __isoc23_strtoull@GLIBC_2.38 when built on glibc 2.38 or newer."""
    needs = system_needs([made_up(glibc=("GLIBC_2.2.5", "GLIBC_2.38")), made_up(cxx=("GLIBCXX_3.4.21",))], torch_libraries())
    assert needs.glibc == "2.38" and needs.glibcxx == "3.4.21"
    assert needs.policy.startswith("manylinux_2_38_")
    assert stricter_platform("manylinux_2_28_x86_64", needs.policy) == needs.policy
    assert stricter_platform("manylinux_2_28_x86_64", "manylinux_2_17_x86_64") == "manylinux_2_28_x86_64"
    assert stricter_platform("linux_x86_64", needs.policy) == "linux_x86_64"  # a local torch build claims no manylinux


def test_versions_needed_from_torchs_own_libraries_do_not_count() -> None:
    needs = system_needs([made_up(gomp=("GOMP_5.0", "OMP_9.9"))], torch_libraries())
    assert needs.glibc == "" and needs.libraries == ()


def test_a_kernel_linking_a_library_nobody_provides_is_refused_by_name() -> None:
    kernel = KernelNeeds("abc.so", ("libtorch_cpu.so", "libfoo.so.3"), {})
    with pytest.raises(UnprovidedLibraryError, match=re.escape("compiled kernel abc.so links libfoo.so.3, which neither torch's wheel")):
        system_needs([kernel], torch_libraries())
