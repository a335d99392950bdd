"""The manifest's shape, typed: one definition for the build that writes
`manifest.json` and the loader that reads it.

They are TypedDicts, so that the JSON is the objects (nothing to convert on
either side) and mypy checks every key both sides use. Keys marked NotRequired
are added by a later step of the build, or are present only in some entries, as
their comments say.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

# A call's or a result's nested structure, as `torch_internals.treespec_to_json`
# writes it: "leaf", "tuple", "list" or "namedtuple" (children), "dict" or
# "keyed" (keys and children), with the import path of a named tuple's or a
# keyed class's `class` ("module:Qualified.name").
TreeSpec = TypedDict(
    "TreeSpec",
    {"type": str, "children": NotRequired[list["TreeSpec"]], "keys": NotRequired[list[str]], "class": NotRequired[str]},
)


class InputLeaf(TypedDict):
    """One flat input of the compiled graph, named after forward()'s parameters:
    a tensor (dtype, device, shape, layout) or a constant compiled in (value)."""

    name: str
    value: NotRequired[int | float | bool | str | None]  # instead of the tensor's keys: calls must pass this same constant
    dtype: NotRequired[str]  # "float32"
    device: NotRequired[str]
    shape: NotRequired[list[int | str]]  # sizes, or the names of declared dims
    layout: NotRequired[str]  # "contiguous" or "channels_last"
    below: NotRequired[int]  # an integer input the graph indexes a size with (token ids, cache positions): values in [0, below)


class OutputLeaf(TypedDict):
    dtype: str
    shape: list[int | str]  # sizes, dims' names, or torch's symbol where no dim is one


class CallInputs(TypedDict):
    tree: TreeSpec  # (args, kwargs)
    leaves: list[InputLeaf]


class CallOutputs(TypedDict):
    tree: TreeSpec
    leaves: list[OutputLeaf]


class DimRecord(TypedDict):
    """A declared dim: its range, its bucket sizes, and whether a variant keeps it dynamic."""

    min: int
    max: int
    buckets: list[int]
    dynamic: bool


class OutputAccuracy(TypedDict, total=False):
    """One output's figures: `equal` for an integer output (it must equal eager's),
    else relative error, cosine similarity and element error (worker/accuracy.py)."""

    equal: bool
    relative_error: float
    cosine: float
    element_error: float


class BatchAccuracy(TypedDict):
    batch: str  # which calibration batch, in the build's words
    outputs: list[OutputAccuracy]


class AccuracyRecord(TypedDict):
    """How an artifact's outputs compared on the example inputs (worker/accuracy.py)."""

    against: str  # "eager", or "float32 eager" for a lower-precision model
    outputs: list[OutputAccuracy]
    batches: NotRequired[list[BatchAccuracy]]  # int8 with `calibration`: the batches it was also checked on
    calls: NotRequired[list[list[OutputAccuracy]]]  # a lower precision: each call after the first, against float32
    precision: NotRequired[PrecisionRecord]  # a lower precision: its error against eager over its own rounding
    token_agreement: NotRequired[TokenAgreement]
    vnni: NotRequired[bool]  # int8, int8-dynamic: whether the CPU it was checked on had VNNI (`_manifest.VNNI`), where int8 products do not saturate


class TokenAgreement(TypedDict):
    """A decoder's (quantized linear layers) most likely token at each position of the build's
    calls (the first output's argmax over its last axis), against float32's."""

    agreed: int
    positions: int
    eager_agreed: NotRequired[int]  # eager's own, in the same precision


class RoundingRatio(TypedDict):
    """One output's (or state buffer's) relative error against eager over all the
    build's calls (`drift`), over its precision's own against float32 (`rounding`)."""

    drift: float
    rounding: float
    ratio: float


class PrecisionRecord(TypedDict):
    calls: int
    outputs: list[RoundingRatio | None]  # None: an integer output (it equals eager's)
    state: NotRequired[dict[str, RoundingRatio | None]]


class WeightSpec(TypedDict):
    kind: str  # the graph signature's input kind: "PARAMETER", "BUFFER" or "CONSTANT_TENSOR"
    shape: list[int]
    dtype: str


