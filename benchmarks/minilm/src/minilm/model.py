"""A BertModel with all-MiniLM-L6-v2's shape: 6 layers, 384 wide, 12 heads, 1536
intermediate, its 30522-token vocabulary; random weights with a fixed seed. And
the batches its int8 build calibrates on."""

import torch
from transformers import BertConfig, BertModel


def minilm() -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    )
    return BertModel(config).eval()


def calibration_batches():
    """Four batches of 8 x 128 token ids with padding masks, like the benchmark's call."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(4):
        ids = torch.randint(0, 30522, (8, 128), generator=generator)
        lengths = torch.randint(16, 129, (8, 1), generator=generator)
        yield (ids,), {"attention_mask": (torch.arange(128) < lengths).long()}


class SentenceEmbedder(torch.nn.Module):
    """all-MiniLM-L6-v2 as sentence-transformers runs it: the mean of the last
    hidden states over the real tokens, L2-normalised. BertModel's pooler runs
    too and is never used (the build leaves it out of the graph)."""

    def __init__(self, bert: BertModel) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(mean, dim=-1)


def embedder() -> torch.nn.Module:
    return SentenceEmbedder(minilm()).eval()


def sentence_batches():
    """Eight batches of 1 to 32 sentences, each padded to its longest (8 to 128 tokens)."""
    generator = torch.Generator().manual_seed(2)
    for batch, longest in [(1, 8), (4, 24), (8, 128), (16, 40), (32, 64), (8, 96), (2, 128), (32, 16)]:
        lengths = torch.randint(4, longest + 1, (batch, 1), generator=generator)
        lengths[0] = longest
        mask = (torch.arange(longest) < lengths).long()
        yield (torch.randint(0, 30522, (batch, longest), generator=generator) * mask,), {"attention_mask": mask}
