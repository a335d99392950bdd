"""The `[tool.hatch.build.hooks.precompile]` table: one schema, validated in one pass.

`parse_config` turns the raw table into frozen dataclasses or raises `ConfigError`
listing every mistake at once, each with its full key path, what was expected and
what was found. Nothing here imports torch: the hook is constructed just to ask
for its dependencies, and a configuration error should not cost a torch import.
"""

from __future__ import annotations

import difflib
import math
import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ..runtime._manifest import CONFIG_TABLE
from .errors import BuildFailure
from .model_config import BOOLEAN, IMPORT_PATH, INT4_GROUP_SIZES, LINEAR_QUANTIZATIONS, AccuracyBounds, Dim, KeyDoc, ModelConfig, TensorInput, choices, model_settings, reference_type
from .options import flatten as flatten_options
from .options import option_problems
from .remote import url_problem
from .targets import CPU_TARGETS, DEFAULT_CPU_TARGETS

TABLE = ".".join(CONFIG_TABLE)

# Keys hatchling itself reads from every build-hook table.
HATCHLING_KEYS = frozenset({"enable-by-default", "dependencies", "require-runtime-dependencies", "require-runtime-features"})

DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
CPU_TARGET_NAMES = tuple(CPU_TARGETS)
RemoteCacheMode = Literal["read-write", "read-only"]
REMOTE_CACHE_MODES: tuple[RemoteCacheMode, ...] = typing.get_args(RemoteCacheMode)


# `[tool.hatch.build.hooks.precompile]`; hatchling's own keys (HATCHLING_KEYS) are accepted too.
TABLE_KEYS = {
    "package": KeyDoc("string", "the single top-level package under `src/` or the root", "import package that receives `_precompiled/`"),
    "fallback": KeyDoc('`"eager"` \\| `"error"`', '`"eager"`', "what `load_compiled` does when no shipped artifact fits"),
    "cpp-form": KeyDoc("boolean", "`true`", "each model's `cpp-form` unless it sets its own: `false` builds no C++ form but where a model asks for one"),
    "cpu-targets": KeyDoc(
        'array of `"avx2"`, `"avx512"`',
        '`["avx2"]`',
        "the x86-64 CPU variants to build (see [CPU targets](targets.md#cpu-targets))",
    ),
    "jobs": KeyDoc(
        "integer >= 1",
        "by the machine",
        "models compiled at once; `HATCH_PRECOMPILE_JOBS` overrides it (see [Builds that scale](builds.md#builds-that-scale-cache-parallel-workers-parts))",
    ),
    "remote-cache": KeyDoc(
        "`redis://`, `rediss://` or `s3://` URL",
        "none",
        "a build cache shared by machines, behind the local one; no password here; `HATCH_PRECOMPILE_REMOTE_CACHE` "
        "overrides it (see [the remote build cache](builds.md#a-remote-build-cache-redis-or-s3))",
    ),
    "remote-cache-mode": KeyDoc(
        '`"read-write"` \\| `"read-only"`',
        '`"read-write"`',
        '`"read-only"`: take entries from the remote store, never write one; `HATCH_PRECOMPILE_REMOTE_CACHE_MODE` overrides it',
    ),
    "models.<name>": KeyDoc("table", "(required, one or more)", "one model; `<name>` is a Python identifier"),
}


def model_keys() -> dict[str, KeyDoc]:
    """`[tool.hatch.build.hooks.precompile.models.<name>]`'s keys, from ModelConfig's fields."""
    return {setting.key: KeyDoc(reference_type(ModelConfig, name), setting.default, setting.meaning) for name, setting in model_settings(ModelConfig).items()}


def reference_tables() -> str:
    """The configuration reference's tables, in Markdown (docs/configuration.md).
    The parser accepts exactly the keys these tables name."""

    def table(keys: dict[str, KeyDoc]) -> str:
        rows = [f"| `{key}` | {doc.type} | {doc.default} | {doc.meaning} |" for key, doc in keys.items()]
        return "\n".join(["| key | type | default | meaning |", "|---|---|---|---|", *rows])

    hatchling = ", ".join(f"`{key}`" for key in sorted(HATCHLING_KEYS))
    return f"`[{TABLE}]`:\n\n{table(TABLE_KEYS)}\n\nhatchling's own hook keys ({hatchling}) are accepted too.\n\n`[{TABLE}.models.<name>]`:\n\n{table(model_keys())}\n"


_MODEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_PACKAGE_NAME = re.compile(r"^[A-Za-z_]\w*$")


class ConfigError(BuildFailure, ValueError):
    """Every problem found in the configuration, one per line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"hatch-precompile: invalid configuration ({len(problems)} problem(s)):\n{lines}")


@dataclass(frozen=True)
class PrecompileConfig:
    package: str | None  # None: the project's single top-level package, found by the hook
    fallback: str  # a model's `fallback` unless it sets its own
    cpu_targets: tuple[str, ...]
    models: dict[str, ModelConfig]
    jobs: int | None = None  # compile workers at once; None: by cores and memory
    remote_cache: str | None = None  # the shared store's URL (never with a password: that comes from the environment)
    remote_cache_mode: RemoteCacheMode = "read-write"

    @property
    def torch_free(self) -> bool:
        """Every model asks for a torch-free form: the wheel is meant to need NumPy, not torch."""
        return bool(self.models) and all(model.torch_free for model in self.models.values())


class _Checker:
    """Collects problems instead of stopping at the first one."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def keys(self, table: dict[str, Any], path: str, allowed: Iterable[str]) -> None:
        allowed = list(allowed)
        for key in table:
            if key not in allowed:
                hint = difflib.get_close_matches(key, allowed, n=1)
                suggestion = f"; did you mean `{hint[0]}`?" if hint else f"; expected one of: {', '.join(allowed)}"
                self.fail(f"{path}.{key}", f"unknown key{suggestion}")

    def table(self, value: Any, path: str) -> dict[str, Any] | None:
        if isinstance(value, dict):
            return value
        self.fail(path, f"expected a table, found {_describe(value)}")
        return None

    def string(self, value: Any, path: str, pattern: re.Pattern[str] | None = None, what: str = "") -> str | None:
        if not isinstance(value, str):
            self.fail(path, f"expected a string{what and ' ' + what}, found {_describe(value)}")
            return None
        if pattern is not None and not pattern.match(value):
            self.fail(path, f"expected {what}, found {value!r}")
            return None
        return value

    def choice(self, value: Any, path: str, choices: tuple[str, ...]) -> str | None:
        if value in choices:
            return str(value)
        hint = difflib.get_close_matches(str(value), choices, n=1) if isinstance(value, str) else []
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        self.fail(path, f"expected one of {', '.join(repr(c) for c in choices)}, found {_describe(value)}{suggestion}")
        return None

    def boolean(self, value: Any, path: str) -> bool | None:
        if isinstance(value, bool):
            return value
        self.fail(path, f"expected true or false, found {_describe(value)}")
        return None

    def integer(self, value: Any, path: str, minimum: int) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected an integer >= {minimum}, found {_describe(value)}")
            return None
        if value < minimum:
            self.fail(path, f"expected an integer >= {minimum}, found {value}")
            return None
        return value


def _describe(value: Any) -> str:
    kind = {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)
    shown = repr(value)
    return f"{kind} {shown}" if len(shown) <= 60 else kind


