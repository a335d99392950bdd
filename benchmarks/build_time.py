"""Build time of a three-model project: cold, parallel, cached, one model changed, parts.

Writes a project with three small models (a transformer encoder layer over token
ids, a conv net, an MLP; each a different graph, dynamic batch) into a scratch
folder and builds its wheel with `python -m build --wheel --no-isolation`, so the
hook is the one installed in this environment (`./dev.sh bench-build` runs it).
Every case runs --runs times in fresh processes, cases interleaved so that they
share the machine's load; the table shows the median wall time of the build
command (min-max), the hook's share (its `precompile: ...` lines, from the first
to "done"), its ratio to the cold build, and the peak RSS of the largest process
(the build backend or one compile worker).

Cases:
- cold, 1 worker: empty build cache, HATCH_PRECOMPILE_JOBS=1 (models one after another)
- cold, 2 workers: empty build cache, two models compiling at once (compared with 1 worker)
- rebuild, no changes: the cache the cold build filled, nothing changed, 2 workers
  (compared with the cold build with 2 workers, as are the next two)
- rebuild, one model changed: one model's code edited (a constant), the others cached
- parts: `hatch-precompile compile-part` per model into its own folder (timed
  together, one after another, in the build column), then the wheel assembled
  from the three parts with the cache off (the hook column); the wheel's
  `_precompiled/` is compared byte for byte with the cold build's

With --remote redis or --remote s3, a store of that kind is started on loopback
(Debian's redis-server, moto's S3 server; tests/servers.py), the cold build with
2 workers also fills it, and one more case runs:
- empty local cache, warm remote store: a new, empty build cache, every artifact
  from the store (compared with the cold build with 2 workers); its wheel is
  compared byte for byte with the cold build's, and the store's transfer rate is
  printed from the hook's summary line

--project picks what is built: the three-model project above (every case), or,
with the cold, rebuild and remote cases only, `example` (example_project's
encoder), `transformers` (example_transformers: BERT and GPT-2) or `battery`
(the architecture battery's models that load lean, tests/battery).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servers import Server  # tests/servers.py

MODELS = """
import torch
from torch import nn

SCALE = 1.0


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(1000, 64)
        self.layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)

    def forward(self, ids):
        return self.layer(self.embed(ids)).mean(dim=1) * SCALE


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.body(x).mean(dim=(2, 3)))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.net = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 8))

    def forward(self, x):
        return torch.softmax(self.net(x), dim=-1)


def encoder():
    return Encoder()


def convnet():
    return ConvNet()


def mlp():
    return Mlp()
"""

PYPROJECT = """
[build-system]
requires = ["hatchling", "hatch-precompile"]
build-backend = "hatchling.build"

[project]
name = "threemodels"
version = "1.0"

[tool.hatch.build.hooks.precompile.models.encoder]
factory = "threemodels.models:encoder"
inputs = [{ shape = ["batch", 32], dtype = "int64", range = [0, 1000] }]
dims = { batch = { min = 1, max = 32 } }

[tool.hatch.build.hooks.precompile.models.convnet]
factory = "threemodels.models:convnet"
inputs = [{ shape = ["batch", 3, 32, 32] }]
dims = { batch = { min = 1, max = 32 } }

[tool.hatch.build.hooks.precompile.models.mlp]
factory = "threemodels.models:mlp"
inputs = [{ shape = ["batch", 32] }]
dims = { batch = { min = 1, max = 32 } }
"""

COLD_1, COLD_2, REBUILD, CHANGED, PARTS = (
    "cold, 1 worker",
    "cold, 2 workers",
    "rebuild, no changes, 2 workers",
    "rebuild, one model changed, 2 workers",
    "parts: 3 compiled apart, then assembled",
)
REMOTE = "empty local cache, warm remote store, 2 workers"
BASELINE = {  # what each case's hook time is compared with
    COLD_2: COLD_1,
    REBUILD: COLD_2,
    CHANGED: COLD_2,
    PARTS: COLD_2,
    REMOTE: COLD_2,
}
REPO = Path(__file__).resolve().parent.parent
PROJECTS = ("threemodels", "example", "transformers", "battery")


def write_project(folder: Path, which: str = "threemodels") -> Path:
    if which in ("example", "transformers"):
        source = REPO / ("example_project" if which == "example" else "example_transformers")
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("dist", "build", "_precompiled", "*.egg-info"))
        return folder
    if which == "battery":
        sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "battery")]
        from architectures import ARCHITECTURES, OPTIONS, table  # the battery's own declarations
        from conftest import write_project as write_test_project

        lean = [a for a in [*ARCHITECTURES, *OPTIONS] if a.refused is None and a.form == "lean"]
        models = (REPO / "tests" / "battery" / "models.py").read_text()
        project = write_test_project(folder, "battery", models, table(lean, "battery"))
        return project
    package = folder / "src" / "threemodels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from ._precompiled import load_compiled\n")
    (package / "models.py").write_text(MODELS)
    (folder / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT).lstrip())
    return folder


def timed(command: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, int, str]:
    """(wall seconds, peak RSS of the largest process in MB, output) of `command`
    run in a fresh process that reports its children's peak memory."""
    probe = (
        "import resource, subprocess, sys, time\n"
        "start = time.perf_counter()\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "seconds = time.perf_counter() - start\n"
        "sys.stdout.write(done.stdout + done.stderr + '\\n')\n"
        "print(f'@@ {seconds} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss} {done.returncode}')\n"
    )
    result = subprocess.run([sys.executable, "-c", probe, *command], env=env, cwd=cwd, capture_output=True, text=True)
    *lines, last = result.stdout.rstrip().splitlines()
    seconds, rss_kb, status = last.split()[1:]
    output = "\n".join(lines)
    if status != "0":
        raise SystemExit(f"{' '.join(command)} failed:\n{output[-4000:]}")
    return float(seconds), int(rss_kb) // 1024, output


