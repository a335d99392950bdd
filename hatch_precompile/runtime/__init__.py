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

Beside these files, in a built wheel: `manifest.json` (what was compiled, for
which torch, Python, platform and CPU, with file sizes and sha256) and one
folder per model holding, per CPU target and shape variant, the
AOTCompiledArtifact (`cpu_avx2.bin`), inductor's output module (`cpu_avx2.py`,
the "lean form", where the build could check it runs on its own), the compiled
kernels both use (`kernels/*.so`), the "C++ form" where the model asked for one
(`cpu_avx2_cpp.so`, which holds its own kernels) and the weights.

The modules here, one job each:
  _layout.py         the name of every file and folder here
  _schema.py         the manifest's shape, typed (the build writes it by the same types)
  _manifest.py       read and verify the manifest; what this process is (torch, Python, CPU, C/C++ runtimes)
  _choice.py         choose what fits this process: the CPU target, then each variant's form (`FORMS`)
  _integrity.py      check shipped files against the manifest (weights once per file state)
  _cache.py          the private cache folder where loading may write
  _contract.py       check a call's arguments; rebuild the output structure
  _weights.py        bind the shipped, factory or caller's weights
  _ops.py            import the libraries that define the model's custom ops
  _graph.py          what a form is (`Form`) and what its load returns: a graph that binds a handle's weights
  _cpp.py            the C++ form: AOTInductor's model container library, weights bound per handle
  _lean.py           the lean form: run the output module and kernels directly
  _frozen_tensors.py an int8 variant's frozen constants, rebuilt (its only form is the lean one)
  _generate.py       generation from a decoder with a KV cache in its state: greedy, sampled, streamed
  _fork.py           workers forked after a model ran get one thread (OpenMP's pool does not survive fork)
  _artifact.py       the artifact form: unpickle through torch._inductor
  _torch_private.py  every use of torch internals

Loading picks the best CPU target this process can run, from the manifest alone:
same torch build and Python, every CPU feature the target needs, and kernels no
wider than torch itself uses here (so ATEN_CPU_CAPABILITY=avx2 also limits us).
Then it loads the C++ form where the model has one (`cpp-form = true`: the graph
compiled by AOTInductor into one library), else the lean form (neither imports
the compiler) or, where the build refused that, the artifact form (imports
torch._inductor). No C++ compiler runs in any of them.

Where no shipped artifact fits (a source checkout, an editable install, a wheel
built without the hook, another torch, Python or CPU), the model's `fallback`
decides: "eager" builds the module with its factory and warns once; "error"
raises `PrecompiledModelError`. Either way the message says why and how to get one.

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

from . import _fork
from ._choice import FORM_VARIABLE, FORMS, Choice, Plan, next_form, plan, why_form
from ._contract import CallContract, given_back, unflatten
from ._errors import PrecompiledFallbackWarning, PrecompiledIntegrityError, PrecompiledModelError
from ._generate import Generating
from ._graph import FormUnavailable, Graph
from ._manifest import MANIFEST_FORMAT, VNNI, cpu_features, fallback_policy, read_manifest, unavailable
from ._ops import OpLibraryError, import_op_libraries
from ._schema import ArtifactEntry, ModelEntry, SourceModel, ships_weights
from ._weights import bind_weights, build_module, read_weights

__all__ = ["PrecompiledFallbackWarning", "PrecompiledIntegrityError", "PrecompiledModelError", "explain", "load_compiled"]
__all__ += ["MANIFEST_FORMAT"]  # read by the build, which writes manifests in this format

OUTPUT_FORMS = ("classes", "plain")  # library output classes rebuilt, or dicts and tuples

_lock = threading.Lock()
_loaded: dict[tuple[str, str], CompiledModel | _EagerModel] = {}  # (name, outputs) -> model with the default weights
_variants: dict[str, _Variants] = {}  # loaded graphs, shared by every binding of weights


def load_compiled(
    name: str,
    *,
    fallback: str | None = None,
    state_dict: dict[str, Any] | None = None,
    module: Any = None,
    outputs: str | None = None,
) -> Callable[..., Any]:
    """Return the model `name`: compiled if a shipped artifact fits, else per the fallback.

    Weights: by default those the build shipped (`weights = "embed"`) or the
    factory's (`weights = "factory"`, called now). `state_dict=` or `module=` binds
    the caller's instead (a fine-tuned copy), checked against the names, shapes and
    dtypes that were compiled. `fallback` ("eager" or "error") overrides
    $HATCH_PRECOMPILE_FALLBACK, which overrides the model's configured policy.
    `outputs="plain"` returns dicts and tuples where the module returns library
    output classes (no import of their library); the default is the model's
    configured `outputs`.

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
    default_weights = state_dict is None and module is None
    with _lock:
        model = _loaded.get((name, outputs or "")) if default_weights else None
        if model is not None:
            if isinstance(model, _EagerModel) and fallback_policy(fallback, model.config) == "error":
                raise PrecompiledModelError(unavailable(name, model.reason))
            return model.with_own_state() if model.has_state else model
        how = plan(name)
        if how.entry is not None and how.choices and name not in _variants:
            try:
                _variants[name] = _Variants(name, how.entry, how.choices, fallback_policy(fallback, how.model))
            except (OpLibraryError, FormUnavailable) as error:
                how = Plan(how.model, how.entry, [], str(error))
            except (ImportError, OSError) as error:  # the dynamic loader refused a shipped kernel
                how = Plan(how.model, how.entry, [], f"a shipped kernel could not be loaded here: {error}")
        if how.entry is not None and how.choices:
            weights = _int8_weights(name, how.entry, state_dict, module)
            if weights is None:
                weights = bind_weights(name, how.entry, state_dict, module)
            classes = (outputs or how.entry["outputs_form"]) == "classes"
            model = CompiledModel(name, how.entry, _variants[name], weights, classes, own_state=False)
        elif fallback_policy(fallback, how.model) == "error":
            raise PrecompiledModelError(unavailable(name, how.reason))
        else:
            model = _fall_back(name, how, state_dict, module)
        if default_weights:
            _loaded[(name, outputs or "")] = model
        return model.with_own_state() if model.has_state else model


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
    here and in which form, or why none fits. Reads the manifest only; loads nothing."""
    manifest = read_manifest()
    if manifest is None:
        return f"no compiled models: no manifest.json next to {__file__.rsplit('/', 1)[0]} (source checkout, editable install or --no-hooks wheel)"
    lines: list[str] = []
    features = cpu_features()
    for each in [name] if name is not None else sorted(manifest["models"]):
        how = plan(each, manifest)
        if how.entry is None or not how.choices:
            lines.append(f"{each}: {how.reason}; fallback: {fallback_policy(None, how.model)}")
            continue
        described = [f"{choice.file} ({choice.title}{why_form(choice)})" for choice in how.choices]
        line = f"{each}: would load {', '.join(described)} for CPU target {how.choices[0].artifact['cpu_target']}"
        loaded = _variants.get(each)
        if loaded is not None and loaded.failure:
            line += f"; loaded {', '.join(loaded.files)} instead: {loaded.failure}"
        op_libraries = how.entry["op_libraries"]
        if op_libraries:
            line += f", after importing {', '.join(sorted(set(op_libraries.values())))} (custom ops {', '.join(op_libraries)})"
        lines.append(line + slow_precision(how.entry["dtype"], features) + int8_without_vnni(how.choices[0].artifact, features))
    return "\n".join(lines)


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


class _Variants:
    """The loaded shape variants of one model for one CPU target, most
    specialised first, each a graph that `CompiledModel` binds weights to. A
    variant whose form fails to load here loads in the next form that fits (the
    reason is in `failure`), unless the model's fallback policy is "error";
    where no other form fits, FormUnavailable says so and the fallback applies."""

    def __init__(self, name: str, model: ModelEntry, choices: list[Choice], policy: str) -> None:
        self.name, self.dims = name, model["dims"]
        self.contract = CallContract(name, model["inputs"], model["dims"])
        import_op_libraries(model["op_libraries"])
        ordered = sorted(choices, key=lambda c: len(c.artifact["specialized"]), reverse=True)
        self.failure = ""
        self.variants: list[tuple[dict[str, int], str, Graph]] = []
        for planned in ordered:
            graph, choice = self._load(name, model, planned, policy)
            self.variants.append((choice.artifact["specialized"], choice.file, graph))
        self.files = [file for _, file, _ in self.variants]

    def _load(self, name: str, model: ModelEntry, choice: Choice, policy: str) -> tuple[Graph, Choice]:
        try:
            return FORMS[choice.form].load(name, model, choice.artifact), choice
        except FormUnavailable as error:
            other = next_form(choice)
            if other is None:  # the model's fallback applies (`load_compiled`)
                raise FormUnavailable(f"{error}, and no other form of {choice.artifact['file']} fits here") from None
            if policy == "error":
                raise PrecompiledModelError(f"model {name!r}: {error} (fallback is 'error'; {FORM_VARIABLE}={other.form} loads the {other.title} instead)") from None
            self.failure = str(error)
            return self._load(name, model, other, policy)

    def pick(self, sizes: dict[str, int]) -> int:
        """The index of the variant for these dim sizes: an exact bucket, else the dynamic one."""
        for index, (specialized, _, _) in enumerate(self.variants):
            if all(sizes.get(dim) == size for dim, size in specialized.items()):
                return index
        dim, size = next((d, sizes[d]) for d, spec in self.dims.items() if not spec["dynamic"] and sizes[d] not in spec["buckets"])
        raise ValueError(f"model {self.name!r}: dim {dim!r} is {size}, but it was compiled only for the sizes {self.dims[dim]['buckets']}")


class CompiledModel(Generating):
    """Compiled graphs with weights bound: call it like the module's forward.

    A model with state (`state`: the buffers its graphs update in place, such as
    a KV cache) holds its own copy of them, which every call reads and updates
    as the module's forward does its buffers; the weights are shared."""

    def __init__(self, name: str, model: ModelEntry, variants: _Variants, weights: list[Any], classes: bool, *, own_state: bool = True) -> None:
        """`own_state=False` makes the handle `load_compiled` keeps and never returns
        for a model with state: its state is the shared initial values, which
        `with_own_state` copies for each handle it makes."""
        self.name, self._model = name, model
        self._inputs, self._outputs = model["inputs"], model["outputs"]
        self._variants, self._classes = variants, classes
        self._contract = variants.contract
        order = model["weights"]["order"]
        self._state_at = {state: order.index(state) for state in model["state"]}
        self._initial = weights  # shared by every handle; the state's values before any call
        copied = set(self._state_at.values()) if own_state else set()
        self._weights = [w.clone() if index in copied else w for index, w in enumerate(weights)]
        # Each variant with these weights; the kept handle of a model with state is never called.
        self._runs = [graph.bind(self._weights) for _, _, graph in variants.variants] if own_state or not self._state_at else []

    @property
    def has_state(self) -> bool:
        return bool(self._state_at)

    @property
    def state(self) -> dict[str, Any]:
        """This handle's state by buffer name: the tensors its calls update in place."""
        return {state: self._weights[index] for state, index in self._state_at.items()}

    def reset(self) -> None:
        """Put the state back as the build left it (a KV cache's zeros): start a new sequence."""
        for index in self._state_at.values():
            self._weights[index].copy_(self._initial[index])

    def with_own_state(self) -> CompiledModel:
        """A handle on the same graphs and weights with a state of its own, as the build left it."""
        return CompiledModel(self.name, self._model, self._variants, self._initial, self._classes)

    def _decoder_call(self) -> Callable[[Any, Any], Any]:
        if {"input_ids", "cache_position"} <= set(self._inputs["tree"]["children"][1].get("keys", [])):
            return lambda ids, positions: self(input_ids=ids, cache_position=positions)
        return self

    def _cache_positions(self) -> int | None:
        """The cache's positions: the bound the build found on `cache_position`'s
        values (the size the graph indexes with them)."""
        leaf = next((leaf for leaf in self._inputs["leaves"] if leaf["name"] == "cache_position"), None)
        return None if leaf is None else leaf.get("below")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        given, conformed, sizes = self._contract.accept(args, kwargs)
        run = self._runs[self._variants.pick(sizes)]
        _fork.note_call()
        outputs = run(conformed)
        if conformed is not given:
            outputs = given_back(outputs, conformed, given)
        return unflatten(self._outputs["tree"], iter(outputs), self._classes)

    def artifact_for(self, *args: Any, **kwargs: Any) -> str:
        """Which shipped file would serve this call (shape buckets dispatch on size)."""
        return self._variants.files[self._variants.pick(self._contract.accept(args, kwargs)[2])]

    def check_inputs(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Flatten a call's arguments and check them against what was compiled
        (compiled code checks nothing: a wrong dtype or size gives garbage or a
        crash). Raises ValueError naming the input; returns the flat inputs."""
        return self._contract.accept(args, kwargs)[0]

    def __repr__(self) -> str:
        return f"<compiled model {self.name!r} from {', '.join(self._variants.files)}>"


def _fall_back(name: str, how: Plan, state_dict: dict[str, Any] | None, module: Any) -> _EagerModel:
    """The module itself (the caller's, or the factory's with the given or shipped
    weights bound), with a warning saying why it is not compiled."""
    warnings.warn(
        f"model {name!r} runs eagerly (not compiled): {unavailable(name, how.reason).split(': ', 1)[1]}",
        PrecompiledFallbackWarning,
        stacklevel=3,
    )
    if module is None:
        module = build_module(how.model)
        if state_dict is not None:
            module.load_state_dict(state_dict)
        elif how.entry is not None and ships_weights(how.entry["weights"]):
            own = module.state_dict()
            module.load_state_dict({k: v for k, v in read_weights(how.entry["weights"]).items() if k in own}, strict=False)
    state = how.entry["state"] if how.entry is not None else []
    return _EagerModel(module.eval(), how.model, how.reason, state)


class _EagerModel(Generating):
    """The module built by its factory, called without autograd like the compiled
    one; with state, as the compiled one: per handle, and `reset()`."""

    def __init__(self, module: Any, config: SourceModel, reason: str, state: list[str]) -> None:
        self.module, self.config, self.reason = module, config, reason
        buffers = dict(module.named_buffers())
        self._initial = {name: buffers[name].clone() for name in state}

    @property
    def has_state(self) -> bool:
        return bool(self._initial)

    @property
    def state(self) -> dict[str, Any]:
        buffers = dict(self.module.named_buffers())
        return {name: buffers[name] for name in self._initial}

    def reset(self) -> None:
        for name, tensor in self.state.items():
            tensor.copy_(self._initial[name])

    def with_own_state(self) -> _EagerModel:
        """A copy of the module that shares its parameters and owns its buffers, reset."""
        import copy

        shared = {id(parameter): parameter for parameter in self.module.parameters()}
        handle = _EagerModel(copy.deepcopy(self.module, memo=shared), self.config, self.reason, [])
        handle._initial = self._initial
        handle.reset()
        return handle

    def _decoder_call(self) -> Callable[[Any, Any], Any]:
        return lambda ids, positions: self(input_ids=ids, cache_position=positions)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        _fork.note_call()
        with torch.no_grad():
            return self.module(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<eager fallback {type(self.module).__name__}>"
