"""The shim provider of the NumPy path: AOTInductor's C shim, from torch's
`libtorch_cpu.so`, called through ctypes without importing torch.

A C++ form's library calls torch only through the shim's C functions
(`aoti_torch_*`: make, inspect and free tensors, and a few operators); its
own C interface (`_container.py`) takes and returns tensors as the shim's
`AtenTensorHandle`. So a process with NumPy arrays needs these, and nothing of
torch's Python: `load()` finds the installed torch's libraries on disk
(`_manifest.installed_torch`, which reads no more than torch's version file),
loads them with `RTLD_GLOBAL` so that the container library's undefined
`aoti_torch_*` symbols resolve to them, and this module makes a tensor handle
over an array's memory, and an array over an output handle's memory.

This is the one module that names the provider: a smaller library exporting the
same shim functions would replace `libtorch_cpu.so` here and nowhere else.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable
from typing import Any

from . import _torch_private
from ._manifest import installed_torch

Handle = ctypes.c_void_p  # AtenTensorHandle
_Sizes = ctypes.POINTER(ctypes.c_int64)
PROVIDER = "libtorch_cpu.so"  # what `load` opens, in torch's lib folder (after libc10.so, which it needs; then libtorch.so)


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

    def _function(self, name: str, *argtypes: Any) -> Callable[..., int]:
        function = getattr(self.library, name)
        function.argtypes, function.restype = list(argtypes), ctypes.c_int32  # AOTITorchError: 0 is success
        return function  # type: ignore[no-any-return]

    def _code(self, name: str) -> int:
        function = getattr(self.library, name)
        function.argtypes, function.restype = [], ctypes.c_int32
        return int(function())

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


@functools.cache
def _loaded() -> Shim:
    with _loading:
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


def load() -> Shim:
    """The shim, loaded once per process (ShimUnavailable where it cannot be)."""
    return _loaded()


def one_thread() -> None:
    """What `torch.set_num_threads(1)` does, for a child forked after a model ran."""
    _torch_private.set_num_threads(_loaded().library, 1)
