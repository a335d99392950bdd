"""`python -m hatch_precompile.worker.lean_check REQUEST.json`: run lean modules as the loader would.

A fresh interpreter, so that nothing the compile left in the process (inductor's
modules, its kernel cache, patched functions) can make a module pass here that
would fail in a user's process. Each module runs through the loader's own code
(`runtime/_lean.py`) on each call of the build's check (the example inputs,
then a model's steps from its initial state, or the dims' min, a size between
and max: `capture.Captured.steps`); its outputs, and its state
after the last call, must equal the artifact's bit for bit (the artifact's passed the accuracy check), and afterwards
neither torch._inductor nor torch._dynamo may have been imported (except by the
modules defining custom ops the graph calls, which the loader imports too).

Writes `<request stem>.result.json` beside the request: module file -> "" or the reason.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TypedDict, cast

from ..runtime._schema import ConstantSpec
from .form import COMPILER_MODULES


class FrozenTensorsFile(TypedDict):
    file: str  # an int8 variant's constants file
    specs: dict[str, ConstantSpec]


class ModuleCheck(TypedDict):
    """One lean module to run, and what to run it with (worker/lean.py writes it)."""

    file: str
    data: str  # torch.save of compile.CheckedSequence: the calls, the artifact's outputs and state
    extern_kernels: list[str]
    inputs_to_check: list[int]
    kernels: list[str]
    kernels_dir: str  # its model's
    constants: FrozenTensorsFile | None


class CheckRequest(TypedDict):
    modules: list[ModuleCheck]
    op_libraries: dict[str, str]  # custom op -> the module defining it, imported first


def read_results(path: Path) -> dict[str, str]:
    """What `main` wrote: per module file, "" or the reason; ValueError where it is not that."""
    results = json.loads(path.read_text(encoding="utf-8"))
    if not (isinstance(results, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in results.items())):
        raise ValueError(f"{path} is not a lean check's result")
    return cast(dict[str, str], results)


def check(module: ModuleCheck) -> str:
    import torch

    from ..runtime._frozen_tensors import rebuild_constants
    from ..runtime._layout import kernel_file
    from ..runtime._lean import make_runner

    kernels = {key: Path(module["kernels_dir"]) / kernel_file(key) for key in module["kernels"]}
    path = Path(module["file"])
    constants = {}
    if module["constants"] is not None:  # an int8 variant's: its file, and how each constant is rebuilt
        constants_path = Path(module["constants"]["file"])
        constants = rebuild_constants(constants_path.read_bytes(), constants_path, module["constants"]["specs"])
    source = path.read_text(encoding="utf-8")
    run = make_runner(source, str(path), kernels, module["extern_kernels"], module["inputs_to_check"], constants)
    data = torch.load(module["data"], weights_only=True)  # compile.CheckedSequence
    weights = data["initial"]  # the state in it is updated in place by each call, as the loader's is
    for call, (inputs, expected) in enumerate(zip(data["calls"], data["outputs"]), start=1):
        with torch.no_grad():
            outputs = list(run([*weights, *inputs]))
        on_call = f" on call {call}" if len(data["calls"]) > 1 else ""
        if len(outputs) != len(expected):
            return f"it returned {len(outputs)} outputs{on_call}, the artifact {len(expected)}"
        for index, (lean, artifact) in enumerate(zip(outputs, expected)):
            if not torch.equal(lean, artifact):
                return f"output {index}{on_call} differs from the artifact's by up to {_worst(lean, artifact):.3g}"
    for index, artifact in zip(data["state_inputs"], data["state"]):
        if not torch.equal(weights[index], artifact):
            return f"its state (input {index}) differs from the artifact's after {len(data['calls'])} calls by up to {_worst(weights[index], artifact):.3g}"
    return ""


def _worst(lean: Any, artifact: Any) -> float:
    return float((lean.float() - artifact.float()).abs().max().item())


def check_all(modules: list[ModuleCheck]) -> dict[str, str]:
    """Per module file, "" if it matched or the reason it did not."""
    results = {}
    for module in modules:
        try:
            results[module["file"]] = check(module)
        except Exception as error:  # reported per module; the build ships the artifact form instead
            results[module["file"]] = f"running it failed: {type(error).__name__}: {error}"
    return results


def main(request_path: str) -> int:
    from ..runtime._ops import import_op_libraries

    request: CheckRequest = json.loads(Path(request_path).read_text(encoding="utf-8"))  # written just now by worker/lean.py
    import_op_libraries(request["op_libraries"])  # as the loader does; what they import is theirs
    before = {name for name in COMPILER_MODULES if name in sys.modules}
    results = check_all(request["modules"])
    imported = [name for name in COMPILER_MODULES if name in sys.modules and name not in before]
    if imported:
        results = {file: reason or f"running it imported {', '.join(imported)}" for file, reason in results.items()}
    Path(request_path).with_suffix(".result.json").write_text(json.dumps(results), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