def parse_config(raw: dict[str, Any]) -> PrecompileConfig:
    """Validate the hook's table (as hatchling hands it over) and return its typed form."""
    check = _Checker()
    check.keys(raw, TABLE, sorted({key.split(".")[0] for key in TABLE_KEYS} | HATCHLING_KEYS))

    package = raw.get("package")
    if package is not None:
        package = check.string(package, f"{TABLE}.package", _PACKAGE_NAME, "an import package name such as 'my_pkg'")
    fallback = check.choice(raw.get("fallback", "eager"), f"{TABLE}.fallback", choices(ModelConfig, "fallback")) or "eager"
    cpu_targets = _parse_cpu_targets(check, raw.get("cpu-targets", list(DEFAULT_CPU_TARGETS)), f"{TABLE}.cpu-targets")
    cpp_form = check.boolean(raw.get("cpp-form", True), f"{TABLE}.cpp-form")
    jobs = check.integer(raw["jobs"], f"{TABLE}.jobs", 1) if "jobs" in raw else None
    remote_cache = check.string(raw["remote-cache"], f"{TABLE}.remote-cache") if "remote-cache" in raw else None
    if remote_cache is not None and (problem := url_problem(remote_cache, from_table=True)):
        check.fail(f"{TABLE}.remote-cache", problem)
    remote_cache_mode = typing.cast(RemoteCacheMode, check.choice(raw.get("remote-cache-mode", "read-write"), f"{TABLE}.remote-cache-mode", REMOTE_CACHE_MODES) or "read-write")

    models: dict[str, ModelConfig] = {}
    raw_models = check.table(raw.get("models", {}), f"{TABLE}.models")
    if raw_models is not None and not raw_models:
        check.fail(f"{TABLE}.models", "no models declared; add a [tool.hatch.build.hooks.precompile.models.NAME] table")
    for name, raw_model in (raw_models or {}).items():
        path = f"{TABLE}.models.{name}"
        if not _MODEL_NAME.match(name):
            check.fail(path, f"model names must be Python identifiers (letters, digits, _), found {name!r}")
        model_table = check.table(raw_model, path)
        if model_table is not None:
            model = _parse_model(check, name, model_table, path, {"fallback": fallback, "cpu_targets": cpu_targets, "cpp_form": bool(cpp_form)})
            if model is not None:
                models[name] = model

    if check.problems:
        raise ConfigError(check.problems)
    return PrecompileConfig(
        package=package,
        fallback=fallback,
        cpu_targets=cpu_targets,
        models=models,
        jobs=jobs,
        remote_cache=remote_cache,
        remote_cache_mode=remote_cache_mode,
    )


def _parse_model(check: _Checker, name: str, raw: dict[str, Any], path: str, table_defaults: dict[str, Any]) -> ModelConfig | None:
    """One model's table. The settings that are a choice (a `Literal` field) or an
    import path are read the same way from ModelConfig's fields; the rest below."""
    before = len(check.problems)
    settings = model_settings(ModelConfig)
    check.keys(raw, path, [setting.key for setting in settings.values()])
    values: dict[str, Any] = dict(table_defaults)  # the table's, unless the model sets its own
    for field_name, setting in settings.items():
        if setting.key not in raw:
            continue
        if allowed := choices(ModelConfig, field_name):
            values[field_name] = check.choice(raw[setting.key], f"{path}.{setting.key}", allowed)
        elif setting.type == IMPORT_PATH:
            values[field_name] = check.string(raw[setting.key], f"{path}.{setting.key}", _IMPORT_PATH, "'module:callable'")
        elif setting.type == BOOLEAN:
            values[field_name] = check.boolean(raw[setting.key], f"{path}.{setting.key}")

    if "factory" not in raw:
        check.fail(f"{path}.factory", "missing; expected 'module:callable' returning the torch.nn.Module")
    if "example-inputs" in raw:
        for key in ("inputs", "kwargs"):
            if key in raw:
                check.fail(f"{path}.{key}", "cannot be combined with `example-inputs`; declare inputs one way")
    elif "inputs" not in raw and "kwargs" not in raw:
        check.fail(path, 'declares no inputs; add `inputs = [{ shape = [...], dtype = "..." }]` or `example-inputs`')

    values["args"] = tuple(spec for i, item in enumerate(_array(check, raw.get("inputs", []), f"{path}.inputs")) if (spec := _parse_input(check, item, f"{path}.inputs[{i}]")) is not None)
    kwargs: dict[str, TensorInput] = {}
    for key, item in (check.table(raw.get("kwargs", {}), f"{path}.kwargs") or {}).items():
        if (spec := _parse_input(check, item, f"{path}.kwargs.{key}")) is not None:
            kwargs[key] = spec
    values["kwargs"] = kwargs

    raw_dims = raw.get("dims", {})
    values["dims"] = _parse_dims(check, raw_dims, f"{path}.dims", by_axes="example-inputs" in raw)
    if "example-inputs" not in raw and isinstance(raw_dims, dict):
        _check_dims_used(check, path, raw, declared=list(raw_dims))

    options = check.table(raw.get("options", {}), f"{path}.options")
    if options is not None:
        for where, message in option_problems(options, f"{path}.options"):
            check.fail(where, message)
        values["options"] = flatten_options(options)
    if "cpu-targets" in raw:
        values["cpu_targets"] = _parse_cpu_targets(check, raw["cpu-targets"], f"{path}.cpu-targets")
    values["accuracy"] = _parse_accuracy(check, raw.get("accuracy", {}), f"{path}.accuracy")
    if values["accuracy"].max_error_ratio is not None and values.get("dtype") not in ("bfloat16", "float16"):
        needs = 'so it needs `dtype = "bfloat16"` or `"float16"`; a float32 model is held to eager by `max-relative-error`'
        check.fail(f"{path}.accuracy.max-error-ratio", f"bounds a lower precision's error against its own rounding, {needs}")
    _check_quantize(check, raw, path, values)
    if values.get("torch_free") and not values.get("cpp_form", True):
        check.fail(f"{path}.torch-free", "is a kind of C++ form, so it needs `cpp-form = true` (this model or the table sets it false)")

    if len(check.problems) > before:
        return None
    return ModelConfig(name=name, **values)


