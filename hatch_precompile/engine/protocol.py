"""What crosses between the build and a compile worker, typed on both sides.

The build (`jobs`) writes a `WorkerRequest` per model and starts
`python -m hatch_precompile.worker REQUEST.json ...` with the requests of the
models that worker builds, in order. The worker prints one line per finished
step on stdout, `PROGRESS_PREFIX` followed by JSON {"model": str, "step": str,
"seconds": float | None, "once": bool} ("once": a notice about the build as a
whole, such as the remote store being down, shown once whichever worker says it;
anything else there, or on stderr, is torch's chatter), and writes each model's out_dir/RESULT_FILE: a `BuiltModel`, or a
`WorkerFailure` for the first model that failed, after which it stops (later
models get no result). It exits 0 only when every model has a `BuiltModel`. JSON is the wire format only: each side reads it back
into these classes at once (a progress line: `Progress`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..runtime._schema import ModelEntry
from .model_config import ModelConfig
from .remote import Traffic
from .sources import ArtifactSources

PROGRESS_PREFIX = "@hatch-precompile-progress "
RESULT_FILE = "result.json"


@dataclass(frozen=True)
class Progress:
    """A step a worker finished, as it prints it on stdout."""

    model: str
    step: str
    seconds: float | None = None
    once: bool = False  # a notice about the build as a whole, shown once whichever worker says it

    def line(self) -> str:
        return PROGRESS_PREFIX + json.dumps(dataclasses.asdict(self))

    @classmethod
    def parse(cls, line: str) -> Progress | None:
        """The step a line of a worker's stdout reports; None for anything else (torch's chatter)."""
        if not line.startswith(PROGRESS_PREFIX):
            return None
        return cls(**json.loads(line[len(PROGRESS_PREFIX) :]))


@dataclass(frozen=True)
class WorkerRequest:
    """One model to build, and where the worker finds and keeps things."""

    model: ModelConfig
    out_dir: Path  # the model's staging folder: its artifacts, kernels and weights go here
    import_paths: list[str]  # put first on sys.path: where the project's packages are importable from
    sources: ArtifactSources  # the parts and build cache to take artifacts from, and where to keep new ones
    compiler_outputs: Path  # what the C++ compiler builds for every model alike (`BuildPlan.compiler_outputs`)

    def write(self, path: Path) -> None:
        data = {
            "model": self.model.to_json(),
            "out_dir": str(self.out_dir),
            "import_paths": self.import_paths,
            "sources": self.sources.to_json(),
            "compiler_outputs": str(self.compiler_outputs),
        }
        path.write_text(json.dumps(data), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> WorkerRequest:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(
            ModelConfig.from_json(data["model"]),
            Path(data["out_dir"]),
            data["import_paths"],
            ArtifactSources.from_json(data["sources"]),
            Path(data["compiler_outputs"]),
        )


@dataclass(frozen=True)
class BuiltModel:
    """What a worker made of one model (the loader's CompiledModel is what a user calls)."""

    entry: ModelEntry  # the model's manifest entry; its files lie in the staging folder's `<model>/`
    keys: dict[str, str]  # artifact file -> cache key
    origins: dict[str, str]  # artifact file -> "compiled", "cached", "remote <store>" or "part <folder>"
    seconds: float  # the worker's time on this model (imports and the shared lean check aside)
    traffic: Traffic = field(default_factory=Traffic)  # what moved through the remote store


@dataclass(frozen=True)
class WorkerFailure:
    """Why a worker could not build its model: the step it was in and the message for the user."""

    step: str
    message: str


def write_result(out_dir: Path, result: BuiltModel | WorkerFailure) -> None:
    data: dict[str, Any]
    if isinstance(result, BuiltModel):
        data = {"entry": result.entry, "keys": result.keys, "origins": result.origins, "seconds": result.seconds, "traffic": result.traffic.to_json()}
    else:
        data = {"error": {"step": result.step, "message": result.message}}
    (out_dir / RESULT_FILE).write_text(json.dumps(data), encoding="utf-8")


def read_result(out_dir: Path) -> BuiltModel | WorkerFailure | None:
    """The worker's result, or None where it wrote none (it crashed or was stopped)."""
    path = out_dir / RESULT_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if "error" in data:
        return WorkerFailure(data["error"]["step"], data["error"]["message"])
    if not (isinstance(data.get("entry"), dict) and isinstance(data["entry"].get("artifacts"), list)):
        raise ValueError(f"{path}: the worker's result holds no model entry")
    return BuiltModel(data["entry"], data["keys"], data["origins"], data["seconds"], Traffic.from_json(data["traffic"]))
