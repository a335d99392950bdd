"""Greedy decoding with a static KV cache: time to the first token and per-token time.

Run it in an environment where the example wheel and benchmarks/decoder's wheel
(package decoder_bench) are installed: `./dev.sh bench-decode` builds both and runs
this. Models (--models, all five by default): a Llama-style decoder of 92 M
parameters (6 layers, 768 wide, 12 heads of 64, RMSNorm, rotary positions, SwiGLU
2048, vocabulary 32000), its KV cache in buffers each call updates in place
(benchmarks/decoder/src/decoder_bench/model.py):

- decoder: float32, a cache of 1024 positions
- decoder_2048: the same weights, a cache of 2048 positions
- decoder_bf16: the 1024 model in bfloat16
- decoder_int8: the 1024 model with weight-only int8 (`quantize = "int8-weight-only"`:
  int8 weights, a scale per output channel, bfloat16 activations)
- decoder_int4: the 1024 model with weight-only int4 (`quantize = "int4-weight-only"`,
  group-size 128: packed 4-bit weights, a scale and zero point per 128 inputs)

Every case does the same work, batch 1: a prompt of --prompt random token ids
(fixed seed) in one call `model(input_ids, arange(prompt))`, the argmax of its last
logits, then --new-tokens steps, each feeding the last token back at the next
position, `model(token[:, None], tensor([position]))`, and taking its argmax. The
new tokens compared are those fed to the steps (the prompt's argmax and the
first --new-tokens - 1 steps'). Cases, each in fresh processes (median of
--runs, min-max shown), every case of every model interleaved in one run, so that
they share the machine's current load:

- eager: import, build the module with the package's factory, which draws its
  seeded random weights (no checkpoint is read; bfloat16: `.to(torch.bfloat16)`),
  decode. The weight-only models: the bfloat16 module quantized as the build
  quantizes it, by `hatch_precompile.worker.linears.quantize_weights` with the
  model's table from benchmarks/decoder/pyproject.toml (torchao computes the
  weights; the time to import it and to quantize is in the first token), so every
  case of a weight-only model runs the same quantized graph. hatch_precompile and
  torchao come from the environment, or from --quantizer, a folder on PYTHONPATH
  in those processes only (`./dev.sh bench-decode` installs them there, so that
  the other cases' environment stays the wheel's: torch and the package alone)
- torch.compile, warm cache: the eager module through `torch.compile(dynamic=True)`,
  with the inductor cache a setup process filled by decoding once (a private
  TORCHINDUCTOR_CACHE_DIR); the one-token steps compile a second graph (size 1 is
  specialized), which the cache also holds
- AOTInductor: at setup, torch.export of the eager module with the sequence dynamic
  (1 to the cache length, on input_ids' dim 1 and cache_position's dim 0) and
  `torch._inductor.aoti_compile_and_package` (weight-only models: of the quantized
  eager module, the graph the wheel's build captures); in the process,
  `torch._inductor.aoti_load_package`, no C++ compiler on PATH. "n/a: reason"
  where the export or the compile fails
- load_compiled, lean form: as load_compiled below, with HATCH_PRECOMPILE_FORM=lean
- load_compiled: `load_compiled(name)` from the wheel (its C++ form, which
  benchmarks/decoder's models ask for, `cpp-form = true`: no compiler
  imported), a handle with its own cache; empty private caches (the first process
  after install: the weights file is hashed), no C++ compiler on PATH

Columns: first token is the time from process start (`import torch` included) to
the prompt's call done and its argmax taken; per token is the median step time
(call and argmax) in each process, then the median over processes (min-max
across processes); first step is the first one-token call alone (median over
processes); ratios are against float32 eager with the 1024 cache. Peak RSS is the
process's maximum resident memory. For load_compiled, the cost of its input
checks alone on a step's inputs is printed under the table. "tokens = eager's" says whether the case's new
tokens equal its model's eager ones (float32 eager for the float32 models,
bfloat16 eager for decoder_bf16, the quantized eager module for decoder_int8 and
decoder_int4). The accuracy table compares every case's prompt
logits (all positions) with float32 eager's (relative error, norm of the
difference over the norm of float32's, and cosine), and its new tokens with
float32 eager's: after how many they first differ.

The wheel's size per model: the bytes the installed package ships for it, read
from its _precompiled/manifest.json: its weights file, its artifacts (both CPU
targets, the artifact and the lean module of each) and their kernels, and the
ratio to float32's (decoder). Last, the targets of issue 46 for the weight-only
models, met or missed, from the lean form's (load_compiled's) figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from cold_start import cpu_model, no_compiler_path, positive, run_with_own_tmpdir, spread, version  # the cold-start benchmark's helpers, beside this script

CHILD_TIMEOUT_S = 1800  # one process; torch.compile's or AOTInductor's setup on two slow cores stays far below
PACKAGE = "decoder_bench"
VOCAB = 32000


@dataclass(frozen=True)
class Model:
    key: str  # the --models name and the name in load_compiled
    title: str
    factory: str  # "module:function" building the eager module
    max_len: int  # the cache's positions: the dynamic sequence's upper bound
    dtype: str | None = None  # the precision compiled (and eager's), where not float32
    quantize: str | None = None  # the weight-only scheme: eager quantizes its module as the build does


MODELS = {
    "decoder": Model("decoder", "decoder, float32, cache of 1024", "decoder_bench.model:decoder", 1024),
    "decoder_2048": Model("decoder_2048", "decoder, float32, cache of 2048", "decoder_bench.model:decoder_2048", 2048),
    "decoder_bf16": Model("decoder_bf16", "decoder, bfloat16, cache of 1024", "decoder_bench.model:decoder", 1024, "bfloat16"),
    "decoder_int8": Model("decoder_int8", "decoder, weight-only int8 (bfloat16 activations), cache of 1024", "decoder_bench.model:decoder", 1024, "bfloat16", "int8-weight-only"),
    "decoder_int4": Model("decoder_int4", "decoder, weight-only int4, group-size 128 (bfloat16 activations), cache of 1024", "decoder_bench.model:decoder", 1024, "bfloat16", "int4-weight-only"),
}
BASELINE = "decoder"  # its eager case is the "vs" of every ratio, and float32's tokens and logits

EAGER, COMPILE_WARM, AOTI, LOADER = "eager", "torch.compile, warm cache", "AOTInductor", "load_compiled"
LOADER_LEAN = "load_compiled, lean form"
CASES = [EAGER, COMPILE_WARM, AOTI, LOADER_LEAN, LOADER]
COMPILER = ["torch._inductor", "torch._dynamo"]  # in sys.modules: the process paid for importing the compiler
PROJECT = Path(__file__).resolve().parent / "decoder" / "pyproject.toml"  # the weight-only models' tables, for eager's quantization

# Issue 46's targets for the weight-only models, on the lean form (load_compiled):
# (model, what, limit, against): per token against float32 eager's, first token and
# peak RSS against float32's lean form, the shipped bytes against float32's.
TARGETS = [
    ("decoder_int8", "per token", 0.35, "float32 eager"),
    ("decoder_int4", "per token", 0.28, "float32 eager"),
    ("decoder_int8", "first token", 1.0, "float32 load_compiled"),
    ("decoder_int4", "first token", 1.0, "float32 load_compiled"),
    ("decoder_int8", "peak RSS", 0.5, "float32 load_compiled"),
    ("decoder_int8", "wheel size", 0.35, "float32"),
    ("decoder_int4", "wheel size", 0.25, "float32"),
]


# One case in one fresh process: argv is the case and the spec (JSON). Prints one
# JSON line: the measurements, or {"skipped": why}. "aoti setup" instead exports
# and packages the model for the AOTInductor case. With spec["logits_file"], the
# prompt's logits are saved there (torch.save, float32) for the accuracy table.
CHILD = r"""
import json, os, sys, time
start = time.perf_counter()
import importlib
import resource
import torch

floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # what importing torch alone holds
case, spec = sys.argv[1], json.loads(sys.argv[2])
torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
prompt = torch.randint(0, spec["vocab"], (1, spec["prompt"]), generator=torch.Generator().manual_seed(0))


def eager_module():
    module, function = spec["factory"].split(":")
    model = getattr(importlib.import_module(module), function)()
    model = model.to(getattr(torch, spec["dtype"])) if spec["dtype"] else model
    if spec["quantize"]:  # as the build does: its table, then torchao's weights in the same modules
        import tomllib
        from hatch_precompile.engine.config import parse_config
        from hatch_precompile.worker.linears import quantize_weights

        with open(spec["project"], "rb") as file:
            table = tomllib.load(file)["tool"]["hatch"]["build"]["hooks"]["precompile"]
        quantize_weights(parse_config(table).models[spec["key"]], model)
    return model


def load():
    if case == "eager":
        return eager_module()
    if case == "torch.compile, warm cache":
        return torch.compile(eager_module(), dynamic=True)
    if case == "AOTInductor":
        return torch._inductor.aoti_load_package(spec["aoti_package"])
    return importlib.import_module(spec["package"]).load_compiled(spec["key"])


def aoti_setup():
    model = eager_module()
    seq = torch.export.Dim("seq", min=1, max=spec["max_len"])
    exported = torch.export.export(
        model, (prompt, torch.arange(spec["prompt"])), dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}}
    )
    torch._inductor.aoti_compile_and_package(exported, package_path=spec["aoti_package"])


