"""Compiling the wheel's own shim for the torch-free libraries of a build.

A library compiled with `aot_inductor.link_libtorch = False` leaves undefined
what torch would have given it: the C shim's functions (`aoti_torch_*`) and
ATen's vector math, which calls SLEEF (`Sleef_expf16_u10`: exp, float, 16
lanes, 1.0 ULP). The shim implements the first in its sources (`*.cpp`); the second
is generated here, for exactly the functions the libraries reference, each
lane through glibc's libm, or glibc's vector math (libmvec) where it has the
function at a symbol version no newer than torch's own glibc floor (2.28), so
that the shim does not raise the wheel's tag. `unprovided` names what neither
gives: the operator that keeps a model from its torch-free form.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

# The shim's source: shim.h (its tensors), tensors.cpp, blas.cpp, operators.cpp.
SOURCES = tuple(sorted(Path(__file__).parent.glob("*.cpp")))
SHIM_PREFIX = "aoti_torch_"
# The OpenMP runtime the torch-free libraries and the shim link (by this soname):
# not one a manylinux wheel may take from the system, so the wheel carries the
# build machine's, as auditwheel's repair would (GCC's runtime library exception).
OPENMP_SONAME = "libgomp.so.1"

_SLEEF = re.compile(r"Sleef_(?P<function>[a-z0-9]+?)(?P<kind>[fd])(?P<lanes>\d+)(?:_u\d+)?")
# SLEEF's name -> its libm name and arity.
_UNARY = {
    name: name
    for name in (
        "exp",
        "exp2",
        "exp10",
        "expm1",
        "log",
        "log2",
        "log10",
        "log1p",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "erf",
        "erfc",
        "lgamma",
        "tgamma",
        "cbrt",
        "sqrt",
    )
}
_BINARY = {name: name for name in ("pow", "atan2", "fmod", "hypot", "nextafter", "copysign")}
# In glibc's libmvec since 2.22: below torch's glibc floor, so free to use.
_LIBMVEC = {"exp", "log", "sin", "cos", "pow"}
# (kind, lanes) -> the vector type, the ISA a function of it is compiled for, libmvec's ISA letter.
_VECTORS = {
    ("f", 16): ("__m512", "avx512f", "e"),
    ("d", 8): ("__m512d", "avx512f", "e"),
    ("f", 8): ("__m256", "avx2,fma", "d"),
    ("d", 4): ("__m256d", "avx2,fma", "d"),
    ("f", 4): ("__m128", "sse4.2", "b"),
    ("d", 2): ("__m128d", "sse4.2", "b"),
}


def referenced(library: Path) -> set[str]:
    """The shim and SLEEF symbols a library leaves to its provider (its undefined
    dynamic symbols, read with pyelftools, as `engine/native.py` reads its needs)."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with library.open("rb") as stream:
        symbols = ELFFile(stream).get_section_by_name(".dynsym")
        undefined = {symbol.name for symbol in symbols.iter_symbols() if symbol["st_shndx"] == "SHN_UNDEF"} if isinstance(symbols, SymbolTableSection) else set()
    return {name for name in undefined if name.startswith((SHIM_PREFIX, "Sleef_"))}


def provided_shim_functions() -> set[str]:
    """The shim functions the shim's sources define."""
    return {name for source in SOURCES for name in re.findall(r"^\S.*?\b(aoti_torch_\w+)\(", source.read_text(encoding="utf-8"), re.MULTILINE)}


def unprovided(symbols: Iterable[str]) -> list[str]:
    """What of `symbols` the wheel's shim cannot give, sorted: shim functions it
    does not implement (mostly operators, `aoti_torch_cpu_<op>`) and vector math
    it cannot generate."""
    shim = provided_shim_functions()
    return sorted(symbol for symbol in symbols if (symbol not in shim) if symbol.startswith(SHIM_PREFIX) or _vector_function(symbol) is None)


def _vector_function(symbol: str) -> str | None:
    """The C++ definition of one SLEEF function, or None where it is not one this generates."""
    match = _SLEEF.fullmatch(symbol)
    if not match or (match["kind"], int(match["lanes"])) not in _VECTORS:
        return None
    name, kind, lanes = match["function"], match["kind"], int(match["lanes"])
    arity = 1 if name in _UNARY else 2 if name in _BINARY else 0
    if not arity:
        return None
    vector, isa, letter = _VECTORS[kind, lanes]
    scalar = "float" if kind == "f" else "double"
    libm = (_UNARY | _BINARY)[name] + ("f" if kind == "f" else "")
    parameters = ", ".join(f"{vector} {argument}" for argument in "xy"[:arity])
    head = f'extern "C" __attribute__((target("{isa}"))) {vector} {symbol}({parameters})'
    if name in _LIBMVEC:
        mvec = f"_ZGV{letter}N{lanes}{'v' * arity}_{libm}"
        return f'extern "C" __attribute__((target("{isa}"))) {vector} {mvec}({parameters});\n{head} {{ return {mvec}({", ".join("xy"[:arity])}); }}\n'
    lanes_of = "".join(f"  {scalar} {argument}s[{lanes}];\n  std::memcpy({argument}s, &{argument}, sizeof {argument});\n" for argument in "xy"[:arity])
    call = f"std::{_UNARY.get(name) or _BINARY[name]}(xs[i]{', ys[i]' if arity == 2 else ''})"
    return f"{head} {{\n{lanes_of}  for (int i = 0; i < {lanes}; ++i) xs[i] = {call};\n  std::memcpy(&x, xs, sizeof x);\n  return x;\n}}\n"


def vector_math_source(symbols: Iterable[str]) -> str:
    """The generated C++ of the SLEEF functions among `symbols`."""
    functions = [definition for symbol in sorted(symbols) if symbol.startswith("Sleef_") for definition in [_vector_function(symbol)] if definition]
    return "// Generated by hatch_precompile/shim/build.py: the vector math this wheel's libraries call.\n#include <cmath>\n#include <cstring>\n#include <immintrin.h>\n\n" + "\n".join(functions)


def compile_shim(symbols: Iterable[str], output: Path, compiler: str | None = None) -> None:
    """Compile the shim with the vector math `symbols` need into `output`
    (RuntimeError with the compiler's message where it fails)."""
    missing = unprovided(symbols)
    if missing:
        raise ValueError(f"the wheel's shim cannot provide {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="hatch-precompile-shim-") as scratch:
        generated = Path(scratch) / "vector_math.cpp"
        generated.write_text(vector_math_source(symbols), encoding="utf-8")
        command = [
            compiler or os.environ.get("CXX", "g++"),
            "-O3",
            "-fno-math-errno",
            "-std=c++17",
            "-shared",
            "-fPIC",
            "-fopenmp",
            "-s",
            f"-ffile-prefix-map={scratch}=shim",
            f"-ffile-prefix-map={SOURCES[0].parent}=shim",
            "-o",
            str(output),
            *map(str, SOURCES),
            str(generated),
            "-lmvec",
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"compiling the wheel's shim failed ({' '.join(command)}):\n{done.stderr[-3000:]}")


def openmp_runtime(compiler: str | None = None) -> Path:
    """The build compiler's OpenMP runtime library, which the wheel carries."""
    found = subprocess.run([compiler or os.environ.get("CXX", "g++"), f"-print-file-name={OPENMP_SONAME}"], capture_output=True, text=True, check=True).stdout.strip()
    path = Path(found).resolve()
    if not path.is_file():
        raise RuntimeError(f"the C++ compiler names no {OPENMP_SONAME} ({found!r}), which the torch-free form links")
    return path
