"""What every form's `load(name, model, artifact)` returns: a graph to bind weights to.

A form is one module here (`_cpp.py`, `_lean.py`, `_artifact.py`) with a `load`
that verifies and loads one shipped variant and returns a `Graph`;
`CompiledModel` binds each handle's weights (and state) to it once and then
calls what `bind` returned with each call's flat inputs. The lean and artifact
forms' graphs take the weights before the inputs on every call
(`PositionalGraph`); the C++ form binds them into a container of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Graph(Protocol):
    def bind(self, weights: list[Any]) -> Callable[[list[Any]], Any]:
        """A function of a call's flat inputs that runs the graph with `weights`
        (the graph's order; a model's state among them is this handle's)."""
        ...


class PositionalGraph:
    """A graph that takes its weights before the call's inputs, every call."""

    def __init__(self, run: Callable[[list[Any]], Any]) -> None:
        self._run = run

    def bind(self, weights: list[Any]) -> Callable[[list[Any]], Any]:
        run = self._run
        return lambda inputs: run([*weights, *inputs])
