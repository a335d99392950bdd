"""Loads the models that hatch-precompile compiled into this package.

This file is written into wheels as `<package>/_precompiled/__init__.py` by the
hatch-precompile build hook; keep the same copy in your source tree (run
`python -m hatch_precompile init`) so that `from ._precompiled import load_compiled`
works in a source checkout and an editable install too. It needs torch and the
standard library only (safetensors when a model ships its weights).

    from example_pkg import load_compiled
    encoder = load_compiled("encoder")   # loads once per process, thread-safe
    out = encoder(input_ids)             # same arguments and outputs as the module

Beside this file, in a built wheel: `manifest.json` (what was compiled, for which
torch, Python, platform and CPU, with file sizes and sha256) and one folder per
model holding one artifact per CPU target, the compiled kernels those load
(`kernels/*.so`) and the weights.

Loading picks the best artifact this process can run, from the manifest alone:
same torch build and Python, every CPU feature the target needs, and kernels no
wider than torch itself uses here (so ATEN_CPU_CAPABILITY=avx2 also limits us).
Then it unpickles the artifact and hands inductor the shipped kernels when it
asks to compile them: no C++ compiler runs, and a kernel that is not shipped is
an error. Inductor writes the artifact's Python wrapper into a private cache.

Where no shipped artifact fits (a source checkout, an editable install, a wheel
built without the hook, another torch, Python or CPU), the model's `fallback`
decides: "eager" builds the module with its factory and warns once; "error"
raises `PrecompiledModelError`. Either way the message says why and how to get one.

Environment variables (read when a model is loaded):
  HATCH_PRECOMPILE_CPU_TARGET  use only this CPU target ("avx2", "avx512")
  HATCH_PRECOMPILE_FALLBACK    "eager" or "error" for every model of this process
  HATCH_PRECOMPILE_CACHE_DIR   the private cache (default ~/.cache/hatch-precompile;
                               read once per process)
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["load_compiled", "explain", "PrecompiledModelError", "PrecompiledIntegrityError", "PrecompiledFallbackWarning"]

_HERE = Path(__file__).resolve().parent
_MANIFEST = _HERE / "manifest.json"
_CONFIG_TABLE = ("tool", "hatch", "build", "hooks", "precompile")
MANIFEST_FORMAT = 1
CPU_TARGET_VARIABLE = "HATCH_PRECOMPILE_CPU_TARGET"  # force one CPU target (if the CPU can run it)
CACHE_DIR_VARIABLE = "HATCH_PRECOMPILE_CACHE_DIR"  # where loading may write (default ~/.cache/hatch-precompile)
FALLBACK_VARIABLE = "HATCH_PRECOMPILE_FALLBACK"  # "eager" or "error" for the whole process


class PrecompiledModelError(RuntimeError):
    """No shipped artifact can run here and the fallback policy is "error"."""


class PrecompiledIntegrityError(PrecompiledModelError):
    """A shipped file is not what the build wrote (tampered, truncated, missing)."""


class PrecompiledFallbackWarning(UserWarning):
    """A model runs eagerly because no shipped artifact fits this process."""


_lock = threading.Lock()
_loaded: dict[str, Callable[..., Any]] = {}  # load_compiled(name) with the default weights
_graphs: dict[str, _Graphs] = {}  # deserialized artifacts, shared by every binding of weights


def load_compiled(
    name: str, *, fallback: str | None = None, state_dict: dict[str, Any] | None = None, module: Any = None
) -> Callable[..., Any]:
    """Return the model `name`: compiled if a shipped artifact fits, else per the fallback.

    Weights: by default those the build shipped (`weights = "embed"`) or the
    factory's (`weights = "factory"`, called now). `state_dict=` or `module=` binds
    the caller's instead (a fine-tuned copy), checked against the names, shapes and
    dtypes that were compiled. `fallback` ("eager" or "error") overrides
    $HATCH_PRECOMPILE_FALLBACK, which overrides the model's configured policy.

    Artifacts load once per process, and concurrent first calls wait for that one
    load; the default-weights model is reused too. Damaged files always raise
    `PrecompiledIntegrityError`, whatever the policy.
    """
    if state_dict is not None and module is not None:
        raise ValueError(f"model {name!r}: pass state_dict= or module=, not both")
    default_weights = state_dict is None and module is None
    with _lock:
        model = _loaded.get(name) if default_weights else None
        if model is not None:
            if isinstance(model, _EagerModel) and _fallback_policy(fallback, model.config) == "error":
                raise PrecompiledModelError(_unavailable(name, model.reason))
            return model
        plan = _plan(name)
        if plan.artifacts:
            if name not in _graphs:
                _graphs[name] = _Graphs(name, plan.model, plan.artifacts)
            model = CompiledModel(name, plan.model, _graphs[name], _bind_weights(name, plan.model, state_dict, module))
        elif _fallback_policy(fallback, plan.model) == "error":
            raise PrecompiledModelError(_unavailable(name, plan.reason))
        else:
            model = _fall_back(name, plan, state_dict, module)
        if default_weights:
            _loaded[name] = model
        return model


def explain(name: str | None = None) -> str:
    """Say, for one model or all, which shipped artifacts `load_compiled` would use
    here, or why none fits. Reads the manifest only; loads nothing."""
    manifest = _read_manifest()
    if manifest is None:
        return f"no compiled models: no manifest.json next to {_HERE} (source checkout, editable install or --no-hooks wheel)"
    names = [name] if name is not None else sorted(manifest["models"])
    lines = []
    for each in names:
        plan = _plan(each, manifest)
        if plan.artifacts:
            files = ", ".join(a["file"] for a in plan.artifacts)
            lines.append(f"{each}: would load {files} (CPU target {plan.artifacts[0]['cpu_target']})")
        else:
            lines.append(f"{each}: {plan.reason}; fallback: {_fallback_policy(None, plan.model)}")
    return "\n".join(lines)


load_compiled.explain = explain  # type: ignore[attr-defined]  # reachable through the one re-exported name


class _Plan:
    """What loading `name` would do: the model's manifest entry and the artifacts
    to load (one CPU target, every shape variant), or none and the reason."""

    def __init__(self, model: dict[str, Any], artifacts: list[dict[str, Any]], reason: str) -> None:
        self.model, self.artifacts, self.reason = model, artifacts, reason


def _plan(name: str, manifest: dict[str, Any] | None = None) -> _Plan:
    manifest = manifest or _read_manifest()
    if manifest is None:
        reason = (
            f"no compiled artifacts next to {_HERE} (a source checkout, an editable install, "
            "or a wheel built without the precompile hook)"
        )
        return _Plan(_model_from_source_config(name), [], reason)
    model = manifest["models"].get(name)
    if model is None:
        known = ", ".join(sorted(manifest["models"])) or "none"
        raise KeyError(f"no model named {name!r} in {_MANIFEST} (models: {known})")
    artifacts, reason = _pick_artifacts(model)
    return _Plan(model, artifacts, reason)


def _fallback_policy(requested: str | None, model: dict[str, Any]) -> str:
    policy = requested or os.environ.get(FALLBACK_VARIABLE) or model["fallback"]
    if policy not in ("eager", "error"):
        source = "the fallback argument" if requested else FALLBACK_VARIABLE
        raise ValueError(f"{source} must be 'eager' or 'error', got {policy!r}")
    return policy


def _unavailable(name: str, reason: str) -> str:
    return (
        f"model {name!r}: {reason}. Build and install a wheel with the hatch-precompile hook "
        "(`hatch build`, `python -m build`, `pip wheel .`) using the torch and Python you deploy with."
    )


def _read_manifest() -> dict[str, Any] | None:
    """The manifest, checked against the digest in the generated `_build` module."""
    try:
        data = _MANIFEST.read_bytes()
    except FileNotFoundError:
        return None
    try:
        from ._build import MANIFEST_SHA256
    except ImportError:
        raise PrecompiledIntegrityError(f"{_MANIFEST} is present but {_HERE / '_build.py'} is not: the install is damaged") from None
    if hashlib.sha256(data).hexdigest() != MANIFEST_SHA256:
        raise PrecompiledIntegrityError(f"{_MANIFEST} does not match the digest the build recorded: it was modified")
    manifest = json.loads(data)
    if manifest.get("format") != MANIFEST_FORMAT:
        raise PrecompiledModelError(
            f"{_MANIFEST} has format {manifest.get('format')!r}; this loader reads format {MANIFEST_FORMAT}"
        )
    return manifest


def _verified_bytes(record: dict[str, Any]) -> bytes:
    """A shipped file's bytes, checked against the manifest's size and sha256.
    The same bytes are then used, so nothing can change in between."""
    path = _HERE / record["file"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PrecompiledIntegrityError(f"{path} is missing: reinstall the package") from None
    _check_digest(path, len(data), hashlib.sha256(data).hexdigest(), record)
    return data


def _verified_path(record: dict[str, Any]) -> Path:
    """A shipped file's path, after hashing it in chunks (for files read by path:
    weights are memory-mapped, kernels are loaded by the dynamic loader)."""
    path = _HERE / record["file"]
    digest = hashlib.sha256()
    try:
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    except FileNotFoundError:
        raise PrecompiledIntegrityError(f"{path} is missing: reinstall the package") from None
    _check_digest(path, path.stat().st_size, digest.hexdigest(), record)
    return path


def _check_digest(path: Path, size: int, sha256: str, record: dict[str, Any]) -> None:
    if size != record["size"] or sha256 != record["sha256"]:
        raise PrecompiledIntegrityError(
            f"{path} does not match the manifest (size {size}, expected {record['size']}; sha256 "
            f"{'matches' if sha256 == record['sha256'] else 'differs'}): it was modified or truncated; "
            "reinstall the package"
        )


# --- Choosing an artifact ------------------------------------------------------------

# torch.backends.cpu.get_cpu_capability() levels, lowest first; it honours a user's
# ATEN_CPU_CAPABILITY downgrade, so a variant above it is never picked.
_ATEN_LEVELS = ("DEFAULT", "AVX2", "AVX512")


def _running_environment() -> dict[str, Any]:
    import torch

    return {
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "platform": sysconfig.get_platform(),
        "cpu_features": {name for name, present in torch.cpu.get_capabilities().items() if present is True},
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
    }


def _pick_artifacts(model: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The artifacts (every shape variant) of the best CPU target this process can
    run, or none and why none fits.

    Decided from the manifest alone, so nothing is unpickled and no native code is
    loaded for a variant that does not fit. The torch build is compared by version
    (with its local label, e.g. +cpu) and git revision: the artifact's exact key,
    torch_key(), hashes every torch source file and costs a second to compute."""
    here = _running_environment()
    targets: dict[str, list[dict[str, Any]]] = {}
    for artifact in sorted(model["artifacts"], key=lambda a: _aten_level(a["aten_capability"]), reverse=True):
        targets.setdefault(artifact["cpu_target"], []).append(artifact)
    forced = os.environ.get(CPU_TARGET_VARIABLE)
    if forced:
        if forced not in targets:
            return [], f"{CPU_TARGET_VARIABLE}={forced} but the shipped CPU targets are: {', '.join(targets)}"
        targets = {forced: targets[forced]}
    reasons = []
    for target, artifacts in targets.items():
        first = artifacts[0]  # the variants of one target share their requirements
        built = first["built_with"]
        problems = [f"{what} differs" for what in ("torch", "torch_git", "python", "platform") if built[what] != here[what]]
        missing = sorted(set(first["cpu_features"]) - here["cpu_features"])
        if missing:
            problems.append(f"CPU lacks {', '.join(missing)}")
        if _aten_level(first["aten_capability"]) > _aten_level(here["aten_capability"]):
            problems.append(f"torch runs {here['aten_capability']} kernels here, not {first['aten_capability']} (see ATEN_CPU_CAPABILITY)")
        if not problems:
            return artifacts, ""
        reasons.append(
            f"{first['file']} was built with torch {built['torch']} ({built['torch_git'][:12]}) on "
            f"cp{built['python'].replace('.', '')} {built['platform']} for {target}: " + ", ".join(problems)
        )
    found = ", ".join(sorted(here["cpu_features"])) or "none"
    running = (
        f"running torch {here['torch']} ({here['torch_git'][:12]}) on cp{here['python'].replace('.', '')} "
        f"{here['platform']} with {here['aten_capability']} kernels and CPU features: {found}"
    )
    return [], f"no shipped artifact fits this process: {'; '.join(reasons)}; {running}"


