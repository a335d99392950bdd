"""A Llama-style decoder of 92 M parameters with a static KV cache, for
benchmarks/decode.py: 6 layers, 768 wide, 12 heads of 64, RMSNorm, rotary
position embeddings computed from `cache_position`, a SwiGLU MLP (2048), a
32000-token vocabulary and an untied head; random weights with a fixed seed
(the build reaches no model hub). And the calls its build checks: a prompt and
three next-token steps.

`forward(input_ids, cache_position) -> logits (batch, seq, vocab)`: the prompt in
one call (cache_position = arange(prompt)), then each new token in a call of its
own at the next position. The cache is in non-persistent buffers
(MAX_BATCH, heads, max_len, 64) that a call writes at `cache_position` and attends
over up to it.
"""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, LAYERS, INTERMEDIATE = 32000, 768, 12, 6, 2048
HEAD_DIM = WIDTH // HEADS
MAX_BATCH = 1
ROPE_THETA = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotary(cache_position: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (seq, HEAD_DIM) of the positions, computed in float32 whatever the
    model's dtype (as Llama's are)."""
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, device=cache_position.device, dtype=torch.float32) / HEAD_DIM)
    angles = cache_position.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class Layer(nn.Module):
    def __init__(self, max_len: int) -> None:
        super().__init__()
        self.attention_norm, self.mlp_norm = RMSNorm(WIDTH), RMSNorm(WIDTH)
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(WIDTH, INTERMEDIATE, bias=False), nn.Linear(WIDTH, INTERMEDIATE, bias=False)
        self.down = nn.Linear(INTERMEDIATE, WIDTH, bias=False)
        shape = (MAX_BATCH, HEADS, max_len, HEAD_DIM)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x: torch.Tensor, cache_position: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.attention_norm(x)
        q, k, v = (proj(h).view(b, s, HEADS, HEAD_DIM).transpose(1, 2) for proj in (self.q, self.k, self.v))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        self.k_cache[:b].index_copy_(2, cache_position, k)
        self.v_cache[:b].index_copy_(2, cache_position, v)
        attention = F.scaled_dot_product_attention(q, self.k_cache[:b], self.v_cache[:b], attn_mask=mask)
        x = x + self.o(attention.transpose(1, 2).reshape(b, s, WIDTH))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    """forward(input_ids, cache_position) -> logits, for the prompt and for each next token."""

    def __init__(self, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Layer(max_len) for _ in range(LAYERS))
        self.norm, self.head = RMSNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)
        for module in self.modules():  # small enough that the logits are not degenerate
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        cos, sin = rotary(cache_position, x.dtype)
        mask = torch.arange(self.max_len, device=input_ids.device)[None, :] <= cache_position[:, None]
        for layer in self.layers:
            x = layer(x, cache_position, cos, sin, mask)
        return self.head(self.norm(x))


def decoder() -> nn.Module:
    """Cache of 1024 positions (float32; the bfloat16 build converts it)."""
    torch.manual_seed(0)
    return Decoder(max_len=1024).eval()


def decoder_2048() -> nn.Module:
    """The same weights, a cache of 2048 positions."""
    torch.manual_seed(0)
    return Decoder(max_len=2048).eval()


def prompt() -> tuple[tuple, dict]:
    """A prompt of 7 tokens, batch 1."""
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(1))
    return (ids, torch.arange(7)), {}


def steps() -> list[tuple[tuple, dict]]:
    """Three next-token steps after `prompt`."""
    generator = torch.Generator().manual_seed(2)
    return [((torch.randint(0, VOCAB, (1, 1), generator=generator), torch.tensor([7 + i])), {}) for i in range(3)]
