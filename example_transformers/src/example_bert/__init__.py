"""A small BERT encoder, shipped precompiled: `load_compiled("bert")(input_ids, attention_mask=mask)`."""

from ._precompiled import load_compiled

__all__ = ["load_compiled"]
