"""The shim provider of the NumPy path: AOTInductor's C shim, from torch's
`libtorch_cpu.so` or from the wheel's own, called through ctypes without
importing torch.

A C++ form's library calls torch only through the shim's C functions
(`aoti_torch_*`: make, inspect and free tensors, and a few operators); its
own C interface (`_container.py`) takes and returns tensors as the shim's
`AtenTensorHandle`. So a process with NumPy arrays needs these, and nothing of
torch's Python: `load()` finds the installed torch's libraries on disk
(`_manifest.installed_torch`, which reads no more than torch's version file),
loads them with `RTLD_GLOBAL` so that the container library's undefined
`aoti_torch_*` symbols resolve to them, and this module makes a tensor handle
over an array's memory, and an array over an output handle's memory.

A torch-free library (`provider = "wheel"` in its manifest record) was built
against no torch library, for the wheel's own shim (`libaoti_shim.so`, built
with the wheel from `hatch_precompile/shim/`'s sources), which exports the
same functions over tensors of its own and takes its matrix products from the
BLAS that NumPy loaded (`_blas`). One process has one provider: the first
library loaded decides, since both export the same names to every library
loaded after them.

This is the one module that names the providers.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Callable
from typing import Any

from . import _torch_private
from ._layout import OPENMP_FILE
from ._manifest import installed_torch

Handle = ctypes.c_void_p  # AtenTensorHandle
_Sizes = ctypes.POINTER(ctypes.c_int64)
PROVIDER = "libtorch_cpu.so"  # what `load` opens, in torch's lib folder (after libc10.so, which it needs; then libtorch.so)
# NumPy's BLAS exports cblas_sgemm under one of these names: pip's wheels (scipy-openblas,
# 64-bit integers), older ones and conda's (plain or 64_ suffixed).
_SGEMM = (("scipy_cblas_sgemm64_", True), ("cblas_sgemm64_", True), ("scipy_cblas_sgemm", False), ("cblas_sgemm", False))
_THREADS_LOCAL = ("openblas_set_num_threads_local", "scipy_openblas_set_num_threads_local64_", "scipy_openblas_set_num_threads_local")


class ShimUnavailable(OSError):
    """The shim's provider cannot be loaded here (the dynamic loader's reason)."""


class Shim:
    """The loaded shim: the C functions the NumPy path calls, with their C types."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        int64, int32, handle_out = ctypes.c_int64, ctypes.c_int32, ctypes.POINTER(Handle)
        self.create = self._function("aoti_torch_create_tensor_from_blob", ctypes.c_void_p, int64, _Sizes, _Sizes, int64, int32, int32, int32, handle_out)
        self.delete = self._function("aoti_torch_delete_tensor_object", Handle)
        self.data_ptr = self._function("aoti_torch_get_data_ptr", Handle, ctypes.POINTER(ctypes.c_void_p))
        self.dim = self._function("aoti_torch_get_dim", Handle, ctypes.POINTER(int64))
        self.sizes = self._function("aoti_torch_get_sizes", Handle, ctypes.POINTER(_Sizes))
        self.strides = self._function("aoti_torch_get_strides", Handle, ctypes.POINTER(_Sizes))
        self.cpu = self._code("aoti_torch_device_type_cpu")
        self._codes: dict[str, int] = {}
        self._last_error = getattr(library, "hatch_precompile_shim_last_error", None)  # the wheel's own shim's, which keeps its reasons
        if self._last_error is not None:
            self._last_error.argtypes, self._last_error.restype = [], ctypes.c_char_p

    def _function(self, name: str, *argtypes: Any) -> Callable[..., int]:
        function = getattr(self.library, name)
        function.argtypes, function.restype = list(argtypes), ctypes.c_int32  # AOTITorchError: 0 is success
        return function  # type: ignore[no-any-return]

    def _code(self, name: str) -> int:
        function = getattr(self.library, name)
        function.argtypes, function.restype = [], ctypes.c_int32
        return int(function())

    def last_error(self) -> str:
        """Why the calling thread's last shim function failed, where the provider says ("" where not)."""
        return (self._last_error() or b"").decode(errors="replace") if self._last_error is not None else ""

    def dtype_code(self, dtype: str) -> int:
        """The shim's code for a torch dtype name ("float32": `aoti_torch_dtype_float32()`)."""
        if dtype not in self._codes:
            self._codes[dtype] = self._code(f"aoti_torch_dtype_{dtype}")
        return self._codes[dtype]

    def tensor(self, array: Any, code: int) -> ctypes.c_void_p:
        """A new tensor handle over `array`'s memory (no copy), of dtype `code`; the
        array must outlive it. Strides in elements, as torch counts them."""
        ndim, itemsize = array.ndim, array.itemsize
        sizes = (ctypes.c_int64 * ndim)(*array.shape)
        strides = (ctypes.c_int64 * ndim)(*[stride // itemsize for stride in array.strides])
        handle = Handle()
        if self.create(array.ctypes.data, ndim, sizes, strides, 0, code, self.cpu, 0, ctypes.byref(handle)):
            raise RuntimeError(f"aoti_torch_create_tensor_from_blob refused an array of shape {array.shape}")
        return handle

    def array(self, handle: int, dtype: Any) -> Any:
        """A NumPy array over an output handle's memory, without a copy; it takes the
        handle, deleted once the last array viewing it is gone."""
        import numpy

        viewed = numpy.asarray(_Output(self, handle, dtype))
        return viewed if viewed.dtype == dtype else viewed.view(dtype)  # bfloat16 (ml_dtypes) crosses as its bits


class _Output:
    """Owns an output tensor handle: the `base` of the arrays that view its memory,
    so that NumPy frees it once, when the last of them is collected (in whichever
    thread), however long they outlive the model."""

    def __init__(self, shim: Shim, handle: int, dtype: Any) -> None:
        self._shim, self._handle = shim, Handle(handle)
        data, ndim, sizes, strides = ctypes.c_void_p(), ctypes.c_int64(), _Sizes(), _Sizes()
        if shim.data_ptr(self._handle, ctypes.byref(data)) or shim.dim(self._handle, ctypes.byref(ndim)):
            raise RuntimeError("the shim could not describe an output tensor")
        shim.sizes(self._handle, ctypes.byref(sizes))
        shim.strides(self._handle, ctypes.byref(strides))
        count = ndim.value
        self.__array_interface__ = {
            "data": (data.value or 0, False),
            "shape": tuple(sizes[:count]),
            "strides": tuple(stride * dtype.itemsize for stride in strides[:count]),
            "typestr": dtype.str if dtype.kind != "V" else f"<u{dtype.itemsize}",
            "version": 3,
        }

    def __del__(self) -> None:
        self._shim.delete(self._handle)


_loading = threading.Lock()
_provider: dict[str, Shim] = {}  # what was loaded (PROVIDER, or the own shim's path) -> its shim: one per process


def load(own: Any = None) -> Shim:
    """The shim, loaded once per process: torch's, or the wheel's own library at
    `own` (a Path) for a torch-free library (ShimUnavailable where it cannot be,
    or where this process already runs the other one)."""
    with _loading:
        wanted = str(own) if own is not None else PROVIDER
        if not _provider:
            _provider[wanted] = _load_own(own) if own is not None else _load_torch()
        elif wanted not in _provider:
            running = f"torch's {PROVIDER}" if PROVIDER in _provider else "the wheel's own shim (torch-free models)"
            needed = "the wheel's own shim" if own is not None else f"torch's {PROVIDER}"
            raise ShimUnavailable(f"this process runs C++ forms on {running}, and this one needs {needed}: one process holds one shim (load these models in separate processes)")
        return _provider[wanted]


def _load_torch() -> Shim:
    torch = installed_torch()
    try:
        ctypes.CDLL(str(torch.libraries / "libc10.so"), mode=ctypes.RTLD_GLOBAL)
        shim = Shim(ctypes.CDLL(str(torch.libraries / PROVIDER), mode=ctypes.RTLD_GLOBAL))
        # A library built against a CUDA build of torch names libtorch.so too (for no symbol of it):
        # loaded, so that the dynamic loader finds it by that name (on a CPU build it is a stub).
        ctypes.CDLL(str(torch.libraries / "libtorch.so"), mode=ctypes.RTLD_GLOBAL)
        return shim
    except OSError as error:
        raise ShimUnavailable(f"torch {torch.version}'s {PROVIDER} cannot be loaded from {torch.libraries} ({error}): reinstall torch=={torch.version.split('+')[0]}") from None


def _load_own(path: Any) -> Shim:
    openmp = path.with_name(OPENMP_FILE)  # the libgomp.so.1 the shim and the libraries link, found by its soname once loaded
    try:
        if openmp.exists():
            ctypes.CDLL(str(openmp), mode=ctypes.RTLD_GLOBAL)
        library = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        raise ShimUnavailable(f"the wheel's shim {path} cannot be loaded here ({error})") from None
    sgemm, ilp64, threads_local = _blas()
    library.hatch_precompile_shim_use_blas.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]
    library.hatch_precompile_shim_use_blas(sgemm, int(ilp64), threads_local)
    return Shim(library)


def _blas() -> tuple[int, bool, int | None]:
    """NumPy's BLAS, as loaded by `import numpy` (found in this process's memory
    map): its cblas_sgemm, whether it takes 64-bit integers, and OpenBLAS's
    per-thread thread count setter where it has one."""
    import numpy

    with open("/proc/self/maps", encoding="utf-8") as maps:
        loaded = dict.fromkeys(line.split(maxsplit=5)[5].strip() for line in maps if len(line.split(maxsplit=5)) == 6)
    for path in (name for name in loaded if re.search(r"(openblas|blas|mkl_rt)[^/]*\.so", name)):
        library = ctypes.CDLL(path)
        for name, ilp64 in _SGEMM:
            if hasattr(library, name):
                local = next((getattr(library, setter) for setter in _THREADS_LOCAL if hasattr(library, setter)), None)
                return ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0, ilp64, ctypes.cast(local, ctypes.c_void_p).value if local else None
    raise ShimUnavailable(f"NumPy {numpy.__version__} loaded no BLAS that exports cblas_sgemm (the torch-free form's matrix products): install NumPy's wheel from PyPI")


def one_thread() -> None:
    """What `torch.set_num_threads(1)` does, for a child forked after a model ran."""
    if not _provider:
        return
    name, shim = next(iter(_provider.items()))
    if name == PROVIDER:
        _torch_private.set_num_threads(shim.library, 1)
    else:
        shim.library.hatch_precompile_shim_set_num_threads(1)
