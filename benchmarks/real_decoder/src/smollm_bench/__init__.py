from ._precompiled import load_compiled

__all__ = ["load_compiled"]
