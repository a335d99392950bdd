"""Greedy generation from a decoder with a static KV cache in its state.

The decoder is called as such decoders are written for torch.export (and as
transformers' export wrapper calls them): `model(input_ids, cache_position)`,
positionally or by keyword, returning logits of shape (batch, seq, vocab). The
prompt goes in one call, then each new token in a call of its own at the next
position; the cache in the model's state holds the rest. This is what
`CompiledModel.generate` runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def greedy(call: Callable[[Any, Any], Any], input_ids: Any, max_new_tokens: int, stop_token: int | None) -> Any:
    """The new tokens (batch, n) after the prompt `input_ids` (batch, seq), each the
    argmax of the last position's logits; n is `max_new_tokens`, or fewer where
    every row has produced `stop_token` (rows that stopped earlier repeat it).
    `call(ids, positions)` runs the model on the state it left. The prompt and
    the tokens must fit the cache: a position past it raises IndexError."""
    import torch

    batch, length = input_ids.shape
    logits = call(input_ids, torch.arange(length))
    tokens: list[Any] = []
    finished = torch.zeros(batch, dtype=torch.bool)
    for step in range(max_new_tokens):
        token = logits[:, -1].argmax(-1)
        if stop_token is not None:
            token = torch.where(finished, stop_token, token)
            finished |= token == stop_token
        tokens.append(token)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        logits = call(token[:, None], torch.tensor([length + step]))
    return torch.stack(tokens, dim=1) if tokens else input_ids.new_empty((batch, 0))
