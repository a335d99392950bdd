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

MODELS = '''
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
'''

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

CASES = (
    "cold, 1 worker",
    "cold, 2 workers",
    "rebuild, no changes, 2 workers",
    "rebuild, one model changed, 2 workers",
    "parts: 3 compiled apart, then assembled",
)
BASELINE = {  # what each case's hook time is compared with
    CASES[1]: CASES[0],
    CASES[2]: CASES[1],
    CASES[3]: CASES[1],
    CASES[4]: CASES[1],
}


def write_project(folder: Path) -> Path:
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


def one_run(scratch: Path) -> dict[str, tuple[float, float, int]]:
    """Every case once, in order; (wall s, hook s, peak RSS MB) per case."""
    project = write_project(scratch / "project")
    cache = scratch / "cache"
    base = {**os.environ, "HATCH_PRECOMPILE_PARTS": ""}
    results = {}
    seconds, rss, output, reference = build(project, scratch / "out", {**base, "HATCH_PRECOMPILE_BUILD_CACHE": "off", "HATCH_PRECOMPILE_JOBS": "1"})
    results[CASES[0]] = (seconds, hook_seconds(output), rss)
    seconds, rss, output, files = build(project, scratch / "out", {**base, "HATCH_PRECOMPILE_BUILD_CACHE": str(cache), "HATCH_PRECOMPILE_JOBS": "2"})
    results[CASES[1]] = (seconds, hook_seconds(output), rss)
    assert files == reference, "the parallel build's _precompiled/ differs from the one-at-a-time build's"
    seconds, rss, output, files = build(project, scratch / "out", {**base, "HATCH_PRECOMPILE_BUILD_CACHE": str(cache), "HATCH_PRECOMPILE_JOBS": "2"})
    assert output.count(": compiled,") == 0, "a rebuild with no changes compiled"
    results[CASES[2]] = (seconds, hook_seconds(output), rss)
    assert files == reference, "the cached build's _precompiled/ differs"
    models = project / "src/threemodels/models.py"
    models.write_text(models.read_text().replace("SCALE = 1.0", f"SCALE = {1 + time.time() % 1:.6f}"))
    seconds, rss, output, _ = build(project, scratch / "out", {**base, "HATCH_PRECOMPILE_BUILD_CACHE": str(cache), "HATCH_PRECOMPILE_JOBS": "2"})
    assert output.count(": compiled,") == 1, "one changed model should compile, and only it"
    results[CASES[3]] = (seconds, hook_seconds(output), rss)
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
    results[CASES[4]] = (part_seconds + seconds, hook_seconds(output), max(part_rss, rss))
    return results


def spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="times each case runs (default 3)")
    args = parser.parse_args()
    print(f"# build time, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"torch {metadata.version('torch')}, hatch-precompile {metadata.version('hatch-precompile')}, median of {args.runs} run(s)")
    runs: dict[str, list[tuple[float, float, int]]] = {case: [] for case in CASES}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="build-time-") as scratch:
            for case, result in one_run(Path(scratch)).items():
                runs[case].append(result)
    hook = {case: statistics.median(r[1] for r in runs[case]) for case in CASES}
    print("| case | build, s | hook, s | hook vs | peak RSS, MB |")
    print("|---|---|---|---|---|")
    for case in CASES:
        walls, hooks, rss = zip(*runs[case], strict=True)
        versus = f"{hook[case] / hook[BASELINE[case]]:.2f}x {BASELINE[case]}" if case in BASELINE else ""
        print(f"| {case} | {spread(list(walls))} | {spread(list(hooks))} | {versus} | {max(rss)} |")
    print(f"parallel: 2 workers compile the cold build {hook[CASES[0]] / hook[CASES[1]]:.2f}x as fast as 1")
    print("parts: the wheel's _precompiled/ is byte-identical to the cold build's (checked every run)")


if __name__ == "__main__":
    main()
