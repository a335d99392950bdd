"""Produce each artifact of a captured model, check it against eager, describe it.

Runs in the compile worker. For each shape variant and CPU target, takes the
artifact from a part or the build cache when one holds it under its key
(`key.py`), else compiles it; writes into `out_dir` the artifact and the
compiled kernels it loads (`kernels/k_<key>.so`, shared between artifacts when
identical), then each of its other forms the model wants (`FORMS`: the C++ form,
`cpp_form.py`, and the lean form, `lean.py`, each produced through `form.py`'s
interface); runs it on the example inputs against eager, and describes it for
the manifest. The forms are checked later, in fresh processes (`main.py`), on
the calls this saved of each variant (`CheckedSequence`). The weights are
`weights.py`'s. An int8 model's variants (`quantize.py`) are compiled frozen and
have no artifact: each ships its lean module, and its constants in place of the
artifact.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch

from ..engine.errors import ModelBuildError
from ..engine.model_config import ModelConfig
from ..engine.native import UnprovidedLibraryError, read_needs, system_needs, torch_libraries
from ..engine.sources import ArtifactSources, PartMismatch
from ..engine.targets import CPU_TARGETS, CpuTarget, features_from_flags, host_target, is_x86_64
from ..runtime import _torch_private
from ..runtime._choice import FORMS as LOADED_FORMS  # what a variant ships, read as the loader reads it
from ..runtime._frozen_tensors import rebuild_constants
from ..runtime._layout import KERNELS_DIR, artifact_file, constants_file, kernel_file
from ..runtime._lean import make_runner
from ..runtime._manifest import VNNI, cpu_features
from ..runtime._schema import ArtifactEntry, BatchAccuracy, ModelEntry, OutputLeaf, QuantizationRecord, WeightsEntry, is_lean_only
from . import cpp_form, lean, torch_internals
from .accuracy import SANITY_BOUNDS, check_accuracy, check_calls, yardstick
from .capture import Captured, _torch_error
from .form import BuildForm, Pending, Variant
from .key import artifact_key, build_environment
from .quantize import Quantized, check_int8_kernels, failing_layer, int8_inductor_config
from .weights import lifted_weights

# The forms the build makes of each compiled variant besides its artifact, each
# produced and then checked through `form.BuildForm`; a new form is one line here.
FORMS: tuple[BuildForm, ...] = (cpp_form, lean)
CHECK_DIR = "form-checks"  # scratch: the calls each variant's forms are checked on
Runner = Callable[[list[Any]], Any]  # a compiled graph: its flat inputs -> its flat outputs


def model_entry(model: ModelConfig, captured: Captured, weights: WeightsEntry, op_libraries: dict[str, str], artifacts: list[ArtifactEntry], quantization: QuantizationRecord | None) -> ModelEntry:
    """The model's manifest entry (less file sizes and hashes, added at assembly)."""
    exported = captured.exported
    entry: ModelEntry = {
        "factory": model.factory,
        "dtype": model.dtype,
        "fallback": model.fallback,
        "outputs_form": model.outputs,
        "quantize": model.quantize,
        "state": captured.state,
        "inputs": {"tree": captured.input_tree, "leaves": captured.input_leaves},
        "outputs": {
            "tree": torch_internals.treespec_to_json(exported.call_spec.out_spec),
            "leaves": _output_leaves(exported, captured),
        },
        "dims": {d: {"min": spec.min, "max": spec.max, "buckets": list(spec.buckets), "dynamic": spec.dynamic} for d, spec in model.dims.items()},
        "weights": weights,
        "op_libraries": op_libraries,
        "artifacts": artifacts,
    }
    if quantization is not None:
        entry["quantization"] = quantization
    return entry


def cpu_targets(model: ModelConfig) -> list[CpuTarget]:
    """The configured x86-64 targets; elsewhere one target for the build machine's CPU."""
    if is_x86_64():
        return [CPU_TARGETS[name] for name in model.cpu_targets]
    return [host_target(tuple(sorted(cpu_features())))]


@dataclass
class ProducedArtifact:
    """An artifact in its model's folder, where it came from, and its forms
    waiting for their checks."""

    entry: ArtifactEntry
    key: str
    origin: str  # "compiled", "cached", or "part <folder>"
    checked_here: bool  # False: from a part for a CPU this machine lacks
    pending: Pending | None  # None: not run here, or no form to check
    form_times: list[str]  # what producing each timed form took, for the build log, where compiled here


