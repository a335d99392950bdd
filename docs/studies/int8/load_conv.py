"""Run side for produce_conv.py's lean form: load.py (fresh process, fake compilers, no inductor
import), with a rebuild_constants that resolves tensor arguments of a prepack recipe
({"tensor": "<const>.arg<i>"}, e.g. the weight scales of onednn.qconv_prepack).

usage: load_conv.py OUTDIR [--no-time]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load  # noqa: E402  (installs the fake compilers, imports torch)
import torch  # noqa: E402


def rebuild_constants(outdir):
    from safetensors import safe_open

    with safe_open(str(outdir / "constants.safetensors"), framework="pt") as f:
        meta = json.loads(f.metadata()["constants"])
        names = set(f.keys())
        extra = {k: f.get_tensor(k).clone() for k in names if "." in k}  # plain weights and tensor args
        storages = {}
        for sid in {m["storage"] for m in meta.values() if not m.get("mkldnn")}:
            raw = f.get_tensor(sid)
            fresh = torch.empty(raw.numel(), dtype=torch.uint8)
            fresh.copy_(raw)
            storages[sid] = fresh.untyped_storage()
    out = {}
    for name, m in meta.items():
        if m.get("mkldnn"):
            ns, op = m["op"].split(".")[:2]
            fn = getattr(getattr(torch.ops, ns), op)
            args = [extra[a["tensor"]] if isinstance(a, dict) else a for a in m["args"]]
            out[name] = fn(extra[m["weight"]], *args, **m["kwargs"])
            continue
        t = torch.empty(0, dtype=getattr(torch, m["dtype"]))
        t.set_(storages[m["storage"]], m["offset"], m["size"], m["stride"])
        out[name] = t
    return out, meta


if __name__ == "__main__":
    load.rebuild_constants = rebuild_constants
    load.main()
