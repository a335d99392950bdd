"""Generation from a decoder with a static KV cache in its state.

The decoder is called as such decoders are written for torch.export (and as
transformers' export wrapper calls them): `model(input_ids, cache_position)`,
positionally or by keyword, returning logits of shape (batch, seq, vocab) or the
last position's alone, (batch, vocab). The prompt goes in one call, then each new
token in a call of its own at the next position; the cache in the model's state
holds the rest. `CompiledModel.generate` and `.stream` run this.

Each token is the most likely one (greedy), or is drawn as transformers'
`generate(do_sample=True)` draws it: the logits divided by `temperature`, then
top-k, then top-p (the smallest set of tokens whose probability reaches `top_p`,
at least one), softmax, and one draw, with the caller's generator or one seeded
with `seed`, so that a run can be repeated. On torch tensors the draw is
`torch.multinomial`'s (a `torch.Generator`), transformers' own; on NumPy arrays
it is the inverse of the distribution at one uniform number per row from a
`numpy.random.Generator` (NumPy has no multinomial draw over a batch of rows):
the same distribution, from other random numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ._arrays import ArrayKind


@dataclass(frozen=True)
class TokenChoice:
    """How each next token is chosen: greedy where `sample` is False."""

    sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    generator: Any = None  # a torch.Generator or numpy.random.Generator for the draws, or None: the global one


def token_choice(do_sample: bool, temperature: float, top_k: int | None, top_p: float | None, generator: Any, seed: int | None, kind: ArrayKind) -> TokenChoice:
    """The checked arguments of `generate`: ValueError names the one out of range."""
    if not do_sample:
        if generator is not None or seed is not None:
            raise ValueError("generator= and seed= draw sampled tokens: pass do_sample=True, or leave them out for greedy tokens")
        return TokenChoice()
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 with do_sample=True (it divides the logits), got {temperature!r}; for the most likely token use do_sample=False")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 (the tokens kept) or None, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (the probability the kept tokens reach) or None, got {top_p!r}")
    if generator is not None and seed is not None:
        raise ValueError("pass generator= or seed=, not both")
    if seed is not None:
        generator = kind.xp.Generator().manual_seed(seed) if kind.NAME == "torch" else kind.xp.random.default_rng(seed)
    return TokenChoice(True, float(temperature), top_k, top_p, generator)


def stop_set(stop_tokens: int | Iterable[int] | None) -> list[int]:
    """The stop tokens as a list: one token id, several, or none."""
    if stop_tokens is None:
        return []
    tokens = [stop_tokens] if isinstance(stop_tokens, int) else list(stop_tokens)
    if not all(isinstance(token, int) and not isinstance(token, bool) and token >= 0 for token in tokens):
        raise ValueError(f"stop_tokens must be a token id or token ids (integers >= 0), got {stop_tokens!r}")
    return tokens


def check_budget(input_ids: Any, max_new_tokens: int, cache_positions: int | None) -> None:
    """Refuse, before any call, a prompt and new tokens that do not fit the cache:
    the prompt takes positions 0..n-1 and each new token but the last one more."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if getattr(input_ids, "ndim", 0) != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a (batch, length) array of token ids with length >= 1, got {getattr(input_ids, 'shape', type(input_ids).__name__)}")
    length = input_ids.shape[1]
    if cache_positions is None:
        return
    if length > cache_positions:
        raise ValueError(f"the prompt has {length} tokens, longer than the cache's {cache_positions} positions; shorten it to {cache_positions} tokens or fewer")
    if length + max_new_tokens - 1 > cache_positions:
        raise ValueError(
            f"the prompt's {length} tokens and {max_new_tokens} new ones need {length + max_new_tokens - 1} positions of the cache, which holds "
            f"{cache_positions}; ask for at most {cache_positions - length + 1} new tokens"
        )


def stream(call: Callable[[Any, Any], Any], input_ids: Any, max_new_tokens: int, how: TokenChoice, stop_tokens: list[int], kind: ArrayKind) -> Iterator[Any]:
    """Yield each new token, (batch,), as soon as it is chosen: `max_new_tokens`, or
    fewer where every row has produced one of `stop_tokens` (a row that stopped
    repeats its stop token). `call(ids, positions)` runs the model on the state
    it left; `kind` is the kind of its arrays."""
    xp = kind.xp
    batch, length = input_ids.shape
    stops = xp.asarray(stop_tokens, dtype=xp.int64)
    finished = kind.zeros(batch, "bool")
    stopped_with = kind.zeros(batch, "int64")
    logits = call(input_ids, kind.positions(0, length))
    for step in range(max_new_tokens):
        token = next_token(last_logits(logits, batch, kind), how, kind)
        if stop_tokens:
            token = xp.where(finished, stopped_with, token)
            newly = ~finished & xp.isin(token, stops)
            stopped_with = xp.where(newly, token, stopped_with)
            finished |= newly
        yield token
        if bool(finished.all()) or step == max_new_tokens - 1:
            return
        logits = call(token[:, None], kind.positions(length + step, length + step + 1))


