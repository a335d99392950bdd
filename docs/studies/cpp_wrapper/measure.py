"""Issue 47's route, measured: inductor's C++ wrapper (`cpp_wrapper=True`) for the
graph that `standalone_compile` compiles, built into a plain shared library with
entry.cpp's entry point and called through ctypes, against the lean form's graph
code (inductor's Python wrapper) and AOTInductor's C++ runner called directly.

    python docs/studies/cpp_wrapper/measure.py build MODEL   # encoder | bert | decoder | decoder_bf16
    python docs/studies/cpp_wrapper/measure.py time MODEL [--rounds N]
    python docs/studies/cpp_wrapper/measure.py placement decoder   # where the weights lie, per decode step
    python docs/studies/cpp_wrapper/measure.py direct bert         # AOTInductor's .so loaded as a loader would

Run from the repository root in `.venv` (torch 2.13.0+cpu, transformers). `build`
exports the model once (the example encoder, the example BERT: a dynamic batch;
the 92 M benchmark decoder: a dynamic sequence, its KV cache in buffers), runs
torch's decompositions as the build does, compiles it twice with the project's
own `compile_exported` (the Python wrapper, then `cpp_wrapper=True`) and once
with AOTInductor (`aoti_compile_and_package` of the same export), and keeps the
output modules, the lifted weights and the package in SCRATCH. `time` builds the
C++ wrapper's source with entry.cpp into a library (inductor's C++ compile
command, `include_pytorch`), loads it with `ctypes.PyDLL`, and in one process,
interleaved, times the three sides' graph code only (no loader checks, no
pytree): per call at batch 8 and 1 (encoder, BERT), per decode step over 64 new
tokens after a 128-token prompt (decoders); it checks that the C++ wrapper's
outputs, and for decoders the state, equal the Python wrapper's bit for bit.

Not project code: what it relies on (the `cpp_wrapper_src` string and the
`num_outputs=` argument in the module, `inductor_entry_impl`'s signature, the
GIL it releases) is the study's finding, see README.md.
"""

# ruff: noqa: E402  (the clock starts before the imports: `direct` reports the time from start to first output)
from __future__ import annotations

import time

START = time.perf_counter()

import argparse
import ctypes
import importlib.util
import inspect
import mmap
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import torch

REPO = Path(__file__).resolve().parents[3]
SCRATCH = Path("/tmp/cpp-wrapper-study")
sys.path.insert(0, str(REPO))


