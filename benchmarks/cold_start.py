"""Cold start and steady-state latency of the example models, each several ways.

Run it in an environment where the example wheels are installed (`./dev.sh bench`
builds both and runs this). Models (--models):

- encoder: the example encoder (example_project, package example_pkg), token ids
  [8, 64]
- bert: the transformers example (example_transformers, package example_bert), a
  small BertModel; input_ids [8, 32] and a fixed padding mask as attention_mask
- mlp_537mb, mlp_2gb: models whose load is their weights (benchmarks/big_weights,
  package big_weights): eight square Linear layers, 537 MB and 2.1 GB of float32;
  input [8, width]. Not in the default set (the wheel is 2.7 GB): ask for them
- minilm, minilm_bf16, minilm_int8: a BertModel the size of all-MiniLM-L6-v2 (benchmarks/minilm,
  package minilm), compiled in float32, in bfloat16 and quantized to int8; token ids [8, 128] and a
  padding mask. Measured against eager and ONNX Runtime, and each case's first
  output (last_hidden_state) against float32 eager's. Not in the default set
- embedder, embedder_int8: a sentence embedder over that BertModel (mean pooling,
  L2 norm), with a dynamic batch and sequence length, in float32 and in int8;
  the same call. Its embeddings against float32 eager's. Not in the default set

Each case runs in fresh processes (median of --runs, min-max shown), every case of
every model interleaved in one run, so that they share the machine's current load.
First output is timed from process start, `import torch` included:

- import torch alone (the floor): the process imports torch and stops; what
  every case but ONNX Runtime pays before its model, the row to read them against
- eager: import, build the module with the model's factory, call it (the encoder
  also loads the wheel's shipped weights; BERT's factory makes its own, and
  imports transformers)
- eager, fast path (the MLPs): the way users load big models: the module built
  on the meta device, the wheel's safetensors file memory-mapped and bound with
  `load_state_dict(assign=True)`
- torch.compile, empty cache: the eager module through torch.compile, empty
  inductor cache
- torch.compile, warm cache: the same, with the cache a previous process filled
- torch.compile cpp_wrapper, warm cache: the same with inductor's `cpp_wrapper`
  option (the graph's wrapper is C++, like AOTInductor's), for its steady state
- load_compiled: `load_compiled(name)`, the loader's default form; empty caches
  (the first process after install: the weights file is hashed), no C++ compiler
  on PATH
- load_compiled, next processes (the MLPs): the same with the private cache a
  previous process left, which holds the weights' verification stamp
- load_compiled, lean form: the same, with HATCH_PRECOMPILE_FORM=lean set (the
  default form is the C++ one where the model was built with `cpp-form = true`,
  as the encoder, BERT and the embedder are here)
- load_compiled, artifact form: the same, with HATCH_PRECOMPILE_FORM=artifact set
  (loaders that do not read it run their default form)
- load_compiled, plain outputs (bert only): `load_compiled(name, outputs="plain")`,
  which returns dicts and tuples instead of transformers' output classes, so that
  transformers is never imported; "n/a" where the loader has no such keyword
- load_compiled, NumPy arrays, no torch (the encoder, BERT and the embedder):
  `load_compiled(name, arrays="numpy")` in a process that imports numpy and the
  package only (it fails if torch gets imported), on the same inputs saved as
  arrays at setup; its first output is compared with load_compiled's (the C++
  form) bit for bit
- import numpy + dlopen libtorch_cpu.so (the NumPy path's floor): numpy
  imported and torch's libc10.so and libtorch_cpu.so loaded by ctypes, which
  every torch-free load pays before its model
- ONNX Runtime, no torch in the process (every model but the MLPs), as its users
  run it: torch.onnx.export (dynamo, dynamic batch) at setup, which also saves
  the call's inputs as numpy arrays; then a process that imports numpy and
  onnxruntime only (it fails if torch gets imported), an InferenceSession on
  the CPU provider, as many threads
- AOTInductor: torch.export and aoti_compile_and_package at setup (dynamic batch;
  for the CPU target the loader takes here, as the wheel's variants are compiled),
  aoti_load_package in the process, no C++ compiler on PATH (it only asks one
  for its version). For bert the process first imports transformers.modeling_outputs,
  as any user must: the package can rebuild BERT's output class only once it
  is registered with torch's pytree

Columns: steady state is the median time per call over --calls calls after a
warm-up, same input and thread count in every case; for load_compiled also the
cost of its input checks alone. Peak RSS is the process's maximum resident memory
(weights included: eager holds them in the module, load_compiled memory-maps the
shipped file). "compiler imported" says whether torch._inductor and torch._dynamo
were in sys.modules right after the first output; for bert, "transformers
imported" likewise. With --figure PATH the results are also drawn as one PNG
(`benchmarks/figure.py`, matplotlib): every case of every model side by side,
first output with the `import torch` floor marked, and steady state.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

BATCH = 8
CHILD_TIMEOUT_S = 1800  # one process; torch.compile of BERT on two slow cores stays far below


@dataclass(frozen=True)
class Model:
    key: str  # the --models name
    title: str
    package: str  # the installed package that re-exports load_compiled
    name: str  # the model's name in load_compiled
    factory: str  # "module:function" building the eager module
    sequence: int  # input_ids is [BATCH, sequence]
    attention_mask: bool  # also pass attention_mask= (a fixed padding mask)
    eager_loads_weights: bool  # eager binds the wheel's weights.safetensors to the factory's module
    max_batch: int  # the AOTInductor export's dynamic batch range is [1, max_batch]
    library: str | None  # the library of the output classes, whose import we record
    output_module: str | None  # defines them; AOTInductor's package rebuilds them only once it is imported
    features: int = 0  # > 0: the input is one float tensor [BATCH, features] instead of token ids
    dtype: str | None = None  # the precision compiled (and eager's), where not float32
    sequence_range: tuple[int, int] | None = None  # the AOTInductor export's dynamic sequence range, as the wheel's (else static)


MODELS = {
    "encoder": Model(
        key="encoder",
        title="example encoder (example_project)",
        package="example_pkg",
        name="encoder",
        factory="example_pkg.model:build_encoder",
        sequence=64,
        attention_mask=False,
        eager_loads_weights=True,
        max_batch=64,
        library=None,
        output_module=None,
    ),
    "bert": Model(
        key="bert",
        title="transformers BertModel (example_transformers)",
        package="example_bert",
        name="bert",
        factory="example_bert.model:build_bert",
        sequence=32,
        attention_mask=True,
        eager_loads_weights=False,
        max_batch=16,
        library="transformers",
        output_module="transformers.modeling_outputs",  # registers ModelOutput classes with torch's pytree
    ),
    **{
        key: Model(
            key=key,
            title=f"MLP of eight {width}x{width} Linear layers, {size} of float32 weights (benchmarks/big_weights)",
            package="big_weights",
            name=key,
            factory=f"big_weights.model:{key}",
            sequence=0,
            attention_mask=False,
            eager_loads_weights=True,
            max_batch=64,
            library=None,
            output_module=None,
            features=width,
        )
        for key, width, size in (("mlp_537mb", 4096, "537 MB"), ("mlp_2gb", 8192, "2.1 GB"))
    },
}
MINILM = "BertModel the size of all-MiniLM-L6-v2"
EMBEDDER = "sentence embedder over the MiniLM-sized BertModel, dynamic batch and sequence"
MODELS.update(
    {
        key: Model(
            key=key,
            title=f"{title}, {precision} (benchmarks/minilm)",
            package="minilm",
            name=key,
            factory=f"minilm.model:{factory}",
            sequence=128,
            attention_mask=True,
            eager_loads_weights=False,
            max_batch=16 if factory == "minilm" else 32,
            library="transformers" if factory == "minilm" else None,  # the embedder returns a tensor
            output_module="transformers.modeling_outputs" if factory == "minilm" else None,
            dtype=dtype,
            sequence_range=None if factory == "minilm" else (8, 128),
        )
        for key, factory, title, dtype, precision in (
            ("minilm", "minilm", MINILM, None, "float32"),
            ("minilm_bf16", "minilm", MINILM, "bfloat16", "bfloat16"),
            ("minilm_int8", "minilm", MINILM, None, "int8"),
            ("embedder", "embedder", EMBEDDER, None, "float32"),
            ("embedder_int8", "embedder", EMBEDDER, None, "int8"),
        )
    }
)
DEFAULT_MODELS = ["encoder", "bert"]
BIG_CALLS = 20  # steady-state calls for the MLPs, whose calls stream their weights

EAGER, COMPILE_EMPTY, COMPILE_WARM = "eager", "torch.compile, empty cache", "torch.compile, warm cache"
EAGER_FAST = "eager, fast path"
LOADER_NEXT = "load_compiled, next processes"
COMPILE_CPP = "torch.compile cpp_wrapper, warm cache"
LOADER, LOADER_ARTIFACT, LOADER_PLAIN = "load_compiled", "load_compiled, artifact form", "load_compiled, plain outputs"
LOADER_LEAN = "load_compiled, lean form"
LOADER_NUMPY = "load_compiled, NumPy arrays, no torch"
NUMPY_FLOOR = "import numpy + dlopen libtorch_cpu.so (its floor)"
NUMPY_CASES = (NUMPY_FLOOR, LOADER_NUMPY)  # run by NUMPY_CHILD: no torch in the process
AOTI = "AOTInductor"
ORT = "ONNX Runtime, no torch in the process"
TORCH_FLOOR = "import torch alone (the floor)"
COMPILER = ["torch._inductor", "torch._dynamo"]  # in sys.modules: the process paid for importing the compiler


def cases_for(model: Model) -> list[str]:
    """The cases measured for a model; the first is the baseline of "vs eager"."""
    if model.features:
        return [EAGER_FAST, TORCH_FLOOR, LOADER, LOADER_NEXT]
    if model.key in ("minilm_int8", "embedder_int8"):  # the eager module is the float32 one's: only the int8 graph is new
        return [LOADER]
    if model.key == "embedder":
        return [EAGER, TORCH_FLOOR, LOADER_LEAN, LOADER, NUMPY_FLOOR, LOADER_NUMPY, AOTI]
    if model.package == "minilm":
        return [EAGER, TORCH_FLOOR, LOADER_LEAN, LOADER, ORT]
    plain = [LOADER_PLAIN] if model.library else []  # only a model with library output classes has "plain" ones
    return [EAGER, TORCH_FLOOR, COMPILE_EMPTY, COMPILE_WARM, COMPILE_CPP, LOADER_LEAN, LOADER, LOADER_ARTIFACT, *plain, NUMPY_FLOOR, LOADER_NUMPY, AOTI, ORT]


# One case in one fresh process: argv is the case, the number of timed calls and
# the model (JSON). Prints one JSON line: the measurements, or {"skipped": why}.
# "aoti setup" instead exports and packages the model for the AOTInductor case,
# "onnx setup" exports it for ONNX Runtime. With spec["output_file"], the first
# output's first tensor is saved there (torch.save) for the accuracy table.
CHILD = r"""
import json, os, sys, time
start = time.perf_counter()
import importlib
import torch