def _aten_level(capability: str) -> int:
    return _ATEN_LEVELS.index(capability) if capability in _ATEN_LEVELS else 0


# --- The compiled model --------------------------------------------------------------


class _Graphs:
    """The deserialized artifacts of one model for one CPU target, one per shape
    variant, most specialised first; weights are bound by `CompiledModel`."""

    def __init__(self, name: str, model: dict[str, Any], artifacts: list[dict[str, Any]]) -> None:
        self.name, self.dims = name, model["dims"]
        ordered = sorted(artifacts, key=lambda a: len(a["specialized"]), reverse=True)
        self.variants = [(a["specialized"], a["file"], _deserialize(name, model, a)) for a in ordered]
        self.files = [a["file"] for a in artifacts]

    def pick(self, sizes: dict[str, int]) -> tuple[str, Callable[..., list[Any]]]:
        """(file, callable) of the artifact for these dim sizes: an exact bucket,
        else the dynamic one."""
        for specialized, file, compiled in self.variants:
            if all(sizes.get(dim) == size for dim, size in specialized.items()):
                return file, compiled
        dim, size = next((d, sizes[d]) for d, spec in self.dims.items() if not spec["dynamic"] and sizes[d] not in spec["buckets"])
        raise ValueError(
            f"model {self.name!r}: dim {dim!r} is {size}, but it was compiled only for the sizes {self.dims[dim]['buckets']}"
        )


def _deserialize(name: str, model: dict[str, Any], artifact: dict[str, Any]) -> Callable[..., list[Any]]:
    """Verify an artifact and its kernels, then unpickle it with the shipped kernels."""
    from . import _torch_private

    data = _verified_bytes(artifact)
    kernels = {key: _verified_path(model["kernels"][key]) for key in artifact["kernels"]}
    try:
        key, payload = _torch_private.split_artifact(data)
    except _torch_private.ArtifactFormatError as error:
        raise PrecompiledIntegrityError(f"{_HERE / artifact['file']}: {error}") from None
    if key.hex() != artifact["built_with"]["torch_key"]:
        raise PrecompiledIntegrityError(
            f"{_HERE / artifact['file']} was written by another torch build than the manifest says "
            f"(torch key {key.hex()[:16]}..., manifest {artifact['built_with']['torch_key'][:16]}...)"
        )
    try:
        with _private_inductor_cache(), _torch_private.shipped_kernels(kernels):
            return _torch_private.deserialize_artifact(payload)
    except _torch_private.MissingKernelError as error:
        raise PrecompiledIntegrityError(f"model {name!r}, {artifact['file']}: {error}") from None


class CompiledModel:
    """Compiled artifacts with weights bound: call it like the module's forward."""

    def __init__(self, name: str, model: dict[str, Any], graphs: _Graphs, weights: list[Any]) -> None:
        self.name = name
        self._inputs, self._outputs = model["inputs"], model["outputs"]
        keywords = set(model["inputs"]["tree"]["children"][1].get("keys", []))
        self._keyword_constants = {
            leaf["name"]: leaf["value"] for leaf in model["inputs"]["leaves"] if "value" in leaf and leaf["name"] in keywords
        }
        self._graphs, self._weights = graphs, weights

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat_inputs, sizes = self._checked(args, kwargs)
        _, compiled = self._graphs.pick(sizes)
        return _unflatten(self._outputs["tree"], iter(compiled(*self._weights, *flat_inputs)))

    def artifact_for(self, *args: Any, **kwargs: Any) -> str:
        """Which shipped artifact would serve this call (shape buckets dispatch on size)."""
        return self._graphs.pick(self._checked(args, kwargs)[1])[0]

    def check_inputs(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Flatten a call's arguments and check them against what was compiled
        (compiled code checks nothing: a wrong dtype or size gives garbage or a
        crash). Raises ValueError naming the input; returns the flat tensors."""
        return self._checked(args, kwargs)[0]

    def _checked(self, args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, int]]:
        kwargs = {**self._keyword_constants, **kwargs}  # compiled-in keyword constants may be left out
        flat_inputs = _flatten_call(self.name, self._inputs["tree"], args, kwargs)
        return flat_inputs, _check_inputs(self.name, self._inputs["leaves"], self._graphs.dims, flat_inputs)

    def __repr__(self) -> str:
        return f"<compiled model {self.name!r} from {', '.join(self._graphs.files)}>"


@contextlib.contextmanager
def _private_inductor_cache() -> Iterator[None]:
    """Point inductor at this user's private cache while loading: it writes the
    artifact's Python wrapper there and imports it, so a shared, world-writable
    directory (inductor's default is under /tmp) would let others plant code."""
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(_private_cache_dir() / "inductor")
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


@functools.cache
def _private_cache_dir() -> Path:
    """$HATCH_PRECOMPILE_CACHE_DIR, else ~/.cache/hatch-precompile (XDG_CACHE_HOME
    honoured), created 0700; if that cannot be created (a read-only home), a
    private temporary directory for this process, removed at exit. A directory
    that others can write to, or that another user owns, is refused."""
    configured = os.environ.get(CACHE_DIR_VARIABLE)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = Path(configured) if configured else base / "hatch-precompile"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        if configured:
            raise
        temporary = tempfile.mkdtemp(prefix="hatch-precompile-")
        atexit.register(shutil.rmtree, temporary, ignore_errors=True)
        return Path(temporary)
    info = directory.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PrecompiledModelError(
            f"refusing cache directory {directory}: it must be owned by you and private (mode 0700), "
            f"found owner uid {info.st_uid} and mode {oct(info.st_mode & 0o777)}; "
            f"fix it or set {CACHE_DIR_VARIABLE} to another directory"
        )
    return directory


def _read_weights(weights: dict[str, Any]) -> dict[str, Any]:
    """The shipped tensors by name, memory-mapped by safetensors (no pickle); tied
    weights are stored once and bound under each name."""
    from safetensors.torch import load_file

    tensors = load_file(_verified_path(weights))
    for alias, name in weights["aliases"].items():
        tensors[alias] = tensors[name]
    return tensors


def _bind_weights(name: str, model: dict[str, Any], state_dict: dict[str, Any] | None, module: Any) -> list[Any]:
    """The tensors the compiled graph takes before the user inputs, in its order,
    from the caller's module or state_dict, the factory, or the shipped file;
    constants no module attribute holds always come from the shipped file."""
    spec = model["weights"]
    shipped = _read_weights(spec) if "file" in spec else {}
    if module is not None:
        lookup, source = _tensor_lookup(module), "the module given"
    elif state_dict is not None:
        lookup, source = dict(state_dict).get, "the state_dict given"
    elif spec["mode"] == "factory":
        lookup, source = _tensor_lookup(_build_module(model)), f"the module from factory {model['factory']!r}"
    else:
        return [shipped[n] for n in spec["order"]]
    tensors, problems = [], []
    for weight in spec["order"]:
        want = spec["specs"][weight]
        tensor = shipped.get(weight) if want["kind"] == "CONSTANT_TENSOR" else lookup(weight)
        if tensor is None:
            problems.append(f"{weight} is missing")
            continue
        found = f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} on {tensor.device.type}"
        if found != f"{want['dtype']}{want['shape']} on cpu":
            problems.append(f"{weight} is {found}, expected {want['dtype']}{want['shape']} on cpu")
        tensors.append(tensor.detach())
    if problems:
        more = f"; and {len(problems) - 8} more" if len(problems) > 8 else ""
        raise ValueError(f"model {name!r}: {source} does not fit the compiled model: {'; '.join(problems[:8])}{more}")
    return tensors


def _tensor_lookup(module: Any) -> Callable[[str], Any]:
    """Find a module's tensor by state-dict name: parameters and buffers (tied ones
    under each name), then plain tensor attributes."""
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))

    def lookup(name: str) -> Any:
        if name in named:
            return named[name]
        target = module
        for part in name.split("."):
            target = getattr(target, part, None)
        return target

    return lookup


