"""The loader's `generate` and `stream` (runtime/_generate.py) on eager decoders
with a static KV cache in buffers: the hand-written one of tests/stateful and
transformers' Llama through its own export wrapper. Greedy tokens against the
decoder's own loop; sampling's probabilities against transformers' warpers, and
seeded sampling against transformers' `generate`; stop tokens, streaming,
decoders that return the last position's logits, and the bad inputs, refused
before any call. The same code runs in every wheel: tests/test_state.py and
tests/test_low_bit.py run it from installed wheels. Also what `explain` says of
a bfloat16 model on a CPU that cannot run it fast."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
import torch

from hatch_precompile.runtime._arrays import array_kind
from hatch_precompile.runtime._generate import Generating, TokenChoice, probabilities

from conftest import REPO

spec = importlib.util.spec_from_file_location("state_models", REPO / "tests" / "stateful" / "models.py")
assert spec is not None and spec.loader is not None
models = importlib.util.module_from_spec(spec)
spec.loader.exec_module(models)


class Eager(Generating):
    """A decoder module as a loaded model is: called without autograd, its cache reset."""

    _kind = array_kind("torch")

    def __init__(self, module: torch.nn.Module, positions: int | None, keywords: bool = False) -> None:
        self.module, self.positions, self.keywords, self.calls = module, positions, keywords, 0
        self.initial = {name: buffer.clone() for name, buffer in module.named_buffers()}

    def reset(self) -> None:
        for name, buffer in self.module.named_buffers():
            buffer.copy_(self.initial[name])

    def _decoder_call(self) -> Callable[[Any, Any], Any]:
        def call(ids: Any, positions: Any) -> Any:
            self.calls += 1
            with torch.no_grad():
                return self.module(input_ids=ids, cache_position=positions) if self.keywords else self.module(ids, positions)

        return call

    def _cache_positions(self) -> int | None:
        return self.positions


class LastPosition(torch.nn.Module):
    """The decoder returning the last position's logits alone, (batch, vocab)."""

    def __init__(self, decoder: torch.nn.Module) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        return self.decoder(input_ids, cache_position)[:, -1]


