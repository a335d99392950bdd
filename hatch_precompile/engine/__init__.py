"""The build's planning and assembly, in the backend's process (and the CLI's).

`config` validates the table into `model_config`'s typed settings; `settings`
resolves jobs, caches and parts; `pipeline` runs a build: it plans, starts compile
workers that build the models (`jobs`), takes artifacts from the build cache
(`cache`), a remote store (`remote`) or parts (`parts`), checks native libraries
(`native`), and assembles `_precompiled/` (`assemble`, its names from the loader's
`runtime/_layout.py`).

Rules: no torch. The compile worker (`worker/`) is another process, started with
`python -m hatch_precompile.worker`; what crosses to it is `protocol`'s request and
result, as JSON. Nothing here imports `worker/`; the worker imports from here (the
typed config, the artifact sources), never the other way round.
"""
