"""hatch-precompile: a Hatch build hook that compiles torch models into wheels.

Three processes run this code, and the folders say which:
- `backend/` (with `cli/`): the build frontend's process: hatchling's hook and the
  setuptools backend; no torch.
- `engine/`: what that process does: configuration, planning, jobs, the build cache,
  parts, native checks and assembling `_precompiled/`; no torch.
- `worker/`: one process per model: capture, compile, checks and torch's internals.
- `runtime/`: the loader that lands in users' wheels; torch and the standard library.
- `shim/`: the torch-free form's own shim (C++ source) and its compile, at assembly
  and in the worker's check; no torch. The compiled library ships, the folder does not.

`docs/architecture.md` draws them and what crosses between them.
"""

__version__ = "0.1.0"
