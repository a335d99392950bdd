"""Run the compile workers, several at once, and collect what they made.

Shared by the hatch hook and `hatch-precompile compile-part`. The models are
dealt to at most `jobs` workers in turn (the first, third, ... model to one, the
second, fourth, ... to another); each worker is a child process in its own
session (`python -m hatch_precompile.worker`, talking `protocol`) that builds its
models one after the other, so that torch and inductor are imported once per
worker, not per model, and stopping it also ends inductor's compile pool. The
first failure, or Ctrl-C, stops every worker and raises; the caller removes the
scratch folder. Progress arrives as one line per finished step, from whichever
worker finished it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cache import EntryStore
from .errors import ModelBuildError
from .model_config import ModelConfig
from .protocol import RESULT_FILE, BuiltModel, Progress, WorkerFailure, WorkerRequest, read_result
from .remote import RemoteSettings
from .sources import ArtifactSources, Claim

# Memory to allow one worker (capture, inductor, the checks). Measured peaks:
# 0.4 GB for the build benchmark's small models, 0.94 GB for the transformers
# example's BERT and GPT-2; doubled for larger models.
WORKER_MEMORY = 2 * 2**30


@dataclass(frozen=True)
class BuildPlan:
    """What every worker of one build shares."""

    root: Path  # the project: the workers' working directory
    import_paths: list[str]  # where the project's packages are importable from
    staging: Path  # scratch; a folder per model is written here
    jobs: int
    cache: EntryStore | None  # the build cache to read, None when off
    keep: EntryStore | None  # where new artifacts are kept: the build cache, or a part
    claims: dict[str, dict[str, Claim]]  # per model, the artifacts given as parts
    remote: RemoteSettings | None = None  # the shared store behind the build cache, if any

    @property
    def compiler_outputs(self) -> Path:
        """What the C++ compiler builds for every model alike, the precompiled
        headers and inductor's vector-ISA probes: kept in the build cache (shared
        by every build of the same torch and compiler), else scratch."""
        return (self.cache.root if self.cache else self.staging) / "compiler"


def default_jobs(models: int) -> int:
    """As many workers as there are models, cores and WORKER_MEMORY-sized shares
    of the available memory, whichever is fewest (when neither `jobs` nor
    $HATCH_PRECOMPILE_JOBS says)."""
    cpus = _cpus()
    available = _available_memory()
    by_memory = max(1, available // WORKER_MEMORY) if available else cpus
    return max(1, min(models, cpus, by_memory))


def compile_models(models: list[ModelConfig], plan: BuildPlan, say: Callable[[str], None], done: Callable[[str], None]) -> dict[str, BuiltModel]:
    """Build every model, in at most `plan.jobs` workers; entries by model name."""
    workers = _Workers()
    lock = threading.Lock()
    said: set[str] = set()  # the build-wide notices shown so far (a store that is down, ...)

    def once(line: str) -> bool:
        """Whether `line` is new to this build (then it is shown)."""
        with lock:
            new = line not in said
            said.add(line)
            return new

    def locked(report: Callable[[str], None]) -> Callable[[str], None]:
        def report_line(line: str) -> None:
            with lock:
                report(line)

        return report_line

    say, done = locked(say), locked(done)
    count = max(1, min(plan.jobs, len(models)))
    groups = [models[index::count] for index in range(count)]
    results: dict[str, BuiltModel] = {}
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="precompile") as pool:
        futures = [pool.submit(_run_worker, index, group, count, plan, workers, say, done, once) for index, group in enumerate(groups)]
        try:
            for future in as_completed(futures):
                results.update(future.result())
        except BaseException:
            workers.stop_all()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return {model.name: results[model.name] for model in models}


def _run_worker(
    index: int,
    models: list[ModelConfig],
    count: int,
    plan: BuildPlan,
    workers: _Workers,
    say: Callable[[str], None],
    done: Callable[[str], None],
    once: Callable[[str], bool],
) -> dict[str, BuiltModel]:
    """One worker building `models` in turn; their results by name, or the first failure raised."""
    requests = []
    for model in models:
        out_dir = plan.staging / model.name
        out_dir.mkdir()
        sources = ArtifactSources(plan.claims.get(model.name, {}), plan.cache, plan.keep, plan.remote)
        request = plan.staging / f"{model.name}.request.json"
        WorkerRequest(model, out_dir, plan.import_paths, sources, plan.compiler_outputs).write(request)
        requests.append(str(request))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(plan.staging / "inductor-cache")}
    if count > 1:  # share the cores between the workers' compile pools
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, _cpus() // count)))
    log_path = plan.staging / f"worker-{index}.log"
    with log_path.open("w") as log:
        worker = workers.start(models[0].name, [sys.executable, "-m", "hatch_precompile.worker", *requests], plan.root, env, log)
        try:
            assert worker.stdout is not None
            for line in worker.stdout:
                step = Progress.parse(line)
                if step is None:
                    log.write(line)
                elif not step.once:
                    timing = "" if step.seconds is None else f" ({step.seconds:.1f} s)"
                    say(f"precompile: {step.model}: {step.step}{timing}")
                elif once(step.step):
                    say(f"precompile: {step.step}")
            worker.wait()
        finally:
            workers.end(worker)
    results = {model.name: read_result(plan.staging / model.name) for model in models}
    for name, result in results.items():
        if isinstance(result, WorkerFailure):
            raise ModelBuildError(name, result.step, result.message)
    built = {}
    for model in models:
        result = results[model.name]
        if not isinstance(result, BuiltModel) or worker.returncode != 0:
            if workers.stopping.is_set():
                raise ModelBuildError(model.name, "compiling", "stopped: another model failed or the build was interrupted")
            tail = log_path.read_text(errors="replace")[-3000:]
            raise ModelBuildError(model.name, "compiling", f"the compile worker exited with {worker.returncode}:\n{tail}")
        (plan.staging / model.name / RESULT_FILE).unlink()  # the staging folder becomes the wheel's files
        done(f"precompile: {model.name}: done in {result.seconds:.1f} s")
        built[model.name] = result
    return built


class _Workers:
    """The running worker processes, so that a failure or Ctrl-C can stop them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[str]] = set()
        self.stopping = threading.Event()

    def start(self, model: str, command: list[str], cwd: Path, env: dict[str, str], log: Any) -> subprocess.Popen[str]:
        with self._lock:
            if self.stopping.is_set():
                raise ModelBuildError(model, "starting", "stopped before it started: another model failed or the build was interrupted")
            process = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,  # so that stopping it ends its compile pool too
            )
            self._running.add(process)
            return process

    def end(self, process: subprocess.Popen[str]) -> None:
        _end_process_group(process)
        with self._lock:
            self._running.discard(process)

    def stop_all(self) -> None:
        self.stopping.set()
        with self._lock:
            running = list(self._running)
        for process in running:
            _end_process_group(process)


def _end_process_group(process: subprocess.Popen[str]) -> None:
    """Stop the worker and everything it started (inductor's compile pool)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