def _check_quantize(check: _Checker, raw: dict[str, Any], path: str, values: dict[str, Any]) -> None:
    """`quantize` and the keys that go with it. Static int8 (`"int8"`) is quantized
    from the float32 module and calibrated; the weight-only schemes run bfloat16
    activations, since their CPU kernels are fast only with those."""
    quantize = values.get("quantize")
    if "calibration" in raw and quantize != "int8":
        check.fail(f"{path}.calibration", 'sets the int8 activation scales, so it needs `quantize = "int8"`; add that or remove it')
    if "group-size" in raw:
        if quantize != "int4-weight-only":
            check.fail(f"{path}.group-size", 'is the int4 weights\' group size, so it needs `quantize = "int4-weight-only"`; add that or remove it')
        elif raw["group-size"] not in INT4_GROUP_SIZES or isinstance(raw["group-size"], bool):
            check.fail(f"{path}.group-size", f"expected one of {', '.join(map(str, INT4_GROUP_SIZES))} (the CPU kernel's group sizes), found {_describe(raw['group-size'])}")
        else:
            values["group_size"] = raw["group-size"]
    if quantize in LINEAR_QUANTIZATIONS:
        if values.get("dtype") != "bfloat16":
            check.fail(
                f"{path}.dtype",
                f'is {values.get("dtype") or "unset (float32)"}, but `quantize = {quantize!r}` needs `dtype = "bfloat16"`: '
                + (
                    "the layers between its int8 products run in bfloat16, and its accuracy is held to bfloat16's own rounding (docs/configuration.md#int8-dynamic)"
                    if quantize == "int8-dynamic"
                    else "the CPU kernels for 8- and 4-bit weights are fast only with bfloat16 activations; with float32 ones the graph dequantizes "
                    "every weight and runs a float32 matrix product, 1.3-2.9x slower than plain float32 (docs/configuration.md#weight-only-int8-and-int4)"
                ),
            )
        if values.get("weights") == "factory":
            check.fail(f"{path}.weights", 'is "factory", but the factory gives float weights and the graph takes the quantized ones the build made; ship them: `weights = "embed"`')
        return
    if quantize is None:
        return
    if values.get("dtype") not in (None, "float32"):
        check.fail(f"{path}.dtype", f'is {values["dtype"]!r}, but `quantize = "int8"` quantizes the float32 module; remove one of the two')
    for dim in values["dims"].values():
        if dim.buckets:
            check.fail(
                f"{path}.dims.{dim.name}",
                "has buckets, which `quantize` does not support: one int8 graph with a dynamic dim ran as fast as one compiled for a fixed size (docs/studies/int8); give only { min, max }",
            )


def _array(check: _Checker, value: Any, path: str) -> list[Any]:
    if isinstance(value, list):
        return value
    check.fail(path, f"expected an array, found {_describe(value)}")
    return []


def _parse_cpu_targets(check: _Checker, raw: Any, path: str) -> tuple[str, ...]:
    items = _array(check, raw, path)
    if isinstance(raw, list) and not raw:
        check.fail(path, f"expected at least one of {', '.join(repr(t) for t in CPU_TARGET_NAMES)}, found []")
    targets = [t for i, item in enumerate(items) if (t := check.choice(item, f"{path}[{i}]", CPU_TARGET_NAMES))]
    if len(set(targets)) != len(targets):
        check.fail(path, f"lists a target twice: {targets}")
    return tuple(targets) or DEFAULT_CPU_TARGETS


