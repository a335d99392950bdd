"""How far a correct low-precision build and a wrong one are from float32 on a
trained, deep model: SmolLM2-135M-Instruct (30 layers, benchmarks/real_decoder),
on the build's own check calls (a prompt of real text, then 8 teacher-forced
steps), eager in each precision against eager float32.

    SMOLLM_DIR=MODEL_DIR python docs/studies/low_precision_bounds/measure.py

For each precision (bfloat16; int8 and int4 weights with bfloat16 activations) it
prints eager's error against float32 over the calls, and the build's error ratio
(worker/accuracy.py's own check, at its defaults) of three wrong builds of it,
each held to the correct eager model in the same precision: one layer's weight at
twice its scale, one square weight transposed, one decoder layer dropped (its
output projections zeroed, so that only the residual passes); with how often
each one's most likely token is float32's. The wrong builds are made before
quantization, as a wrong kernel or a wrong conversion would leave them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from hatch_precompile.engine.errors import ModelBuildError
from hatch_precompile.engine.model_config import ModelConfig
from hatch_precompile.worker.accuracy import check_calls, figures, lower_precision_yardstick
from hatch_precompile.worker.linears import quantize_weights

MODEL_PY = Path(__file__).resolve().parents[3] / "benchmarks" / "real_decoder" / "src" / "smollm_bench" / "model.py"
_spec = importlib.util.spec_from_file_location("smollm_model", MODEL_PY)
smollm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(smollm)  # by file: the package's __init__ needs its built _precompiled

LAYER = 15


def layers(module):
    return module.model.model.layers  # the export wrapper, then LlamaForCausalLM


def wrong_scale(module):
    with torch.no_grad():
        layers(module)[LAYER].mlp.down_proj.weight.mul_(2)


def transposed(module):
    with torch.no_grad():
        w = layers(module)[LAYER].self_attn.o_proj.weight
        w.copy_(w.t().clone())


def dropped(module):
    with torch.no_grad():
        layers(module)[LAYER].self_attn.o_proj.weight.zero_()
        layers(module)[LAYER].mlp.down_proj.weight.zero_()


def run(module):
    calls = [smollm.prompt(), *smollm.steps()]
    with torch.no_grad():
        return [[module(*args, **kwargs).float()] for args, kwargs in calls]


def variant(precision, damage=None):
    module = smollm.lm(torch.float32 if precision == "float32" else torch.bfloat16)
    if damage:
        damage(module)
    if precision.startswith("int"):
        scheme, _, group = precision.partition("-g")
        quantize = f"{scheme}-weight-only"
        quantize_weights(ModelConfig(name="m", factory="f:f", dtype="bfloat16", quantize=quantize, group_size=int(group) if group else None), module)
    return run(module)


def agreement(outputs, reference):
    return sum(int((c[0].argmax(-1) == r[0].argmax(-1)).sum()) for c, r in zip(outputs, reference)), sum(r[0].shape[1] for r in reference)


def main():
    torch.manual_seed(0)
    float32 = run(smollm.lm(torch.float32))
    bfloat16 = run(smollm.lm(torch.bfloat16))
    model = ModelConfig(name="m", factory="f:f", dtype="bfloat16")
    names = [f"call {i}" for i in range(len(float32))]
    print("| precision | eager vs float32: relative error over the calls, worst call | top-1 = float32's | wrong scale | transposed | dropped layer |")
    print("|---|---|---|---|---|---|")
    for precision in ["bfloat16", "int8", "int4-g32", "int4-g64"]:
        eager = bfloat16 if precision == "bfloat16" else variant(precision)
        ruler = lower_precision_yardstick(model, names, [], (eager, []), (bfloat16, []), (float32, []))
        worst = max(figures(c[0], r[0])["relative_error"] for c, r in zip(eager, float32))
        agreed, positions = agreement(eager, float32)
        cells = [f"{ruler.rounding.outputs[0] if precision == 'bfloat16' else _relative(eager, float32):.3f}, {worst:.3f}", f"{agreed}/{positions}"]
        for damage in (wrong_scale, transposed, dropped):
            try:
                check_calls(model, ruler, variant(precision, damage), None)
                cells.append("passed")
            except ModelBuildError as error:
                ratio = error.message.split(", ")[1].split("x what")[0]
                agreed, _ = agreement(variant(precision, damage), float32)
                cells.append(f"{ratio}x ({agreed}/{positions})")
        print(f"| {precision} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nbfloat16's own rounding (eager bfloat16 against float32 over the calls), the yardstick of every row: {ruler.rounding.outputs[0]:.4f}")


def _relative(outputs, reference):
    difference = sum((c[0].double() - r[0].double()).square().sum().item() for c, r in zip(outputs, reference))
    return (difference / sum(r[0].double().square().sum().item() for r in reference)) ** 0.5


if __name__ == "__main__":
    main()