def produce_artifact(
    model: ModelConfig,
    captured: Captured,
    fixed: dict[str, int],
    target: CpuTarget,
    out_dir: Path,
    sources: ArtifactSources,
    op_libraries: dict[str, str],
    quantized: Quantized | None = None,
) -> ProducedArtifact:
    """One shape variant for one CPU target, from a part or the build cache when
    one holds it under its key, else compiled with its forms; either way run on
    the example inputs and checked against eager (where this machine's CPU can
    run it). `quantized` is an int8 model's converted module
    (`quantize.quantize`), which is compiled instead of the export, frozen, into
    a variant with no artifact, and checked on the calibration batches it holds
    for that too."""
    name = model.name
    int8 = quantized.module if quantized is not None else None
    key = artifact_key(model, captured, fixed, target, int8)
    file = artifact_file(target.name, fixed)
    if quantized is not None:
        file = constants_file(file)
    try:
        entry, origin = sources.fetch(key, file, out_dir, build_environment())
    except PartMismatch as mismatch:
        raise ModelBuildError(name, f"taking {file} from a part", str(mismatch)) from None
    initial = _initial_weights(captured, int8)
    state_inputs = _state_inputs(captured)
    form_times: list[str] = []
    weights = [w.clone() if index in state_inputs else w for index, w in enumerate(initial)]  # each call updates the state
    calls = [torch_internals.tree_leaves(call) for call in captured.calls]
    flat = [*weights, *calls[0]]
    if entry is None:
        config = _target_config(model, target)
        if int8 is not None:
            entry, outputs, run, frozen = _compile_frozen(model, config, fixed, target, out_dir, file, flat, copy.deepcopy(int8))
            variant = Variant(model, captured, config.options, entry, out_dir, None, frozen, op_libraries)
        else:
            entry, outputs, run, output_module = _compile_artifact(model, captured, fixed, target, config, out_dir, file, flat)
            variant = Variant(model, captured, config.options, entry, out_dir, output_module, None, op_libraries)
        origin = "compiled"
        form_times = _produce_forms(variant)
    elif not set(entry["cpu_features"]) <= cpu_features():
        return ProducedArtifact(entry, key, origin, False, None, [])
    else:
        run = _saved_runner(out_dir, entry)
        with torch.no_grad():
            outputs = list(run(flat))
    steps = []
    for call in calls[1:]:
        with torch.no_grad():
            steps.append(list(run([*weights, *call])))
    state = [weights[index] for index in sorted(state_inputs)]
    batches = _check_calibration_batches(model, captured, quantized, run) if quantized is not None else []
    ruler = yardstick(model, captured)
    # An int8 model's calibration batches held its bounds; its example inputs need only be sane.
    entry["accuracy"] = check_calls(model, ruler, [outputs, *steps], state, first=SANITY_BOUNDS if batches else None)
    if batches:
        entry["accuracy"]["batches"] = batches
    if model.quantize in ("int8", "int8-dynamic"):  # explain() says so where it runs without VNNI and this check had it
        entry["accuracy"]["vnni"] = bool(VNNI & cpu_features())
    if not any(LOADED_FORMS[form.NAME].shipped(entry) for form in FORMS):
        return ProducedArtifact(entry, key, origin, True, None, form_times)  # the artifact form alone: nothing more to check
    data_path = _save_sequence(entry, CheckedSequence(initial, calls, [outputs, *steps], sorted(state_inputs), state), out_dir)
    order = list(lifted_weights(captured))
    pending = Pending(model, op_libraries, entry, out_dir, origin == "compiled", data_path, order, captured.input_leaves, ruler)
    return ProducedArtifact(entry, key, origin, True, pending, form_times)


def _produce_forms(variant: Variant) -> list[str]:
    """Each form the model wants, produced from the just compiled variant into its
    entry; returns what the timed ones took, for the build log."""
    said = []
    for form in FORMS:
        if form.wanted(variant.model):
            started = time.perf_counter()
            record = form.produce(variant)
            cast(dict[str, Any], variant.entry)[form.NAME] = record  # the entry's key for the form
            if form.TIMED:
                outcome = "refused after" if "refused" in record else "in"  # the reason is said once per model
                said.append(f"its {form.TITLE} {outcome} {time.perf_counter() - started:.1f} s")
    return said


@dataclass
class CheckedSequence:
    """What a variant's forms are checked with, in a fresh process: the calls, the
    artifact's outputs for each from the initial weights and state, and the
    state after."""

    initial: list[torch.Tensor]  # the graph's weights, the state as it is before any call
    calls: list[list[Any]]  # each call's flat user inputs
    outputs: list[list[Any]]  # the artifact's flat outputs for each
    state_inputs: list[int]  # where the state is among the weights
    state: list[torch.Tensor]  # the state after the last call


