"""A model's settings, declared once: `ModelConfig`'s fields.

Each field of `ModelConfig` (but `name`) carries a `Setting` in its metadata: its
key in `[tool.hatch.build.hooks.precompile.models.<name>]`, how the configuration
reference shows it, whether it decides what is compiled, and its JSON form. What
used to be lists kept by hand derives from the fields: the keys the parser
accepts and the reference documents (`model_settings`), the choices of a
`Literal`-typed field (`choices`) and how the reference shows them, the form sent to the compile worker and kept
in a part (`to_json`/`from_json`), the settings a part is checked against
(`compiled_json`) and those hashed into the artifact key (`keyed_json`). A new
field with a `Setting` reaches all of them (tests/test_config.py adds one).

No torch here: the hook reads this before anything imports torch.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from .targets import DEFAULT_CPU_TARGETS

Fallback = Literal["eager", "error"]
Weights = Literal["embed", "factory"]
ModuleDtype = Literal["float32", "bfloat16", "float16"]
Quantization = Literal["int8", "int8-weight-only", "int4-weight-only", "int8-dynamic"]
# The linear layers replaced, on the bfloat16 module before capture, by ones with
# 8- or 4-bit weights (worker/linears.py); int8-dynamic also rounds their inputs to int8.
LINEAR_QUANTIZATIONS = ("int8-weight-only", "int4-weight-only", "int8-dynamic")
INT4_GROUP_SIZES = (32, 64, 128)
DEFAULT_INT4_GROUP_SIZE = 32  # llama.cpp Q4_0's; divides the widths of small LLMs (576, 768, 960) where 128 does not
OutputForm = Literal["classes", "plain"]  # runtime.OUTPUT_FORMS, which the loader checks (a test keeps them equal)

IMPORT_PATH = '`"module:callable"`'  # a Setting of this type is checked as an import path
CHOICES = ""  # the type of a `Literal` field: the reference shows its values (`reference_type`)
BOOLEAN = "boolean"  # a Setting of this type is checked as `true` or `false`


@dataclass(frozen=True)
class KeyDoc:
    """How the configuration reference (docs/configuration.md) shows one key: its
    type, its default and what it means."""

    type: str
    default: str
    meaning: str


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Setting(KeyDoc):
    """One model key: `key` in the TOML table, the reference's row (KeyDoc), and
    what the build does with it.

    `compiled`: the value decides what is captured and compiled, so a part made
    with another value is refused (engine/parts.py). `keyed`: the value is hashed
    into the artifact key as set (worker/key.py; the captured graph carries what
    the others change). `to_plain`/`from_plain`: its JSON form and back."""

    key: str = ""
    compiled: bool = False
    keyed: bool = False
    to_plain: Callable[[Any], Any] = _same
    from_plain: Callable[[Any], Any] = _same


def setting(key: str, type: str, default: str, meaning: str, **what: Any) -> dict[str, Setting]:
    """A field's metadata: `field(metadata=setting("factory", ...))`."""
    return {"setting": Setting(type, default, meaning, key=key, **what)}


@dataclass(frozen=True)
class Dim:
    """A named dynamic dimension; the compiled artifact accepts sizes in [min, max]."""

    name: str
    min: int
    max: int
    # Only for `example-inputs` models: where the dim sits, as (input, axis) with
    # input a positional index (int) or keyword name (str).
    axes: tuple[tuple[int | str, int], ...] = ()
    buckets: tuple[int, ...] = ()  # sizes that get an artifact of their own (static)
    dynamic: bool = True  # whether one artifact also serves every size in [min, max]

    def variants(self) -> list[int | None]:
        """The sizes compiled separately, then None for the dynamic artifact."""
        return [*self.buckets, *([None] if self.dynamic else [])]


@dataclass(frozen=True)
class TensorInput:
    """One declared example input: sizes are ints (static) or dim names (dynamic).
    Or, with `constant`, a non-tensor argument compiled in as that value."""

    shape: tuple[int | str, ...] = ()
    dtype: str = "float32"
    value_range: tuple[float, float] | None = None
    constant: bool | int | float | str | None = None


