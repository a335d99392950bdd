"""The torch-free form's check: each library on the wheel's own shim, on NumPy
arrays, through the loader's code, in a venv that has no torch.

The venv is made here (`python -m venv --without-pip`) and holds links to the
build environment's NumPy (and ml_dtypes, where installed) and to
hatch_precompile itself, nothing else: `import torch` fails in it, so a library
or a loader step that needed torch cannot pass. The shim is compiled for the
libraries checked, as the wheel's will be for all of them (`shim/build.py`).
The calls are the build's check calls from the initial state, in order (the
state of a model that has one carries from call to call, as in a handle), and
the parent compares each call's outputs with eager's (`cpp_form.check`).

`<venv>/bin/python -m hatch_precompile.worker.torch_free REQUEST.json` is that
interpreter: it writes each library's outputs, or why it could not run them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..runtime._layout import OPENMP_FILE, SHIM_FILE
from ..shim.build import compile_shim, openmp_runtime

CHECK_MODULE = "hatch_precompile.worker.torch_free"
# What the venv links from the build environment: NumPy (with its BLAS), ml_dtypes for bfloat16, and this package.
LINKED = ("numpy", "ml_dtypes", "hatch_precompile")


def run_without_torch(checks: list[dict[str, Any]], scratch: Path) -> list[list[list[Any]] | str]:
    """Run each check (`library`, `record`, the weights' `order`, the input
    `leaves`, the `outputs`' dtypes, `data`: the variant's CheckedSequence file)
    in a venv without torch; per check, its outputs for each call (torch
    tensors), or why it could not run."""
    import torch

    shim = scratch / SHIM_FILE
    try:
        compile_shim({symbol for check in checks for symbol in check["record"]["references"]}, shim)
        shutil.copyfile(openmp_runtime(), scratch / OPENMP_FILE)
    except (ValueError, RuntimeError) as error:
        return [str(error)] * len(checks)
    python = _venv_without_torch(scratch / "venv")
    request = []
    for index, check in enumerate(checks):
        data = torch.load(check["data"], weights_only=True)  # compile.CheckedSequence
        arrays = scratch / f"torch-free-{index}.npz"
        _save_arrays(arrays, data["initial"], data["calls"])
        outputs = scratch / f"torch-free-{index}-outputs.npz"
        model = {  # the manifest entry's parts the loader reads
            "weights": {"order": check["order"], "specs": {name: {"dtype": str(tensor.dtype).removeprefix("torch.")} for name, tensor in zip(check["order"], data["initial"])}},
            "inputs": {"leaves": check["leaves"]},
            "outputs": {"leaves": [{"dtype": dtype} for dtype in check["outputs"]]},
        }
        request.append({"library": check["library"], "record": check["record"], "model": model, "arrays": str(arrays), "calls": len(data["calls"]), "outputs": str(outputs)})
    path = scratch / "torch-free-check.json"
    path.write_text(json.dumps({"shim": str(shim), "checks": request}), encoding="utf-8")
    environment = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([str(python), "-I", "-m", CHECK_MODULE, str(path)], capture_output=True, text=True, env=environment, cwd=scratch)
    if done.returncode:
        return [f"the check process in a venv without torch exited with {done.returncode}: {done.stderr.strip()[-1500:]}"] * len(checks)
    results: list[list[list[Any]] | str] = []
    import numpy

    for check in request:
        with numpy.load(check["outputs"]) as saved:
            failed = str(saved["failed"]) if "failed" in saved else ""
            results.append(failed or [[torch.from_numpy(saved[f"call{call}_{output}"].copy()) for output in range(int(saved[f"call{call}"]))] for call in range(check["calls"])])
    return results


def _venv_without_torch(folder: Path) -> Path:
    """A venv whose site-packages links only `LINKED` from this environment; its Python."""
    if not folder.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, capture_output=True)
    site = Path(subprocess.run([str(folder / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True, capture_output=True, text=True).stdout.strip())
    for name in LINKED:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        package = Path(next(iter(spec.submodule_search_locations)))
        for source in (package, package.with_name(f"{name}.libs")):  # NumPy's wheel keeps its BLAS beside it
            if source.exists() and not (site / source.name).exists():
                (site / source.name).symlink_to(source)
    return folder / "bin" / "python"


def _save_arrays(path: Path, initial: list[Any], calls: list[list[Any]]) -> None:
    """The weights and each call's tensor inputs as NumPy arrays (bfloat16 as its
    bits, which the loader views as ml_dtypes' type); other inputs by value."""
    import numpy
    import torch

    def array(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().contiguous()
        return tensor.view(torch.uint16).numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()

    arrays = {f"weight{index}": array(tensor) for index, tensor in enumerate(initial)}
    for call, inputs in enumerate(calls):
        for index, value in enumerate(inputs):
            arrays[f"call{call}_{index}"] = array(value) if isinstance(value, torch.Tensor) else numpy.asarray(value)
    numpy.savez(path, **arrays)


def _run(check: dict[str, Any], shim: Path) -> dict[str, Any]:
    """One library on each call from the initial state, through the loader's code."""
    import numpy

    from ..runtime._arrays import numpy_dtype
    from ..runtime._cpp import ArrayContainerGraph

    model, leaves = check["model"], check["model"]["inputs"]["leaves"]
    specs = model["weights"]["specs"]
    with numpy.load(check["arrays"]) as saved:
        weights = [saved[f"weight{index}"].view(numpy_dtype(specs[name]["dtype"])) for index, name in enumerate(model["weights"]["order"])]
        calls = [[_input(saved[f"call{call}_{index}"], leaf) for index, leaf in enumerate(leaves)] for call in range(check["calls"])]
    graph = ArrayContainerGraph(Path(check["library"]), check["record"], model, shim)
    run = graph.bind(weights)  # the state in it is updated in place by each call
    outputs: dict[str, Any] = {}
    for call, inputs in enumerate(calls):
        returned = [numpy.array(output) for output in run(inputs)]  # copies: the views die with this process's arrays
        outputs[f"call{call}"] = len(returned)
        outputs.update({f"call{call}_{index}": output for index, output in enumerate(returned)})
    return outputs


def _input(saved: Any, leaf: dict[str, Any]) -> Any:
    from ..runtime._arrays import numpy_dtype

    return saved.view(numpy_dtype(leaf["dtype"])) if "dtype" in leaf else saved.item()


def main(request_path: str) -> int:
    import numpy

    request = json.loads(Path(request_path).read_text(encoding="utf-8"))  # written just now by run_without_torch
    for check in request["checks"]:
        try:
            ran = _run(check, Path(request["shim"]))
        except Exception as error:  # reported per library; the variant ships without a C++ form, the reason in the manifest
            ran = {"failed": f"running it failed: {type(error).__name__}: {error}"}
        if "torch" in sys.modules and "failed" not in ran:
            ran = {"failed": "running it imported torch"}
        numpy.savez(check["outputs"], **ran)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
