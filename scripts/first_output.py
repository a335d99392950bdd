"""Time to first output of the example encoder, each case in a fresh process.

Run inside an environment where the example wheel is installed (`./dev.sh demo`
does that). Compiled: import the package, `load_compiled("encoder")`, call it.
Eager: import the package, build the module with its factory, call it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CASE = """
import json, sys, time
start = time.perf_counter()
import torch
import example_pkg
ids = torch.randint(0, 1000, (8, 64))
if sys.argv[1] == "compiled":
    model = example_pkg.load_compiled("encoder")
else:
    from example_pkg.model import build_encoder
    model = build_encoder()
with torch.no_grad():
    out = model(ids)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "shape": list(out["embedding"].shape), "model": repr(model) if sys.argv[1] == "compiled" else type(model).__name__}))
"""


def main() -> None:
    rows = []
    for case in ("eager", "compiled"):
        with tempfile.TemporaryDirectory() as cache:  # empty caches, as in a new container
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor", "HATCH_PRECOMPILE_CACHE_DIR": f"{cache}/hp"}
            out = subprocess.run([sys.executable, "-c", CASE, case], env=env, capture_output=True, text=True, check=True)
        rows.append((case, json.loads(out.stdout)))
    print(f"{'case':<10} {'first output (s)':>17}  {'embedding shape':<16} model")
    for case, row in rows:
        print(f"{case:<10} {row['seconds']:>17.2f}  {row['shape']!s:<16} {row['model']}")


if __name__ == "__main__":
    main()
