"""Errors that stop a build, worded for the person running it, and how a build
backend ends with them.

A `BuildFailure` is expected: the configuration, a model that cannot be
captured or misses its accuracy, a part or cache that does not match, a missing
dependency. Its message says what to fix, so the backend ends with that message
alone (`failures_said_plainly`): the frontend's frames (pyproject_hooks,
hatchling, setuptools) would only bury it. Anything else is a bug of the
plugin's own and keeps its traceback, with a line saying so.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import ParamSpec, TypeVar


class BuildFailure(Exception):
    """An expected failure; its message names the model or key, what was expected and what was found."""


class ModelBuildError(BuildFailure, RuntimeError):
    """A model failed to build: which model, which step, and torch's words."""

    def __init__(self, model: str, step: str, message: str) -> None:
        self.model, self.step, self.message = model, step, message
        super().__init__(f"hatch-precompile: model {model!r} failed while {step}: {message}")


class BuildEnvironmentError(BuildFailure, RuntimeError):
    """The build environment cannot make the wheel that was asked for."""


@contextlib.contextmanager
def failures_said_plainly() -> Iterator[None]:
    """Around a build backend's work: a BuildFailure ends the process with its
    message and exit status 1 (SystemExit, which every frontend reports without a
    stack, as scikit-build-core does); any other exception propagates with its
    traceback after a line that says it is a bug to report."""
    try:
        yield
    except BuildFailure as failure:
        sys.stdout.flush()
        raise SystemExit(f"\n{failure}") from None
    except Exception:
        print(
            f"hatch-precompile {_version()}: an unexpected error, a bug in hatch-precompile rather than in this project: "
            "please report it, with the traceback below, to hatch-precompile's issue tracker",
            file=sys.stderr,
            flush=True,
        )
        raise


P = ParamSpec("P")
R = TypeVar("R")


def said_plainly(hook: Callable[P, R]) -> Callable[P, R]:
    """A PEP 517 hook run within `failures_said_plainly`."""

    @functools.wraps(hook)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with failures_said_plainly():
            return hook(*args, **kwargs)

    return run


def _version() -> str:
    try:
        return metadata.version("hatch-precompile")
    except metadata.PackageNotFoundError:  # a checkout on sys.path, not installed
        return "(not installed)"
