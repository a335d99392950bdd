"""llama.cpp as the far anchor for CPU decode: greedy decoding of a GGUF model through
llama-cpp-python, time to the first token and per-token time.

Run it with the Python of an environment where llama-cpp-python is installed (a CPU
build) together with what llama.cpp's converter needs (torch, transformers, numpy,
safetensors, sentencepiece where the tokenizer is one):

    python benchmarks/llama_cpp.py --model-dir HF_FOLDER --work DIR --quants Q8_0,Q4_0

llama-cpp-python installs from its sdist, building llama.cpp with -march=native. With
GCC 12, leave AMX out of that build (CFLAGS and CXXFLAGS "-mno-amx-tile -mno-amx-int8
-mno-amx-bf16"): its AMX kernels' tile configuration is optimized away and Q8_0 or Q4_0
models crash on the first matmul (general protection fault in ggml_backend_amx_mul_mat;
llama.cpp pull request 26954). Decoding one token at a time uses the AVX-512 VNNI
kernels either way.

Conversion, once per --work folder (kept there, redone when the model folder's files
change): llama.cpp's convert_hf_to_gguf.py turns the Hugging Face folder (safetensors)
into a 16-bit GGUF (bfloat16 if the checkpoint is, else float16: its "auto"), then
llama_model_quantize (the quantize tool's library call, through the bindings) makes one
GGUF per --quants name (any llama_ftype's MOSTLY_ suffix: Q8_0, Q4_0, Q4_K_M, F16...),
with the quantize tool's defaults (so Q4_0 keeps the output matrix, or the tied embedding
that serves as one, at Q6_K, or Q8_0 where its width is no multiple of 256).
The converter comes from --llama-cpp-src (a llama.cpp source tree), or else from the
sdist of the installed llama-cpp-python, which vendors the llama.cpp it was built from
(`pip download` into --work, unpacked there).

Every quant does the same work, batch 1, in --runs fresh processes each (this script
again, --child), the quants interleaved run after run so that they share the machine's
current load: import llama_cpp, load the GGUF with `Llama(n_ctx, n_threads and
n_threads_batch = --threads, n_batch = n_ubatch = max(512, --prompt))` (memory-mapped,
llama.cpp's default), tokenize a fixed English text with the model's tokenizer (its
BOS first where the GGUF says to add one, the text repeated, cut to exactly --prompt
ids: the same ids for every quant),
`Llama.eval` them in one batch, take the argmax of the last position's logits, then
--new-tokens steps, each evaluating the last token and taking its argmax. The new tokens
reported are those fed to the steps (the prompt's argmax and the first --new-tokens - 1
steps'), as benchmarks/decode.py reports them.

Columns: GGUF size is the file's; first token is the time from the process's start (its
standard-library imports aside, as in decode.py) to the prompt evaluated and its argmax
taken, `import llama_cpp` and the load included; per token is the median step time
(eval and argmax) in each process, then the median over processes (min-max across
processes); peak RSS is the process's maximum resident memory (VmHWM; the mapped
weights it touched included). Under the table, each quant's first 16 new token ids, to
compare with other runtimes on the same checkpoint and prompt (--json writes the
prompt's ids too).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING

from cold_start import cpu_model, positive, spread  # the cold-start benchmark's helpers, beside this script

STARTED = perf_counter()  # a --child process's start: its first token counts from here
if Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]  # this script's folder: `import llama_cpp` is the package, not this file

if TYPE_CHECKING:
    from llama_cpp import Llama

TEXT = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step, "
    "and every morning the baker on the corner opens his shop before the sun has risen over the hills. "
)
SHOWN_TOKENS = 16
CONVERTER = "convert_hf_to_gguf.py"
CONVERTER_PARTS = [CONVERTER, "conversion", "gguf-py"]  # what the converter needs of a llama.cpp tree
CHILD_TIMEOUT_S = 1800


def quant_type(name: str) -> int:
    """The llama_ftype a --quants name stands for (llama_cpp.LLAMA_FTYPE_MOSTLY_<name>)."""
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}", None)
    if ftype is None:
        raise SystemExit(f"unknown quant {name!r}: llama_cpp has no LLAMA_FTYPE_MOSTLY_{name}")
    return ftype


def fingerprint(model_dir: Path) -> dict:
    """What the cached GGUFs were made from: the folder, its files' sizes and times, llama-cpp-python's version."""
    files = {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(model_dir.iterdir()) if p.is_file()}
    return {"model_dir": str(model_dir.resolve()), "files": files, "llama_cpp_python": metadata.version("llama-cpp-python")}


def sdist_sources(work: Path) -> Path:
    """The llama.cpp tree vendored in the installed llama-cpp-python's sdist (its converter's parts), fetched once into work."""
    tree = work / "llama.cpp"
    if (tree / CONVERTER).exists():
        return tree
    version = metadata.version("llama-cpp-python")
    download = work / "sdist"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", f"llama-cpp-python=={version}", "-d", str(download)]
    if subprocess.run(command, stdout=sys.stderr).returncode != 0:
        raise SystemExit(f"could not download llama-cpp-python {version}'s sdist; pass --llama-cpp-src")
    (archive,) = download.glob("*.tar.gz")
    prefix = f"{archive.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
    with tarfile.open(archive) as sdist:
        members = [m for m in sdist.getmembers() if m.name.startswith(prefix) and m.name[len(prefix) :].split("/")[0] in CONVERTER_PARTS]
        for member in members:
            member.name = member.name[len(prefix) :]
        sdist.extractall(tree, members=members, filter="data")
    shutil.rmtree(download)
    return tree


def convert(model_dir: Path, sources: Path, out: Path) -> None:
    """The Hugging Face folder to a 16-bit GGUF with llama.cpp's converter."""
    partial = out.with_suffix(".partial")
    command = [sys.executable, str(sources / CONVERTER), str(model_dir), "--outtype", "auto", "--outfile", str(partial)]
    print(f"converting: {' '.join(command)}", file=sys.stderr, flush=True)
    if subprocess.run(command, stdout=sys.stderr).returncode != 0:
        raise SystemExit(f"{CONVERTER} failed on {model_dir}")
    partial.rename(out)


