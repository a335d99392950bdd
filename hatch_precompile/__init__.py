"""hatch-precompile: a Hatch build hook that compiles torch models into wheels.

The hook (`plugin.PrecompileBuildHook`) reads `[tool.hatch.build.hooks.precompile]`
(`config`), compiles each model in a child process (`worker`, which runs
`capture` then `compile`), and assembles the wheel's `_precompiled/` folder
(`assemble`). What lands in users' wheels is `runtime/`: the loader and the one
module that touches torch's private internals.
"""

__version__ = "0.1.0"