case, calls, spec = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
torch.set_num_threads(int(os.environ["BENCH_THREADS"]))


def inputs():
    # The same call in every case: token ids, and a fixed padding mask where the
    # model takes one (row i ends in 2*i padding tokens); or one float tensor.
    batch, length = spec["batch"], spec["sequence"]
    if spec["features"]:
        return (torch.randn(batch, spec["features"], generator=torch.Generator().manual_seed(0)),), {}
    ids = torch.randint(0, 1000, (batch, length), generator=torch.Generator().manual_seed(0))
    if not spec["attention_mask"]:
        return (ids,), {}
    mask = (torch.arange(length) < length - 2 * torch.arange(batch)[:, None]).long()
    return (ids,), {"attention_mask": mask}


def eager_module(fast=False):
    module, function = spec["factory"].split(":")
    factory = getattr(importlib.import_module(module), function)
    if fast:  # no initialisation: parameters on the meta device, replaced by the mapped file's tensors
        with torch.device("meta"):
            model = factory()
    else:
        model = factory()
    if spec["dtype"]:
        model = model.to(getattr(torch, spec["dtype"]))
    if spec["eager_loads_weights"]:
        from pathlib import Path
        from safetensors.torch import load_file
        package = Path(importlib.import_module(spec["package"]).__file__).parent
        weights = load_file(package / "_precompiled" / spec["name"] / "weights.safetensors")
        model.load_state_dict(weights, strict=fast, assign=fast)
    return model