@dataclass(frozen=True)
class AccuracyBounds:
    """`accuracy = { max-relative-error = 0.04, min-cosine = 0.999, max-element-error = 1e-4, max-error-ratio = 3 }`:
    the worst each floating output may be against the float32 model, and a
    lower-precision model's error against eager over its precision's own (see
    worker/accuracy.py); a bound left out takes the dtype's default."""

    max_relative_error: float | None = None
    min_cosine: float | None = None
    max_element_error: float | None = None
    min_token_agreement: float | None = None  # lower-precision decoders with state: greedy tokens equal to float32's
    max_error_ratio: float | None = None  # lower precisions: drift from eager over the precision's own rounding


def _input_to_plain(spec: TensorInput) -> dict[str, Any]:
    if spec.constant is not None:
        return {"value": spec.constant}
    return {"shape": list(spec.shape), "dtype": spec.dtype, "range": list(spec.value_range or [])}


def _input_from_plain(data: dict[str, Any]) -> TensorInput:
    if "value" in data:
        return TensorInput(constant=data["value"])
    value_range = tuple(data["range"])
    return TensorInput(tuple(data["shape"]), data["dtype"], (value_range[0], value_range[1]) if value_range else None)


def _dims_to_plain(dims: dict[str, Dim]) -> dict[str, Any]:
    return {d.name: {"min": d.min, "max": d.max, "buckets": list(d.buckets), "dynamic": d.dynamic, "axes": [list(a) for a in d.axes]} for d in dims.values()}