def quantize(base: Path, out: Path, quant: str, threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = quant_type(quant)
    params.nthread = threads
    partial = out.with_suffix(".partial")
    print(f"quantizing: {base.name} -> {out.name}", file=sys.stderr, flush=True)
    if llama_cpp.llama_model_quantize(str(base).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize to {quant} failed")
    partial.rename(out)


def prepare(args: argparse.Namespace) -> dict[str, Path]:
    """Each quant's GGUF in --work, converted and quantized unless the cache already holds it for this model folder."""
    args.work.mkdir(parents=True, exist_ok=True)
    stamp, source = args.work / "source.json", fingerprint(args.model_dir)
    if not stamp.exists() or json.loads(stamp.read_text()) != source:
        for old in args.work.glob("*.gguf"):
            old.unlink()
        stamp.write_text(json.dumps(source, indent=1))
    base = args.work / "base.gguf"
    if not base.exists():
        convert(args.model_dir, args.llama_cpp_src or sdist_sources(args.work), base)
    files = {quant: args.work / f"{quant}.gguf" for quant in args.quants}
    for quant, path in files.items():
        if not path.exists():
            quantize(base, path, quant, args.threads)
    return files


def prompt_ids(llm: Llama, length: int) -> list[int]:
    """Exactly `length` ids: BOS where the GGUF's tokenizer adds one, then the fixed text repeated."""
    text = TEXT
    while len(ids := llm.tokenize(text.encode(), add_bos=True)) < length:
        text += TEXT
    return ids[:length]


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM). Not getrusage's ru_maxrss: Linux carries that
    over exec, so a child would report its parent's peak (here the quantizing parent's) if larger."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no VmHWM in /proc/self/status")


def child(args: argparse.Namespace) -> None:
    """One measured process: prints one JSON line."""
    import llama_cpp
    import numpy as np  # llama-cpp-python's own dependency

    imported = perf_counter() - STARTED
    llm = llama_cpp.Llama(
        model_path=str(args.child),
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=max(512, args.prompt),
        n_ubatch=max(512, args.prompt),
        verbose=False,
    )
    loaded = perf_counter() - STARTED
    vocab = llm.n_vocab()

    def argmax() -> int:
        return int(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,)).argmax())

    prompt = prompt_ids(llm, args.prompt)
    llm.eval(prompt)
    token = argmax()
    first = perf_counter() - STARTED
    tokens, steps = [], []
    for _ in range(args.new_tokens):
        tokens.append(token)
        start = perf_counter()
        llm.eval([token])
        token = argmax()
        steps.append(perf_counter() - start)
    llm.reset()  # prefill again from an empty cache, warm
    start = perf_counter()
    llm.eval(prompt)
    argmax()
    prefill = perf_counter() - start
    print(json.dumps({"import": imported, "load": loaded, "first": first, "step": statistics.median(steps), "prefill": prefill, "tokens": tokens, "prompt": prompt, "rss": peak_rss_mb()}))


