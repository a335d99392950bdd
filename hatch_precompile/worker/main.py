"""The compile worker's process: `python -m hatch_precompile.worker REQUEST.json`.

The hook runs one worker per model so that torch, the project's code and
inductor's state never enter the build backend's process. What it reads, prints
and writes is `build.protocol`'s: a `WorkerRequest`, progress lines, and a
`BuiltModel` or a `WorkerFailure`.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..build.protocol import PROGRESS_PREFIX, BuiltModel, WorkerFailure, WorkerRequest, write_result
from ..runtime._schema import WeightsEntry

if TYPE_CHECKING:
    from ..build.cache import ArtifactSources
    from ..build.config import ModelConfig
    from .capture import Captured
    from .compile import ProducedArtifact



@contextmanager
def _step(description: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    _report(description, time.perf_counter() - start)


def _report(description: str, seconds: float | None = None) -> None:
    print(PROGRESS_PREFIX + json.dumps({"step": description, "seconds": None if seconds is None else round(seconds, 2)}), flush=True)


def run(request: WorkerRequest) -> BuiltModel:
    sys.path[:0] = request.import_paths
    with _step("imported torch"):
        import torch  # noqa: F401  (timed on its own: seconds on a cold disk)

        from . import torch_internals
    with torch_internals.precompiled_headers_in(request.headers):
        return _produce(request.model, request.out_dir, request.sources)


def _produce(model: ModelConfig, out_dir: Path, sources: ArtifactSources) -> BuiltModel:
    """Build the module, capture and compile (or fetch) each variant, check the lean forms."""
    from ..build.errors import ModelBuildError
    from . import torch_internals
    from .accuracy import summary as accuracy_summary
    from .capture import build_module, capture, shape_variants
    from .compile import CHECK_DIR, cpu_targets, model_entry, produce_artifact
    from .weights import lifted_weights, save_weights

    with _step("built the module"):
        module, reference = build_module(model)
    produced: list[ProducedArtifact] = []
    first: Captured | None = None
    weights: WeightsEntry | None = None
    for fixed in shape_variants(model):
        shape = ", ".join(f"{dim}={size}" for dim, size in fixed.items()) or "dynamic dims"
        with _step(f"captured with torch.export ({shape})"):
            captured = capture(model, module, fixed, reference)
        if first is None:
            first, weights = captured, save_weights(model, captured, out_dir)
        elif weights is not None and list(lifted_weights(captured)) != weights["order"]:
            raise ModelBuildError(model.name, f"capturing ({shape})", "the weights the graph takes differ between shape variants")
        for target in cpu_targets(model):
            started = time.perf_counter()
            artifact = produce_artifact(model, captured, fixed, target, out_dir, sources)
            produced.append(artifact)
            checked = accuracy_summary(artifact.entry["accuracy"]) if artifact.checked_here else f"not run here: this CPU lacks {target.name} (checked where the part was built)"
            source = "compiled" if artifact.origin == "compiled" else f"{artifact.origin}: {artifact.entry['file']}"
            _report(f"{target.name} ({shape}): {source}, {checked}", time.perf_counter() - started)
    assert first is not None and weights is not None
    op_libraries = torch_internals.python_op_libraries(first.exported)
    _check_lean_forms(produced, out_dir, op_libraries)
    shutil.rmtree(out_dir / CHECK_DIR, ignore_errors=True)
    for artifact in produced:
        if sources.keep is not None:
            sources.keep.store(artifact.key, out_dir, artifact.entry)
        lean = artifact.entry["lean"]
        form = "lean form" if "file" in lean else f"artifact form only, lean form refused: {lean['refused']}"
        _report(f"{artifact.entry['file']}: {form}")
    return BuiltModel(
        model_entry(model, first, weights, op_libraries, [a.entry for a in produced]),
        {a.entry["file"]: a.key for a in produced},
        {a.entry["file"]: a.origin for a in produced},
    )


def _check_lean_forms(produced: list[ProducedArtifact], out_dir: Path, op_libraries: dict[str, str]) -> None:
    """Run each lean module on the example inputs against its artifact and eager:
    freshly compiled ones in a new interpreter, as the loader would; ones from the
    build cache or a part here (they passed that check when compiled, and their
    key pins their code). A module that fails is removed, and its artifact ships
    in the artifact form only, with the reason in the manifest."""
    from ..runtime._layout import KERNELS_DIR
    from .compile import CHECK_DIR
    from .lean import check_in_fresh_process, check_in_this_process

    fresh = [a.candidate for a in produced if a.candidate is not None and a.origin == "compiled"]
    reused = [a.candidate for a in produced if a.candidate is not None and a.origin != "compiled"]
    reasons: dict[str, str] = {}
    if fresh:
        with _step(f"ran the lean form of {len(fresh)} artifact(s) in a fresh process and compared"):
            reasons.update(check_in_fresh_process(fresh, out_dir / KERNELS_DIR, out_dir / CHECK_DIR, op_libraries))
    if reused:
        with _step(f"ran the lean form of {len(reused)} cached artifact(s) and compared"):
            reasons.update(check_in_this_process(reused, out_dir / KERNELS_DIR))
    for candidate in [*fresh, *reused]:
        reason = reasons.get(str(candidate.module_path), "the check did not report on it")
        if reason:
            candidate.module_path.unlink()
            candidate.artifact["lean"] = {"refused": reason}


def main(request_path: str) -> int:
    from ..build.errors import ModelBuildError

    request = WorkerRequest.read(Path(request_path))
    result: BuiltModel | WorkerFailure
    try:
        result = run(request)
    except ModelBuildError as error:
        result = WorkerFailure(error.step, error.message)
    except Exception:
        result = WorkerFailure("building", traceback.format_exc())
    write_result(request.out_dir, result)
    return 0 if isinstance(result, BuiltModel) else 1