def _dims_from_plain(data: dict[str, Any]) -> dict[str, Dim]:
    return {name: Dim(name, d["min"], d["max"], axes=tuple((which, axis) for which, axis in d["axes"]), buckets=tuple(d["buckets"]), dynamic=d["dynamic"]) for name, d in data.items()}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """One `[tool.hatch.build.hooks.precompile.models.<name>]` table, checked
    (engine/config.py). The fields are in the reference's order."""

    name: str
    factory: str = field(metadata=setting("factory", IMPORT_PATH, "(required)", "returns the `torch.nn.Module`; imported from the project's source (src or flat layout)", compiled=True))
    args: tuple[TensorInput, ...] = field(
        default=(),
        metadata=setting(
            "inputs",
            "array of input tables",
            "(none)",
            "positional inputs, in order",
            compiled=True,
            to_plain=lambda args: [_input_to_plain(i) for i in args],
            from_plain=lambda data: tuple(_input_from_plain(i) for i in data),
        ),
    )
    kwargs: dict[str, TensorInput] = field(
        default_factory=dict,
        metadata=setting(
            "kwargs",
            "table of input tables",
            "(none)",
            'keyword inputs, e.g. `kwargs = { attention_mask = { shape = ["batch", 64], dtype = "int64" } }`',
            compiled=True,
            to_plain=lambda kwargs: {k: _input_to_plain(i) for k, i in kwargs.items()},
            from_plain=lambda data: {k: _input_from_plain(i) for k, i in data.items()},
        ),
    )
    example_inputs: str | None = field(
        default=None,
        metadata=setting(
            "example-inputs",
            IMPORT_PATH,
            "(none)",
            "instead of `inputs`/`kwargs`: returns `(args, kwargs)` of real tensors (nested tuples, lists and dicts allowed)",
            compiled=True,
        ),
    )
    example_steps: str | None = field(
        default=None,
        metadata=setting(
            "example-steps",
            IMPORT_PATH,
            "the example inputs twice more",
            "for a model with state (buffers its forward updates, such as a KV cache): returns an iterable of `(args, kwargs)` "
            "calls made after the example inputs (a decoder's next-token steps); the build checks each call's outputs and the "
            "state after the last against eager (see [Models with state](usage.md#models-with-state-kv-caches-and-generation))",
        ),
    )
    dims: dict[str, Dim] = field(
        default_factory=dict,
        metadata=setting("dims", "table", "`{}`", "the named dims: dynamic ranges and/or buckets, see below", compiled=True, keyed=True, to_plain=_dims_to_plain, from_plain=_dims_from_plain),
    )
    weights: Weights = field(
        default="embed",
        metadata=setting(
            "weights",
            CHOICES,
            '`"embed"`',
            "`embed`: ship parameters, buffers and constants as safetensors; `factory`: ship nothing but constants, call the factory at load "
            "(an int8 model has its weights compiled in: only its eager fallback calls the factory)",
        ),
    )
    dtype: ModuleDtype | None = field(
        default=None,
        metadata=setting(
            "dtype",
            CHOICES,
            "(unchanged)",
            "convert the module's floating-point state before capture",
            compiled=True,
            keyed=True,
        ),
    )
    options: dict[str, Any] = field(
        default_factory=dict,
        metadata=setting(
            "options",
            "table",
            "`{}`",
            "inductor options, each `true` or `false`: `max_autotune`, `max_autotune_gemm`, `epilogue_fusion`, "
            "`aggressive_fusion`, `coordinate_descent_tuning` (see [Inductor options](#inductor-options))",
            compiled=True,
            keyed=True,
        ),
    )
    fallback: Fallback = field(default="eager", metadata=setting("fallback", CHOICES, "the table's `fallback`", "per-model override"))
    cpu_targets: tuple[str, ...] = field(default=DEFAULT_CPU_TARGETS, metadata=setting("cpu-targets", "array", "the table's `cpu-targets`", "per-model override", to_plain=list, from_plain=tuple))
    accuracy: AccuracyBounds = field(
        default=AccuracyBounds(),
        metadata=setting(
            "accuracy",
            "table",
            "by `dtype`",
            "`{ max-relative-error = 1e-4, min-cosine = 0.999, max-element-error = 1e-4 }`: the worst each floating output may be"
            " against the float32 model; for a lower precision, `max-error-ratio` (its error against eager over its precision's own, default 3)"
            " and `min-token-agreement` for decoders (see [Accuracy checks](#accuracy-checks)); a bound left out keeps its default",
            to_plain=lambda bounds: {k: v for k, v in vars(bounds).items() if v is not None},
            from_plain=lambda data: AccuracyBounds(**data),
        ),
    )
    quantize: Quantization | None = field(
        default=None,
        metadata=setting(
            "quantize",
            CHOICES,
            "(none)",
            "`int8`: quantize the float32 module's weights and activations (PT2E, torchao's X86InductorQuantizer; see [int8](#int8)); "
            '`int8-weight-only`, `int4-weight-only`: store the linear layers\' weights in 8 or 4 bits, with `dtype = "bfloat16"` '
            "activations, for decoders (see [Weight-only int8 and int4](#weight-only-int8-and-int4)); "
            "`int8-dynamic`: int8 weights and each call's inputs to the linear layers rounded to int8, multiplied in int8 (VNNI), "
            'with `dtype = "bfloat16"` between them: the fastest int8 for decoders (see [int8-dynamic](#int8-dynamic)); '
            "each needs torchao in the build environment",
            compiled=True,
            keyed=True,
        ),
    )
    group_size: int | None = field(
        default=None,
        metadata=setting(
            "group-size",
            "integer",
            f"`{DEFAULT_INT4_GROUP_SIZE}`",
            "with `int4-weight-only`: 32, 64 or 128 weights share a scale and a zero point; smaller is closer to bfloat16 and reads a little more per token. "
            "The output layer (the logits) is stored in int8, as llama.cpp keeps it at 6 or 8 bits",
            compiled=True,
            keyed=True,
        ),
    )
    calibration: str | None = field(
        default=None,
        metadata=setting(
            "calibration",
            IMPORT_PATH,
            "the example inputs",
            "with `quantize`: returns an iterable of `(args, kwargs)` batches, shaped like the inputs, that set the int8 scales;"
            " with four or more, every fourth is held out of them and the accuracy check runs on it",
            compiled=True,
        ),
    )
    outputs: OutputForm = field(
        default="classes",
        metadata=setting(
            "outputs",
            CHOICES,
            '`"classes"`',
            "`plain`: `load_compiled` returns dicts and tuples where the module returns library output classes or named tuples, so their library (transformers: about 1 s) is never imported",
        ),
    )

    cpp_form: bool = field(
        default=True,
        metadata=setting(
            "cpp-form",
            BOOLEAN,
            "`true` (the table's `cpp-form`)",
            "also compile each variant's graph as C++, into one library per variant (AOTInductor's model container, "
            "weights bound from the weights file at load), which `load_compiled` then loads first: each call crosses into C++ once, "
            'and it alone runs on NumPy arrays without torch (`arrays="numpy"`; see [The C++ form](#the-c-form)); '
            "adds a compile of 6-25 s per variant; `false` leaves it out",
            compiled=True,
            keyed=True,
        ),
    )
    torch_free: bool = field(
        default=False,
        metadata=setting(
            "torch-free",
            BOOLEAN,
            "`false`",
            "build the C++ form without libtorch (AOTInductor's `link_libtorch = false`), on a shim the wheel builds of its own, "
            "so that it runs on NumPy arrays in an environment without torch (see [The torch-free form](usage.md#the-torch-free-form)); "
            "a model whose graph calls an operator the shim does not give builds the usual C++ form instead under the fallback policy, "
            'and fails with `fallback = "error"`; needs `cpp-form`',
            compiled=True,
            keyed=True,
        ),
    )

    def to_json(self) -> dict[str, Any]:
        """The plain-data form handed to the compile worker and kept in a part."""
        return {"name": self.name} | {name: s.to_plain(getattr(self, name)) for name, s in model_settings(type(self)).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelConfig:
        """The config back from `to_json`'s form, in the compile worker."""
        return cls(name=data["name"], **{name: s.from_plain(data[name]) for name, s in model_settings(cls).items()})

    @property
    def quantizes_linears(self) -> bool:
        """Whether the linear layers alone are quantized, on the bfloat16 module
        (`quantize = "int8"` quantizes the whole float32 graph with PT2E)."""
        return self.quantize in LINEAR_QUANTIZATIONS

    def shape_variants(self) -> list[dict[str, int]]:
        """One entry per artifact shape (per CPU target): see `shape_variants`."""
        return shape_variants(self.dims)

    def compiled_json(self) -> dict[str, Any]:
        """The settings that decide what is compiled, in `to_json`'s form."""
        plain = self.to_json()
        return {name: plain[name] for name, s in model_settings(type(self)).items() if s.compiled}

    def keyed_json(self) -> dict[str, Any]:
        """The settings the artifact key hashes as set, in `to_json`'s form."""
        plain = self.to_json()
        return {name: plain[name] for name, s in model_settings(type(self)).items() if s.keyed}


def shape_variants(dims: dict[str, Dim]) -> list[dict[str, int]]:
    """One entry per artifact shape: the dims fixed to a bucket size (the others
    stay dynamic), most dynamic first."""
    variants: list[dict[str, int]] = [{}]
    for name, dim in dims.items():
        variants = [{**v, **({name: size} if size is not None else {})} for v in variants for size in dim.variants()]
    return sorted(variants, key=len)


def model_settings(config_class: type[ModelConfig] = ModelConfig) -> dict[str, Setting]:
    """Each field's Setting, by field name, in the reference's order."""
    return {f.name: f.metadata["setting"] for f in dataclasses.fields(config_class) if "setting" in f.metadata}


def reference_type(config_class: type[ModelConfig], field_name: str) -> str:
    """How the configuration reference shows a field's type: a `Literal` field's
    values, so that they cannot drift from what the parser accepts; else its Setting's."""
    allowed = choices(config_class, field_name)
    return " \\| ".join(f'`"{value}"`' for value in allowed) if allowed else model_settings(config_class)[field_name].type


def choices(config_class: type[ModelConfig], field_name: str) -> tuple[str, ...]:
    """The values a `Literal`-typed field allows (`Literal[...] | None` too); () for other fields."""
    hint = typing.get_type_hints(config_class)[field_name]
    literals = [arg for arg in (typing.get_args(hint) if typing.get_origin(hint) is not Literal else (hint,)) if typing.get_origin(arg) is Literal]
    return tuple(value for literal in literals for value in typing.get_args(literal))
