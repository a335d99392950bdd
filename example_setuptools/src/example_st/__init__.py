"""A small MLP, shipped precompiled: `load_compiled("mlp")(features)`."""

from ._precompiled import load_compiled

__all__ = ["load_compiled"]
