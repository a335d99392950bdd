"""A small text encoder, shipped precompiled: `load_compiled("encoder")(input_ids)`."""

from ._precompiled import load_compiled

__all__ = ["load_compiled"]