def prompt(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, models.VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_greedy_tokens_are_the_decoders_own_loop_and_stream_yields_them_one_by_one() -> None:
    decoder = models.decoder()
    ids = prompt(2, 5)
    expected, logits = [], None
    with torch.no_grad():
        logits = decoder(ids, torch.arange(5))
        for position in range(5, 15):
            expected.append(logits[:, -1].argmax(-1))
            logits = decoder(expected[-1][:, None], torch.tensor([position]))
    model = Eager(models.decoder(), models.MAX_LEN)
    assert torch.equal(model.generate(ids, 10), torch.stack(expected, 1))
    streamed = list(model.stream(ids, 10))
    assert len(streamed) == 10 and all(token.shape == (2,) for token in streamed)
    assert torch.equal(torch.stack(streamed, 1), torch.stack(expected, 1))
    last = Eager(LastPosition(models.decoder()), models.MAX_LEN)  # (batch, vocab) logits
    assert torch.equal(last.generate(ids, 10), torch.stack(expected, 1))


def test_greedy_takes_the_first_largest_logit_in_bfloat16_and_float16_as_in_float32() -> None:
    """The greedy choice widens half-precision logits before its argmax (torch's
    argmax over bfloat16 is a scalar loop): the same index, ties to the first."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(3, 49152, generator=generator)
    rows[1, 7] = rows[1, 4000] = rows[1].max() + 1  # a tie: the first one wins
    for kind in (array_kind("torch"), array_kind("numpy")):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            half = rows.to(dtype)
            expected = half.float().argmax(-1)
            chosen = kind.argmax(half if kind.NAME == "torch" else half.float().numpy().astype("float16" if dtype == torch.float16 else "float32"))
            assert torch.equal(torch.as_tensor(chosen), expected) and int(chosen[1]) == 7, (kind.NAME, dtype, chosen)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, None, None), (0.7, 50, None), (1.3, None, 0.9), (0.8, 20, 0.8), (1.0, 1, None), (1.0, None, 1e-6)])
def test_sampling_draws_from_transformers_distribution(temperature: float, top_k: int | None, top_p: float | None) -> None:
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 3
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None:
        scores = TopPLogitsWarper(top_p)(None, scores)
    ours = probabilities(logits, TokenChoice(True, temperature, top_k, top_p))
    torch.testing.assert_close(ours, scores.softmax(-1), rtol=0, atol=1e-7)


def test_seeded_sampling_repeats_and_matches_transformers_generate() -> None:
    """transformers draws from torch's global generator; so does generate() given
    neither generator= nor seed=, so the same manual_seed gives the same tokens."""
    lm = models.llama_lm().eval()
    lm.generation_config.eos_token_id = None
    ids = prompt(1, 6, seed=3)
    settings = {"temperature": 0.9, "top_k": 40, "top_p": 0.95}
    torch.manual_seed(7)
    with torch.no_grad():
        reference = lm.generate(ids, max_new_tokens=12, do_sample=True, cache_implementation="static", pad_token_id=0, **settings)[:, 6:]
    model = Eager(models.llama(), 48, keywords=True)
    torch.manual_seed(7)
    assert torch.equal(model.generate(ids, 12, do_sample=True, **settings), reference)
    first = model.generate(ids, 12, do_sample=True, seed=1, **settings)
    assert torch.equal(model.generate(ids, 12, do_sample=True, generator=torch.Generator().manual_seed(1), **settings), first)
    assert not torch.equal(model.generate(ids, 12, do_sample=True, seed=2, **settings), first)


def test_rows_stop_at_any_of_their_stop_tokens_and_then_repeat_it() -> None:
    model = Eager(models.decoder(), models.MAX_LEN)
    ids = prompt(2, 5)
    free = model.generate(ids, 12)
    stops = [int(free[0, 3]), int(free[1, 6])]  # row 0 stops at its 4th token, row 1 at its 7th (unless it meets row 0's first)
    stopped = model.generate(ids, 12, stop_tokens=stops)
    for row in range(2):
        at = next(i for i, token in enumerate(free[row].tolist()) if token in stops)
        assert stopped[row, : at + 1].tolist() == free[row, : at + 1].tolist()
        assert set(stopped[row, at:].tolist()) == {int(free[row, at])}
    assert stopped.shape[1] == max(next(i for i, t in enumerate(free[r].tolist()) if t in stops) for r in range(2)) + 1


def test_bad_arguments_and_a_prompt_past_the_cache_are_refused_before_any_call() -> None:
    model = Eager(models.decoder(), models.MAX_LEN)
    cases = {
        "temperature must be > 0 with do_sample=True": {"do_sample": True, "temperature": 0},
        "top_p must be in (0, 1]": {"do_sample": True, "top_p": 1.5},
        "top_k must be an integer >= 1": {"do_sample": True, "top_k": 0},
        "generator= and seed= draw sampled tokens": {"seed": 3},
        "stop_tokens must be a token id or token ids": {"stop_tokens": ["eos"]},
    }
    for message, arguments in cases.items():
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
            model.generate(prompt(1, 4), 4, **arguments)
    with pytest.raises(ValueError, match="the prompt has 65 tokens, longer than the cache's 64 positions"):
        model.generate(prompt(1, 65), 1)
    with pytest.raises(ValueError, match="the prompt's 60 tokens and 10 new ones need 69 positions of the cache, which holds 64; ask for at most 5 new tokens"):
        model.stream(prompt(1, 60), 10)
    assert model.calls == 0
    assert model.generate(prompt(1, 60), 5).shape == (1, 5)  # exactly filling the cache


def test_a_decoder_whose_output_is_not_logits_is_refused_with_what_it_returned() -> None:
    class Hidden(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
            return input_ids.float().sum(-1)  # (batch,): a score per row, not logits

    with pytest.raises(ValueError, match=r"generate needs the model to return logits of shape \(batch, seq, vocab\) or \(batch, vocab\) for a batch of 2.*returned \(2,\)"):
        Eager(Hidden(), None).generate(prompt(2, 5), 3)


def test_explain_says_where_the_cpu_cannot_run_bfloat16_fast() -> None:
    """A bfloat16 model (weight-only ones included) on a CPU without AVX512-BF16
    or AMX runs correctly but emulated: explain() says so; elsewhere nothing."""
    from hatch_precompile.runtime import slow_precision

    avx2 = frozenset({"avx", "avx2", "fma3"})
    assert "neither AVX512-BF16 nor AMX" in slow_precision("bfloat16", avx2) and "correct" in slow_precision("bfloat16", avx2)
    assert slow_precision("bfloat16", avx2 | {"avx512_bf16"}) == slow_precision("bfloat16", avx2 | {"amx_bf16"}) == ""
    assert slow_precision(None, avx2) == slow_precision("float32", avx2) == ""
