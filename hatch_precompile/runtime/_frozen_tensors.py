"""The constants an int8 variant's lean module binds, rebuilt from the shipped file.

An int8 graph is compiled with its weights frozen in: its output module declares
each constant as a global (`_frozen_param3 = None`) that inductor bound after
loading it, and so does this loader. The build saved each one as
`ArtifactEntry["constants"]` describes (`worker/frozen_tensors.py`): a view of a
storage whose bytes the file holds, or a oneDNN-packed weight, rebuilt by the
same prepack call the build's constant folding made, here, so that its layout is
the one this CPU's oneDNN chooses. No compiler and no torchao: the prepack ops
are torch's own.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from . import _torch_private
from ._arrays import array_kind
from ._schema import ConstantSpec
from ._weights import safetensors_views


def rebuild_constants(data: bytes, path: Path, specs: dict[str, ConstantSpec]) -> dict[str, Any]:
    """Each constant by global name, from the constants file's checked bytes."""
    import torch

    with warnings.catch_warnings():  # views of read-only bytes: each is copied (storages) or only read (prepacks)
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        stored = safetensors_views(data, path, array_kind("torch"))
    storages: dict[str, Any] = {}  # each storage copied once, into memory torch allocates (aligned, writable)
    constants = {}
    for name, spec in specs.items():
        if "prepack" in spec:
            arguments = [stored[a["tensor"]] if "tensor" in a else a.get("value") for a in spec["arguments"]]
            constants[name] = _torch_private.prepack(spec["prepack"], arguments)
            continue
        storage = storages.setdefault(spec["storage"], stored[spec["storage"]].clone().untyped_storage())
        tensor = torch.empty(0, dtype=getattr(torch, spec["dtype"]))
        constants[name] = tensor.set_(storage, spec["offset"], spec["size"], spec["stride"])
    return constants
