"""The build backends: the process a build frontend (pip, build, hatch) runs.

`hatch_hook` is hatchling's build hook; `setuptools_backend` wraps setuptools'
PEP 517 backend; `distfiles` rewrites the wheels and sdists setuptools writes.
Both backends hand the work to `engine.pipeline` and add only what their tool needs.

Rules: no torch (configuration errors and wheel assembly cost no torch import, and a
compile worker that crashes cannot take the frontend's process with it); imports from
`engine/`, never from `worker/`. Users name two entry points outside this folder, kept
there as one-line doors: `hatch_precompile.hooks` (hatchling's plugin registration) and
`hatch_precompile.setuptools_backend` (a `build-backend` name in users' pyproject.toml).
"""
