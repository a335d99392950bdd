"""A C++ form's library through its own C interface, by ctypes: the NumPy path.

The library is AOTInductor's model container, and exports AOTInductor's C
interface (`torch/csrc/inductor/aoti_runtime/interface.h`), the same calls
torch's own runner makes: create a container, bind each constant by name to a
tensor the caller keeps (`...UpdateUserManagedConstantBufferPairs`: no copy,
and a state tensor it updates in place is the caller's), run it on tensor
handles (inputs are taken, outputs given). Each function returns 0 on success;
the library prints its C++ exception where one returns 1.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._shim import Handle, Shim


class _ConstantPair(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("handle", Handle)]  # AOTInductorConstantMapEntry


class ContainerLibrary:
    """One C++ form library, loaded (OSError where the dynamic loader refuses it)."""

    def __init__(self, path: Path, shim: Shim) -> None:
        self.path, self.shim = path, shim
        self._library = ctypes.CDLL(str(path))
        container, size = ctypes.POINTER(Handle), ctypes.c_size_t
        self._create = self._function("AOTInductorModelContainerCreateWithDevice", container, size, ctypes.c_char_p, ctypes.c_char_p)
        self._delete = self._function("AOTInductorModelContainerDelete", Handle)
        self._count = self._function("AOTInductorModelContainerGetNumConstants", Handle, ctypes.POINTER(size))
        self._constant_name = self._function("AOTInductorModelContainerGetConstantName", Handle, size, ctypes.POINTER(ctypes.c_char_p))
        self._outputs = self._function("AOTInductorModelContainerGetNumOutputs", Handle, ctypes.POINTER(size))
        self._bind = self._function("AOTInductorModelContainerUpdateUserManagedConstantBufferPairs", Handle, ctypes.POINTER(_ConstantPair), size, ctypes.c_bool, ctypes.c_bool)
        self._run = self._function("AOTInductorModelContainerRun", Handle, ctypes.POINTER(Handle), size, ctypes.POINTER(Handle), size, Handle, Handle)

    def _function(self, name: str, *argtypes: Any) -> Callable[..., int]:
        function = getattr(self._library, name)
        function.argtypes, function.restype = list(argtypes), ctypes.c_int32
        return function  # type: ignore[no-any-return]

    def _call(self, what: str, result: int) -> None:
        if result:
            said = self.shim.last_error()
            raise RuntimeError(f"{self.path}: {what} failed: {said}" if said else f"{self.path}: {what} failed (the library printed its reason on standard error)")

    def create(self) -> Container:
        handle = Handle()
        self._call("creating its container", self._create(ctypes.byref(handle), 1, b"cpu", None))
        return Container(self, handle)


class Container:
    """One model container of a library; deleted with this object (after the
    constants it reads, which it holds)."""

    def __init__(self, library: ContainerLibrary, handle: ctypes.c_void_p) -> None:
        self.library, self._handle = library, handle
        self._kept: list[Any] = []  # the constants' arrays and handles, which the container reads
        count = ctypes.c_size_t()
        library._call("counting its outputs", library._outputs(handle, ctypes.byref(count)))
        self.outputs = count.value

    def constant_names(self) -> list[str]:
        count, name = ctypes.c_size_t(), ctypes.c_char_p()
        self.library._call("counting its constants", self.library._count(self._handle, ctypes.byref(count)))
        names = []
        for index in range(count.value):
            self.library._call("naming a constant", self.library._constant_name(self._handle, index, ctypes.byref(name)))
            names.append((name.value or b"").decode())
        return names

    def bind(self, constants: dict[str, tuple[Any, int]]) -> None:
        """Make the container read each constant (its name -> an array and its
        shim dtype code) from that array, without a copy; every one is needed."""
        shim = self.library.shim
        pairs = (_ConstantPair * len(constants))()
        for pair, (name, (array, code)) in zip(pairs, constants.items()):
            handle = shim.tensor(array, code)
            pair.name, pair.handle = name.encode(), handle
            self._kept += [array, handle]
        self.library._call("binding its constants", self.library._bind(self._handle, pairs, len(constants), False, True))

    def runner(self, codes: list[int]) -> Callable[[list[Any]], list[int]]:
        """A function of the call's input arrays (each of the dtype whose shim code
        is in `codes`) that runs the container and returns its output handles;
        it keeps the container alive."""
        shim, run, outputs = self.library.shim, self.library._run, self.outputs
        inputs_type, outputs_type = Handle * len(codes), Handle * outputs
        call = self.library._call

        def run_on(arrays: list[Any]) -> list[int]:
            given = inputs_type(*[shim.tensor(array, code) for array, code in zip(arrays, codes)])  # taken by the run
            returned = outputs_type()
            call("running it", run(self._handle, given, len(codes), returned, outputs, None, None))
            return list(returned)

        return run_on

    def __del__(self) -> None:
        self.library._delete(self._handle)
        for kept in self._kept:
            if isinstance(kept, Handle):
                self.library.shim.delete(kept)