class TorchAndPython(TypedDict):
    """The torch build and Python of a process, as the build records them and the
    loader compares them (`_manifest.torch_and_python`, called by both)."""

    torch: str  # "2.13.0+cpu"
    torch_git: str
    python: str  # "3.11"
    platform: str  # sysconfig's, "linux-x86_64"


class BuiltWith(TorchAndPython):
    """What an artifact depends on; the loader compares it with the running process."""

    torch_key: str  # the hash of torch's sources that inductor keys on
    machine: str


class NativeNeeds(TypedDict):
    """What the kernels need from the system, read from their ELF files."""

    glibc: str | None
    glibcxx: str | None
    libraries: list[str]
    policy: str  # the manylinux policy the kernels meet


class LeanRecord(TypedDict):
    """An artifact's lean module: its file, or why the build refused one."""

    file: NotRequired[str]
    extern_kernels: NotRequired[list[str]]
    inputs_to_check: NotRequired[list[int]]
    refused: NotRequired[str]  # instead of the keys above
    size: NotRequired[int]  # added at assembly, with sha256
    sha256: NotRequired[str]


SHIM_PROVIDER = "wheel"  # a CppRecord's `provider`: the wheel's own shim (`_precompiled/libaoti_shim.so`)


class CppRecord(TypedDict):
    """An artifact's C++ form (`runtime/_cpp.py`): its library, or why the build has none."""

    file: NotRequired[str]  # `<model>/cpu_avx2_cpp.so`
    constants: NotRequired[dict[str, str]]  # the library's name for each constant -> its weight's state-dict name
    ops: NotRequired[FileRecord]  # `cpu_avx2_cpp.json`, the ops it calls through AOTInductor's proxy executor, where any
    returned_inputs: NotRequired[list[list[int]]]  # [output, input]: outputs that are an input as it is (the caller's is handed back)
    provider: NotRequired[str]  # SHIM_PROVIDER: the torch-free form, linked against no torch library, run on the wheel's own shim
    references: NotRequired[list[str]]  # a torch-free library's: what it takes from the shim (the shim is built for these)
    torch_free_refused: NotRequired[str]  # why a torch-free model's library is the usual one (what the wheel's shim lacks)
    refused: NotRequired[str]  # instead of the keys above
    size: NotRequired[int]  # added at assembly, with sha256
    sha256: NotRequired[str]


class PrepackArgument(TypedDict):
    """One argument of a oneDNN prepack call: a tensor stored in the constants file, or a value."""

    tensor: NotRequired[str]
    value: NotRequired[int | float | list[int] | None]  # instead of `tensor`


class ConstantSpec(TypedDict):
    """One tensor an int8 variant's lean module binds as a global. Either a view of
    a storage the constants file holds as bytes (`storage` with dtype, size, stride,
    offset), or a oneDNN weight in its CPU-specific packed layout, which no file
    can hold: rebuilt at load by calling `prepack` on its `arguments` (the plain
    int8 weight first), as the build's constant folding called it."""

    storage: NotRequired[str]  # the uint8 tensor in the file holding the storage's bytes
    dtype: NotRequired[str]
    size: NotRequired[list[int]]
    stride: NotRequired[list[int]]
    offset: NotRequired[int]
    prepack: NotRequired[str]  # instead of the keys above: "onednn.qlinear_prepack" or "onednn.qconv_prepack"
    arguments: NotRequired[list[PrepackArgument]]


class ArtifactEntry(TypedDict):
    """One shape variant for one CPU target."""

    # The AOTCompiledArtifact, `<model>/cpu_avx2.bin`; for an int8 variant, which
    # has none (a frozen graph cannot be saved as one), the constants its lean
    # module binds, `<model>/cpu_avx2_constants.safetensors`.
    file: str
    specialized: dict[str, int]  # the dims fixed to a bucket size
    device: str
    cpu_target: str
    cpu_features: list[str]  # what the CPU must have
    aten_capability: str  # the ATen kernels' level it was compiled against
    vector_isa: str
    kernels: list[str]  # keys into the model's `kernels`
    native: NativeNeeds
    built_with: BuiltWith
    lean: NotRequired[LeanRecord]  # added once the lean module is written
    cpp: NotRequired[CppRecord]  # the C++ form, where the model asks for one (`cpp-form = true`)
    constants: NotRequired[dict[str, ConstantSpec]]  # an int8 variant's, by global name: it loads in the lean form only
    accuracy: NotRequired[AccuracyRecord]  # added once checked
    size: NotRequired[int]  # added at assembly, with sha256
    sha256: NotRequired[str]