def load():
    if case == "eager":
        return eager_module()
    if case == "eager, fast path":
        return eager_module(fast=True)
    if case.startswith("torch.compile cpp_wrapper"):
        return torch.compile(eager_module(), options={"cpp_wrapper": True})
    if case.startswith("torch.compile"):
        return torch.compile(eager_module())
    if case == "AOTInductor":
        if spec["output_module"]:  # as its user must: the package names output classes it cannot import
            importlib.import_module(spec["output_module"])
        return torch._inductor.aoti_load_package(spec["aoti_package"])
    load_compiled = importlib.import_module(spec["package"]).load_compiled
    if case == "load_compiled, plain outputs":
        try:
            return load_compiled(spec["name"], outputs="plain")
        except TypeError as error:  # a loader without the keyword
            print(json.dumps({"skipped": str(error)}))
            sys.exit(0)
    return load_compiled(spec["name"])  # the artifact form: HATCH_PRECOMPILE_FORM is set


def to_export():
    # The eager module, its inputs, and every input's first dim dynamic (batch), the second too where the wheel's is (sequence).
    import inspect
    args, kwargs = inputs()
    model = eager_module()
    dims = {0: torch.export.Dim("batch", min=1, max=spec["max_batch"])}
    if spec["sequence_range"]:  # and the sequence, where the wheel's is dynamic too
        dims[1] = torch.export.Dim("seq", min=spec["sequence_range"][0], max=spec["sequence_range"][1])
    first = next(iter(inspect.signature(model.forward).parameters))
    return model, args, kwargs, {first: dims, **{key: dims for key in kwargs}}


