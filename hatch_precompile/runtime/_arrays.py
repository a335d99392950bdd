"""The two kinds of array a loaded model can take and return: torch tensors
(`load_compiled(name)`) and NumPy arrays (`load_compiled(name, arrays="numpy")`,
which never imports torch).

The call contract (`_contract.py`), the weights (`_weights.py`), a handle's
state (`_handle.py`) and generation (`_generate.py`) are written once, over the
few operations that differ between the two, which each kind gives here. Nothing
in this module imports torch or NumPy before a kind is asked for.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._schema import ModelEntry

ARRAY_KINDS = ("torch", "numpy")


class TorchArrays:
    """Tensors, as the module's forward takes them: each input's dtype exactly as
    compiled (compiled code would read other bytes), any strides (copied into the
    compiled layout)."""

    NAME = "torch"
    WHAT = "a tensor"

    def __init__(self) -> None:
        import torch

        self.xp, self.array_type = torch, torch.Tensor
        self._layouts = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}

    def dtype(self, name: str) -> Any:
        return getattr(self.xp, name)

    def layout(self, name: str | None) -> Any:
        return self._layouts[name or "contiguous"]

    def fits(self, value: Any, dtype: Any, layout: Any) -> bool:
        """Whether `value` can go to compiled code as it is (the calls' fast path)."""
        return isinstance(value, self.array_type) and value.dtype is dtype and value.is_cpu and value.is_contiguous(memory_format=layout)

    def dtype_problem(self, value: Any, want: str) -> str:
        found = str(value.dtype).removeprefix("torch.")
        return "" if found == want else f"expected dtype {want}, got {found}"

    def device(self, value: Any) -> str:
        return str(value.device.type)

    def has_values(self, value: Any) -> bool:
        return bool(value.numel())

    def dtype_name(self, value: Any) -> str:
        return str(value.dtype).removeprefix("torch.")

    def stored_dtype_name(self, name: str) -> str:
        return name

    def plain(self, value: Any) -> Any:
        """A weight as a graph binds it: without autograd's record."""
        return value.detach()

    def row_sums(self, data: Any, rows: int) -> bytearray:
        """`_integrity.chunk_checksums`' row sums, on every core: OpenMP's pool
        may start here, so a child forked after it gets one thread (`_fork.py`)."""
        from . import _fork
        from ._integrity import torch_row_sums

        _fork.note_call()
        return torch_row_sums(data, rows)

    def conformed(self, value: Any, want: str, layout: Any) -> Any:
        """`value` in the layout compiled for: itself where it is, else a copy."""
        return value if value.is_contiguous(memory_format=layout) else value.clone(memory_format=layout)

    def value_range(self, value: Any) -> tuple[int, int]:
        low, high = self.xp.aminmax(value)
        return int(low.item()), int(high.item())

    def frombuffer(self, buffer: Any, dtype: str, count: int, offset: int) -> Any:
        return self.xp.frombuffer(buffer, dtype=self.dtype(dtype), count=count, offset=offset) if count else self.xp.empty(0, dtype=self.dtype(dtype))

    def broadcast_zero(self, dtype: str, shape: list[int]) -> Any:
        return self.xp.zeros((), dtype=self.dtype(dtype)).expand(shape)

    def copy(self, value: Any) -> Any:
        return value.clone()

    def assign(self, target: Any, source: Any) -> None:
        target.copy_(source)

    def positions(self, start: int, stop: int) -> Any:
        return self.xp.arange(start, stop)

    def zeros(self, count: int, dtype: str) -> Any:
        return self.xp.zeros(count, dtype=self.dtype(dtype))

    def stack_columns(self, tokens: list[Any], batch: int) -> Any:
        return self.xp.stack(tokens, dim=1) if tokens else self.xp.empty((batch, 0), dtype=self.xp.int64)

    def is_floating(self, value: Any) -> bool:
        return bool(value.is_floating_point())

    def argmax(self, rows: Any) -> Any:
        # torch 2.13's argmax over bfloat16 runs a scalar loop: 172 us over SmolLM2's 49152 logits,
        # 37 us widened to float32 first (exactly, so the same index wins).
        return (rows.float() if rows.element_size() < 4 else rows).argmax(-1)


class NumpyArrays:
    """NumPy arrays, as a user of ONNX Runtime holds them: any strides, byte order
    or alignment (copied into the compiled layout), and an integer or floating
    dtype that converts to the compiled one without loss (int32 token ids where
    int64 was compiled). bfloat16 needs `ml_dtypes`' dtype, where it is installed."""

    NAME = "numpy"
    WHAT = "a NumPy array"

    def __init__(self) -> None:
        import numpy

        self.xp, self.array_type = numpy, numpy.ndarray

    def dtype(self, name: str) -> Any:
        return numpy_dtype(name)

    def layout(self, name: str | None) -> str:
        return name or "contiguous"

    def fits(self, value: Any, dtype: Any, layout: str) -> bool:
        if type(value) is not self.array_type or value.dtype is not dtype or not value.flags.aligned:
            return False
        return bool(value.flags.c_contiguous) if layout == "contiguous" else _channels_last(value)

    def dtype_problem(self, value: Any, want: str) -> str:
        wanted = numpy_dtype(want)
        given = value.dtype
        if given == wanted or ((given.kind == wanted.kind or {given.kind, wanted.kind} <= {"i", "u"}) and self.xp.can_cast(given, wanted, "safe")):
            return ""
        return f"expected dtype {want}{' (or one that converts to it without loss)' if wanted.kind in 'iuf' else ''}, got {given.name}"

    def device(self, value: Any) -> str:
        return "cpu"

    def has_values(self, value: Any) -> bool:
        return bool(value.size)

    def dtype_name(self, value: Any) -> str:
        return str(value.dtype.name)

    def stored_dtype_name(self, name: str) -> str:
        return str(storage_dtype(name).name)

    def plain(self, value: Any) -> Any:
        return value

    def row_sums(self, data: Any, rows: int) -> bytes:
        from ._integrity import numpy_row_sums

        return numpy_row_sums(data, rows)

    def conformed(self, value: Any, want: str, layout: str) -> Any:
        if self.fits(value, numpy_dtype(want), layout):
            return value
        native = value.astype(numpy_dtype(want), order="C")  # a new, aligned array of the native byte order
        if layout == "channels_last":
            native = self.xp.ascontiguousarray(native.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        return native

    def value_range(self, value: Any) -> tuple[int, int]:
        return int(value.min()), int(value.max())  # integer inputs only (`below`)

    def frombuffer(self, buffer: Any, dtype: str, count: int, offset: int) -> Any:
        return self.xp.frombuffer(buffer, dtype=storage_dtype(dtype), count=count, offset=offset)

    def broadcast_zero(self, dtype: str, shape: list[int]) -> Any:
        return self.xp.broadcast_to(self.xp.zeros((), dtype=storage_dtype(dtype)), shape)

    def copy(self, value: Any) -> Any:
        return self.xp.array(value, order="C")

    def assign(self, target: Any, source: Any) -> None:
        self.xp.copyto(target, source)

    def positions(self, start: int, stop: int) -> Any:
        return self.xp.arange(start, stop, dtype=self.xp.int64)

    def zeros(self, count: int, dtype: str) -> Any:
        return self.xp.zeros(count, dtype=numpy_dtype(dtype))

    def stack_columns(self, tokens: list[Any], batch: int) -> Any:
        return self.xp.stack(tokens, axis=1) if tokens else self.xp.empty((batch, 0), dtype=self.xp.int64)

    def is_floating(self, value: Any) -> bool:
        return bool(value.dtype.kind == "f" or value.dtype.name == "bfloat16")

    def argmax(self, rows: Any) -> Any:
        return (rows.astype(self.xp.float32) if rows.dtype.itemsize < 4 else rows).argmax(-1)  # as TorchArrays'


def _channels_last(value: Any) -> bool:
    return value.ndim == 4 and bool(value.transpose(0, 2, 3, 1).flags.c_contiguous)


ArrayKind = TorchArrays | NumpyArrays


@functools.cache
def array_kind(name: str) -> ArrayKind:
    """The kind named "torch" or "numpy" (each made once: a kind holds its module)."""
    return TorchArrays() if name == "torch" else NumpyArrays()


class MissingDtypeError(TypeError):
    """An array's dtype has no NumPy dtype here (bfloat16 without `ml_dtypes`)."""


def numpy_dtype(name: str) -> Any:
    """The NumPy dtype of a torch dtype name ("float32", "bfloat16"): bfloat16 is
    `ml_dtypes.bfloat16` (NumPy has none), MissingDtypeError where it is not installed."""
    import numpy

    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise MissingDtypeError("NumPy has no bfloat16 dtype: install ml_dtypes (`pip install ml_dtypes`), which defines the one JAX and ONNX use") from None
        return numpy.dtype(ml_dtypes.bfloat16)
    return numpy.dtype(name)


def missing_numpy_dtype(model: ModelEntry) -> str:
    """Why NumPy cannot hold one of the model's inputs or outputs here (bfloat16
    without ml_dtypes), whichever form runs it; "" where it can."""
    leaves = [*((f"input {leaf['name']}", leaf) for leaf in model["inputs"]["leaves"]), *((f"output {i}", leaf) for i, leaf in enumerate(model["outputs"]["leaves"]))]
    for where, leaf in leaves:
        if leaf.get("dtype") == "bfloat16":
            try:
                numpy_dtype("bfloat16")
            except MissingDtypeError as error:
                return f"its {where} is bfloat16: {error}"
    return ""


def storage_dtype(name: str) -> Any:
    """A NumPy dtype with the bytes of a torch dtype, for arrays only compiled code
    reads (weights, state): bfloat16's bits as uint16 where ml_dtypes is missing."""
    import numpy

    try:
        return numpy_dtype(name)
    except MissingDtypeError:
        return numpy.dtype(numpy.uint16)