def _build_module(model: dict[str, Any]) -> Any:
    """The factory's module, converted to the compiled dtype, in eval mode."""
    import torch

    module = _import_object(model["factory"])()
    if model.get("dtype"):
        module = module.to(getattr(torch, model["dtype"]))
    return module.eval()


def _flatten_call(name: str, tree: dict[str, Any], args: tuple, kwargs: dict) -> list[Any]:
    """Flatten (args, kwargs) along the spec recorded at build time, naming what differs."""
    arg_spec, kwarg_spec = tree["children"]
    if len(args) != len(arg_spec["children"]):
        raise ValueError(
            f"model {name!r}: expected {len(arg_spec['children'])} positional argument(s), got {len(args)}"
        )
    expected = set(kwarg_spec.get("keys", []))
    if set(kwargs) != expected:
        missing, unexpected = sorted(expected - set(kwargs)), sorted(set(kwargs) - expected)
        raise ValueError(
            f"model {name!r}: keyword arguments differ from the compiled signature: "
            f"missing {missing or 'none'}, unexpected {unexpected or 'none'}"
        )
    leaves: list[Any] = []
    _flatten(name, (args, kwargs), tree, "", leaves)
    return leaves


def _flatten(name: str, value: Any, spec: dict[str, Any], path: str, leaves: list[Any]) -> None:
    kind = spec["type"]
    if kind == "leaf":
        leaves.append(value)
    elif kind in ("dict", "keyed"):
        if not hasattr(value, "keys") or set(value.keys()) != set(spec["keys"]):
            raise ValueError(f"model {name!r}: input {path or 'kwargs'} must be a mapping with keys {spec['keys']}")
        for key, child in zip(spec["keys"], spec["children"]):
            _flatten(name, value[key], child, f"{path}[{key!r}]", leaves)
    else:
        container = list if kind == "list" else tuple
        if not isinstance(value, container) or len(value) != len(spec["children"]):
            raise ValueError(
                f"model {name!r}: input {path or 'args'} must be a {kind} of {len(spec['children'])} item(s)"
            )
        for i, (item, child) in enumerate(zip(value, spec["children"])):
            _flatten(name, item, child, f"{path}[{i}]", leaves)