# The inductor options of the wheel's CPU targets (hatch_precompile.engine.targets),
# so that AOTInductor compiles for the target the loader takes here, not the build machine's.
TARGET_CONFIG = {
    "avx2": {"cpp.simdlen": 256, "cpp.march": "x86-64-v3", "cpp.dynamic_threads": True},
    "avx512": {"cpp.simdlen": 512, "cpp.march": "x86-64-v4", "cpp.dynamic_threads": True},
}


def loaded_target():
    explained = importlib.import_module(spec["package"]).load_compiled.explain(spec["name"])
    return explained.rsplit("for CPU target ", 1)[1].split(",")[0].split(";")[0] if "for CPU target " in explained else ""


def aoti_setup():
    model, args, kwargs, shapes = to_export()
    exported = torch.export.export(model, args, kwargs, dynamic_shapes=shapes)
    config = TARGET_CONFIG.get(loaded_target(), {})
    torch._inductor.aoti_compile_and_package(exported, package_path=spec["aoti_package"], inductor_configs=config)


def onnx_setup():
    # The model for ONNX Runtime, and the call's inputs as arrays (in the session's
    # input order), so that its process needs no torch to make them.
    import numpy
    model, args, kwargs, shapes = to_export()
    torch.onnx.export(model, args, spec["onnx_file"], kwargs=kwargs, dynamic_shapes=shapes, dynamo=True)
    numpy.savez(spec["onnx_inputs"], *(t.numpy() for t in (*args, *kwargs.values())))


def first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "__array__") and not isinstance(output, (list, tuple)):
        return torch.from_numpy(output)
    if hasattr(output, "items"):
        return first_tensor(next(iter(output.values())))
    return first_tensor(output[0])


def per_call(function):
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        function()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


if case == "numpy setup":  # the call's inputs as arrays, for the NumPy path's process
    import numpy
    args, kwargs = inputs()
    numpy.savez(spec["numpy_inputs"], **{f"arg{i}": a.numpy() for i, a in enumerate(args)}, **{f"kw_{k}": v.numpy() for k, v in kwargs.items()})
    sys.exit(0)
if case in ("aoti setup", "onnx setup"):
    with torch.no_grad():
        try:
            aoti_setup() if case == "aoti setup" else onnx_setup()
        except Exception as error:  # the case then reports itself skipped
            print(json.dumps({"skipped": f"{type(error).__name__}: {error}"[:300]}))
    sys.exit(0)
if case == "import torch alone (the floor)":  # what every torch case pays before its model: the row to read the others against
    first = time.perf_counter() - start
    import resource
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    imported = {name: name in sys.modules for name in spec["watched"]}
    print(json.dumps({"first": first, "call": None, "check": None, "rss": rss, "imported": imported}))
    sys.exit(0)

args, kwargs = inputs()
with torch.no_grad():
    model = load()
    output = model(*args, **kwargs)
    first = time.perf_counter() - start
    if spec.get("output_file"):
        torch.save(first_tensor(output).float(), spec["output_file"])
    imported = {name: name in sys.modules for name in spec["watched"]}
    for _ in range(10):
        model(*args, **kwargs)
    call = per_call(lambda: model(*args, **kwargs))
    check = per_call(lambda: model.check_inputs(*args, **kwargs)) if case == "load_compiled" else None
    call1 = None
    if case == "load_compiled":  # and at batch 1, beside the NumPy path's; its first output, which that must equal
        import numpy
        numpy.save(spec["loader_output"], first_tensor(output).numpy())
        one, kw_one = [a[:1] for a in args], {k: v[:1] for k, v in kwargs.items()}
        call1 = per_call(lambda: model(*one, **kw_one))
