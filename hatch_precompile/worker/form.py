"""A form of a variant at build time: what the build makes of a compiled variant
besides its artifact, and how it checks it.

Each form is one module with this interface (`lean.py`, `cpp_form.py`), listed
once in `compile.FORMS`; no other module of the build names one. The build
compiles each variant's artifact, runs it against eager and saves the calls it
was checked on (`compile.py`). Then each form the model wants `produce`s its
files from the `Variant` into the model's folder and returns its manifest record
(its file, or why it has none), which the variant's entry holds under the form's
`NAME`. Once every model of the worker is compiled, each form `check`s what it
produced, in a fresh process, on those calls (`Pending`), and replaces a failing
record with the reason (`main.py`). The loader's side of a form is
`runtime/_graph.Form`; the loader chooses between the forms a variant ships.

This module imports no torch at run time: the forms' check processes import it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..engine.model_config import ModelConfig
    from ..runtime._schema import ArtifactEntry, CppRecord, InputLeaf, LeanRecord
    from .accuracy import Yardstick
    from .capture import Captured
    from .torch_internals import FrozenGraph

# What no form's check process may import: the compiler, which the loader never does.
COMPILER_MODULES = ("torch._inductor", "torch._dynamo")

# A timed step of the build log: `with step(model, "ran ...")`.
Step = Callable[[str, str], AbstractContextManager[None]]


@dataclass
class Variant:
    """What a form is produced from: one variant, just compiled."""

    model: ModelConfig
    captured: Captured
    options: dict[str, Any]  # the inductor options it was compiled with (the model's and its CPU target's)
    entry: ArtifactEntry  # its manifest entry, its kernels in `out_dir`
    out_dir: Path  # the model's folder
    output_module: tuple[str, list[int], str] | None  # the artifact's output module (`torch_internals.output_module`)
    frozen: FrozenGraph | None  # an int8 variant's graph, compiled with its weights frozen in, instead of an artifact
    op_libraries: dict[str, str]  # custom op -> the module defining it (`torch_internals.python_op_libraries`)


@dataclass
class Pending:
    """A variant whose forms wait for their checks, and what they are checked with."""

    model: ModelConfig
    op_libraries: dict[str, str]  # custom op -> the module defining it, imported before running the graph
    entry: ArtifactEntry
    out_dir: Path
    compiled_here: bool  # False: from the build cache or a part, whose forms passed their checks when compiled
    data_path: Path  # torch.save of compile.CheckedSequence: the initial weights and state, the calls, the artifact's outputs
    order: list[str]  # the weights' names, in the graph's order
    leaves: list[InputLeaf]
    yardstick: Yardstick  # what its outputs are checked against, call by call


class BuildForm(Protocol):
    """A form's module, at build time."""

    NAME: str  # its key in the variant's manifest entry: "cpp"
    TITLE: str  # in the build log: "C++ form"
    TIMED: bool  # whether producing it compiles code, whose seconds the build log gives

    def wanted(self, model: ModelConfig) -> bool:
        """Whether the model's configuration asks for this form."""
        ...

    def produce(self, variant: Variant) -> LeanRecord | CppRecord:
        """Write the form's files into the variant's folder; return its record, or
        `{"refused": why}`. An error that must stop the build (a form that is the
        variant's only one) is a `ModelBuildError`."""
        ...

    def check(self, pending: list[Pending], scratch: Path, step: Step) -> None:
        """Run what this form produced of each pending variant in a fresh process,
        as the loader would, and compare; remove a failing form's files and put
        the reason in its record."""
        ...