def _parse_accuracy(check: _Checker, raw: Any, path: str) -> AccuracyBounds:
    table = check.table(raw, path) or {}
    check.keys(table, path, ("max-relative-error", "min-cosine", "max-element-error", "min-token-agreement", "max-error-ratio"))
    bounds: dict[str, float] = {}
    for key, low, high, meaning in (
        ("max-relative-error", 0.0, None, "a number > 0: the norm of the difference over the float32 output's norm"),
        ("min-cosine", 0.0, 1.0, "a number in (0, 1]: the cosine similarity with the float32 output"),
        ("max-element-error", 0.0, None, "a number > 0: the largest difference of one element over the float32 output's largest magnitude"),
        ("min-token-agreement", 0.0, 1.0, "a number in (0, 1]: the share of positions whose most likely token is float32's"),
        ("max-error-ratio", 0.0, None, "a number > 0: the compiled outputs' error against eager over the precision's own error against float32"),
    ):
        if key not in table:
            continue
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > low or (high is not None and value > high):
            check.fail(f"{path}.{key}", f"expected {meaning}, found {_describe(value)}")
            continue
        bounds[key.replace("-", "_")] = float(value)
    return AccuracyBounds(**bounds)


def _parse_input(check: _Checker, raw: Any, path: str) -> TensorInput | None:
    table = check.table(raw, path)
    if table is None:
        return None
    before = len(check.problems)
    if "value" in table:
        check.keys(table, path, ("value",))
        value = table["value"]
        if isinstance(value, (dict, list)) or not isinstance(value, (bool, int, float, str)):
            check.fail(f"{path}.value", f"expected a boolean, number or string, found {_describe(value)}")
            return None
        return None if len(check.problems) > before else TensorInput(constant=value)
    check.keys(table, path, ("shape", "dtype", "range", "value"))
    shape: list[int | str] = []
    if "shape" not in table:
        check.fail(f"{path}.shape", "missing; expected an array of sizes (integers) and dim names (strings), or give `value` for a constant")
    for i, size in enumerate(_array(check, table.get("shape", []), f"{path}.shape")):
        if isinstance(size, str):
            shape.append(size)
        elif (n := check.integer(size, f"{path}.shape[{i}]", minimum=1)) is not None:
            shape.append(n)
    dtype = check.choice(table.get("dtype", "float32"), f"{path}.dtype", DTYPES)
    value_range = None
    if "range" in table:
        value_range = _parse_range(check, table["range"], f"{path}.range", dtype)
    if len(check.problems) > before or dtype is None:
        return None
    return TensorInput(shape=tuple(shape), dtype=dtype, value_range=value_range)


def _parse_range(check: _Checker, raw: Any, path: str, dtype: str | None) -> tuple[float, float] | None:
    numbers = raw if isinstance(raw, list) and len(raw) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in raw) else None
    if numbers is None:
        check.fail(path, f"expected [low, high] (two numbers), found {_describe(raw)}")
        return None
    if dtype == "bool":
        check.fail(path, "a range makes no sense for dtype 'bool'; remove it")
        return None
    if not numbers[0] < numbers[1]:
        check.fail(path, f"expected low < high, found {numbers}")
        return None
    return (numbers[0], numbers[1])


MAX_SHAPE_VARIANTS = 32


def _parse_dims(check: _Checker, raw: Any, path: str, by_axes: bool) -> dict[str, Dim]:
    """`batch = { min = 1, max = 64 }` (dynamic), `batch = [1, 8, 32]` (one static
    artifact per size), or `batch = { min = 1, max = 64, buckets = [1, 8] }` (both:
    listed sizes get specialised code, other sizes in range the dynamic artifact)."""
    dims: dict[str, Dim] = {}
    for name, value in (check.table(raw, path) or {}).items():
        dim_path = f"{path}.{name}"
        if by_axes and isinstance(value, list):
            check.fail(dim_path, "with `example-inputs`, give { min, max, axes }: buckets need inputs declared by shape")
            continue
        table = {"buckets": value} if isinstance(value, list) else check.table(value, dim_path)
        if table is None:
            continue
        before = len(check.problems)
        check.keys(table, dim_path, ("min", "max", "axes") if by_axes else ("min", "max", "buckets"))
        buckets = _parse_buckets(check, table["buckets"], f"{dim_path}" if isinstance(value, list) else f"{dim_path}.buckets") if "buckets" in table else ()
        dynamic = "max" in table or not buckets
        low = check.integer(table.get("min", 1), f"{dim_path}.min", minimum=1)
        high = None
        if dynamic and "max" not in table:
            check.fail(f"{dim_path}.max", "missing; a dynamic dim needs an upper bound (the loader checks it)")
        elif dynamic:
            high = check.integer(table["max"], f"{dim_path}.max", minimum=2)
        elif "min" in table:
            check.fail(f"{dim_path}.min", "only buckets are given, so the sizes are exactly those; add `max` for a dynamic range too")
        if dynamic and low is not None and high is not None:
            if low >= high:
                check.fail(dim_path, f"expected min < max, found min={low}, max={high}; a fixed size belongs in `shape`")
            outside = [b for b in buckets if not low <= b <= high]
            if outside:
                check.fail(f"{dim_path}.buckets", f"sizes {outside} lie outside [min, max] = [{low}, {high}]")
        elif buckets:
            low, high = min(buckets), max(buckets)
        axes = _parse_axes(check, table.get("axes"), f"{dim_path}.axes") if by_axes else ()
        if len(check.problems) == before and low is not None and high is not None:
            dims[name] = Dim(name=name, min=low, max=high, axes=axes, buckets=buckets, dynamic=dynamic)
    variants = math.prod(len(dim.variants()) for dim in dims.values())  # len(shape_variants(dims)), without listing them
    if variants > MAX_SHAPE_VARIANTS:
        check.fail(path, f"these dims make {variants} shape variants (each compiled per CPU target); at most {MAX_SHAPE_VARIANTS}")
    return dims


def _parse_buckets(check: _Checker, raw: Any, path: str) -> tuple[int, ...]:
    sizes = [n for i, item in enumerate(_array(check, raw, path)) if (n := check.integer(item, f"{path}[{i}]", minimum=1)) is not None]
    if isinstance(raw, list) and not raw:
        check.fail(path, "expected at least one size, found []")
    if len(set(sizes)) != len(sizes):
        check.fail(path, f"lists a size twice: {sizes}")
    return tuple(sorted(set(sizes)))


def _parse_axes(check: _Checker, raw: Any, path: str) -> tuple[tuple[int | str, int], ...]:
    """`axes = ["0:0", "attention_mask:0", "0.input_ids:1"]`: the input (index or
    keyword, then the keys and indices that lead into a nested one, joined by dots)
    and the axis of each use. The worker checks the path against the example inputs."""
    if raw is None:
        check.fail(path, 'missing; with `example-inputs`, say where each dim sits, e.g. axes = ["0:0", "attention_mask:0"]')
        return ()
    axes: list[tuple[int | str, int]] = []
    for i, item in enumerate(_array(check, raw, path)):
        match = re.fullmatch(r"((?:\d+|[A-Za-z_]\w*)(?:\.[^.:\s]+)*):(\d+)", item) if isinstance(item, str) else None
        if match is None:
            check.fail(
                f"{path}[{i}]",
                f"expected 'input:axis' such as '0:0', 'attention_mask:0' or, into a nested input, '0.input_ids:1' (positional 0, key input_ids, axis 1), found {_describe(item)}",
            )
            continue
        which, axis = match.groups()
        axes.append((int(which) if which.isdigit() else which, int(axis)))
    return tuple(axes)


def _check_dims_used(check: _Checker, path: str, raw: dict[str, Any], declared: list[str]) -> None:
    """Every dim name in a shape is declared, and every declared dim is used.

    Reads the raw tables, so that an input rejected for another reason (say, its
    dtype) does not also make its dims look unused."""
    inputs = raw.get("inputs", [])
    kwargs = raw.get("kwargs", {})
    tables = list(enumerate(inputs)) if isinstance(inputs, list) else []
    shapes = [(f"{path}.inputs[{i}].shape", t.get("shape")) for i, t in tables if isinstance(t, dict)]
    if isinstance(kwargs, dict):
        shapes += [(f"{path}.kwargs.{k}.shape", t.get("shape")) for k, t in kwargs.items() if isinstance(t, dict)]
    seen = set()
    for where, shape in shapes:
        for size in shape if isinstance(shape, list) else []:
            if isinstance(size, str):
                seen.add(size)
                if size not in declared:
                    names = ", ".join(declared) or "none"
                    check.fail(where, f"uses dim {size!r}, which is not declared in {path}.dims (declared: {names})")
    for name in declared:
        if name not in seen:
            check.fail(f"{path}.dims.{name}", "declared but used in no input shape")
