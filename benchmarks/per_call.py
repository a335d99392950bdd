"""Where a call's time goes: the lean and C++ forms against AOTInductor, per call.

Run it in an environment where the example wheels are installed
(`./dev.sh bench-per-call` builds both and runs this). For the example encoder
(token ids [batch, 64]) and the transformers BERT (token ids and a padding mask,
[batch, 32], plain outputs), at batch 8 and 1, and with `--models embedder` the
MiniLM-sized sentence embedder of benchmarks/minilm (dynamic batch and sequence;
8 x 128 and 1 x 16), each side in its own fresh
processes (median of --runs, interleaved; each process times --calls calls):

- lean form: `load_compiled(name)`, no compiler. "per call" is `model(...)`;
  "loader" is what the loader adds around the graph's code (flattening and
  checking the arguments, picking the variant, the output structure): per call
  minus "graph code"; "graph code" is the variant's runner called directly with
  the flat inputs (inductor's output module, with the alignment check).
  Then the output module's calls are timed one by one (each name in its globals
  wrapped; the wrapper's own cost, measured on `len`, taken off): compiled
  kernels, matrix products (`extern_kernels.*`), aten ops called through
  `torch.ops` (attention), and the glue a C++ wrapper does in nanoseconds:
  size/stride asserts, `reinterpret_tensor` views, buffer allocations. "rest"
  is the module's own Python between them: graph code minus all of those.
- C++ form: `load_compiled(name)` where the wheel has it (`cpp-form = true`);
  "graph code" is the container's `run` with the call's flat inputs, bound to
  the weights (AOTInductor's C++ runner); "loader" the rest.
- AOTInductor: `aoti_load_package` of a package exported with a dynamic batch,
  for the CPU target the wheel's variant was compiled for (made at setup, as
  benchmarks/cold_start.py does). "per call" is `model(...)`; "graph code" is
  the package loader's `boxed_run` with the flat inputs (its C++ runner called
  directly); the difference is its Python side (call spec, pytree).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import cold_start  # its models and its AOTInductor setup

MODELS = ("encoder", "bert", "embedder")  # cold_start.MODELS: the models, their inputs and their AOTInductor setup
DEFAULT_MODELS = ("encoder", "bert")
BATCHES = (8, 1)
# The MiniLM-sized embedder (dynamic batch and sequence) at 1 x 16 where the
# others keep their length: a short sentence, as issue 47 measured it (8 x 128, 1 x 16).
SEQUENCE_AT_BATCH_1 = {"embedder": 16}
THREADS = 2

CHILD = r"""
import importlib, json, sys, time
from types import SimpleNamespace
import torch

side, calls, spec = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
torch.set_num_threads(spec["threads"])
batch, length = spec["batch"], spec["sequence"]
ids = torch.randint(0, 1000, (batch, length), generator=torch.Generator().manual_seed(0))
kwargs = {"attention_mask": (torch.arange(length) < length - 2 * torch.arange(batch)[:, None]).long()} if spec["attention_mask"] else {}


