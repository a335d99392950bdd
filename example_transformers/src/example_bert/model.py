"""A BERT-style encoder, a GPT-2 style decoder and a Llama decoder with a static
key/value cache, from transformers, from small configs with fixed weights."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

CONFIG = BertConfig(
    vocab_size=1000,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=64,
)


def build_bert() -> BertModel:
    """Weights from seed 0, so every build and test sees the same model."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return BertModel(CONFIG).eval()


GPT2_CONFIG = GPT2Config(
    vocab_size=1000,
    n_embd=64,
    n_layer=3,
    n_head=4,
    n_positions=128,
    use_cache=False,  # outputs are the logits only, no key/value cache object
    attn_implementation="sdpa",
)


def build_gpt2() -> GPT2LMHeadModel:
    """A GPT-2 style decoder (causal attention, input and output embeddings tied),
    weights from seed 0."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2_CONFIG).eval()


# A Llama decoder that generates: its key/value cache is static, in buffers, through
# transformers' own export wrapper; the compiled model updates it in place.
LLAMA_CONFIG = LlamaConfig(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
CACHE_LENGTH = 128


def build_llama_lm() -> LlamaForCausalLM:
    """The language model itself, weights from seed 0."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lm = LlamaForCausalLM(LLAMA_CONFIG).eval()
    lm.generation_config.cache_implementation = "static"
    return lm


def build_llama() -> torch.nn.Module:
    """What ships: forward(input_ids=..., cache_position=...) -> logits, batch 1,
    with a static cache of CACHE_LENGTH positions in its buffers."""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    return TorchExportableModuleForDecoderOnlyLM(build_llama_lm(), batch_size=1, max_cache_len=CACHE_LENGTH).model.eval()


def llama_prompt() -> tuple[tuple, dict]:
    """The build's example call: a prompt of 5 tokens."""
    ids = torch.randint(0, 1000, (1, 5), generator=torch.Generator().manual_seed(0))
    return (), {"input_ids": ids, "cache_position": torch.arange(5)}


def llama_steps() -> list[tuple[tuple, dict]]:
    """The build's next-token calls after the prompt, checked against eager with the cache they fill."""
    generator = torch.Generator().manual_seed(1)
    return [((), {"input_ids": torch.randint(0, 1000, (1, 1), generator=generator), "cache_position": torch.tensor([5 + i])}) for i in range(3)]
