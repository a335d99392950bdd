"""Models with state, as users write them for torch.export: a decoder that keeps
its static KV cache in buffers, transformers decoders through transformers' own
export wrapper (static cache), and a step counter. Each is seeded and in eval
mode; the functions that make calls (prompts and next-token steps) are here too.

This file becomes `statepkg/models.py` in the project the stateful tests build.
"""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, MAX_BATCH, MAX_LEN = 256, 4, 64


class Layer(nn.Module):
    """Pre-norm attention and MLP; the cache holds every position for MAX_BATCH rows,
    and a call writes its positions into the rows of its batch (`[:b]`)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        shape = (MAX_BATCH, heads, MAX_LEN, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x: torch.Tensor, cache_position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(w, dim=-1)
        q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        self.k_cache[:b].index_copy_(2, cache_position, k)
        self.v_cache[:b].index_copy_(2, cache_position, v)
        attention = F.scaled_dot_product_attention(q, self.k_cache[:b], self.v_cache[:b], attn_mask=mask)
        x = x + self.out(attention.transpose(1, 2).reshape(b, s, w))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    """forward(input_ids, cache_position) -> logits, for the prompt and for each next token."""

    def __init__(self, width: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(VOCAB, width), nn.Embedding(MAX_LEN, width)
        self.layers = nn.ModuleList(Layer(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.position(cache_position)
        mask = torch.arange(MAX_LEN, device=input_ids.device)[None, :] <= cache_position[:, None]
        for layer in self.layers:
            x = layer(x, cache_position, mask)
        return self.head(self.norm(x))


def decoder() -> nn.Module:
    torch.manual_seed(0)
    return Decoder().eval()


def prompt() -> tuple[tuple, dict]:
    """Two prompts of 5 tokens."""
    generator = torch.Generator().manual_seed(1)
    return (torch.randint(0, VOCAB, (2, 5), generator=generator), torch.arange(5)), {}


def steps() -> list[tuple[tuple, dict]]:
    """Four next-token steps after `prompt`."""
    generator = torch.Generator().manual_seed(2)
    return [((torch.randint(0, VOCAB, (2, 1), generator=generator), torch.tensor([5 + i])), {}) for i in range(4)]


class Counter(nn.Module):
    """A step counter and a running sum: state that is not a cache."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("total", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        self.total.add_(x.sum(0))
        return self.total / self.calls


def counter() -> nn.Module:
    return Counter().eval()


# -- transformers decoders with a static cache, through transformers' export wrapper --

DECODER_CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
CACHE_LEN = 48


def _static_cache(lm: nn.Module) -> nn.Module:
    """transformers' own export wrapper for decoders with a static cache, batch 1:
    forward(input_ids=..., cache_position=...) -> logits."""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    lm.eval()
    lm.generation_config.cache_implementation = "static"
    return TorchExportableModuleForDecoderOnlyLM(lm, batch_size=1, max_cache_len=CACHE_LEN).model.eval()


def llama_lm() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**DECODER_CONFIG))


def qwen3_lm() -> nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**DECODER_CONFIG, head_dim=8))


def gpt2_lm() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128))


def llama() -> nn.Module:
    return _static_cache(llama_lm())


def qwen3() -> nn.Module:
    return _static_cache(qwen3_lm())


def gpt2() -> nn.Module:
    return _static_cache(gpt2_lm())


def lm_prompt() -> tuple[tuple, dict]:
    """A prompt of 6 tokens, batch 1, by keyword as transformers' wrapper takes it."""
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    return (), {"input_ids": ids, "cache_position": torch.arange(6)}


def lm_steps() -> list[tuple[tuple, dict]]:
    generator = torch.Generator().manual_seed(4)
    return [((), {"input_ids": torch.randint(0, VOCAB, (1, 1), generator=generator), "cache_position": torch.tensor([6 + i])}) for i in range(3)]
