"""The compile worker: one process per model, the only one that imports torch to build.

`python -m hatch_precompile.worker REQUEST.json` (`main`) captures the model
(`capture`), compiles one artifact per CPU target and shape variant (`compile`,
keyed by `key`), checks each against eager (`accuracy`), writes its lean form
(`lean`, checked in a fresh process by `lean_check`) and its weights (`weights`).
Every use of torch's private build-time internals is in `torch_internals`.

Rules: imports from `engine/` (the typed config, the cache, the layout) and from
`runtime/` (what the shipped loader will do with the artifact), never from `backend/`.
This package's `__init__` imports nothing, so naming it costs the backend no torch.
"""