class Generating:
    """`generate` and `stream` for a loaded decoder (compiled or eager), which
    provides `reset()`, `_decoder_call()`, `_cache_positions()` and `_kind`."""

    _kind: ArrayKind  # the kind of array the handle takes and returns

    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int,
        *,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: Any = None,
        seed: int | None = None,
        stop_tokens: int | Iterable[int] | None = None,
    ) -> Any:
        """Reset the state, then return the new tokens after the prompt `input_ids`
        (batch, length): (batch, n), n = `max_new_tokens` or fewer where every row
        has produced one of `stop_tokens` (a row that stopped repeats its stop
        token). Greedy by default; `do_sample=True` draws each token as
        transformers does (`temperature`, `top_k`, `top_p`), from `generator` or
        a generator seeded with `seed`. A prompt and tokens that do not fit the
        cache, or an argument out of range, raise ValueError before any call."""
        tokens = list(self.stream(input_ids, max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator, seed=seed, stop_tokens=stop_tokens))
        return self._kind.stack_columns(tokens, input_ids.shape[0])

    def stream(
        self,
        input_ids: Any,
        max_new_tokens: int,
        *,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: Any = None,
        seed: int | None = None,
        stop_tokens: int | Iterable[int] | None = None,
    ) -> Iterator[Any]:
        """As `generate`, but an iterator of each new token, (batch,), yielded as
        soon as it is chosen (for a chat UI). The arguments are checked now; the
        state is reset when the first token is asked for."""
        how, stops = token_choice(do_sample, temperature, top_k, top_p, generator, seed, self._kind), stop_set(stop_tokens)
        check_budget(input_ids, max_new_tokens, self._cache_positions())

        def tokens() -> Iterator[Any]:
            self.reset()
            yield from stream(self._decoder_call(), input_ids, max_new_tokens, how, stops, self._kind)

        return tokens()

    def reset(self) -> None:
        raise NotImplementedError

    def _decoder_call(self) -> Callable[[Any, Any], Any]:
        """`call(input_ids, cache_position)`: the model called as it was captured."""
        raise NotImplementedError

    def _cache_positions(self) -> int | None:
        """How many positions the cache holds, where the model says; else None."""
        return None


def last_logits(output: Any, batch: int, kind: ArrayKind) -> Any:
    """The last position's logits, (batch, vocab), of a call's output: logits
    (batch, seq, vocab) or (batch, vocab), alone or as an output's `logits`."""
    logits = output
    if not hasattr(output, "ndim"):
        logits = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", None)
    if not hasattr(logits, "ndim") or logits.ndim not in (2, 3) or logits.shape[0] != batch or not kind.is_floating(logits):
        found = tuple(logits.shape) if hasattr(logits, "shape") else type(output).__name__
        raise ValueError(f"generate needs the model to return logits of shape (batch, seq, vocab) or (batch, vocab) for a batch of {batch}, alone or as `logits`; it returned {found}")
    return logits[:, -1] if logits.ndim == 3 else logits


def next_token(logits: Any, how: TokenChoice, kind: ArrayKind) -> Any:
    """The chosen token of each row of `logits` (batch, vocab)."""
    if not how.sample:
        return kind.argmax(logits)
    if kind.NAME == "torch":
        import torch

        return torch.multinomial(probabilities(logits, how), 1, generator=how.generator)[:, 0]
    return _numpy_draw(_numpy_probabilities(logits, how), how.generator)


def probabilities(logits: Any, how: TokenChoice) -> Any:
    """What sampling draws from: the softmax of the float32 logits over the
    temperature, less the tokens top-k and then top-p leave out (transformers'
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, in that order)."""
    import torch

    scores = logits.float() / how.temperature
    if how.top_k is not None and how.top_k < scores.shape[-1]:
        kth = torch.topk(scores, how.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if how.top_p is not None and how.top_p < 1:
        ascending, order = torch.sort(scores, descending=False, dim=-1)
        drop = ascending.softmax(-1).cumsum(-1) <= 1 - how.top_p
        drop[..., -1:] = False  # the most likely token always stays
        scores = scores.masked_fill(drop.scatter(-1, order, drop), -float("inf"))
    return scores.softmax(-1)


def _numpy_probabilities(logits: Any, how: TokenChoice) -> Any:
    """`probabilities` in NumPy: the same warpers, in the same order."""
    import numpy

    scores = logits.astype(numpy.float32) / numpy.float32(how.temperature)
    if how.top_k is not None and how.top_k < scores.shape[-1]:
        kth = -numpy.partition(-scores, how.top_k - 1, axis=-1)[..., how.top_k - 1 : how.top_k]
        scores = numpy.where(scores < kth, -numpy.inf, scores)
    if how.top_p is not None and how.top_p < 1:
        order = numpy.argsort(scores, axis=-1, kind="stable")
        ascending = numpy.take_along_axis(scores, order, axis=-1)
        drop = numpy.cumsum(_softmax(ascending), axis=-1) <= 1 - how.top_p
        drop[..., -1:] = False  # the most likely token always stays
        dropped = numpy.zeros_like(drop)
        numpy.put_along_axis(dropped, order, drop, axis=-1)
        scores = numpy.where(dropped, -numpy.inf, scores)
    return _softmax(scores)


def _softmax(scores: Any) -> Any:
    import numpy

    exponents = numpy.exp(scores - scores.max(-1, keepdims=True))
    return exponents / exponents.sum(-1, keepdims=True)


def _numpy_draw(probabilities: Any, generator: Any) -> Any:
    """One token per row, drawn from its probabilities: the first whose cumulative
    probability passes a uniform number (`generator`'s, else NumPy's global one)."""
    import numpy

    uniform = (generator if generator is not None else numpy.random).random((probabilities.shape[0], 1))
    cumulative = numpy.cumsum(probabilities, axis=-1)
    chosen = (cumulative < uniform * cumulative[:, -1:]).sum(-1)
    return numpy.minimum(chosen, probabilities.shape[-1] - 1).astype(numpy.int64)