def median_us(function, n=calls):
    for _ in range(min(n, 100)):
        function()
    times = []
    for _ in range(n):
        start = time.perf_counter_ns()
        function()
        times.append(time.perf_counter_ns() - start)
    return sorted(times)[n // 2] / 1000


if side == "aoti":
    if spec["output_module"]:
        importlib.import_module(spec["output_module"])
    model = torch._inductor.aoti_load_package(spec["aoti_package"])
    flat = [ids, *kwargs.values()]
    with torch.no_grad():
        report = {"call": median_us(lambda: model(ids, **kwargs)), "graph": median_us(lambda: model.loader.boxed_run(list(flat)))}
    print(json.dumps(report))
    sys.exit(0)

package = importlib.import_module(spec["package"])
model = package.load_compiled(spec["name"], **({"outputs": "plain"} if spec["library"] else {}))
with torch.no_grad():
    flat, _, sizes = model._contract.accept((ids,), kwargs)
    index = model._variants.pick(sizes)
    bound, graph = model._runs[index], model._variants.variants[index][2]
    report = {"call": median_us(lambda: model(ids, **kwargs)), "graph": median_us(lambda: bound(list(flat))), "loaded": repr(model)}
    if side == "cpp":  # the container's run: AOTInductor's C++ runner, as AOTInductor's own `boxed_run` calls it
        print(json.dumps(report))
        sys.exit(0)
    run, inputs = graph._run, [*model._weights, *flat]  # the lean form: its output module's `call`, timed part by part

    # The output module's globals, each callable wrapped with a timer.
    call = dict(zip(run.__code__.co_freevars, (cell.cell_contents for cell in run.__closure__)))["call"]
    namespace = call.__func__.__globals__
    spent, counts = {}, {}

    def timed(category, function):
        def wrapper(*args, **kw):
            start = time.perf_counter_ns()
            result = function(*args, **kw)
            spent[category] = spent.get(category, 0) + time.perf_counter_ns() - start
            counts[category] = counts.get(category, 0) + 1
            return result
        return wrapper

    probe, item = timed("probe", len), [0]
    wrapper_ns = 1000 * (median_us(lambda: [probe(item) for _ in range(100)], 300) - median_us(lambda: [len(item) for _ in range(100)], 300)) / 100
    for name, value in list(namespace.items()):
        if name.startswith("cpp_fused"):
            namespace[name] = timed("kernels", value)
    namespace["extern_kernels"] = SimpleNamespace(**{n: timed("matrix products", f) for n, f in vars(namespace["extern_kernels"]).items()})
    for name, category in (("assert_size_stride", "size/stride asserts"), ("assert_alignment", "size/stride asserts"), ("reinterpret_tensor", "views"), ("empty_strided_cpu", "allocations")):
        if name in namespace:
            namespace[name] = timed(category, namespace[name])

    class Ops:  # torch.ops.<namespace>.<op>.<overload>, with the overloads timed
        def __init__(self, inner):
            self._inner = inner
        def __getattr__(self, name):
            value = getattr(self._inner, name)
            return timed("aten ops", value) if isinstance(value, torch._ops.OpOverload) else Ops(value)

    class Torch:
        def __getattr__(self, name):
            return Ops(torch.ops) if name == "ops" else getattr(torch, name)

    namespace["torch"] = Torch()
    for _ in range(100):
        call(list(inputs))
    spent.clear(), counts.clear()
    for _ in range(calls):
        call(list(inputs))
    report["parts"] = {c: (spent[c] - counts[c] * wrapper_ns) / calls / 1000 for c in spent}
    report["counts"] = {c: counts[c] // calls for c in counts}
print(json.dumps(report))
"""

PARTS = ("kernels", "matrix products", "aten ops", "size/stride asserts", "views", "allocations")


def run_child(side: str, spec: dict, calls: int, scratch: Path) -> dict:
    env = {**os.environ, "HATCH_PRECOMPILE_FORM": {"lean": "lean", "cpp": "cpp"}.get(side, "auto")}
    done = cold_start.run_with_own_tmpdir([sys.executable, "-c", CHILD, side, str(calls), json.dumps(spec)], env, scratch, 600)
    if done.returncode != 0:
        raise SystemExit(f"{spec['key']} batch {spec['batch']}, {side}: failed\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cell(values: list[float]) -> str:
    """The median over the fresh processes, with their range."""
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def table(key: str, batch: int, lean: list[dict], cpp: list[dict], aoti: list[dict]) -> str:
    """One model at one batch: the lean form's call split into its parts, beside the C++ form's and AOTInductor's."""
    call, cpp_call, aoti_call = [r["call"] for r in lean], [r["call"] for r in cpp], [r["call"] for r in aoti]
    rows = [
        ("per call", cell(call), cell(cpp_call), cell(aoti_call)),
        ("loader / package's Python side", *(cell([r["call"] - r["graph"] for r in side]) for side in (lean, cpp, aoti))),
        ("graph code (C++ form, AOTInductor: its C++ runner)", *(cell([r["graph"] for r in side]) for side in (lean, cpp, aoti))),
    ]
    counts = lean[0]["counts"]
    for part in PARTS:
        if part in counts:
            rows.append((f"  {part} ({counts[part]} calls)", cell([r["parts"][part] for r in lean]), "", ""))
    rows.append(("  rest: the module's own Python", cell([r["graph"] - sum(r["parts"].values()) for r in lean]), "", ""))
    runner = statistics.median(r["graph"] for r in aoti)
    ratios = (
        f"lean form {statistics.median(call) / statistics.median(aoti_call):.2f}x AOTInductor's call; C++ form "
        f"{statistics.median(cpp_call) / statistics.median(aoti_call):.2f}x AOTInductor's call, {statistics.median(cpp_call) / runner:.2f}x its C++ runner called directly"
    )
    lines = [f"{key}, batch {batch} ({ratios}; loaded {cpp[0]['loaded']})", "", "| us per call, median (min-max) over processes | lean form | C++ form | AOTInductor |", "|---|---|---|---|"]
    lines += [f"| {name} | {lean_cell} | {cpp_cell} | {aoti_cell} |" for name, lean_cell, cpp_cell, aoti_cell in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per side (default 3)")
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per process (default 2000)")
    parser.add_argument("--batches", nargs="+", type=int, default=list(BATCHES), help="batch sizes (default 8 1)")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=MODELS, help="embedder: its calls take 10-80 ms, so pass --calls 100 or so")
    options = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, {THREADS} threads, Python {sys.version.split()[0]}, {cold_start.cpu_model()}")
    with tempfile.TemporaryDirectory(prefix="per-call-") as scratch:
        for key in options.models:
            model = cold_start.MODELS[key]
            setup = cold_start.run_child("aoti setup", model, {**os.environ, "BENCH_THREADS": str(THREADS)}, 0, Path(scratch))
            if setup.get("skipped"):
                raise SystemExit(f"{key}: AOTInductor setup failed: {setup['skipped']}")
            for batch in options.batches:
                spec = {
                    "key": key,
                    "package": model.package,
                    "name": model.name,
                    "library": model.library,
                    "output_module": model.output_module,
                    "attention_mask": model.attention_mask,
                    "sequence": SEQUENCE_AT_BATCH_1.get(key, model.sequence) if batch == 1 else model.sequence,
                    "batch": batch,
                    "threads": THREADS,
                    "aoti_package": str(Path(scratch) / f"{key}.pt2"),
                }
                lean, cpp, aoti = [], [], []
                for _ in range(options.runs):  # interleaved: every side shares the machine's load
                    lean.append(run_child("lean", spec, options.calls, Path(scratch)))
                    cpp.append(run_child("cpp", spec, options.calls, Path(scratch)))
                    aoti.append(run_child("aoti", spec, options.calls, Path(scratch)))
                print()
                print(table(key, batch, lean, cpp, aoti))


if __name__ == "__main__":
    main()
