"""Each assumption `runtime/_torch_private.py` makes about torch, checked against the
installed torch. When one of these fails after a torch upgrade, fix that module."""

from __future__ import annotations

import os
import re
import zlib
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn

from hatch_precompile.runtime import _torch_private
from hatch_precompile.runtime._torch_private import ArtifactFormatError


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.relu(self.first(x))
        return {"out": self.second(hidden), "pair": (hidden, x.sum(-1))}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, torch.export.ExportedProgram, Path, Path]:
    """A small model exported with a dynamic batch, compiled into a private cache, saved."""
    folder = tmp_path_factory.mktemp("compiled")
    cache = folder / "inductor-cache"
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    try:
        module = Small().eval()
        batch = torch.export.Dim("batch", min=1, max=32)
        exported = torch.export.export(module, (torch.randn(3, 8),), dynamic_shapes=({0: batch},)).run_decompositions()
        artifact = _torch_private.compile_exported(exported, {})
        path = folder / "small.bin"
        _torch_private.save_artifact(artifact, str(path))
    finally:
        if previous is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
    return module, exported, path, cache


def test_artifact_file_is_framed_header_torch_key_bundle(compiled) -> None:
    _, _, path, _ = compiled
    key, payload = _torch_private.split_artifact(path.read_bytes())
    assert key == _torch_private.torch_key() and len(key) == 32
    assert payload[:1] == b"\x80"  # a pickle


def test_deserialized_bundle_takes_weights_then_inputs_and_returns_a_flat_list(compiled) -> None:
    module, exported, path, _ = compiled
    _, payload = _torch_private.split_artifact(path.read_bytes())
    run = _torch_private.deserialize_artifact(payload)
    weights = [exported.state_dict[s.target] for s in exported.graph_signature.input_specs if s.kind.name == "PARAMETER"]
    x = torch.randn(5, 8)
    with torch.no_grad():
        out = run(*weights, x)
        expected = _torch_private.tree_leaves(module(x))
    assert isinstance(out, list) and len(out) == 3
    for got, want in zip(out, expected):
        torch.testing.assert_close(got, want)


def test_exactly_the_export_dims_are_symbolic_in_the_generated_code(compiled) -> None:
    """Weights and the input's feature size stay static; only the batch is a symbol."""
    _, _, _, cache = compiled
    wrappers = [p.read_text() for p in cache.rglob("*.py") if "def call(" in p.read_text()]
    assert len(wrappers) == 1
    sizes = re.findall(r"assert_size_stride\(arg\d+_1, \(([^)]*)\)", wrappers[0])
    entries = [s.strip() for group in sizes for s in group.split(",") if s.strip()]
    symbolic = [s for s in entries if not s.isdigit()]
    assert len(sizes) == 5  # four weights, one input
    assert len(symbolic) == 1 and symbolic[0].startswith("s"), sizes


def test_tree_specs_become_plain_data(compiled) -> None:
    _, exported, _, _ = compiled
    assert _torch_private.treespec_to_json(exported.call_spec.out_spec) == {
        "type": "dict",
        "keys": ["out", "pair"],
        "children": [{"type": "leaf"}, {"type": "tuple", "children": [{"type": "leaf"}, {"type": "leaf"}]}],
    }


Point = namedtuple("Point", "x y")


class Keyed:
    """Flattened by key, the way transformers registers its ModelOutput classes."""

    def __init__(self, **values: torch.Tensor) -> None:
        self.values = values


torch.utils._pytree.register_pytree_node(
    Keyed, lambda k: (list(k.values.values()), list(k.values)), lambda v, keys: Keyed(**dict(zip(keys, v)))
)


def test_named_tuples_and_keyed_classes_are_recorded_by_import_path() -> None:
    leaves = (torch.ones(1), torch.ones(1))
    point = torch.utils._pytree.tree_flatten(Point(*leaves))[1]
    keyed = torch.utils._pytree.tree_flatten(Keyed(a=leaves[0], b=leaves[1]))[1]
    assert _torch_private.treespec_to_json(point) == {
        "type": "namedtuple",
        "class": "test_torch_assumptions:Point",
        "children": [{"type": "leaf"}, {"type": "leaf"}],
    }
    assert _torch_private.treespec_to_json(keyed) == {
        "type": "keyed",
        "class": "test_torch_assumptions:Keyed",
        "keys": ["a", "b"],
        "children": [{"type": "leaf"}, {"type": "leaf"}],
    }


def test_containers_without_keys_are_refused_by_name() -> None:
    spec = torch.utils._pytree.tree_flatten(torch.return_types.max((torch.ones(1), torch.ones(1))))[1]
    with pytest.raises(TypeError, match="max in inputs or outputs is not supported yet"):
        _torch_private.treespec_to_json(spec)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[: len(data) // 2], "checksum mismatch"),
        (lambda data: data[:3], "too short"),
        (lambda data: data[:10] + bytes([data[10] ^ 1]) + data[11:], "checksum mismatch"),
        (lambda data: zlib.crc32(data[4:-5]).to_bytes(4, "big") + data[4:-5], "runs past the end"),
        (lambda data: zlib.crc32(b"junk").to_bytes(4, "big") + b"junk", "length is cut off"),
    ],
)
def test_damaged_files_raise_a_format_error_not_an_assertion(compiled, damage, message: str) -> None:
    _, _, path, _ = compiled
    with pytest.raises(ArtifactFormatError, match=message):
        _torch_private.split_artifact(damage(path.read_bytes()))
