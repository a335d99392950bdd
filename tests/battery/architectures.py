"""The architecture battery: what each model is, how it is declared, what to expect.

Each `Architecture` becomes one model of the battery project (`table()` writes its
precompile table), is built by the real hook, loaded in a fresh process with no
compiler and compared with eager at each dim's min, max and a size between
(`sizes()`). One whose capture torch refuses declares `refused`: the text the
build must say, in the configuration's terms; it is built alone, since a refused
model fails its whole build.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

Input = dict[str, Any]  # a declared input, as in the configuration: shape, dtype, range


@dataclass(frozen=True)
class Architecture:
    name: str  # the model's name and its factory in models.py
    family: str  # the docs table's grouping
    what: str  # one line for the docs table
    inputs: list[Input]
    dims: dict[str, tuple[int, int]]  # name -> (min, max)
    kwargs: dict[str, Input] = field(default_factory=dict)
    refused: str | None = None  # the build's refusal, for models torch cannot capture
    form: str = "lean"  # the form load_compiled picks: "lean", or "artifact" where the build refuses lean
    options: dict[str, bool] = field(default_factory=dict)
    factory_name: str = ""  # the factory in models.py, when not the model's name
    dtype: str | None = None  # compiled in this precision; compared with the float32 module
    quantize: str | None = None  # "int8": quantized (PT2E) and compiled frozen; compared with the float32 module
    calibration: str = ""  # an int8 model's calibration batches: their function in models.py ("": the example inputs)
    cpp_refused: str = ""  # declared with `cpp-form = true`, which the build refuses in these words (it ships lean)

    @property
    def factory(self) -> str:
        return self.factory_name or self.name


TOKENS: Input = {"shape": ["batch", "seq"], "dtype": "int64", "range": [0, 100]}
MASK: Input = {"shape": ["batch", "seq"], "dtype": "int64", "range": [0, 2]}
SEGMENTS: Input = MASK  # token type ids: which of a sentence pair each token belongs to
TEXT_DIMS = {"batch": (1, 4), "seq": (2, 32)}


def image(*shape: int | str) -> Input:
    return {"shape": ["batch", *shape]}


ARCHITECTURES = [
    # transformers text encoders
    Architecture("bert", "transformers: text encoders", "BertModel", [TOKENS], TEXT_DIMS, {"attention_mask": MASK}),
    Architecture("distilbert", "transformers: text encoders", "DistilBertModel", [TOKENS], TEXT_DIMS, {"attention_mask": MASK}),
    Architecture("albert", "transformers: text encoders", "AlbertModel (shared layers, factorized embeddings)", [TOKENS], TEXT_DIMS, {"attention_mask": MASK}),
    Architecture("deberta_v2", "transformers: text encoders", "DebertaV2Model (relative positions, disentangled attention)", [TOKENS], TEXT_DIMS, {"attention_mask": MASK}),
    Architecture("t5_encoder", "transformers: text encoders", "T5EncoderModel (relative position buckets)", [TOKENS], TEXT_DIMS, {"attention_mask": MASK}),
    # transformers decoders
    Architecture("llama", "transformers: decoders", "LlamaModel (rotary, grouped-query attention)", [TOKENS], TEXT_DIMS, {"attention_mask": MASK}),
    Architecture("mistral", "transformers: decoders", "MistralModel (rotary, grouped-query, sliding window)", [TOKENS], TEXT_DIMS, {"attention_mask": MASK}),
    Architecture(
        "mixtral",
        "transformers: decoders",
        "MixtralModel (mixture of experts, 2 of 4 per token)",
        [TOKENS],
        TEXT_DIMS,
        {"attention_mask": MASK},
        cpp_refused="its graph calls Python custom ops (transformers::grouped_mm_fallback), which a C++ container cannot call",
    ),
    Architecture(
        "switch_transformers",
        "transformers: decoders",
        "SwitchTransformersEncoderModel (sparse experts), token ids only",
        [TOKENS],
        TEXT_DIMS,
        refused="torch.export cannot capture the model even with every declared dim static, so no `dims` setting helps",
    ),
    # transformers in bfloat16, held to the float32 model (relative error, cosine)
    Architecture(
        "minilm_bf16",
        "transformers: bfloat16",
        "BertModel the size of all-MiniLM-L6-v2 (6 layers, 384 wide), in bfloat16",
        [TOKENS],
        TEXT_DIMS,
        {"attention_mask": MASK},
        factory_name="minilm",
        dtype="bfloat16",
    ),
    Architecture(
        "llama_bf16",
        "transformers: bfloat16",
        "LlamaModel (rotary, grouped-query attention), in bfloat16",
        [TOKENS],
        TEXT_DIMS,
        {"attention_mask": MASK},
        factory_name="llama",
        dtype="bfloat16",
    ),
    # int8 (PT2E with torchao), held to the float32 model; loads lean only (no artifact form)
    Architecture(
        "llama_int8",
        "int8 (PT2E)",
        "LlamaModel (rotary, grouped-query attention), quantized to int8",
        [TOKENS],
        TEXT_DIMS,
        {"attention_mask": MASK},
        factory_name="llama",
        quantize="int8",
    ),
    Architecture(
        "gpt2_int8",
        "int8 (PT2E)",
        "GPT2Model with its Conv1D layers made nn.Linear in the factory, quantized to int8",
        [TOKENS],
        TEXT_DIMS,
        {"attention_mask": MASK},
        factory_name="gpt2_as_linear",
        quantize="int8",
    ),
    Architecture(
        "embedder_int8",
        "int8 (PT2E)",
        "A sentence embedder: BertModel (its pooler unused), mean pooling, L2 norm, quantized to int8",
        [TOKENS],
        TEXT_DIMS,
        {"attention_mask": MASK},
        factory_name="sentence_embedder",
        quantize="int8",
        calibration="sentences",
    ),
    Architecture(
        "reranker_int8",
        "int8 (PT2E)",
        "A cross-encoder reranker: BertForSequenceClassification on a sentence pair, one logit, quantized to int8",
        [TOKENS],
        TEXT_DIMS,
        {"attention_mask": MASK, "token_type_ids": SEGMENTS},
        factory_name="reranker",
        quantize="int8",
        calibration="sentence_pairs",
    ),
    Architecture("vit_int8", "int8 (PT2E)", "ViTModel, quantized to int8", [image(3, 32, 32)], {"batch": (1, 4)}, factory_name="vit", quantize="int8"),
    Architecture(
        "resnet_int8",
        "int8 (PT2E)",
        "ResNetModel (convolutions with batch norm, max pooling), quantized to int8",
        [image(3, 32, 32)],
        {"batch": (1, 4)},
        factory_name="resnet",
        quantize="int8",
    ),
    Architecture(
        "conv_maxpool_int8",
        "int8 (PT2E)",
        "Conv2d, ReLU, MaxPool2d, Linear, quantized to int8",
        [image(3, 16, 16)],
        {"batch": (1, 8)},
        factory_name="conv_maxpool",
        quantize="int8",
    ),
    # transformers vision
    Architecture("vit", "transformers: vision", "ViTModel", [image(3, 32, 32)], {"batch": (1, 4)}),
    Architecture(
        "vit_any_size",
        "transformers: vision",
        "ViTModel with a dynamic image size",
        [image(3, "height", "width")],
        {"batch": (1, 4), "height": (16, 64), "width": (16, 64)},
        factory_name="vit",
        refused="even without torch.export: ValueError: Input image size (16*16) doesn't match model (32*32).",
    ),
    Architecture("swin", "transformers: vision", "SwinModel (shifted windows, hierarchical)", [image(3, 32, 32)], {"batch": (1, 4)}),
    Architecture("resnet", "transformers: vision", "ResNetModel (max pooling)", [image(3, 32, 32)], {"batch": (1, 4)}),
    Architecture("convnext", "transformers: vision", "ConvNextModel", [image(3, 32, 32)], {"batch": (1, 4)}),
    # transformers audio
    Architecture("wav2vec2", "transformers: audio", "Wav2Vec2Model (raw waveform)", [{"shape": ["batch", "samples"]}], {"batch": (1, 4), "samples": (400, 1600)}),
    Architecture("whisper_encoder", "transformers: audio", "WhisperModel's encoder (log-mel features)", [image(16, 64)], {"batch": (1, 4)}),
    Architecture(
        "whisper_any_length",
        "transformers: audio",
        "WhisperModel's encoder with a dynamic number of frames",
        [image(16, "frames")],
        {"batch": (1, 4), "frames": (16, 64)},
        factory_name="whisper_encoder",
        refused="Whisper expects the mel input features to be of length 64, but found 17.",
    ),
    # transformers, two kinds of input
    Architecture(
        "clip",
        "transformers: text and image",
        "CLIPModel (token ids and an image)",
        [TOKENS, image(3, 32, 32)],
        TEXT_DIMS,
        {"attention_mask": MASK},
        form="artifact",  # logits_per_text is a view of logits_per_image, which AOTAutograd's wrapper rebuilds
    ),
    # torch.nn built-ins
    Architecture("conv_maxpool", "torch.nn", "Conv2d, ReLU, MaxPool2d, Linear", [image(3, 16, 16)], {"batch": (1, 8)}),
    Architecture("recurrent", "torch.nn", "LSTM (2 layers, bidirectional), GRU, over 4 steps", [{"shape": ["batch", 4, 8]}], {"batch": (1, 4)}),
    Architecture(
        "recurrent_any_length",
        "torch.nn",
        "LSTM and GRU over a dynamic number of steps",
        [{"shape": ["batch", "seq", 8]}],
        {"batch": (1, 4), "seq": (2, 16)},
        factory_name="recurrent",
        refused="dims.seq = { min = 2, max = 16 }: torch.export found that the model only works when seq == 2.",
    ),
    Architecture("rnn_cells", "torch.nn", "RNN, LSTMCell, GRUCell, over 4 steps", [{"shape": ["batch", 4, 8]}], {"batch": (1, 4)}),
    Architecture(
        "convolutions",
        "torch.nn",
        "Conv1d, Conv3d, dilated Conv2d, ConvTranspose1d/2d/3d",
        [{"shape": ["batch", 4, "length"]}, image(2, 4, 4, 4), image(2, 8, 8)],
        {"batch": (1, 4), "length": (8, 32)},
    ),
    Architecture(
        "pooling",
        "torch.nn",
        "Max, average, LP and adaptive pooling in 1, 2 and 3 dims; MaxUnpool2d",
        [image(4, 20), image(4, 12, 12), image(4, 8, 8, 8)],
        {"batch": (1, 4)},
    ),
    Architecture(
        "normalization",
        "torch.nn",
        "BatchNorm, InstanceNorm (1, 2, 3 dims), GroupNorm, LayerNorm, RMSNorm, LocalResponseNorm",
        [image(4, 10), image(4, 6, 6), image(4, 4, 4, 4)],
        {"batch": (1, 4)},
    ),
    Architecture(
        "embedding_bags",
        "torch.nn",
        "EmbeddingBag (sum, mean, max, per-sample weights)",
        [{"shape": ["batch", 5], "dtype": "int64", "range": [0, 50]}, {"shape": ["batch", 5]}],
        {"batch": (1, 8)},
    ),
    Architecture(
        "masked_attention",
        "torch.nn",
        "MultiheadAttention with padding and causal masks; masked scaled_dot_product_attention",
        [{"shape": ["batch", "seq", 16]}, {"shape": ["batch", "seq"], "dtype": "bool"}],
        {"batch": (1, 4), "seq": (2, 16)},
    ),
    Architecture(
        "transformer_layers",
        "torch.nn",
        "TransformerEncoder and TransformerDecoder with masks",
        [{"shape": ["batch", "seq", 16]}, {"shape": ["batch", "target", 16]}, {"shape": ["batch", "seq"], "dtype": "bool"}],
        {"batch": (1, 4), "seq": (2, 16), "target": (2, 16)},
    ),
    Architecture(
        "transformer_layers_unhinted",
        "torch.nn",
        "TransformerDecoder given a causal mask without tgt_is_causal=True",
        [{"shape": ["batch", "seq", 16]}, {"shape": ["batch", "target", 16]}, {"shape": ["batch", "seq"], "dtype": "bool"}],
        {"batch": (1, 4), "seq": (2, 16), "target": (2, 16)},
        refused="torch.export cannot capture the model even with every declared dim static, so no `dims` setting helps",
    ),
]


# The options battery: the small vision net once per inductor option hatch-precompile
# accepts (hatch_precompile/options.py), built and loaded like the architectures.
OPTIONS = [
    Architecture(
        f"option_{name}",
        "inductor options",
        f"conv_maxpool with `options = {{ {name} = {str(value).lower()} }}`",
        [image(3, 16, 16)],
        {"batch": (1, 8)},
        options={name: value},
        factory_name="conv_maxpool",
    )
    for name, value in (
        ("max_autotune", True),
        ("max_autotune_gemm", True),
        ("epilogue_fusion", False),
        ("aggressive_fusion", True),
        ("coordinate_descent_tuning", True),
    )
]


def sizes(architecture: Architecture) -> list[dict[str, int]]:
    """The sizes each model is compared with eager at: every dim at its min, every
    dim at its max, and every dim between."""
    dims = architecture.dims
    return [
        {d: low for d, (low, _) in dims.items()},
        {d: (low + high) // 2 + 1 for d, (low, high) in dims.items()},
        {d: high for d, (_, high) in dims.items()},
    ]


def table(architectures: list[Architecture], package: str, cpp_form: bool = False) -> str:
    """The body of `[tool.hatch.build.hooks.precompile]` declaring these models,
    each with `cpp-form = true` where `cpp_form` (else only those declaring a
    refusal of it, and the rest `cpp-form = false`)."""
    lines = ['fallback = "error"', ""]
    for a in architectures:
        lines.append(f"[tool.hatch.build.hooks.precompile.models.{a.name}]")
        lines.append(f'factory = "{package}.models:{a.factory}"')
        lines.append(f"inputs = [{', '.join(_inline(i) for i in a.inputs)}]")
        if a.kwargs:
            lines.append("kwargs = { " + ", ".join(f"{k} = {_inline(v)}" for k, v in a.kwargs.items()) + " }")
        if a.dtype:
            lines.append(f'dtype = "{a.dtype}"')
        if a.quantize:
            lines.append(f'quantize = "{a.quantize}"')
        if a.calibration:
            lines.append(f'calibration = "{package}.models:{a.calibration}"')
        lines.append(f"cpp-form = {str(cpp_form or bool(a.cpp_refused)).lower()}")
        if a.options:
            lines.append("options = { " + ", ".join(f"{k} = {str(v).lower()}" for k, v in a.options.items()) + " }")
        lines.append("dims = { " + ", ".join(f"{d} = {{ min = {lo}, max = {hi} }}" for d, (lo, hi) in a.dims.items()) + " }")
        lines.append("")
    return "\n".join(lines)


def _inline(value: dict[str, Any]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + " }"
