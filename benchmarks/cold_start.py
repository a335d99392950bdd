"""Cold start and steady-state latency of the example encoder, five ways.

Run it in an environment where the example wheel is installed (`./dev.sh bench`
builds one and runs this). Each case runs in fresh processes (median of --runs,
min-max shown), all in one run so they share the machine's current load:

- eager:          import, build the module, load the shipped weights, first output
- torch.compile:  the same module through torch.compile, empty inductor cache
- torch.compile (warm cache): the same, with the cache a previous process filled
- load_compiled:  the wheel's compiled artifact, empty caches, no C++ compiler on PATH
- AOTInductor:    aoti_compile_and_package at setup, aoti_load_package in the process,
                  no C++ compiler on PATH

Steady state: median time per call over --calls calls after a warm-up, same input
and thread count in every case; for load_compiled also the cost of its input
checks alone. Peak RSS: the process's maximum resident memory (weights included:
eager loads them into the module, load_compiled memory-maps the shipped file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BATCH = 8

CASE = r"""
import json, os, sys, time
start = time.perf_counter()
import torch
case, calls, artifact = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
ids = torch.randint(0, 1000, (BATCH, 64), generator=torch.Generator().manual_seed(0))

def eager_module():
    from pathlib import Path
    from safetensors.torch import load_file
    import example_pkg
    from example_pkg.model import build_encoder
    model = build_encoder()
    weights = Path(example_pkg.__file__).parent / "_precompiled" / "encoder" / "weights.safetensors"
    model.load_state_dict(load_file(weights), strict=False)
    return model

with torch.no_grad():
    if case == "eager":
        model = eager_module()
    elif case.startswith("torch.compile"):
        model = torch.compile(eager_module())
    elif case == "load_compiled":
        from example_pkg import load_compiled
        model = load_compiled("encoder")
    elif case == "AOTInductor":
        model = torch._inductor.aoti_load_package(artifact)
    out = model(ids)
    first = time.perf_counter() - start
    for _ in range(10):
        model(ids)
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        model(ids)
        times.append(time.perf_counter() - t)
    checks = []
    if case == "load_compiled":  # what the input checks cost inside each call
        for _ in range(calls):
            t = time.perf_counter()
            model.check_inputs(ids)
            checks.append(time.perf_counter() - t)
times.sort()
checks.sort()
import resource
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"first": first, "call": times[len(times) // 2], "check": checks[len(checks) // 2] if checks else None, "rss": peak_mb}))
""".replace("BATCH", str(BATCH))

AOTI_SETUP = r"""
import sys, torch
from example_pkg.model import build_encoder
model = build_encoder()
ids = torch.randint(0, 1000, (8, 64))
batch = torch.export.Dim("batch", min=1, max=64)
with torch.no_grad():
    exported = torch.export.export(model, (ids,), dynamic_shapes=({0: batch},))
    torch._inductor.aoti_compile_and_package(exported, package_path=sys.argv[1])
"""


def no_compiler_path(folder: Path) -> str:
    """A PATH on which every C++ compiler name fails: nothing may compile."""
    for name in ("g++", "gcc", "c++", "cc", "clang", "clang++"):
        trap = folder / name
        trap.write_text("#!/bin/sh\necho 'compiler called' >&2\nexit 1\n")
        trap.chmod(0o755)
    return f"{folder}:{os.environ.get('PATH', '')}"


def run_case(case: str, env: dict[str, str], calls: int, artifact: str) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, "-c", CASE, case, str(calls), artifact], env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"{case} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per case (default 5)")
    parser.add_argument("--calls", type=int, default=200, help="calls for the steady-state median (default 200)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="bench-"))
    base = {**os.environ, "BENCH_THREADS": str(args.threads)}
    traps = scratch / "traps"
    traps.mkdir()
    no_compiler = {**base, "PATH": no_compiler_path(traps), "CXX": str(traps / "c++"), "CC": str(traps / "cc")}

    aoti_package = str(scratch / "encoder.pt2")
    subprocess.run([sys.executable, "-c", AOTI_SETUP, aoti_package], check=True, capture_output=True)
    warm_cache = str(scratch / "warm-cache")
    run_case("torch.compile (warm cache)", {**base, "TORCHINDUCTOR_CACHE_DIR": warm_cache}, 1, "")

    def fresh(name: str, env: dict[str, str]) -> dict[str, str]:
        folder = tempfile.mkdtemp(prefix=name, dir=scratch)
        return {**env, "TORCHINDUCTOR_CACHE_DIR": folder + "/inductor", "HATCH_PRECOMPILE_CACHE_DIR": folder + "/hp"}

    cases = {
        "eager": lambda: fresh("eager", base),
        "torch.compile": lambda: fresh("compile", base),
        "torch.compile (warm cache)": lambda: {**base, "TORCHINDUCTOR_CACHE_DIR": warm_cache},
        "load_compiled": lambda: fresh("load", no_compiler),
        "AOTInductor": lambda: fresh("aoti", no_compiler),
    }
    results: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    for _ in range(args.runs):  # interleaved, so that drifting load hits every case alike
        for case, env in cases.items():
            results[case].append(run_case(case, env(), args.calls, aoti_package))

    eager_first = statistics.median(r["first"] for r in results["eager"])
    compile_call = statistics.median(r["call"] for r in results["torch.compile"])
    print(f"example encoder, batch {BATCH}x64, {args.threads} thread(s), {args.runs} fresh processes per case\n")
    print("| case | first output, s (min-max) | vs eager | steady state, ms/call (min-max) | vs torch.compile | peak RSS, MB |")
    print("|---|---|---|---|---|---|")
    for case, runs in results.items():
        first = [r["first"] for r in runs]
        call = [r["call"] * 1000 for r in runs]
        print(
            f"| {case} | {statistics.median(first):.2f} ({min(first):.2f}-{max(first):.2f}) "
            f"| {statistics.median(first) / eager_first:.2f}x "
            f"| {statistics.median(call):.3f} ({min(call):.3f}-{max(call):.3f}) "
            f"| {statistics.median(call) / (compile_call * 1000):.2f}x "
            f"| {statistics.median(r['rss'] for r in runs):.0f} |"
        )
    checks = [r["check"] * 1e6 for r in results["load_compiled"]]
    print(
        f"\nload_compiled input checks: {statistics.median(checks):.1f} us per call "
        f"({min(checks):.1f}-{max(checks):.1f}), included in its steady-state time above"
    )


if __name__ == "__main__":
    main()
