"""The build's precompiled headers: one per torch build and compiler, shared by
builds in any environment, and kernels that do not depend on which environment
built the header."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from conftest import REPO, Venv, run, session_compiler_outputs

# Compile a small model as the worker does; print each kernel's key and sha256.
COMPILE = """
import hashlib, json, sys
from pathlib import Path
import torch
from hatch_precompile.worker import torch_internals

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
batch = torch.export.Dim("batch", min=1, max=32)
exported = torch_internals.decompose(torch.export.export(model, (torch.randn(3, 8),), dynamic_shapes=({0: batch},)))
torch_internals.probe_vector_isas_in(Path(sys.argv[2]))  # the session's probes: this test is about the header
with torch_internals.precompiled_headers_in(Path(sys.argv[1])), torch_internals.captured_kernels() as built:
    torch_internals.compile_exported(exported, {"cpp.simdlen": 256, "cpp.march": "x86-64-v3"})
    print(json.dumps({key: hashlib.sha256(Path(path()).read_bytes()).hexdigest() for key, path in built.items()}))
"""


def compile_in(python: str, headers: Path, inductor_cache: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)}
    probes = session_compiler_outputs() / "vector-isa"
    result = run([python, "-c", COMPILE, str(headers), str(probes)], env=env)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_environments_with_torch_elsewhere_share_one_header_and_build_the_same_kernels(torch_venv: Venv, tmp_path: Path) -> None:
    """The session's header folder, where the builds before this test kept theirs
    (or this test's first compile keeps it): the other environment must find it
    there and build the same kernels with it."""
    import torch

    headers = session_compiler_outputs() / "headers"
    here = compile_in(sys.executable, headers, tmp_path / "inductor-here")
    built = sorted(headers.glob("*.gch"))
    assert built, "no precompiled header was kept in the folder given"
    there = compile_in(torch_venv.python, headers, tmp_path / "inductor-there")
    assert torch_venv.python != sys.executable and str(torch_venv.path) not in torch.__file__
    assert sorted(headers.glob("*.gch")) == built, "the other environment built its own header"
    assert here == there, "the kernels depend on the environment that built the header"
    assert not list(headers.glob("tmp*")), "scratch left in the header folder"
