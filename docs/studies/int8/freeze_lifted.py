"""Does freezing work on the plugin's capture form (export program, weights lifted as
graph inputs) through standalone_compile? MLP only."""

import sys, time, statistics

sys.path.insert(0, "/tmp/int8study")
import torch
from common import make
from produce import quantize, bench

model, example, calib, test = make("mlp")
converted = quantize(model, example, calib)
ep = torch.export.export(converted, example, strict=False)
gm = ep.graph_module
fake_inputs = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
print("placeholders", len(fake_inputs))
flat = [*[ep.state_dict.get(s.target, ep.constants.get(s.target)) if s.target else None for s in ep.graph_signature.input_specs if s.kind.name != "USER_INPUT"], *test]
for aot in (False, True):
    try:
        with torch.no_grad():
            art = torch._inductor.standalone_compile(gm, fake_inputs, dynamic_shapes="from_example_inputs", options={"config_patches": {"freezing": True}}, aot=aot)
            out = art(*flat)
        print("aot", aot, "compiled; ms", bench(lambda *a: art(*a), flat))
        if aot:
            try:
                art.save(path="/tmp/int8study/lifted_frozen.bin", format="binary")
                print("save ok")
            except Exception as e:
                print("save:", type(e).__name__, e)
    except Exception as e:
        print("aot", aot, type(e).__name__, str(e)[:300])