def hook_seconds(output: str) -> float:
    """The hook's time for all models, from its `precompile: N model(s) in S s` line."""
    (line,) = [line for line in output.splitlines() if line.startswith("precompile: ") and " model(s) in " in line]
    return float(line.split(" model(s) in ")[1].split()[0])


def build(project: Path, out: Path, env: dict[str, str]) -> tuple[float, int, str, dict[str, bytes]]:
    shutil.rmtree(out, ignore_errors=True)
    seconds, rss, output = timed([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(project)], env)
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        files = {n: archive.read(n) for n in archive.namelist() if "/_precompiled/" in n}
    return seconds, rss, output, files


def one_run(scratch: Path, run: int, which: str, store: Server | None, transfers: list[tuple[int, float]]) -> dict[str, tuple[float, float, int]]:
    """Every case once, in order; (wall s, hook s, peak RSS MB) per case. With
    a store, the cold build with 2 workers fills it (a new database or prefix per
    run) and the remote case reads it; `transfers` gets its (bytes, seconds)."""
    project = write_project(scratch / "project", which)
    cache = scratch / "cache"
    base = {**os.environ, "HATCH_PRECOMPILE_PARTS": "", "HATCH_PRECOMPILE_REMOTE_CACHE": "off"}
    remote = {**base, **store.env, "HATCH_PRECOMPILE_REMOTE_CACHE": _fresh_location(store, run)} if store else base
    results = {}
    reference = None
    if which == "threemodels":
        seconds, rss, output, reference = build(project, scratch / "out", {**base, "HATCH_PRECOMPILE_BUILD_CACHE": "off", "HATCH_PRECOMPILE_JOBS": "1"})
        results[COLD_1] = (seconds, hook_seconds(output), rss)
    seconds, rss, output, files = build(project, scratch / "out", {**remote, "HATCH_PRECOMPILE_BUILD_CACHE": str(cache), "HATCH_PRECOMPILE_JOBS": "2"})
    results[COLD_2] = (seconds, hook_seconds(output), rss)
    assert reference is None or files == reference, "the parallel build's _precompiled/ differs from the one-at-a-time build's"
    reference = files
    seconds, rss, output, files = build(project, scratch / "out", {**base, "HATCH_PRECOMPILE_BUILD_CACHE": str(cache), "HATCH_PRECOMPILE_JOBS": "2"})
    assert output.count(": compiled,") == 0, "a rebuild with no changes compiled"
    results[REBUILD] = (seconds, hook_seconds(output), rss)
    assert files == reference, "the cached build's _precompiled/ differs"
    if store:
        seconds, rss, output, files = build(project, scratch / "out", {**remote, "HATCH_PRECOMPILE_BUILD_CACHE": str(scratch / "empty-cache"), "HATCH_PRECOMPILE_JOBS": "2"})
        assert output.count(": compiled,") == 0 and " compiled" not in output.split(" model(s) in ")[1].splitlines()[0], "a build from a warm store compiled"
        assert files == reference, "the wheel from the remote store differs in _precompiled/"
        results[REMOTE] = (seconds, hook_seconds(output), rss)
        transfers.append(_transfer(output))
    if which != "threemodels":
        return results
    models = project / "src/threemodels/models.py"
    models.write_text(models.read_text().replace("SCALE = 1.0", f"SCALE = {1 + time.time() % 1:.6f}"))
    seconds, rss, output, _ = build(project, scratch / "out", {**base, "HATCH_PRECOMPILE_BUILD_CACHE": str(cache), "HATCH_PRECOMPILE_JOBS": "2"})
    assert output.count(": compiled,") == 1, "one changed model should compile, and only it"
    results[CHANGED] = (seconds, hook_seconds(output), rss)
    models.write_text(MODELS)

    parts, part_seconds, part_rss = [], 0.0, 0
    for name in ("encoder", "convnet", "mlp"):
        part = scratch / f"part-{name}"
        shutil.rmtree(part, ignore_errors=True)
        env = {**base, "HATCH_PRECOMPILE_BUILD_CACHE": "off"}
        seconds, rss, _ = timed([sys.executable, "-m", "hatch_precompile", "compile-part", "--models", name, "--out", str(part), str(project)], env)
        parts.append(part)
        part_seconds, part_rss = part_seconds + seconds, max(part_rss, rss)
    env = {**base, "HATCH_PRECOMPILE_BUILD_CACHE": "off", "HATCH_PRECOMPILE_PARTS": os.pathsep.join(map(str, parts))}
    seconds, rss, output, files = build(project, scratch / "out", env)
    assert files == reference, "the wheel assembled from parts differs in _precompiled/ from the one built in one go"
    results[PARTS] = (part_seconds + seconds, hook_seconds(output), max(part_rss, rss))
    return results


