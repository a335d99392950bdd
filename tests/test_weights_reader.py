"""The loader's own safetensors reader: the same tensors as the safetensors
library gives, viewed in place, and a clear error for a file it cannot read."""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hatch_precompile.runtime._arrays import array_kind
from hatch_precompile.runtime._errors import PrecompiledIntegrityError
from hatch_precompile.runtime._weights import safetensors_views


def mapped(path: Path) -> mmap.mmap:
    with path.open("rb") as stream:
        return mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_COPY)


def test_every_dtype_and_shape_reads_as_the_safetensors_library_reads_it(tmp_path: Path) -> None:
    tensors = {
        "matrix": torch.randn(3, 5),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "flags": torch.tensor([True, False, True]),
        "flag": torch.tensor(True),
        "ids": torch.arange(7),
        "half": torch.randn(4, dtype=torch.bfloat16),
        "double": torch.randn(2, dtype=torch.float64),
        "small": torch.ones(5, dtype=torch.int8),
    }
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    ours, theirs = safetensors_views(mapped(path), path, array_kind("torch")), load_file(str(path))
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and ours[name].shape == tensor.shape and torch.equal(ours[name], tensor), name


def test_the_builds_writer_aligns_every_tensor_and_the_library_reads_its_file(tmp_path: Path) -> None:
    """worker/weights.py writes each tensor at a multiple of 64 bytes (gaps filled
    with padding tensors the loader skips): an int8 weight at an odd offset, where
    safetensors' own writer puts it, crashed torch's int8-weight matrix product."""
    from hatch_precompile.worker.weights import ALIGNMENT, write_aligned

    tensors = {
        "odd": torch.randn(3, dtype=torch.bfloat16),
        "weight_int8": torch.randint(-127, 127, (96, 33), dtype=torch.int8),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "flag": torch.tensor(True),
        "packed": torch.randint(0, 255, (7, 5), dtype=torch.uint8),
        "double": torch.randn(2, dtype=torch.float64),
    }
    path = tmp_path / "w.safetensors"
    write_aligned(tensors, path)
    ours, theirs = safetensors_views(mapped(path), path, array_kind("torch")), load_file(str(path))
    assert list(ours) == list(tensors) and set(theirs) - set(ours) == {n for n in theirs if n.startswith("__padding__")}
    for name, tensor in tensors.items():
        assert torch.equal(ours[name], tensor) and torch.equal(theirs[name], tensor), name
        assert tensor.numel() == 0 or ours[name].data_ptr() % ALIGNMENT == 0, name


def _file(tmp_path: Path, header: dict, data: bytes) -> Path:
    encoded = json.dumps(header).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data)
    return path


@pytest.mark.parametrize(
    ("header", "found"),
    [
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, "tensor 'w': its offsets do not fit"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, "tensor 'w': its offsets do not fit"),  # past the end
        ({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, "'Q4'"),
        ({"w": {"shape": [2], "data_offsets": [0, 8]}}, "'dtype'"),
    ],
)
def test_a_header_that_does_not_fit_is_an_integrity_error_naming_the_file(tmp_path: Path, header: dict, found: str) -> None:
    path = _file(tmp_path, header, bytes(8))
    with pytest.raises(PrecompiledIntegrityError, match="is not a safetensors file this loader can read") as raised:
        safetensors_views(mapped(path), path, array_kind("torch"))
    assert str(path) in str(raised.value) and found in str(raised.value)
