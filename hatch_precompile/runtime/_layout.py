"""The name of every file and folder in a wheel's `_precompiled/`: the build writes
them by these names and the loader reads them by the same ones.

    <package>/_precompiled/
      __init__.py, _manifest.py, ...   the loader: this folder's modules, copied
      _build.py                        MANIFEST_SHA256, the digest of manifest.json (generated)
      manifest.json                    every model, artifact, kernel and weights file, with sizes and sha256
      libaoti_shim.so                  the wheel's own shim, where a model has a torch-free form (`SHIM_FILE`),
      libgomp_so_1.so                  and the OpenMP runtime it and those libraries link (`OPENMP_FILE`)
      <model>/
        weights.safetensors            the weights (`weights = "embed"`)
        cpu_avx2.bin                   an artifact: one per CPU target and shape variant,
        cpu_avx2_batch8.bin            named by both (`artifact_file`)
        cpu_avx2.py, ...               each artifact's lean module (`lean_module_file`)
        cpu_avx2_cpp.so, ...           each artifact's C++ form, where the model has one (`cpp_library_file`)
        cpu_avx2_cpp.json              the ops it calls through AOTInductor's proxy executor, where any (`cpp_ops_file`)
        cpu_avx2_constants.safetensors an int8 variant's frozen constants, instead of its
                                       artifact (`constants_file`); variants whose
                                       constants are the same bytes share the first's file
        kernels/k_<key>.so             the compiled kernels, shared by the model's artifacts

Every name is an identifier, so that each shipped file lies at an importable
path, as packaging checkers expect of modules and extensions (check-wheel-contents' W004).
"""

from __future__ import annotations

PRECOMPILED_DIR = "_precompiled"
MANIFEST_FILE = "manifest.json"
BUILD_MODULE = "_build.py"
WEIGHTS_FILE = "weights.safetensors"
KERNELS_DIR = "kernels"
SHIM_FILE = "libaoti_shim.so"
OPENMP_FILE = "libgomp_so_1.so"  # libgomp.so.1 by its soname, which the loader loads first


def kernel_file(key: str) -> str:
    """A compiled kernel's file name in its model's `kernels/`."""
    return f"k_{key}.so"


def artifact_file(cpu_target: str, fixed: dict[str, int]) -> str:
    """cpu_avx2.bin, cpu_avx2_batch8.bin: the CPU target, then each dim fixed to a bucket size."""
    return f"cpu_{cpu_target}{''.join(f'_{dim}{size}' for dim, size in sorted(fixed.items()))}.bin"


def lean_module_file(artifact: str) -> str:
    """The lean module of artifact `cpu_avx2.bin`: `cpu_avx2.py`."""
    return artifact.removesuffix(".bin") + ".py"


def constants_file(artifact: str) -> str:
    """What an int8 (frozen) variant ships instead of artifact `cpu_avx2.bin`: the
    constants its lean module binds, `cpu_avx2_constants.safetensors`."""
    return artifact.removesuffix(".bin") + "_constants.safetensors"


def cpp_library_file(artifact: str) -> str:
    """The C++ form of artifact `cpu_avx2.bin`: `cpu_avx2_cpp.so`."""
    return artifact.removesuffix(".bin") + "_cpp.so"


def cpp_ops_file(library: str) -> str:
    """Beside library `cpu_avx2_cpp.so`, the ops it calls through AOTInductor's proxy
    executor: `cpu_avx2_cpp.json`, the name the container's runner looks for."""
    return library.removesuffix(".so") + ".json"