def run_child(path: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", str(path), "--threads", str(args.threads), "--n-ctx", str(args.n_ctx), "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{path.name}: no result after {CHILD_TIMEOUT_S} s") from None
    if result.returncode != 0:
        raise SystemExit(f"{path.name} failed (exit code {result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def interleaved_runs(files: dict[str, Path], args: argparse.Namespace) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {quant: [] for quant in files}
    for run in range(args.runs):
        print(f"run {run + 1}/{args.runs}", file=sys.stderr, flush=True)
        for quant, path in files.items():
            results[quant].append(run_child(path, args))
    return results


def system_info() -> str:
    """llama.cpp's own line on the CPU features its build uses."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode().strip()


def print_table(files: dict[str, Path], results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    print(f"### {args.model_dir.name}: prompt {args.prompt}, {args.new_tokens} new tokens, batch 1, {args.threads} thread(s)\n")
    print("| quant | GGUF, MB | first token, s (min-max) | per token, ms (min-max) | peak RSS, MB |\n|---|---|---|---|---|")
    for quant, runs in results.items():
        size = files[quant].stat().st_size / 2**20
        step = [r["step"] * 1000 for r in runs]
        print(f"| {quant} | {size:.0f} | {spread([r['first'] for r in runs], 2)} | {spread(step, 1)} | {statistics.median(r['rss'] for r in runs):.0f} |")
    print(f"\nFirst {SHOWN_TOKENS} new token ids:\n")
    for quant, runs in results.items():
        same = all(r["tokens"] == runs[0]["tokens"] for r in runs)
        print(f"- {quant}: {runs[0]['tokens'][:SHOWN_TOKENS]}" + ("" if same else " (the runs' tokens differ)"))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, help="the Hugging Face model folder (config.json, safetensors, tokenizer)")
    parser.add_argument("--work", type=Path, help="where the GGUFs are made and kept")
    parser.add_argument("--quants", type=lambda text: text.split(","), default=["Q8_0", "Q4_0"], help="comma-separated llama_ftype names (default Q8_0,Q4_0)")
    parser.add_argument("--llama-cpp-src", type=Path, help=f"a llama.cpp source tree for {CONVERTER} (default: the installed llama-cpp-python's sdist)")
    parser.add_argument("--runs", type=positive, default=5, help="fresh processes per quant (default 5)")
    parser.add_argument("--prompt", type=positive, default=128, help="prompt length in tokens (default 128)")
    parser.add_argument("--new-tokens", type=positive, default=64, help="one-token steps after the prompt (default 64)")
    parser.add_argument("--threads", type=positive, default=2, help="llama.cpp threads (default 2)")
    parser.add_argument("--n-ctx", type=positive, default=1024, help="the context (KV cache) length (default 1024)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # one measured process on this GGUF
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.model_dir is None or args.work is None:
        parser.error("--model-dir and --work are required")
    if args.prompt + args.new_tokens > args.n_ctx:
        parser.error("the prompt and the new tokens must fit --n-ctx")
    for quant in args.quants:
        quant_type(quant)

    files = prepare(args)
    print(
        f"llama-cpp-python {metadata.version('llama-cpp-python')}, Python {platform.python_version()}\n"
        f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs visible), {args.threads} thread(s)\n"
        f"llama.cpp: {system_info()}\n"
        f"batch 1, prompt {args.prompt}, {args.new_tokens} new tokens, context {args.n_ctx}, {args.runs} fresh processes per quant\n",
        flush=True,
    )
    results = interleaved_runs(files, args)
    print_table(files, results, args)
    if args.json:
        raw = {"args": {k: str(v) for k, v in vars(args).items()}, "cpu": cpu_model(), "system_info": system_info(), "files": {q: str(p) for q, p in files.items()}, "results": results}
        args.json.write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
