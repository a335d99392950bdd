"""all-MiniLM-L6-v2, shipped precompiled: `load_compiled("embedder")(features)` returns
sentence-transformers' features dict, `load_compiled("embedding")(input_ids, attention_mask)`
the normalised-free sentence embedding."""

from ._precompiled import load_compiled

__all__ = ["load_compiled"]