def _state_inputs(captured: Captured) -> set[int]:
    """The positions of the model's state among the graph's inputs (weights first)."""
    names = list(lifted_weights(captured)) if captured.state else []
    return {names.index(name) for name in captured.state}


def _check_calibration_batches(model: ModelConfig, captured: Captured, quantized: Quantized, run: Runner) -> list[BatchAccuracy]:
    """An int8 graph against the float32 module on the calibration batches kept for
    the check (none where the model has no `calibration`). Its one graph is
    dynamic in every dim (int8 refuses buckets), so every batch fits it."""
    assert captured.reference is not None  # an int8 model keeps its float32 module
    records: list[BatchAccuracy] = []
    for which, (args, kwargs) in quantized.checks:
        flat = torch_internals.tree_leaves((args, kwargs))
        with torch.no_grad():
            compiled = list(run(flat))
            reference = torch_internals.tree_leaves(captured.reference(*args, **kwargs))
        record = check_accuracy(model, compiled, reference, reference, f"on {which}")
        records.append({"batch": which, "outputs": record["outputs"]})
    return records


def _initial_weights(captured: Captured, quantized: torch.fx.GraphModule | None) -> list[torch.Tensor]:
    """The tensors the graph takes before the user inputs, with the state as it
    was before any call; an int8 graph has its weights frozen in and takes none."""
    if quantized is not None:
        return []
    return [captured.initial_state.get(name, tensor) for name, tensor in lifted_weights(captured).items()]


def _compile_artifact(
    model: ModelConfig, captured: Captured, fixed: dict[str, int], target: CpuTarget, config: _TargetConfig, out_dir: Path, file: str, flat: list[Any]
) -> tuple[ArtifactEntry, list[Any], Runner, tuple[str, list[int], str]]:
    """Compile, write the artifact and its kernels into `out_dir`; returns its
    manifest entry (less the lean record), its outputs on `flat`, a function
    that runs it on other flat inputs, and its output module
    (`torch_internals.output_module`)."""
    with torch_internals.captured_kernels() as built:
        try:
            artifact = torch_internals.compile_exported(captured.exported, config.options)
        except Exception as error:
            raise ModelBuildError(model.name, _compiling(target), _torch_error(error)) from None
        with torch.no_grad():
            outputs = artifact(*flat)
        kernel_files = {key: path() for key, path in built.items()}
    entry = _variant_entry(model, file, fixed, target, config, kernel_files, out_dir)
    torch_internals.save_artifact(artifact, str(out_dir / file))
    return entry, outputs, lambda inputs: artifact(*inputs), torch_internals.output_module(artifact, _state_inputs(captured))


def _compile_frozen(
    model: ModelConfig,
    config: _TargetConfig,
    fixed: dict[str, int],
    target: CpuTarget,
    out_dir: Path,
    file: str,
    flat: list[Any],
    quantized: torch.fx.GraphModule,
) -> tuple[ArtifactEntry, list[Any], Runner, torch_internals.FrozenGraph]:
    """Compile an int8 model's converted module with its weights frozen in, and
    write its kernels into `out_dir`. It has no artifact: its lean form (which
    writes its constants as `file`) is its only form."""
    with torch_internals.captured_kernels() as built:
        try:
            frozen = torch_internals.compile_frozen(quantized, {**config.options, **int8_inductor_config()})
        except Exception as error:
            layer = failing_layer(error)
            raise ModelBuildError(model.name, _compiling(target), _torch_error(error) + (f"\n(at layer {layer})" if layer else "")) from None
        with torch.no_grad():
            outputs = frozen.run(*flat)
        kernel_files = {key: path() for key, path in built.items()}
    check_int8_kernels(model, frozen.source)
    entry = _variant_entry(model, file, fixed, target, config, kernel_files, out_dir)
    return entry, list(outputs), lambda inputs: frozen.run(*inputs), frozen


def _compiling(target: CpuTarget) -> str:
    return f"compiling for CPU target {target.name!r}"


class _TargetConfig(NamedTuple):
    """How one CPU target of a model is compiled, for every form of its variants."""

    options: dict[str, Any]  # the model's inductor options with the target's
    isa: str  # the vector ISA's name, "" for a target that sets none
    isa_flags: str  # its compiler flags