def _fresh_location(store: Server, run: int) -> str:
    """An empty place in the store for run number `run`: another prefix (S3) or database (Redis, 16 of them)."""
    if store.url.startswith("s3://"):
        return f"{store.url}/run-{run}"
    return store.url.rsplit("/", 1)[0] + f"/{run % 16}"


def _transfer(output: str) -> tuple[int, float]:
    """(bytes down, seconds) from the hook's `remote cache ...: N hit(s), ..., X MB down, ..., S s` line."""
    (line,) = [line for line in output.splitlines() if " hit(s), " in line]
    megabytes = float(line.split(" miss(es), ")[1].split(" MB down")[0])
    return int(megabytes * 1e6), float(line.rsplit(", ", 1)[1].removesuffix(" s"))


def spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="times each case runs (default 3)")
    parser.add_argument("--project", choices=PROJECTS, default="threemodels", help="what to build (default: the three-model project)")
    parser.add_argument("--remote", choices=("redis", "s3"), help="also build from a warm remote store of this kind, started on loopback")
    args = parser.parse_args()
    print(
        f"# build time, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {metadata.version('torch')}, hatch-precompile {metadata.version('hatch-precompile')}, median of {args.runs} run(s), "
        f"project {args.project}{f', remote store: {args.remote}' if args.remote else ''}"
    )
    runs: dict[str, list[tuple[float, float, int]]] = {}
    transfers: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory(prefix="build-time-servers-") as servers:
        store = _start(args.remote, Path(servers)) if args.remote else None
        try:
            for run in range(args.runs):
                with tempfile.TemporaryDirectory(prefix="build-time-") as scratch:
                    for case, result in one_run(Path(scratch), run, args.project, store, transfers).items():
                        runs.setdefault(case, []).append(result)
        finally:
            if store:
                store.stop()
    cases = list(runs)
    hook = {case: statistics.median(r[1] for r in runs[case]) for case in cases}
    print("| case | build, s | hook, s | hook vs | peak RSS, MB |")
    print("|---|---|---|---|---|")
    for case in cases:
        walls, hooks, rss = zip(*runs[case], strict=True)
        versus = f"{hook[case] / hook[BASELINE[case]]:.2f}x {BASELINE[case]}" if BASELINE.get(case) in hook else ""
        print(f"| {case} | {spread(list(walls))} | {spread(list(hooks))} | {versus} | {max(rss)} |")
    if COLD_1 in hook:
        print(f"parallel: 2 workers compile the cold build {hook[COLD_1] / hook[COLD_2]:.2f}x as fast as 1")
        print("parts: the wheel's _precompiled/ is byte-identical to the cold build's (checked every run)")
    if transfers:
        moved = statistics.median(b for b, _ in transfers) / 1e6
        seconds = statistics.median(s for _, s in transfers)
        print(
            f"remote store: {moved:.1f} MB down per build in {seconds:.2f} s of store time ({seconds / moved * 1000:.0f} ms per MB, "
            "the hook's own count: fetching and unpacking, checking every sha256); the wheel's _precompiled/ is byte-identical to the cold build's"
        )


def _start(kind: str, folder: Path) -> Server:
    """A store of `kind` on loopback, as the tests start one."""
    sys.path.insert(0, str(REPO / "tests"))
    from servers import start_redis, start_s3

    return start_redis(folder) if kind == "redis" else start_s3(folder)


if __name__ == "__main__":
    main()