import resource
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"first": first, "call": call, "call1": call1, "check": check, "rss": rss, "imported": imported}))
"""


# The NumPy path as its users run it: numpy and the package, no torch in the
# process (it fails if torch gets imported); the floor loads torch's libraries
# alone, as the path does before its model.
NUMPY_CHILD = r"""
import json, os, sys, time
start = time.perf_counter()
import ctypes, importlib, importlib.util
import numpy

case, calls, spec = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
os.environ.setdefault("OMP_NUM_THREADS", os.environ["BENCH_THREADS"])
if case.startswith("import numpy"):
    lib = os.path.join(importlib.util.find_spec("torch").submodule_search_locations[0], "lib")
    for name in ("libc10.so", "libtorch_cpu.so", "libtorch.so"):  # as runtime/_shim.py loads them
        ctypes.CDLL(os.path.join(lib, name), mode=ctypes.RTLD_GLOBAL)
    first = time.perf_counter() - start
    import resource
    print(json.dumps({"first": first, "call": None, "check": None, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "imported": {n: n in sys.modules for n in spec["watched"]}}))
    sys.exit(0)
stored = numpy.load(spec["numpy_inputs"])
args = [stored[k] for k in sorted(k for k in stored.files if k.startswith("arg"))]
kwargs = {k[3:]: stored[k] for k in stored.files if k.startswith("kw_")}
model = importlib.import_module(spec["package"]).load_compiled(spec["name"], arrays="numpy")
output = model(*args, **kwargs)
first = time.perf_counter() - start
if "torch" in sys.modules:
    raise SystemExit("the NumPy path imported torch")
def first_array(value):
    return value if isinstance(value, numpy.ndarray) else first_array(next(iter(value.values())) if hasattr(value, "values") else value[0])
equal = bool(numpy.array_equal(first_array(output), numpy.load(spec["loader_output"]))) if os.path.exists(spec["loader_output"]) else None
imported = {name: name in sys.modules for name in spec["watched"]}
def per_call(function):
    for _ in range(10):
        function()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        function()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]
call = per_call(lambda: model(*args, **kwargs))
one, kw_one = [a[:1] for a in args], {k: v[:1] for k, v in kwargs.items()}
call1 = per_call(lambda: model(*one, **kw_one))
import resource
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"first": first, "call": call, "call1": call1, "check": None, "rss": rss, "imported": imported, "equal": equal}))
"""


# ONNX Runtime as its users run it: numpy inputs (saved at setup), no torch in the
# process; the same thread count, timings, RSS and first-output file (numpy's format).
ORT_CHILD = r"""
import json, os, sys, time
start = time.perf_counter()
import numpy
import onnxruntime

case, calls, spec = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
if not os.path.exists(spec["onnx_file"]):
    print(json.dumps({"skipped": "the export failed at setup"}))
    sys.exit(0)
stored = numpy.load(spec["onnx_inputs"])
arrays = [stored[f"arr_{i}"] for i in range(len(stored.files))]
options = onnxruntime.SessionOptions()
options.intra_op_num_threads = int(os.environ["BENCH_THREADS"])
try:
    session = onnxruntime.InferenceSession(spec["onnx_file"], options, providers=["CPUExecutionProvider"])
except Exception as error:  # no kernel for a type, say bfloat16 on the CPU provider
    print(json.dumps({"skipped": f"{type(error).__name__}: {error}"[:300]}))
    sys.exit(0)
feed = dict(zip([i.name for i in session.get_inputs()], arrays))
output = session.run(None, feed)
first = time.perf_counter() - start
if "torch" in sys.modules:
    raise SystemExit("onnxruntime imported torch: this case would not be what its users run")
if spec.get("output_file"):
    with open(spec["output_file"], "wb") as file:
        numpy.save(file, output[0].astype("float32"))
imported = {name: name in sys.modules for name in spec["watched"]}
for _ in range(10):
    session.run(None, feed)
times = []
for _ in range(calls):
    t = time.perf_counter()
    session.run(None, feed)
    times.append(time.perf_counter() - t)
