"""Registers the build hook with hatchling (entry-point group `hatch`)."""

from hatchling.plugin import hookimpl

from .backend.hatch_hook import PrecompileBuildHook


@hookimpl
def hatch_register_build_hook() -> type[PrecompileBuildHook]:
    return PrecompileBuildHook
