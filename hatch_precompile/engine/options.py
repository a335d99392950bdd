"""The inductor options a model may set under `options`, and why the others are refused.

A model's `options` are inductor config patches for its compile. Only options
the test suite builds end to end are accepted: built, loaded in both forms with
no compiler, and matching eager (`tests/test_battery.py`). Anything else is
refused when the configuration is read, by `hatch-precompile check` and by the
build alike, before anything compiles: an option nobody tried can make a wheel
that needs a compiler at load, or one that cannot be saved at all. Nothing here
imports torch.
"""

from __future__ import annotations

import difflib
from typing import Any

# name -> what it does to the shipped model. Every one takes true or false.
SUPPORTED = {
    "max_autotune": "benchmarks the GEMM and convolution choices at build time and ships the fastest",
    "max_autotune_gemm": "max_autotune for GEMMs only",
    "epilogue_fusion": "fuses pointwise work into the GEMM templates' epilogues",
    "aggressive_fusion": "fuses kernels even where they share no memory access",
    "coordinate_descent_tuning": "tunes GPU (Triton) kernel launch settings; no effect on CPU kernels",
}

# name -> why it is refused and what to do instead (measured on torch 2.13.0 and 2.15.0).
REFUSED = {
    "freezing": (
        "the graph takes its weights as inputs, so inductor's freezing would freeze nothing, and a frozen graph "
        'cannot be saved as an AOT artifact on torch 2.13-2.15 (AOTCompiledArtifact.save fails with "TypeError: '
        "'NoneType' object is not callable\"); remove it"
    ),
    "cpp_wrapper": (
        "it compiles the graph's wrapper as C++ through inductor's code cache, so loading it needs the compiler "
        "modules and the lean form cannot run it; remove it (the Python wrapper the lean form ships costs "
        "microseconds per call)"
    ),
    "cpp.simdlen": "the vector width comes from each CPU target; choose them with `cpu-targets` (avx2, avx512)",
}


def option_problems(raw: dict[str, Any], path: str) -> list[tuple[str, str]]:
    """(key path, message) for each entry of a model's `options` table that is not
    a supported option set to true or false. Nested tables name dotted options:
    `cpp = { simdlen = 256 }` is `cpp.simdlen`."""
    problems = []
    for name, value in flatten(raw).items():
        where = f"{path}.{name}"
        if name in REFUSED:
            problems.append((where, f"not supported: {REFUSED[name]}"))
        elif name not in SUPPORTED:
            close = difflib.get_close_matches(name, SUPPORTED, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append((where, f"not an inductor option hatch-precompile supports; {hint}supported: {', '.join(SUPPORTED)}"))
        elif not isinstance(value, bool):
            problems.append((where, f"expected true or false, found {value!r}"))
    return problems


def flatten(raw: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The options as inductor names them: dotted names, nested tables flattened."""
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat
