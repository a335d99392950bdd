"""Loads the models that hatch-precompile compiled into this package.

This folder is written into wheels as `<package>/_precompiled/` by the
hatch-precompile build. Every build, editable installs included, also writes it
into the source tree (generated, like a version file: keep `_precompiled/` in
.gitignore), so that `from ._precompiled import load_compiled` works in a source
checkout and an editable install too. It needs torch and the standard library
only (it reads the shipped safetensors files itself).

    from example_pkg import load_compiled
    encoder = load_compiled("encoder")   # loads once per process, thread-safe
    out = encoder(input_ids)             # same arguments and outputs as the module

    encoder = load_compiled("encoder", arrays="numpy")   # NumPy in and out: torch is never imported

Beside these files, in a built wheel: `manifest.json` (what was compiled, for
which torch, Python, platform and CPU, with file sizes and sha256) and one
folder per model holding, per CPU target and shape variant, the
AOTCompiledArtifact (`cpu_avx2.bin`), inductor's output module (`cpu_avx2.py`,
the "lean form", where the build could check it runs on its own), the compiled
kernels both use (`kernels/*.so`), the "C++ form" where the model asked for one
(`cpu_avx2_cpp.so`, which holds its own kernels) and the weights.

A load reads plan -> verify -> bind -> handle, a module each:
  _choice.py         plan: what fits this process and the caller's arrays: the CPU target, then each
                     variant's form (`FORMS`), or why nothing does (the fallback applies)
  _variants.py       verify and load each variant's graph in its form (checked by _integrity.py first)
  _weights.py        bind the shipped, factory or caller's weights
  _handle.py         the handle: the graphs with weights bound (or the module itself, eagerly)

The other modules, one job each:
  _layout.py         the name of every file and folder here
  _schema.py         the manifest's shape, typed (the build writes it by the same types)
  _manifest.py       read and verify the manifest; what this process is (torch, Python, CPU, C/C++
                     runtimes), read without importing torch
  _integrity.py      check shipped files against the manifest (weights once per file state)
  _cache.py          the private cache folder where loading may write
  _arrays.py         the two kinds of array (torch tensors, NumPy arrays): what differs between them
  _contract.py       check a call's arguments; rebuild the output structure (for either kind)
  _ops.py            import the libraries that define the model's custom ops
  _graph.py          what a form is (`Form`) and what its load returns: a graph that binds a handle's weights
  _cpp.py            the C++ form: AOTInductor's model container library, weights bound per handle;
                     on NumPy arrays through its C interface (_container.py) and the shim's
                     provider, torch's libtorch_cpu.so (_shim.py), without torch's Python
  _lean.py           the lean form: run the output module and kernels directly
  _frozen_tensors.py an int8 variant's frozen constants, rebuilt (its only form is the lean one)
  _generate.py       generation from a decoder with a KV cache in its state: greedy, sampled, streamed
  _fork.py           workers forked after a model ran get one thread (OpenMP's pool does not survive fork)
  _artifact.py       the artifact form: unpickle through torch._inductor
  _torch_private.py  every use of torch internals

Loading picks the best CPU target this process can run, from the manifest alone:
same torch build and Python, every CPU feature the target needs, and kernels no
wider than torch itself uses here (so ATEN_CPU_CAPABILITY=avx2 also limits us).
Then it loads the C++ form where the model has one (the graph compiled by
AOTInductor into one library), else the lean form (neither imports the
compiler) or, where the build refused that, the artifact form (imports
torch._inductor). No C++ compiler runs in any of them. With `arrays="numpy"`
only the C++ form serves, run through torch's native libraries alone: `import
torch` never runs, and `explain()` says for each model whether it can.

Where no shipped artifact fits (a source checkout, an editable install, a wheel
built without the hook, another torch, Python or CPU), the model's `fallback`
decides: "eager" builds the module with its factory and warns once; "error"
raises `PrecompiledModelError`. Either way the message says why and how to get one.
Where the NumPy path cannot serve a model (no C++ form, ...), "eager" loads it
on torch (the best compiled form that fits there, else the module) behind NumPy
arrays and warns; with no torch installed at all, the error says what to install.

Environment variables (read when a model is loaded):
  HATCH_PRECOMPILE_CPU_TARGET  use only this CPU target ("avx2", "avx512")
  HATCH_PRECOMPILE_FALLBACK    "eager" or "error" for every model of this process
  HATCH_PRECOMPILE_FORM        "auto" (default: C++ where built, else lean where built,
                               else artifact), "cpp" or "lean" (only that form, else the
                               fallback applies) or "artifact" (always the AOTCompiledArtifact)
  HATCH_PRECOMPILE_CACHE_DIR   the private cache: the artifact form's inductor cache and
                               stamps of weights files already verified (default
                               ~/.cache/hatch-precompile; read once per process)
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

from ._arrays import ARRAY_KINDS, array_kind, missing_numpy_dtype
from ._choice import Plan, plan, why_form
from ._errors import PrecompiledFallbackWarning, PrecompiledIntegrityError, PrecompiledModelError
from ._graph import FormUnavailable
from ._handle import CompiledModel, EagerModel, OnTorch
from ._manifest import MANIFEST_FORMAT, VNNI, cpu_features, fallback_policy, installed_torch, read_manifest, release, unavailable
from ._ops import OpLibraryError
from ._schema import ArtifactEntry, ModelEntry, ships_weights
from ._shim import ShimUnavailable
from ._variants import Variants
from ._weights import bind_weights, build_module, read_weights

__all__ = ["PrecompiledFallbackWarning", "PrecompiledIntegrityError", "PrecompiledModelError", "explain", "load_compiled"]
__all__ += ["MANIFEST_FORMAT"]  # read by the build, which writes manifests in this format

OUTPUT_FORMS = ("classes", "plain")  # library output classes rebuilt, or dicts and tuples

_lock = threading.Lock()
_loaded: dict[tuple[str, str, str], Any] = {}  # (name, outputs, arrays) -> model with the default weights
_variants: dict[tuple[str, str], Variants] = {}  # loaded graphs by (name, arrays), shared by every binding of weights


def load_compiled(
    name: str,
    *,
    fallback: str | None = None,
    state_dict: dict[str, Any] | None = None,
    module: Any = None,
    outputs: str | None = None,
    arrays: str = "torch",
) -> Callable[..., Any]:
    """Return the model `name`: compiled if a shipped artifact fits, else per the fallback.

    `arrays="numpy"` returns a model that takes NumPy arrays (and Python ints where
    the module takes ints) and returns NumPy arrays, in plain dicts and tuples:
    its C++ form, run through torch's native libraries without importing torch.
    Where it cannot run so (`explain()` says why), the fallback policy applies:
    "eager" runs the model on torch behind NumPy arrays, with a warning.

    Weights: by default those the build shipped (`weights = "embed"`) or the
    factory's (`weights = "factory"`, called now). `state_dict=` or `module=` binds
    the caller's instead (a fine-tuned copy), checked against the names, shapes and
    dtypes that were compiled; with NumPy arrays, a `state_dict` of arrays. `fallback`
    ("eager" or "error") overrides $HATCH_PRECOMPILE_FALLBACK, which overrides the
    model's configured policy. `outputs="plain"` returns dicts and tuples where the
    module returns library output classes (no import of their library); the
    default is the model's configured `outputs`.

    Artifacts load once per process, and concurrent first calls wait for that one
    load; the default-weights model is reused too. A model with state (buffers
    its forward updates, such as a KV cache) is the exception: each call returns
    a new handle, on the same loaded graphs and weights, with a state of its own
    as the build left it (`reset()` returns a handle's state there). Damaged
    files always raise `PrecompiledIntegrityError`, whatever the policy.
    """
    if state_dict is not None and module is not None:
        raise ValueError(f"model {name!r}: pass state_dict= or module=, not both")
    if outputs not in (None, *OUTPUT_FORMS):
        raise ValueError(f"model {name!r}: outputs must be 'classes' or 'plain', got {outputs!r}")
    if arrays not in ARRAY_KINDS:
        raise ValueError(f"model {name!r}: arrays must be 'torch' or 'numpy', got {arrays!r}")
    if arrays == "numpy" and module is not None:
        raise ValueError(f"model {name!r}: module= holds torch tensors; with arrays='numpy' pass state_dict= of NumPy arrays")
    default_weights = state_dict is None and module is None
    key = (name, outputs or "", arrays)
    with _lock:
        model = _loaded.get(key) if default_weights else None
        if model is None:
            model = _load(name, fallback, state_dict, module, outputs, arrays)
            if default_weights:
                _loaded[key] = model
        elif isinstance(model, EagerModel | OnTorch) and fallback_policy(fallback, _source(name, model)) == "error":
            raise PrecompiledModelError(unavailable(name, model.reason))
        handle: Callable[..., Any] = model.with_own_state() if model.has_state else model
        return handle


def _source(name: str, model: EagerModel | OnTorch) -> Any:
    return model.config if isinstance(model, EagerModel) else plan(name).model


def _load(name: str, fallback: str | None, state_dict: dict[str, Any] | None, module: Any, outputs: str | None, arrays: str) -> Any:
    """Plan, then verify and load the variants, bind the weights, make the handle;
    or fall back, as the policy says."""
    how = plan(name, arrays=arrays)
    policy = fallback_policy(fallback, how.model)
    if how.entry is not None and how.choices and (name, arrays) not in _variants:
        try:
            _variants[(name, arrays)] = Variants(name, how.entry, how.choices, policy, array_kind(arrays))
        except (OpLibraryError, FormUnavailable, ShimUnavailable) as error:
            how = Plan(how.model, how.entry, [], str(error))
        except (ImportError, OSError) as error:  # the dynamic loader refused a shipped kernel
            how = Plan(how.model, how.entry, [], f"a shipped kernel could not be loaded here: {error}")
    if how.entry is not None and how.choices:
        kind = array_kind(arrays)
        weights = _int8_weights(name, how.entry, state_dict, module)
        if weights is None:
            weights = bind_weights(name, how.entry, state_dict, module, kind)
        classes = arrays == "torch" and (outputs or how.entry["outputs_form"]) == "classes"
        return CompiledModel(name, how.entry, _variants[(name, arrays)], weights, classes, own_state=False)
    if policy == "error":
        raise PrecompiledModelError(unavailable(name, how.reason))
    if arrays == "numpy":
        return _on_torch(name, how, fallback, state_dict, outputs)
    return _fall_back(name, how, state_dict, module)


def _on_torch(name: str, how: Plan, fallback: str | None, state_dict: dict[str, Any] | None, outputs: str | None) -> OnTorch:
    """The NumPy path's fallback: the torch path's model behind NumPy arrays."""
    built = f"torch=={release(how.entry['artifacts'][0]['built_with']['torch'])}" if how.entry is not None else "torch"
    cannot = f"model {name!r} cannot run on NumPy arrays here ({how.reason}), and its fallback runs it on torch"
    unheld = missing_numpy_dtype(how.entry) if how.entry is not None else ""
    if unheld:  # on torch too its arrays would need that dtype: refuse now, not at the first call
        raise PrecompiledModelError(f"model {name!r} cannot take and return NumPy arrays here, on any form: {unheld}")
    try:
        installed_torch()
    except ImportError as error:
        raise PrecompiledModelError(f"{cannot}, which cannot be found ({error}): pip install {built}") from None
    warnings.warn(f"model {name!r} runs on torch (imported) behind NumPy arrays: {how.reason}", PrecompiledFallbackWarning, stacklevel=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrecompiledFallbackWarning)  # said once, above
        try:
            tensors = None if state_dict is None else {key: _torch_tensor(value) for key, value in state_dict.items()}
            on_torch = _load(name, fallback, tensors, None, "plain", "torch")
        except ImportError as error:  # torch's files are there, but it does not import
            raise PrecompiledModelError(f"{cannot}, which cannot be imported here ({error}): pip install {built}") from None
    contract = None
    if how.entry is not None:
        from ._contract import CallContract

        contract = CallContract(name, how.entry["inputs"], how.entry["dims"], array_kind("numpy"))
    return OnTorch(on_torch, contract, array_kind("numpy"), how.reason)


def _torch_tensor(value: Any) -> Any:
    import torch

    return torch.from_numpy(value) if not isinstance(value, torch.Tensor) else value


def _int8_weights(name: str, model: ModelEntry, state_dict: dict[str, Any] | None, module: Any) -> list[Any] | None:
    """A quantized model's weights are the build's: an int8 model's graphs take none
    (they are compiled in), a weight-only model's take the shipped quantized ones
    (None: bind them). None for other models."""
    if not model["quantize"]:
        return None
    if state_dict is not None or module is not None:
        raise ValueError(
            f"model {name!r} is quantized to {model['quantize']}: its weights were "
            f"{'compiled into it' if model['quantize'] == 'int8' else 'quantized'} at build time, so "
            "state_dict= and module= cannot replace them; build a wheel from the weights you want to run"
        )
    return [] if model["quantize"] == "int8" else None


def explain(name: str | None = None) -> str:
    """Say, for one model or all, which shipped files `load_compiled` would load
    here and in which form, or why none fits; and whether it would run on NumPy
    arrays without torch (`arrays="numpy"`), or why not. Reads the manifest
    only; loads nothing and imports no torch."""
    manifest = read_manifest()
    if manifest is None:
        return f"no compiled models: no manifest.json next to {__file__.rsplit('/', 1)[0]} (source checkout, editable install or --no-hooks wheel)"
    lines: list[str] = []
    features = cpu_features()
    for each in [name] if name is not None else sorted(manifest["models"]):
        how = plan(each, manifest)
        if how.entry is None or not how.choices:
            lines.append(f"{each}: {how.reason}; fallback: {fallback_policy(None, how.model)}")
        else:
            lines.append(_would_load(each, how, "torch") + slow_precision(how.entry["dtype"], features) + int8_without_vnni(how.choices[0].artifact, features))
        lines.append(f"  without torch (arrays='numpy'): {_without_torch(each, manifest)}")
    return "\n".join(lines)


def _would_load(name: str, how: Plan, arrays: str) -> str:
    described = [f"{choice.file} ({choice.title}{why_form(choice)})" for choice in how.choices]
    line = f"{name}: would load {', '.join(described)} for CPU target {how.choices[0].artifact['cpu_target']}"
    loaded = _variants.get((name, arrays))
    if loaded is not None and loaded.failure:
        line += f"; loaded {', '.join(loaded.files)} instead: {loaded.failure}"
    assert how.entry is not None
    op_libraries = how.entry["op_libraries"]
    if op_libraries:
        line += f", after importing {', '.join(sorted(set(op_libraries.values())))} (custom ops {', '.join(op_libraries)})"
    return line


def _without_torch(name: str, manifest: Any) -> str:
    try:
        import numpy  # noqa: F401  # the arrays it takes
    except ImportError:
        return "no: NumPy is not installed (pip install numpy)"
    how = plan(name, manifest, arrays="numpy")
    if not how.choices:
        return f"no: {how.reason}; fallback: {fallback_policy(None, how.model)} (on torch, behind NumPy arrays)"
    return "yes, " + _would_load(name, how, "numpy").split(": ", 1)[1]


def slow_precision(dtype: str | None, features: frozenset[str]) -> str:
    """What `explain` adds where this CPU cannot run the model's precision fast: its
    results are still correct."""
    if dtype == "bfloat16" and not {"avx512_bf16", "amx_bf16"} & features:
        return (
            "; note: this CPU has neither AVX512-BF16 nor AMX, so bfloat16 arithmetic is emulated: the results are correct, but a model "
            "bound by its arithmetic runs slower than in float32 (a MiniLM-sized BERT 2.6x slower on AVX2), while a decoder bound by "
            "reading its weights still gains (a 92 M decoder: 0.75x float32's time per token)"
        )
    return ""


def int8_without_vnni(artifact: ArtifactEntry, features: frozenset[str]) -> str:
    """What `explain` adds where an int8 model, checked by the build on a CPU with
    VNNI, runs on one without: oneDNN's int8 products can saturate here."""
    if artifact.get("accuracy", {}).get("vnni") and not VNNI & features:
        return (
            "; note: this CPU has no VNNI, where oneDNN's int8 products can saturate, and the build checked this model's accuracy "
            "on a CPU with VNNI: check it here (a small convolution net's cosine to float32 fell from 0.99997 to 0.9984 on AVX2)"
        )
    return ""


load_compiled.explain = explain  # type: ignore[attr-defined]  # reachable through the one re-exported name


def _fall_back(name: str, how: Plan, state_dict: dict[str, Any] | None, module: Any) -> EagerModel:
    """The module itself (the caller's, or the factory's with the given or shipped
    weights bound), with a warning saying why it is not compiled; where torch is
    not installed, an error saying what to do instead."""
    try:
        installed_torch()
    except ImportError:
        raise PrecompiledModelError(f"model {name!r}: {how.reason}") from None
    warnings.warn(
        f"model {name!r} runs eagerly (not compiled): {unavailable(name, how.reason).split(': ', 1)[1]}",
        PrecompiledFallbackWarning,
        stacklevel=4,
    )
    if module is None:
        module = build_module(how.model)
        if state_dict is not None:
            module.load_state_dict(state_dict)
        elif how.entry is not None and ships_weights(how.entry["weights"]):
            own = module.state_dict()
            module.load_state_dict({k: v for k, v in read_weights(how.entry["weights"], array_kind("torch")).items() if k in own}, strict=False)
    state = how.entry["state"] if how.entry is not None else []
    return EagerModel(module.eval(), how.model, how.reason, state)
