"""Workers of a server that loads its model before it forks (gunicorn --preload,
multiprocessing's fork) against workers that each load it: memory and speed.

Run it where benchmarks/big_weights' wheel is installed (`./dev.sh bench-fork`
builds it and runs this). The model is mlp_537mb (eight 4096x4096 Linear layers,
537 MB of float32), input [8, 4096]. Each case starts a server process that makes
--workers workers, which call the model in turn (median of --calls calls each,
after one warm-up) and then stay alive while their memory is read:

- load_compiled, preload, parent called: the server loads and calls the model
  once (a warm-up), then forks. The workers run on one thread each (_fork.py:
  OpenMP's pool does not survive fork, and they would hang)
- load_compiled, preload: the server loads without calling, then forks; the
  workers keep the server's thread count
- load_compiled, a process each: the server starts fresh interpreters that each
  load the model (what a server without --preload does)
- eager mmap, preload: the server builds the module on the meta device and binds
  the wheel's safetensors file memory-mapped (`load_state_dict(assign=True)`),
  without calling it, then forks
- eager mmap, a process each: fresh interpreters that each do that

Memory is Pss from /proc/PID/smaps_rollup (a page shared by n processes counts
1/n in each), summed over the workers, and the server's own; the medians of
--runs runs with min-max. Every case of a run before the next run.

    python benchmarks/fork.py [--runs 3] [--workers 4] [--calls 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES = {
    "load_compiled, preload, parent called": ("compiled", "fork", True),
    "load_compiled, preload": ("compiled", "fork", False),
    "load_compiled, a process each": ("compiled", "spawn", False),
    "eager mmap, preload": ("eager", "fork", False),
    "eager mmap, a process each": ("eager", "spawn", False),
}

# One worker: loads the model where it was not inherited, then answers commands
# on its pipes: "call" runs the calls and answers the median ms and its thread
# count; "exit" ends it.
WORKER = r"""
import json, os, statistics, sys, time
import torch

def load(kind):
    if kind == "compiled":
        from big_weights import load_compiled
        return load_compiled("mlp_537mb")
    import importlib.resources
    from safetensors.torch import load_file
    from big_weights.model import mlp_537mb
    with torch.device("meta"):
        module = mlp_537mb()
    path = importlib.resources.files("big_weights") / "_precompiled" / "mlp_537mb" / "weights.safetensors"
    module.load_state_dict(load_file(str(path)), assign=True)
    return module.eval()

def serve(model, commands, answers):
    x = torch.randn(8, 4096, generator=torch.Generator().manual_seed(0))
    for line in commands:
        if line.strip() != "call":
            return
        with torch.no_grad():
            model(x)
            times = []
            for _ in range(CALLS):
                start = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - start)
        answers.write(json.dumps([1000 * statistics.median(times), torch.get_num_threads()]) + "\n")
        answers.flush()
"""

SERVER = r"""
kind, start, warm_up, workers = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
torch.set_num_threads(THREADS)
pipes, pids = [], []
if start == "fork":
    model = load(kind)
    if warm_up:
        with torch.no_grad():
            model(torch.randn(8, 4096))
    for _ in range(workers):
        to_worker, from_server = os.pipe()
        to_server, from_worker = os.pipe()
        pid = os.fork()
        if pid == 0:
            serve(model, os.fdopen(to_worker), os.fdopen(from_worker, "w"))
            os._exit(0)
        pids.append(pid)
        pipes.append((os.fdopen(from_server, "w"), os.fdopen(to_server)))
else:
    code = sys.argv[5]
    for _ in range(workers):
        child = subprocess.Popen([sys.executable, "-c", code, "worker", kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": str(THREADS)})
        pids.append(child.pid)
        pipes.append((child.stdin, child.stdout))

def pss(pid):
    for line in open(f"/proc/{pid}/smaps_rollup"):
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0

calls = []
for command, answer in pipes:  # in turn: each worker's calls have the cores to themselves
    command.write("call\n"); command.flush()
    calls.append(json.loads(answer.readline()))
report = {"workers_pss": sum(pss(pid) for pid in pids), "server_pss": pss(os.getpid()), "per_call_ms": statistics.median(c[0] for c in calls), "threads": sorted({c[1] for c in calls})}
for command, _ in pipes:
    command.write("exit\n"); command.flush()
for pid in pids:
    os.waitpid(pid, 0)
print(json.dumps(report))
"""


def program(calls: int, threads: int) -> str:
    prelude = WORKER.replace("CALLS", str(calls))
    worker_main = 'if sys.argv[1] == "worker":\n    torch.set_num_threads(THREADS)\n    serve(load(sys.argv[2]), sys.stdin, sys.stdout)\n    sys.exit(0)\nimport subprocess\n'
    return (prelude + worker_main + SERVER).replace("THREADS", str(threads))


def run_case(code: str, case: str, workers: int, timeout: float) -> dict:
    kind, start, warm_up = CASES[case]
    command = [sys.executable, "-c", code, kind, start, "1" if warm_up else "0", str(workers), code]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.communicate()
        return {"hung": True}
    if process.returncode != 0:
        raise SystemExit(f"{case}: the server failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def spread(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    options = parser.parse_args()
    code = program(options.calls, options.threads)
    results: dict[str, list[dict]] = {case: [] for case in CASES}
    for _ in range(options.runs):
        for case in CASES:
            results[case].append(run_case(code, case, options.workers, options.timeout))
    import torch

    print(f"{options.workers} workers, mlp_537mb (537 MB of float32 weights), input [8, 4096], {options.threads} threads asked for; torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    print(f"medians of {options.runs} runs (min-max)\n")
    print("| case | workers' summed Pss, MB | server's Pss, MB | per call, ms | threads per worker |")
    print("|---|---|---|---|---|")
    for case, runs in results.items():
        if any(r.get("hung") for r in runs):
            print(f"| {case} | hung | | | |")
            continue
        threads = sorted({t for r in runs for t in r["threads"]})
        print(f"| {case} | {spread([r['workers_pss'] for r in runs])} | {spread([r['server_pss'] for r in runs])} | {spread([r['per_call_ms'] for r in runs], 1)} | {', '.join(map(str, threads))} |")


if __name__ == "__main__":
    main()
