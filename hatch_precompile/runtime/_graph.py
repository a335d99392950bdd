"""What a form is: a module with this interface (`Form`), whose `load` returns a
graph to bind weights to (`Graph`).

A form is one module here (`_cpp.py`, `_lean.py`, `_artifact.py`), listed in
`_choice.FORMS`: it says what the build shipped of it for a variant, what it
needs of the process, and loads it. `CompiledModel` binds each handle's
weights (and state) to the loaded graph once and then calls what `bind`
returned with each call's flat inputs. The lean and artifact forms' graphs take
the weights before the inputs on every call (`PositionalGraph`); the C++ form
binds them into a container of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ._arrays import ArrayKind
from ._schema import ArtifactEntry, ModelEntry, TorchAndPython


class Graph(Protocol):
    def bind(self, weights: list[Any]) -> Callable[[list[Any]], Any]:
        """A function of a call's flat inputs that runs the graph with `weights`
        (the graph's order; a model's state among them is this handle's)."""
        ...


class Form(Protocol):
    NAME: str  # in the manifest and HATCH_PRECOMPILE_FORM: "cpp"
    TITLE: str  # in messages: "C++ form"

    def shipped(self, artifact: ArtifactEntry) -> bool:
        """Whether the build shipped this variant in this form."""
        ...

    def refused(self, artifact: ArtifactEntry) -> str:
        """Why the build shipped no such form for this variant, where it says
        so; "" where it shipped one, or the model did not ask for one."""
        ...

    def problems(self, artifact: ArtifactEntry, here: TorchAndPython) -> list[str]:
        """What this process lacks to run the variant in this form (its `built_with` says what it was built with)."""
        ...

    def file(self, artifact: ArtifactEntry) -> str:
        """The shipped file that holds this variant in this form."""
        ...

    def serves(self, model: ModelEntry, artifact: ArtifactEntry, arrays: str) -> str:
        """Why this form of the variant cannot take and return `arrays` ("torch" or
        "numpy", `_arrays.ARRAY_KINDS`) here; "" where it can."""
        ...

    def load(self, name: str, model: ModelEntry, artifact: ArtifactEntry, kind: ArrayKind) -> Graph:
        """Verify and load this variant's files, for `kind`'s arrays. Raises
        FormUnavailable where the files are intact but cannot load here (the next
        form that fits is tried), PrecompiledIntegrityError where they are damaged."""
        ...


def torch_only(arrays: str) -> str:
    """`Form.serves` of the forms that run on torch tensors alone."""
    return "" if arrays == "torch" else "it runs on torch tensors (NumPy arrays run the C++ form alone)"


class FormUnavailable(RuntimeError):
    """A shipped form is intact but cannot be loaded here (the dynamic loader's
    reason: a missing library or symbol, another CPU)."""


class PositionalGraph:
    """A graph that takes its weights before the call's inputs, every call, and
    runs without autograd (its aten calls would record it for a caller's weights
    that require grad; the C++ form's container runs below autograd)."""

    def __init__(self, run: Callable[[list[Any]], Any]) -> None:
        self._run = run

    def bind(self, weights: list[Any]) -> Callable[[list[Any]], Any]:
        import torch

        run, no_grad = self._run, torch.no_grad

        def bound(inputs: list[Any]) -> Any:
            with no_grad():
                return run([*weights, *inputs])

        return bound