def _unflatten(spec: dict[str, Any], leaves: Any) -> Any:
    """Rebuild the module's output structure. Classes (named tuples, library output
    classes such as transformers' ModelOutput) are imported by name and rebuilt;
    if that import fails, the user gets a tuple (named tuples) or a dict (keyed
    classes) with the same contents."""
    kind = spec["type"]
    if kind == "leaf":
        return next(leaves)
    children = [_unflatten(child, leaves) for child in spec["children"]]
    if kind in ("dict", "keyed"):
        values = dict(zip(spec["keys"], children))
        cls = _output_class(spec) if kind == "keyed" else None
        return cls(**values) if cls is not None else values
    if kind == "namedtuple":
        cls = _output_class(spec)
        return cls(*children) if cls is not None else tuple(children)
    return tuple(children) if kind == "tuple" else children


_output_classes: dict[str, Any] = {}


def _output_class(spec: dict[str, Any]) -> Any:
    if spec["class"] not in _output_classes:
        try:
            _output_classes[spec["class"]] = _import_object(spec["class"])
        except (ImportError, AttributeError):
            _output_classes[spec["class"]] = None
    return _output_classes[spec["class"]]


def _check_inputs(name: str, specs: list[dict[str, Any]], dims: dict[str, Any], values: list[Any]) -> dict[str, int]:
    """Check each flat input against its spec; return the size of each dim."""
    import torch

    sizes: dict[str, tuple[int, str]] = {}
    for spec, value in zip(specs, values):
        where = f"model {name!r}, input {spec['name']}"
        if "value" in spec:
            if value != spec["value"] or type(value) is not type(spec["value"]):
                raise ValueError(f"{where}: compiled for the constant {spec['value']!r}, got {value!r}")
            continue
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{where}: expected a tensor, got {type(value).__name__}")
        if str(value.dtype) != f"torch.{spec['dtype']}":
            raise ValueError(f"{where}: expected dtype {spec['dtype']}, got {str(value.dtype).removeprefix('torch.')}")
        if value.device.type != spec["device"]:
            raise ValueError(f"{where}: expected a tensor on {spec['device']}, got one on {value.device}")
        shape = spec["shape"]
        if value.dim() != len(shape):
            raise ValueError(f"{where}: expected {len(shape)} dimensions {shape}, got shape {list(value.shape)}")
        for axis, (want, got) in enumerate(zip(shape, value.shape)):
            if isinstance(want, int):
                if got != want:
                    raise ValueError(f"{where}: expected size {want} at dim {axis} (shape {shape}), got {list(value.shape)}")
                continue
            low, high = dims[want]["min"], dims[want]["max"]
            if not low <= got <= high:
                raise ValueError(f"{where}: dim {want!r} (dim {axis}) must be in [{low}, {high}], got {got}")
            first = sizes.setdefault(want, (got, spec["name"]))
            if first[0] != got:
                raise ValueError(f"{where}: dim {want!r} is {got} here but {first[0]} in input {first[1]}")
    return {dim: size for dim, (size, _) in sizes.items()}