class WeightsEntry(TypedDict):
    """The tensors the graph takes before the user's inputs, and where they are shipped."""

    mode: str  # "embed" or "factory"
    order: list[str]  # state-dict names, in the graph's order
    specs: dict[str, WeightSpec]
    file: NotRequired[str]  # the safetensors file, when any tensor is shipped
    aliases: NotRequired[dict[str, str]]  # tied weights: name -> the name stored
    zeros: NotRequired[list[str]]  # state that starts as zeros: not stored, made by the loader
    size: NotRequired[int]  # added at assembly, with sha256 and the chunk checksums
    sha256: NotRequired[str]
    chunk_size: NotRequired[int]
    chunk_checksums: NotRequired[list[int]]


def has_lean_form(artifact: ArtifactEntry) -> bool:
    """Whether the build shipped this variant's lean module (else it said why not, `lean["refused"]`)."""
    return "file" in artifact["lean"]


def is_torch_free(artifact: ArtifactEntry) -> bool:
    """Whether this variant's C++ form is torch-free: it runs on the wheel's own shim, without torch."""
    return has_cpp_form(artifact) and artifact["cpp"].get("provider") == SHIM_PROVIDER


def has_cpp_form(artifact: ArtifactEntry) -> bool:
    """Whether the build shipped this variant's C++ form (a model container library)."""
    return "file" in artifact.get("cpp", {})


def is_lean_only(artifact: ArtifactEntry) -> bool:
    """An int8 variant: its weights are frozen into constants, and it has no artifact form."""
    return "constants" in artifact


def ships_weights(weights: WeightsEntry) -> bool:
    """Whether the wheel gives any tensor (`weights = "embed"`, or constants): in its
    weights file or as state that starts as zeros."""
    return "file" in weights or bool(weights.get("zeros"))


class FileDigest(TypedDict):
    size: int
    sha256: str


class FileRecord(FileDigest):
    file: str


class SourceModel(TypedDict):
    """What an eager fallback needs of a model: in a source checkout (no manifest)
    read from pyproject.toml, else the manifest's entry."""

    factory: str
    dtype: str | None
    fallback: str


class QuantizationRecord(TypedDict):
    """A model's quantized linear layers (`worker/linears.py`)."""

    scheme: str  # "int8-weight-only", "int4-weight-only" or "int8-dynamic"
    layers: list[str]  # the linear layers whose weights are stored quantized
    left: dict[str, str]  # linear layers left in bfloat16: name -> why
    group_size: NotRequired[int]  # int4: weights per scale and zero point
    int8: NotRequired[dict[str, str]]  # int4: layers stored in int8 instead: name -> why (the output layer)
    smoothed_on: NotRequired[int]  # int8-dynamic: the calls its inputs' smoothing was measured on
    shared_input: NotRequired[dict[str, list[str]]]  # layers quantized as one, taking the same input: its name -> theirs


class ModelEntry(SourceModel):
    """One model: how it is called, its weights, and its artifacts."""

    outputs_form: str  # "classes" or "plain"
    quantize: str | None  # "int8": the graphs take no weights (they are frozen in); `weights` is for the eager fallback
    quantization: NotRequired[QuantizationRecord]  # the schemes that quantize linear layers
    state: list[str]  # the buffers the graphs update in place (a KV cache), among `weights`: each handle has its own
    inputs: CallInputs
    outputs: CallOutputs
    dims: dict[str, DimRecord]
    weights: WeightsEntry
    op_libraries: dict[str, str]
    artifacts: list[ArtifactEntry]
    kernels: NotRequired[dict[str, FileRecord]]  # added at assembly: key -> its shipped file


class Manifest(TypedDict):
    format: int
    built_by: str
    package: str
    models: dict[str, ModelEntry]
    shim: NotRequired[FileRecord]  # the wheel's own shim (`libaoti_shim.so`), where a variant is torch-free
    openmp: NotRequired[FileRecord]  # with it, the OpenMP runtime it links (`libgomp_so_1.so`)