def _module_from(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_and_inputs(name: str, batch: int = 2) -> tuple[torch.nn.Module, tuple, dict, dict]:
    """The module, example inputs and dynamic shapes, as the benchmarks export them."""
    if name == "encoder":
        model = _module_from(REPO / "example_project/src/example_pkg/model.py", "encoder_model").build_encoder()
        ids = torch.randint(0, 1000, (batch, 64))
        first = next(iter(inspect.signature(model.forward).parameters))
        return model.eval(), (ids,), {}, {first: {0: torch.export.Dim("batch", min=1, max=64)}}
    if name == "bert":
        model = _module_from(REPO / "example_transformers/src/example_bert/model.py", "bert_model").build_bert()
        ids = torch.randint(0, 1000, (batch, 32))
        mask = torch.ones(batch, 32, dtype=torch.long)
        dim = torch.export.Dim("batch", min=1, max=16)
        first = next(iter(inspect.signature(model.forward).parameters))
        return model.eval(), (ids,), {"attention_mask": mask}, {first: {0: dim}, "attention_mask": {0: dim}}
    decoder = _module_from(REPO / "benchmarks/decoder/src/decoder_bench/model.py", "decoder_model").decoder()
    if name == "decoder_bf16":
        decoder = decoder.to(torch.bfloat16)
    seq = torch.export.Dim("seq", min=1, max=1024)
    prompt = torch.randint(0, 32000, (1, 128), generator=torch.Generator().manual_seed(0))
    return decoder.eval(), (prompt, torch.arange(128)), {}, {"input_ids": {1: seq}, "cache_position": {0: seq}}


def build(name: str) -> None:
    from torch._inductor.decomposition import select_decomp_table

    from hatch_precompile.worker.torch_internals.inductor import compile_exported, start_model
    from hatch_precompile.worker.weights import write_aligned

    SCRATCH.mkdir(exist_ok=True)
    model, args, kwargs, shapes = model_and_inputs(name)
    exported = torch.export.export(model, args, kwargs, dynamic_shapes=shapes)
    decomposed = exported.run_decompositions(select_decomp_table())
    lifted = [s.target for s in decomposed.graph_signature.input_specs if s.kind.name in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")]
    write_aligned({n: decomposed.state_dict[n] if n in decomposed.state_dict else decomposed.constants[n] for n in lifted}, SCRATCH / f"{name}.safetensors")
    for wrapper, config in (("python", {}), ("cpp", {"cpp_wrapper": True})):
        start_model()
        began = time.perf_counter()
        artifact = compile_exported(decomposed, config)
        (SCRATCH / f"{name}_{wrapper}.py").write_text(artifact.inner_fn.compiled_fn.source_code)
        print(f"{name}: {wrapper} wrapper compiled in {time.perf_counter() - began:.1f} s")
    for package, config in ((f"{name}.pt2", {}), (f"{name}_external.pt2", {"aot_inductor.package_constants_in_so": False})):
        began = time.perf_counter()
        torch._inductor.aoti_compile_and_package(exported, package_path=str(SCRATCH / package), inductor_configs=config)
        print(f"{name}: AOTInductor package {package} compiled in {time.perf_counter() - began:.1f} s")


def cpp_library(name: str) -> Callable[[list[Any], list[Any]], list[Any]]:
    """The C++ wrapper as a library: its source, entry.cpp, inductor's compile."""
    from torch._C import _aoti
    from torch._inductor.codecache import CppCodeCache

    class WrapperLibrary(CppCodeCache):
        cache: ClassVar[dict[str, Any]] = {}
        cpp_compile_command_flags: ClassVar[dict[str, Any]] = {"include_pytorch": True, "shared": True}

    module = (SCRATCH / f"{name}_cpp.py").read_text()
    match = re.search(r'cpp_wrapper_src = \(\nr"""(.*?)"""\n\)', module, re.S)
    outputs = re.search(r"num_outputs=(\d+)", module)
    assert match and outputs, "the C++ wrapper's module changed shape"
    entry = (Path(__file__).parent / "entry.cpp").read_text()
    began = time.perf_counter()
    library = WrapperLibrary.load(f"{match.group(1)}\n#define HATCH_PRECOMPILE_OUTPUTS {outputs.group(1)}\n{entry}", device_type="cpu")
    print(f"{name}: C++ wrapper library built in {time.perf_counter() - began:.1f} s ({Path(library._name).stat().st_size / 1e3:.0f} kB)")
    call = ctypes.PyDLL(library._name).hatch_precompile_call  # the GIL held: the wrapper releases it itself
    call.restype, call.argtypes = ctypes.py_object, [ctypes.py_object, ctypes.py_object]

    def run(kept: list[Any], inputs: list[Any]) -> list[Any]:
        return _aoti.alloc_tensors_by_stealing_from_void_ptrs(call(kept, _aoti.unsafe_alloc_void_ptrs_from_tensors(inputs)))

    return run


def per_call_us(run: Callable[[list[Any]], Any], user: list[Any], calls: int) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        run(user)
    return (time.perf_counter() - began) / calls * 1e6


def mapped_weights(name: str) -> dict[str, torch.Tensor]:
    """The lifted tensors as the loader binds them: views of the memory-mapped,
    64-byte-aligned safetensors file in the graph's order (their placement moves
    a decode step by 5%: scattered allocations were 12.43 ms, this file 11.72)."""
    from hatch_precompile.runtime._weights import safetensors_views

    path = SCRATCH / f"{name}.safetensors"
    with open(path, "rb") as file:
        mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    return safetensors_views(mapping, path)


def time_model(name: str, rounds: int) -> None:
    from torch._C import _aoti

    torch.set_num_threads(2)
    torch.set_grad_enabled(False)
    mapped = mapped_weights(name)
    is_state = [n for n in mapped if "cache" in n]  # the decoders' KV cache, which each side updates in its own copy

    def own_copy() -> dict[str, torch.Tensor]:
        return {n: t.clone() if n in is_state else t for n, t in mapped.items()}

    python_weights, cpp_weights, container_weights = own_copy(), own_copy(), own_copy()
    kept = _aoti.unsafe_alloc_void_ptrs_from_tensors(list(cpp_weights.values()))  # handles made once: the entry gives the graph its own
    cpp = cpp_library(name)
    python = _module_from(SCRATCH / f"{name}_python.py", f"{name}_python").call
    aoti = torch._C._aoti.AOTIModelPackageLoader(str(SCRATCH / f"{name}.pt2"), "model", False, 1, -1)
    container = torch._C._aoti.AOTIModelPackageLoader(str(SCRATCH / f"{name}_external.pt2"), "model", False, 1, -1)
    container.load_constants({n: container_weights[n] for n in container.get_constant_fqns()}, False, True, True)  # user_managed: no copy
    python_list = list(python_weights.values())
    sides: dict[str, Callable[[list[Any]], Any]] = {
        "Python wrapper (the lean form's graph code)": lambda user: python([*python_list, *user]),
        "C++ wrapper through ctypes": lambda user: cpp(kept, list(user)),
        "AOTInductor's container, weights bound from the file": lambda user: container.boxed_run(list(user)),
        "AOTInductor's C++ runner (boxed_run)": lambda user: aoti.boxed_run(list(user)),
    }
    if name.startswith("decoder"):
        _time_decode(name, sides, [python_weights[n] for n in is_state], [cpp_weights[n] for n in is_state], rounds)
        return
    for batch in (8, 1):
        _, args, kwargs, _ = model_and_inputs(name, batch)
        user = [*args, *kwargs.values()]
        outputs = {side: run(user) for side, run in sides.items()}
        same = [torch.equal(a, b) for a, b in zip(*list(outputs.values())[:2])]
        times: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(rounds):
            for side, run in sides.items():
                times[side].append(per_call_us(run, user, 200))  # the mean of 200 calls; the median over rounds
        base = statistics.median(times["AOTInductor's C++ runner (boxed_run)"])
        print(f"\n{name}, batch {batch}: C++ wrapper outputs = Python wrapper's: {all(same)}")
        for side, values in times.items():
            print(f"| {name} | {batch} | {side} | {statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f}) | {statistics.median(values) / base:.2f}x |")


def _time_decode(name: str, sides: dict[str, Callable[[list[Any]], Any]], python_state: list[Any], cpp_state: list[Any], rounds: int) -> None:
    _, (prompt, _), _, _ = model_and_inputs(name)
    per_token: dict[str, list[float]] = {side: [] for side in sides}
    tokens: dict[str, list[int]] = {}
    for _ in range(rounds):
        for side, run in sides.items():
            token = run([prompt, torch.arange(128)])[0][:, -1].argmax(-1)
            steps, generated = [], []
            for position in range(128, 192):
                generated.append(int(token))
                began = time.perf_counter()
                token = run([token[:, None], torch.tensor([position])])[0][:, -1].argmax(-1)
                steps.append(time.perf_counter() - began)
            per_token[side].append(statistics.median(steps) * 1000)
            tokens[side] = generated
    state_same = all(torch.equal(a, b) for a, b in zip(python_state, cpp_state))
    python_side, _, _, aoti_side = sides
    same = {side: tokens[side] == tokens[python_side] for side in sides}
    print(f"\n{name}: tokens = the first side's: {same}" + (f"; C++ wrapper's state = Python wrapper's: {state_same}" if python_state else ""))
    base = statistics.median(per_token[aoti_side])
    for side, values in per_token.items():
        print(f"| {name} | {side} | {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}) | {statistics.median(values) / base:.2f}x |")


def placement(name: str, rounds: int) -> None:
    """A decode step of AOTInductor's container with its weights in three places,
    beside the library that holds them itself."""
    torch.set_num_threads(2)
    torch.set_grad_enabled(False)
    mapped = mapped_weights(name)
    loaded = {n: t.clone() for n, t in mapped.items()}  # one allocation each, as torch.load gives them
    blob = torch.empty(sum(-(-t.nbytes // 64) * 64 for t in mapped.values()), dtype=torch.uint8)
    in_blob, offset = {}, 0
    for n, t in mapped.items():
        in_blob[n] = blob[offset : offset + t.nbytes].view(t.dtype).view(t.shape).copy_(t)
        offset += -(-t.nbytes // 64) * 64
    sides = {}
    for label, weights in (("weights from torch.load", loaded), ("one anonymous buffer, graph order", in_blob), ("the mapped file, as the wheel", mapped)):
        container = torch._C._aoti.AOTIModelPackageLoader(str(SCRATCH / f"{name}_external.pt2"), "model", False, 1, -1)
        before = _rss_mb()
        container.load_constants({n: weights[n].clone() if "cache" in n else weights[n] for n in container.get_constant_fqns()}, False, True, True)
        print(f"{label}: binding grew RSS by {_rss_mb() - before:.1f} MB (the cache's own copy included)")
        sides[label] = lambda user, c=container: c.boxed_run(list(user))
    inside = torch._C._aoti.AOTIModelPackageLoader(str(SCRATCH / f"{name}.pt2"), "model", False, 1, -1)
    sides["inside the library"] = lambda user: inside.boxed_run(list(user))
    _time_decode(name, sides, [], [], rounds)


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def direct(name: str) -> None:
    """First output of AOTInductor's library loaded as the loader would: its
    runner straight from the `.so`, the weights bound from the mapped file."""
    import zipfile

    began = time.perf_counter()
    library = SCRATCH / f"{name}_external.so"
    if not library.exists():
        with zipfile.ZipFile(SCRATCH / f"{name}_external.pt2") as package:
            member = next(m for m in package.namelist() if m.endswith(".so"))
            library.write_bytes(package.read(member))
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), 1)
    mapped = mapped_weights(name)
    runner.update_constant_buffer({constant: mapped[fqn] for constant, fqn in runner.get_constant_names_to_original_fqns().items()}, False, True, True)
    length = {"encoder": 64, "bert": 32}[name]  # the inputs alone: building the module would import transformers
    inputs = [torch.randint(0, 1000, (1, length)), *([torch.ones(1, length, dtype=torch.long)] if name == "bert" else [])]
    outputs = runner.run(inputs)
    print(f"{name}: first output {time.perf_counter() - START:.2f} s after start ({began - START:.2f} s to import torch and this script)")
    print(f"outputs {[tuple(o.shape) for o in outputs]}; compiler imported: {[m for m in ('torch._inductor', 'torch._dynamo') if m in sys.modules] or 'no'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["build", "time", "placement", "direct"])
    parser.add_argument("model", choices=["encoder", "bert", "decoder", "decoder_bf16"], help="direct: encoder or bert")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (time)")
    args = parser.parse_args()
    if args.step == "build":
        build(args.model)
    elif args.step == "time":
        time_model(args.model, args.rounds)
    elif args.step == "placement":
        placement(args.model, args.rounds)
    else:
        direct(args.model)


if __name__ == "__main__":
    main()