# --- Falling back -------------------------------------------------------------------


def _fall_back(name: str, plan: _Plan, state_dict: dict[str, Any] | None, module: Any) -> _EagerModel:
    """The module itself (the caller's, or the factory's with the given or shipped
    weights bound), with a warning saying why it is not compiled."""
    warnings.warn(
        f"model {name!r} runs eagerly (not compiled): {_unavailable(name, plan.reason).split(': ', 1)[1]}",
        PrecompiledFallbackWarning,
        stacklevel=3,
    )
    if module is None:
        module = _build_module(plan.model)
        if state_dict is not None:
            module.load_state_dict(state_dict)
        elif "file" in plan.model.get("weights", {}):
            own = module.state_dict()
            module.load_state_dict({k: v for k, v in _read_weights(plan.model["weights"]).items() if k in own}, strict=False)
    return _EagerModel(module.eval(), plan.model, plan.reason)


class _EagerModel:
    """The module built by its factory, called without autograd like the compiled one."""

    def __init__(self, module: Any, config: dict[str, Any], reason: str) -> None:
        self.module, self.config, self.reason = module, config, reason

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.no_grad():
            return self.module(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<eager fallback {type(self.module).__name__}>"


def _import_object(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def _model_from_source_config(name: str) -> dict[str, Any]:
    """Read the model's factory and fallback from the pyproject.toml above this file."""
    for directory in _HERE.parents:
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file():
            import tomllib

            table: Any = tomllib.loads(pyproject.read_text(encoding="utf-8"))
            for key in _CONFIG_TABLE:
                table = table.get(key, {})
            models = table.get("models", {})
            if not models:
                break  # the nearest project is not one that uses hatch-precompile
            if name not in models:
                known = ", ".join(sorted(models)) or "none"
                raise KeyError(f"no model named {name!r} in {pyproject} (models: {known})")
            config = models[name]
            return {"factory": config["factory"], "dtype": config.get("dtype"), "fallback": config.get("fallback", table.get("fallback", "eager"))}
    raise PrecompiledModelError(
        f"model {name!r}: no manifest.json next to {_HERE} and no pyproject.toml above it: "
        "this package was built without the hatch-precompile hook"
    )