call = sorted(times)[len(times) // 2]
import resource
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"first": first, "call": call, "check": None, "rss": rss, "imported": imported}))
"""


def output_file(scratch: Path, model: Model, case: str) -> Path:
    """Where a case saves its first output, for `accuracy_rows` (the minilm models)."""
    return scratch / f"{model.key}-{re.sub(r'[^a-z]+', '-', case.lower())}.pt"


def run_child(case: str, model: Model, env: dict[str, str], calls: int, scratch: Path) -> dict:
    watched = COMPILER + ([model.library] if model.library else [])
    files = {
        "aoti_package": str(scratch / f"{model.key}.pt2"),
        "onnx_file": str(scratch / f"{model.key}.onnx"),
        "onnx_inputs": str(scratch / f"{model.key}.inputs.npz"),
        "numpy_inputs": str(scratch / f"{model.key}.numpy-inputs.npz"),
        "loader_output": str(scratch / f"{model.key}.loader-output.npy"),
    }
    if model.package == "minilm":
        files["output_file"] = str(output_file(scratch, model, case))
    spec = json.dumps({**asdict(model), "batch": BATCH, "watched": watched, **files})
    try:
        child = ORT_CHILD if case == ORT else NUMPY_CHILD if case in NUMPY_CASES else CHILD
        result = run_with_own_tmpdir([sys.executable, "-c", child, case, str(calls), spec], env, scratch, CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{model.key}, {case}: no result after {CHILD_TIMEOUT_S} s") from None
    if result.returncode != 0:
        raise SystemExit(f"{model.key}, {case} failed:\n{result.stderr[-3000:]}")
    reports = [line for line in result.stdout.splitlines() if line.startswith("{")]  # torch.onnx.export prints too
    return json.loads(reports[-1]) if reports else {}


def run_with_own_tmpdir(command: list[str], env: dict[str, str] | None, scratch: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one measured process with a TMPDIR of its own under `scratch`, removed
    after it: `aoti_load_package` unpacks its package, weights included, into a
    temporary folder it never removes (19 GB of them piled up in /tmp after a
    few runs of these benchmarks)."""
    tmpdir = Path(tempfile.mkdtemp(prefix="child-tmp-", dir=scratch))
    try:
        return subprocess.run(command, env={**(env if env is not None else os.environ), "TMPDIR": str(tmpdir)}, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def no_compiler_path(folder: Path) -> str:
    """A PATH on which every C++ compiler name fails: nothing may compile."""
    for name in ("g++", "gcc", "c++", "cc", "clang", "clang++"):
        trap = folder / name
        trap.write_text("#!/bin/sh\necho 'compiler called' >&2\nexit 1\n")
        trap.chmod(0o755)
    return f"{folder}:{os.environ.get('PATH', '')}"


class Environments:
    """The child processes' environments: fresh caches per process unless a case
    needs the warm one, and no C++ compiler for the cases that must not compile."""

    def __init__(self, scratch: Path, threads: int) -> None:
        self.scratch = scratch
        self.base = {**os.environ, "BENCH_THREADS": str(threads)}
        self.base.pop("HATCH_PRECOMPILE_FORM", None)  # the default form unless a case sets it
        traps = scratch / "traps"
        traps.mkdir()
        self.no_compiler = {**self.base, "PATH": no_compiler_path(traps), "CXX": str(traps / "c++"), "CC": str(traps / "cc")}

    def warm_cache(self, model: Model, case: str) -> dict[str, str]:
        folder = f"{model.key}-{'cpp-' if case == COMPILE_CPP else ''}warm-cache"
        return {**self.base, "TORCHINDUCTOR_CACHE_DIR": str(self.scratch / folder)}

    def for_case(self, case: str, model: Model) -> dict[str, str]:
        if case in (COMPILE_WARM, COMPILE_CPP):
            return self.warm_cache(model, case)
        if case == LOADER_NEXT:  # the private cache every run shares, stamped by the setup's run
            folder = self.scratch / f"{model.key}-loader"
            return {**self.no_compiler, "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor", "HATCH_PRECOMPILE_CACHE_DIR": f"{folder}/hp"}
        env = self.no_compiler if case.startswith(LOADER) or case == AOTI else self.base
        if case == LOADER_ARTIFACT:
            env = {**env, "HATCH_PRECOMPILE_FORM": "artifact"}
        if case == LOADER_LEAN:
            env = {**env, "HATCH_PRECOMPILE_FORM": "lean"}
        folder = tempfile.mkdtemp(prefix="case-", dir=self.scratch)
        return {**env, "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor", "HATCH_PRECOMPILE_CACHE_DIR": f"{folder}/hp"}


def accuracy_rows(models: list[Model], scratch: Path) -> list[tuple[str, ...]]:
    """(model, case, relative error, cosine) of every minilm case's saved output
    against float32 eager's (the eager case of the float32 model with the same
    factory), where both were measured."""
    import numpy
    import torch

    rows = []
    for model in models:
        float32 = next(m for m in MODELS.values() if m.factory == model.factory and m.dtype is None and EAGER in cases_for(m))
        reference_file = output_file(scratch, float32, EAGER)
        if model.package != "minilm" or not reference_file.exists():
            continue
        reference = torch.load(reference_file).double().flatten()
        for case in cases_for(model):
            path = output_file(scratch, model, case)
            if not path.exists():
                continue
            output = (torch.from_numpy(numpy.load(path)) if case == ORT else torch.load(path)).double().flatten()
            error = ((output - reference).norm() / reference.norm()).item()
            cosine = torch.nn.functional.cosine_similarity(output, reference, dim=0).item()
            rows.append((model.key, case, f"{error:.2e}", f"{cosine:.6f}"))
    return rows


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def explain(model: Model) -> str:
    """What load_compiled says it would load here (which CPU target): reads the manifest only."""
    code = f"from {model.package} import load_compiled; print(load_compiled.explain({model.name!r}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else f"explain failed: {result.stderr.strip()[-300:]}"


def print_header(args: argparse.Namespace, models: list[Model]) -> None:
    libraries = "".join(f", {m.library} {version(m.library)}" for m in models if m.library)
    print(
        f"torch {version('torch')}, Python {platform.python_version()}{libraries}\n"
        f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs visible), {args.threads} thread(s)\n"
        f"batch {BATCH}, {args.runs} fresh processes per case, steady state over {args.calls} calls\n",
        flush=True,
    )


