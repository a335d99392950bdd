"""The compile worker: `python -m hatch_precompile.worker REQUEST.json`.

The hook runs one worker per model so that torch, the project's code and
inductor's state never enter the build backend's process. Protocol:
- REQUEST.json: {"model": ModelConfig.to_json(), "out_dir": str, "import_paths": [str]}
- stdout: one line per finished step, `PROGRESS_PREFIX` followed by JSON
  {"step": str, "seconds": float}; anything else on stdout/stderr is torch's chatter.
- out_dir/result.json: {"entry": manifest entry} or {"error": {"step", "message"}};
  the exit status is 0 only with an entry.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

PROGRESS_PREFIX = "@hatch-precompile-progress "
RESULT_FILE = "result.json"


@contextmanager
def _step(description: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    report = {"step": description, "seconds": round(time.perf_counter() - start, 2)}
    print(PROGRESS_PREFIX + json.dumps(report), flush=True)


def run(request: dict[str, Any]) -> dict[str, Any]:
    sys.path[:0] = request["import_paths"]
    model = request["model"]
    out_dir = Path(request["out_dir"])
    with _step("imported torch"):
        import torch  # noqa: F401  (timed on its own: seconds on a cold disk)

        from .capture import build_module, capture, shape_variants
        from .compile import compile_for_target, cpu_targets, lifted_weights, model_entry, save_weights
        from .errors import ModelBuildError
    with _step("built the module"):
        module = build_module(model)
    artifacts: list[dict[str, Any]] = []
    first = weights = None
    for fixed in shape_variants(model):
        shape = ", ".join(f"{dim}={size}" for dim, size in fixed.items()) or "dynamic dims"
        with _step(f"captured with torch.export ({shape})"):
            captured = capture(model, module, fixed)
        if first is None:
            first, weights = captured, save_weights(model, captured, out_dir)
        elif list(lifted_weights(captured)) != weights["order"]:
            raise ModelBuildError(model["name"], f"capturing ({shape})", "the weights the graph takes differ between shape variants")
        for target in cpu_targets(model):
            with _step(f"compiled for {target.name} ({shape}) and checked against eager"):
                artifacts.append(compile_for_target(model, captured, fixed, target, out_dir))
    assert first is not None and weights is not None
    return model_entry(model, first, weights, artifacts)


def main(request_path: str) -> int:
    from .errors import ModelBuildError

    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    result_path = Path(request["out_dir"]) / RESULT_FILE
    try:
        result: dict[str, Any] = {"entry": run(request)}
    except ModelBuildError as error:
        result = {"error": {"step": error.step, "message": error.message}}
    except Exception:
        result = {"error": {"step": "building", "message": traceback.format_exc()}}
    result_path.write_text(json.dumps(result), encoding="utf-8")
    return 0 if "entry" in result else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