def _target_config(model: ModelConfig, target: CpuTarget) -> _TargetConfig:
    """Probes the build machine's vector ISA for the target (a compile and run)."""
    config = {**model.options}
    isa, isa_flags = "", ""
    if target.simdlen:
        try:
            isa, isa_flags = torch_internals.vector_isa(target.simdlen)
        except Exception as error:  # the probe compiles and runs a program with the C++ compiler
            raise ModelBuildError(model.name, _compiling(target), f"probing the CPU's vector instructions failed: {_torch_error(error)}") from None
        if not isa:
            raise ModelBuildError(
                model.name,
                _compiling(target),
                f"this build machine's CPU has no {target.aten_capability} ({target.simdlen}-bit vectors), and inductor "
                f"only generates vector code the build machine can run; build on a machine with {target.aten_capability} "
                f"(or compile this target there as a part: `hatch-precompile compile-part`, see the README) "
                f"or remove {target.name!r} from cpu-targets",
            )
        config.update(target.inductor_config())
    return _TargetConfig(config, isa, isa_flags)


def _variant_entry(
    model: ModelConfig,
    file: str,
    fixed: dict[str, int],
    target: CpuTarget,
    config: _TargetConfig,
    kernel_files: dict[str, str],
    out_dir: Path,
) -> ArtifactEntry:
    """Copy the compiled kernels into `out_dir`, read what they need of the
    system, and describe the variant (less its lean record)."""
    kernels_dir = out_dir / KERNELS_DIR
    kernels_dir.mkdir(exist_ok=True)
    for key, path in kernel_files.items():
        shutil.copyfile(path, kernels_dir / kernel_file(key))
    try:
        needs = system_needs([read_needs(kernels_dir / kernel_file(key)) for key in kernel_files], torch_libraries())
    except UnprovidedLibraryError as error:
        raise ModelBuildError(model.name, "checking the compiled kernels' native dependencies", str(error)) from None
    return {
        "file": file,
        "specialized": fixed,
        "device": "cpu",
        "cpu_target": target.name,
        "cpu_features": sorted({*target.features, *features_from_flags(config.isa_flags)}),
        "aten_capability": target.aten_capability,
        "vector_isa": config.isa,
        "kernels": sorted(kernel_files),
        "native": needs.manifest(),
        "built_with": build_environment(),
    }


def _saved_runner(out_dir: Path, entry: ArtifactEntry) -> Runner:
    """Load a saved artifact as the loader's artifact form does (its kernels from
    the files beside it, never a compiler); an int8 variant, which has no
    artifact, in its lean form. Returns a function of the flat inputs."""
    kernels = {key: out_dir / KERNELS_DIR / kernel_file(key) for key in entry["kernels"]}
    if is_lean_only(entry):
        lean, path = entry["lean"], out_dir / entry["file"]
        constants = rebuild_constants(path.read_bytes(), path, entry["constants"])
        module = out_dir / lean["file"]
        lean_run = make_runner(module.read_text(encoding="utf-8"), str(module), kernels, lean["extern_kernels"], lean["inputs_to_check"], constants)
        return lambda inputs: lean_run(list(inputs))
    _, payload = _torch_private.split_artifact((out_dir / entry["file"]).read_bytes())
    with _torch_private.shipped_kernels(kernels):
        artifact = _torch_private.deserialize_artifact(payload)
    return lambda inputs: artifact(*inputs)


def _save_sequence(entry: ArtifactEntry, sequence: CheckedSequence, out_dir: Path) -> Path:
    """What the fresh-process checks of the lean and C++ forms run and compare
    with (the artifact's outputs and state, which passed the accuracy check)."""
    data_path = out_dir / CHECK_DIR / f"{Path(entry['file']).stem}.pt"
    data_path.parent.mkdir(exist_ok=True)
    torch.save(dataclasses.asdict(sequence), data_path)
    return data_path


def _output_leaves(exported: torch.export.ExportedProgram, captured: Captured) -> list[OutputLeaf]:
    """Dtype and shape of each output, sizes named after the dims where they are one."""
    placeholders = [n for n in exported.graph_module.graph.nodes if n.op == "placeholder"]
    user_inputs = placeholders[len(placeholders) - len(captured.input_leaves) :]
    dim_of_symbol = {str(size): want for node, leaf in zip(user_inputs, captured.input_leaves) if "shape" in leaf for size, want in zip(node.meta["val"].shape, leaf["shape"]) if isinstance(want, str)}
    output_node = next(iter(reversed(exported.graph_module.graph.nodes)))
    kinds = [spec.kind.name for spec in exported.graph_signature.output_specs]
    leaves: list[OutputLeaf] = []
    for node in [n for n, kind in zip(output_node.args[0], kinds) if kind == "USER_OUTPUT"]:  # not the state's new values
        value = node.meta["val"]
        shape: list[int | str] = [s if isinstance(s, int) else dim_of_symbol.get(str(s), str(s)) for s in value.shape]
        leaves.append({"dtype": str(value.dtype).removeprefix("torch."), "shape": shape})
    return leaves