if case == "aoti setup":
    with torch.no_grad():
        try:
            aoti_setup()
        except Exception as error:  # the case then reports itself skipped
            print(json.dumps({"skipped": f"{type(error).__name__}: {error}"[:300]}))
    sys.exit(0)
if case == "AOTInductor" and not os.path.exists(spec["aoti_package"]):
    print(json.dumps({"skipped": "the export or the compile failed at setup"}))
    sys.exit(0)

with torch.no_grad():
    model = load()
    logits = model(prompt, torch.arange(spec["prompt"]))
    token = logits[:, -1].argmax(-1)
    first = time.perf_counter() - start
    imported = {name: name in sys.modules for name in spec["watched"]}
    prompt_logits, tokens, steps = logits, [], []
    for position in range(spec["prompt"], spec["prompt"] + spec["new_tokens"]):
        tokens.append(int(token))
        t = time.perf_counter()
        token = model(token[:, None], torch.tensor([position]))[:, -1].argmax(-1)
        steps.append(time.perf_counter() - t)
    check = None
    if case.startswith("load_compiled"):  # the handle's input checks alone, on a step's inputs
        step_inputs, checks = (token[:, None], torch.tensor([position])), []
        for _ in range(spec["new_tokens"]):
            t = time.perf_counter()
            model.check_inputs(*step_inputs)
            checks.append(time.perf_counter() - t)
        check = sorted(checks)[len(checks) // 2]
    if spec.get("logits_file"):
        torch.save(prompt_logits.float(), spec["logits_file"])
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
step = sorted(steps)[len(steps) // 2]
print(json.dumps({"first": first, "step": step, "first_step": steps[0], "check": check, "tokens": tokens, "rss": rss, "floor": floor, "imported": imported}))
"""


def logits_file(scratch: Path, model: Model, case: str) -> Path:
    return scratch / f"{model.key}-{case.split(',')[0].replace(' ', '-').replace('.', '-')}.pt"


def run_child(case: str, model: Model, env: dict[str, str], args: argparse.Namespace, scratch: Path, save_logits: bool = False) -> dict:
    spec = {
        **asdict(model),
        "package": PACKAGE,
        "vocab": VOCAB,
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "watched": COMPILER,
        "aoti_package": str(scratch / f"{model.key}.pt2"),
        "project": str(PROJECT),
    }
    if save_logits:
        spec["logits_file"] = str(logits_file(scratch, model, case))
    try:
        result = run_with_own_tmpdir([sys.executable, "-c", CHILD, case, json.dumps(spec)], env, scratch, CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{model.key}, {case}: no result after {CHILD_TIMEOUT_S} s") from None
    if result.returncode != 0:
        raise SystemExit(f"{model.key}, {case} failed:\n{result.stderr[-3000:]}")
    reports = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return json.loads(reports[-1]) if reports else {}


class Environments:
    """The child processes' environments: fresh caches per process but for
    torch.compile's warm one, and no C++ compiler for AOTInductor and load_compiled."""

    def __init__(self, scratch: Path, threads: int, quantizer: Path | None) -> None:
        self.scratch = scratch
        self.quantizer = quantizer
        self.base = {**os.environ, "BENCH_THREADS": str(threads)}
        self.base.pop("HATCH_PRECOMPILE_FORM", None)  # the loader's default form
        traps = scratch / "traps"
        traps.mkdir()
        self.no_compiler = {**self.base, "PATH": no_compiler_path(traps), "CXX": str(traps / "c++"), "CC": str(traps / "cc")}

    def for_case(self, case: str, model: Model) -> dict[str, str]:
        if case == COMPILE_WARM:  # the setup's run filled it; every measured run reuses it
            env = {**self.base, "TORCHINDUCTOR_CACHE_DIR": str(self.scratch / f"{model.key}-warm-cache")}
        else:
            folder = tempfile.mkdtemp(prefix="case-", dir=self.scratch)
            env = {**(self.no_compiler if case in (AOTI, LOADER, LOADER_LEAN) else self.base), "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor", "HATCH_PRECOMPILE_CACHE_DIR": f"{folder}/hp"}
            if case == LOADER_LEAN:
                env["HATCH_PRECOMPILE_FORM"] = "lean"
        if model.quantize and case in (EAGER, COMPILE_WARM) and self.quantizer:  # (the AOTInductor setup runs as eager)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.quantizer), env.get("PYTHONPATH")]))
        return env


def interleaved_runs(models: list[Model], envs: Environments, args: argparse.Namespace) -> dict[str, dict[str, list]]:
    """Every case of every model once per run, run after run, so that drifting load
    hits every case alike. A case that reports itself skipped is not run again.
    The first run saves each case's prompt logits."""
    results: dict[str, dict[str, list]] = {m.key: {case: [] for case in CASES} for m in models}
    for run in range(args.runs):
        print(f"run {run + 1}/{args.runs}", file=sys.stderr, flush=True)
        for model in models:
            for case, runs in results[model.key].items():
                if runs and "skipped" in runs[0]:
                    continue
                env = envs.for_case(case, model)
                runs.append(run_child(case, model, env, args, envs.scratch, save_logits=run == 0))
    return results


def tokens_of(runs: list[dict]) -> list[int] | None:
    """The case's new tokens, or None if its runs disagree (they should not)."""
    first = runs[0]["tokens"]
    return first if all(r["tokens"] == first for r in runs) else None


def first_difference(tokens: list[int] | None, reference: list[int] | None) -> str:
    if tokens is None or reference is None:
        return "varies between runs"
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return f"after {i} (token {i + 1} differs)"
    return f"none in {len(tokens)}"


def imported(runs: list[dict]) -> str:
    answers = set()
    for run in runs:
        present = [m for m in COMPILER if run["imported"][m]]
        answers.add("yes" if len(present) == len(COMPILER) else "no" if not present else ", ".join(present) + " only")
    return answers.pop() if len(answers) == 1 else "mixed"


def explain(model: Model) -> str:
    """What load_compiled says it would load here (which CPU target): reads the manifest only."""
    code = f"from {PACKAGE} import load_compiled; print(load_compiled.explain({model.key!r}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else f"explain failed: {result.stderr.strip()[-300:]}"


def print_table(model: Model, results: dict[str, list[dict]], baseline: dict[str, list[dict]], args: argparse.Namespace) -> None:
    print(f"### {model.title}: prompt {args.prompt}, {args.new_tokens} new tokens, batch 1, {args.threads} thread(s)\n")
    print(f"load_compiled.explain(): {explain(model)}\n")
    columns = ["case", "first token, s (min-max)", "vs eager fp32", "per token, ms (min-max)", "vs eager fp32", "first step, ms", "peak RSS, MB", "compiler imported", "tokens = eager's"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    base_first = statistics.median(r["first"] for r in baseline[EAGER])
    base_step = statistics.median(r["step"] for r in baseline[EAGER])
    eager_tokens = tokens_of(results[EAGER])
    skipped = {}
    for case, runs in results.items():
        if "skipped" in runs[0]:
            skipped[case] = runs[0]["skipped"]
            print(f"| {case} | n/a: {runs[0]['skipped'][:80].replace('|', '/')} |" + " |" * (len(columns) - 2))
            continue
        first = [r["first"] for r in runs]
        step = [r["step"] * 1000 for r in runs]
        tokens = tokens_of(runs)
        same = "varies between runs" if tokens is None or eager_tokens is None else "yes" if tokens == eager_tokens else ("no, " + first_difference(tokens, eager_tokens))
        print(
            f"| {case} | {spread(first, 2)} | {statistics.median(first) / base_first:.2f}x "
            f"| {spread(step, 1)} | {statistics.median(step) / (base_step * 1000):.2f}x "
            f"| {statistics.median(r['first_step'] * 1000 for r in runs):.0f} "
            f"| {statistics.median(r['rss'] for r in runs):.0f} | {imported(runs)} | {same} |"
        )
    checks = [r["check"] * 1e6 for r in results[LOADER] if r.get("check") is not None]
    if checks:
        print(f"\nload_compiled input checks: {spread(checks, 1)} us per call, included in its per-token time above")
    for case, reason in skipped.items():
        print(f"\n{case}: n/a ({reason})")
    print()


def print_accuracy(models: list[Model], results: dict[str, dict[str, list]], scratch: Path) -> None:
    """Every case's prompt logits and new tokens against float32 eager's (decoder)."""
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # this environment has no numpy; torch.load warns
    import torch

    reference_file = logits_file(scratch, MODELS[BASELINE], EAGER)
    if BASELINE not in results or not reference_file.exists():
        return
    reference = torch.load(reference_file).double().flatten()
    reference_tokens = tokens_of(results[BASELINE][EAGER])
    print("### Accuracy: each case's prompt logits and new tokens against float32 eager's (decoder, cache of 1024)\n")
    print("| model | case | relative error | cosine | first differing token |\n|---|---|---|---|---|")
    for model in models:
        for case, runs in results[model.key].items():
            path = logits_file(scratch, model, case)
            if "skipped" in runs[0] or not path.exists():
                continue
            output = torch.load(path).double().flatten()
            error = ((output - reference).norm() / reference.norm()).item()
            cosine = torch.nn.functional.cosine_similarity(output, reference, dim=0).item()
            differs = first_difference(tokens_of(runs), reference_tokens)
            print(f"| {model.key} | {case} | {error:.2e} | {cosine:.6f} | {differs} |")
    print()


def shipped_sizes(models: list[Model]) -> dict[str, dict[str, int]]:
    """Each model's shipped bytes by part, from the installed package's manifest
    (the sizes the build recorded, checked against the files): its weights file,
    its artifacts (each variant's artifact and lean module) and its kernels."""
    spec = importlib.util.find_spec(PACKAGE)  # the package's folder, without importing it (or torch)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{PACKAGE} is not installed")
    folder = Path(spec.origin).parent / "_precompiled"
    manifest = json.loads((folder / "manifest.json").read_text())
    sizes = {}

    def size(record: dict) -> int:
        on_disk = (folder / record["file"]).stat().st_size
        if on_disk != record["size"]:
            raise SystemExit(f"{record['file']}: {on_disk} bytes on disk, the manifest says {record['size']}")
        return on_disk

    for model in models:
        entry = manifest["models"][model.key]
        weights = size(entry["weights"]) if "file" in entry["weights"] else 0
        artifacts = sum(size(a) + (size(a["lean"]) if "file" in a.get("lean", {}) else 0) for a in entry["artifacts"])
        kernels = sum(size(k) for k in entry.get("kernels", {}).values())
        sizes[model.key] = {"weights": weights, "artifacts": artifacts, "kernels": kernels, "total": weights + artifacts + kernels}
    return sizes


def print_sizes(models: list[Model], sizes: dict[str, dict[str, int]]) -> None:
    print(f"### The wheel's size per model: the bytes {PACKAGE} ships for each (its manifest)\n")
    print("| model | weights file, MB | artifacts, MB | kernels, MB | total, MB | vs float32 |")
    print("|---|---|---|---|---|---|")
    for model in models:
        part = {name: value / 1e6 for name, value in sizes[model.key].items()}
        print(f"| {model.key} | {part['weights']:.1f} | {part['artifacts']:.1f} | {part['kernels']:.1f} | {part['total']:.1f} | {sizes[model.key]['total'] / sizes[BASELINE]['total']:.2f}x |")
    print(
        "\nartifacts: every CPU target's artifact and lean module; each model counted whole, files it shares with another included;"
        " the state (the KV cache) starts as zeros and is not shipped: the loader makes it\n"
    )


def print_targets(results: dict[str, dict[str, list]], sizes: dict[str, dict[str, int]]) -> None:
    """Issue 46's targets for the weight-only models, from the lean form's figures."""
    rows = []
    for key, what, limit, against in TARGETS:
        if key not in results:
            continue
        lean, base_lean = results[key][LOADER_LEAN], results[BASELINE][LOADER_LEAN]
        if what == "per token":
            value, reference, unit = statistics.median(r["step"] for r in lean) * 1000, statistics.median(r["step"] for r in results[BASELINE][EAGER]) * 1000, "ms"
        elif what == "first token":
            value, reference, unit = statistics.median(r["first"] for r in lean), statistics.median(r["first"] for r in base_lean), "s"
        elif what == "peak RSS":
            value, reference, unit = statistics.median(r["rss"] for r in lean), statistics.median(r["rss"] for r in base_lean), "MB"
        else:
            value, reference, unit = sizes[key]["total"] / 1e6, sizes[BASELINE]["total"] / 1e6, "MB"
        ratio = value / reference
        verdict = "met" if ratio <= limit else "missed"
        form = "shipped" if what == "wheel size" else "load_compiled"
        row = f"- {key}, {what} ({form}): {value:.3g} {unit} against {against}'s {reference:.3g} {unit}, {ratio:.2f}x; target <= {limit:.2f}x: {verdict}"
        if what == "peak RSS":  # the part the model's precision can move: what import torch holds is common to both
            floor = statistics.median(r["floor"] for r in lean + base_lean)
            row += f" (above import torch's {floor:.0f} MB: {value - floor:.0f} against {reference - floor:.0f} MB, {(value - floor) / (reference - floor):.2f}x)"
        rows.append(row)
    if rows:
        print("### Targets (issue 46)\n")
        print("\n".join(rows) + "\n")


def print_cpp_targets(results: dict[str, dict[str, list]]) -> None:
    """Issue 47's decode targets, on the C++ form (load_compiled's default where built)."""
    eager = statistics.median(r["step"] for r in results[BASELINE][EAGER])
    rows = []
    for key, limit in (("decoder", 0.78), ("decoder_bf16", 0.70)):
        if key in results and results[key][LOADER]:
            step = statistics.median(r["step"] for r in results[key][LOADER])
            aoti = [r["step"] for r in results[key][AOTI] if "step" in r]
            beside = f", AOTInductor {statistics.median(aoti) * 1000:.2f} ms ({statistics.median(aoti) / eager:.2f}x)" if aoti else ""
            verdict = "met" if step / eager <= limit else "missed"
            rows.append(f"- {key}, per token (C++ form): {step * 1000:.2f} ms, {step / eager:.2f}x float32 eager{beside}; target <= {limit:.2f}x: {verdict}")
    for key in results:
        if results[key][LOADER] and results[key][LOADER_LEAN]:
            first, lean = (statistics.median(r["first"] for r in results[key][case]) for case in (LOADER, LOADER_LEAN))
            rows.append(f"- {key}, first token: C++ form {first:.2f} s, lean form {lean:.2f} s; target <= the lean form's: {'met' if first <= lean else 'missed'}")
    if rows:
        print("### Targets (issue 47: the C++ form)\n")
        print("\n".join(rows) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS), help="models to measure (default: all); decoder, every ratio's baseline, is always measured")
    parser.add_argument("--runs", type=positive, default=5, help="fresh processes per case (default 5)")
    parser.add_argument("--prompt", type=positive, default=128, help="prompt length in tokens (default 128)")
    parser.add_argument("--new-tokens", type=positive, default=64, help="one-token steps after the prompt (default 64)")
    parser.add_argument("--threads", type=positive, default=2, help="torch threads in every case (default 2)")
    parser.add_argument("--quantizer", type=Path, help="a folder holding hatch_precompile and torchao (pip install --target), for the weight-only models' eager module (default: this environment)")
    args = parser.parse_args()
    models = [MODELS[key] for key in dict.fromkeys([BASELINE, *args.models])]  # float32 eager is every ratio's base
    if any(args.prompt + args.new_tokens > m.max_len for m in models):
        parser.error("the prompt and the new tokens must fit every model's cache (1024 positions)")

    print(
        f"torch {version('torch')}, Python {platform.python_version()}, {PACKAGE} {version('decoder-bench')}\n"
        f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs visible), {args.threads} thread(s)\n"
        f"batch 1, prompt {args.prompt}, {args.new_tokens} new tokens, {args.runs} fresh processes per case\n",
        flush=True,
    )
    sizes = shipped_sizes(models)  # before the long part: a wheel without a model stops here
    scratch = Path(tempfile.mkdtemp(prefix="bench-decode-"))
    try:
        envs = Environments(scratch, args.threads, args.quantizer.resolve() if args.quantizer else None)
        for model in models:  # setup: the AOTInductor package, torch.compile's warm cache
            print(f"setup: {model.key}", file=sys.stderr, flush=True)
            run_child("aoti setup", model, envs.for_case(EAGER, model), args, scratch)
            run_child(COMPILE_WARM, model, envs.for_case(COMPILE_WARM, model), args, scratch)
        results = interleaved_runs(models, envs, args)
        for model in models:
            print_table(model, results[model.key], results[BASELINE], args)
        print_accuracy(models, results, scratch)
        print_sizes(models, sizes)
        print_targets(results, sizes)
        print_cpp_targets(results)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
