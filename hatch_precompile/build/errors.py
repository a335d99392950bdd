"""Errors that stop a build, worded for the person running it."""


class ModelBuildError(RuntimeError):
    """A model failed to build: which model, which step, and torch's words."""

    def __init__(self, model: str, step: str, message: str) -> None:
        self.model, self.step, self.message = model, step, message
        super().__init__(f"hatch-precompile: model {model!r} failed while {step}: {message}")


class BuildEnvironmentError(RuntimeError):
    """The build environment cannot make the wheel that was asked for."""
