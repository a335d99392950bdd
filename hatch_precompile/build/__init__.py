"""The build's planning and assembly, in the backend's process (and the CLI's).

`config` validates the table; `settings` resolves jobs, cache and parts; `pipeline`
runs a build: it plans, starts compile workers that build the models (`jobs`), takes
artifacts from the build cache (`cache`) or from parts (`parts`), checks native
libraries (`native`), and assembles `_precompiled/` (`assemble`, named by `layout`).

Rules: no torch. The compile worker (`worker/`) is another process, started with
`python -m hatch_precompile.worker`; what crosses to it is `protocol`'s request and
result, as JSON. Nothing here imports `worker/`; the worker imports from here (the
typed config, the cache's sources, the layout), never the other way round.
"""