def interleaved_runs(models: list[Model], envs: Environments, args: argparse.Namespace) -> dict[str, dict[str, list]]:
    """Every case of every model once per run, run after run, so that drifting load
    hits every case alike. A case that reports itself skipped is not run again."""
    results: dict[str, dict[str, list]] = {m.key: {case: [] for case in cases_for(m)} for m in models}
    for run in range(args.runs):
        print(f"run {run + 1}/{args.runs}", file=sys.stderr, flush=True)
        for model in models:
            for case, runs in results[model.key].items():
                if runs and "skipped" in runs[0]:
                    continue
                runs.append(run_child(case, model, envs.for_case(case, model), calls_for(model, args), envs.scratch))
    return results


def calls_for(model: Model, args: argparse.Namespace) -> int:
    return min(args.calls, BIG_CALLS) if model.features else args.calls


def spread(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def imported(runs: list[dict], modules: list[str]) -> str:
    """Which of `modules` were in sys.modules after the first output: "yes" (all),
    "no" (none), else the ones that were; "mixed" if the runs disagree."""
    answers = set()
    for run in runs:
        present = [m for m in modules if run["imported"][m]]
        answers.add("yes" if len(present) == len(modules) else "no" if not present else ", ".join(present) + " only")
    return answers.pop() if len(answers) == 1 else "mixed"


def print_table(model: Model, results: dict[str, list[dict]], threads: int) -> None:
    batch_shape = f"{BATCH}x{model.sequence}" + (" (+ attention_mask)" if model.attention_mask else "")
    if model.features:
        batch_shape = f"{BATCH}x{model.features}"
    print(f"### {model.title}, batch {batch_shape}, {threads} thread(s)\n")
    print(f"load_compiled.explain(): {explain(model)}\n")
    columns = ["case", "first output, s (min-max)", "vs eager", "steady state, ms/call (min-max)", "vs torch.compile", "peak RSS, MB", "compiler imported"]
    columns += [f"{model.library} imported"] if model.library else []
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    eager_first = statistics.median(r["first"] for r in results[cases_for(model)[0]])
    compile_runs = results.get(COMPILE_EMPTY)
    compile_call = statistics.median(r["call"] for r in compile_runs) if compile_runs else None
    skipped = {}
    for case, runs in results.items():
        if "skipped" in runs[0]:
            skipped[case] = runs[0]["skipped"]
            print(f"| {case} |" + " n/a |" * (len(columns) - 1))
            continue
        first = [r["first"] for r in runs]
        call = [r["call"] * 1000 for r in runs if r["call"] is not None]  # none for the floor, which calls nothing
        steady = f"{spread(call, 3)} | {f'{statistics.median(call) / (compile_call * 1000):.2f}x' if compile_call else 'n/a'}" if call else "n/a | n/a"
        print(
            f"| {case} | {spread(first, 2)} | {statistics.median(first) / eager_first:.2f}x "
            f"| {steady} "
            f"| {statistics.median(r['rss'] for r in runs):.0f} "
            f"| {imported(runs, COMPILER)} |" + (f" {imported(runs, [model.library])} |" if model.library else "")
        )
    checks = [r["check"] * 1e6 for r in results[LOADER]]
    print(f"\nload_compiled input checks: {spread(checks, 1)} us per call, included in its steady-state time above")
    numpy_runs = results.get(LOADER_NUMPY)
    if numpy_runs and "skipped" not in numpy_runs[0]:
        torch_floor = statistics.median(r["first"] for r in results[TORCH_FLOOR])
        floor = statistics.median(r["first"] for r in results[NUMPY_FLOOR])
        first = statistics.median(r["first"] for r in numpy_runs)
        rss = statistics.median(r["rss"] for r in numpy_runs) / statistics.median(r["rss"] for r in results[LOADER])
        print(
            f"NumPy path: first output {first / torch_floor:.2f}x `import torch` alone, {first - floor:+.2f} s over its floor; "
            f"peak RSS {rss:.2f}x load_compiled's; first output equal to load_compiled's bit for bit: {sorted({r['equal'] for r in numpy_runs}, key=str)}"
        )
        for key, batch in (("call", BATCH), ("call1", 1)):
            ours, theirs = [r[key] * 1000 for r in numpy_runs], [r[key] * 1000 for r in results[LOADER]]
            print(f"  per call at batch {batch}: {spread(ours, 3)} ms against load_compiled's {spread(theirs, 3)} ms: {statistics.median(ours) / statistics.median(theirs):.3f}x")
    for case, reason in skipped.items():
        print(f"{case}: n/a ({reason})")
    print()


def positive(text: str) -> int:
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text}")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=DEFAULT_MODELS, help=f"models to measure (default: {' '.join(DEFAULT_MODELS)})")
    parser.add_argument("--runs", type=positive, default=5, help="fresh processes per case (default 5)")
    parser.add_argument("--calls", type=positive, default=200, help="calls for the steady-state median (default 200)")
    parser.add_argument("--threads", type=positive, default=os.cpu_count() or 1, help="torch threads in every case (default: the CPUs visible)")
    parser.add_argument("--figure", type=Path, help="also draw the results as one PNG here (benchmarks/figure.py; needs matplotlib)")
    args = parser.parse_args()
    models = [MODELS[key] for key in dict.fromkeys(args.models)]

    print_header(args, models)
    scratch = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        envs = Environments(scratch, args.threads)
        for model in models:  # setup: the AOTInductor package, the warm caches, the loader's stamp
            print(f"setup: {model.key}", file=sys.stderr, flush=True)
            for case, setup in ((AOTI, "aoti setup"), (ORT, "onnx setup"), (LOADER_NUMPY, "numpy setup")):
                if case in cases_for(model):
                    run_child(setup, model, envs.for_case(EAGER, model), 0, scratch)
            for warm in (COMPILE_WARM, COMPILE_CPP, LOADER_NEXT):
                if warm in cases_for(model):
                    run_child(warm, model, envs.for_case(warm, model), 1, scratch)
        results = interleaved_runs(models, envs, args)
        accuracy = accuracy_rows(models, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for model in models:
        print_table(model, results[model.key], args.threads)
    if args.figure:
        import figure

        subtitle = f"torch {version('torch')}, {cpu_model()}, {args.threads} thread(s), batch {BATCH}; medians of {args.runs} fresh processes, min-max whiskers"
        figure.draw([(model.key, results[model.key]) for model in models], TORCH_FLOOR, args.figure, subtitle)
        print(f"figure: {args.figure}\n")
    if accuracy:
        print("### Accuracy: each case's first output (last_hidden_state; the embedder's embeddings) against float32 eager's, same input\n")
        print("| model | case | relative error | cosine similarity |\n|---|---|---|---|")
        for row in accuracy:
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
