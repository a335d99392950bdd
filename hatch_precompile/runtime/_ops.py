"""Custom ops that Python code defines, imported before a compiled graph runs.

A library can define an op in Python (`torch.library.custom_op`): transformers'
mixture-of-experts layers call `torch.ops.transformers.grouped_mm_fallback`.
torch knows such an op only once the module defining it has run, and the
compiled graph calls it by name, in both forms. The build records, per model,
each such op and its module (`op_libraries` in the manifest); the loader
imports those modules first.
"""

from __future__ import annotations

import importlib


class OpLibraryError(ImportError):
    """A module that defines a custom op the compiled graph calls cannot be imported."""


def import_op_libraries(op_libraries: dict[str, str]) -> None:
    """Import the module defining each custom op (op name -> module)."""
    for op, module in sorted(op_libraries.items()):
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise OpLibraryError(f"the compiled graph calls the custom op {op}, which {module} defines, and importing it failed ({error}); install the package that provides {module}") from None
