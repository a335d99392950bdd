"""Build side for a small conv net: produce.py's flow (quantize, freeze-compile, time, lean form) with
  - model "conv": Conv2d(3,16,3,p1) -> ReLU -> MaxPool2d(2) -> Conv2d(16,32,3,p1) -> ReLU
    -> AdaptiveAvgPool2d(1) -> Flatten -> Linear(32,10), input 8x3x32x32;
  - a prepack recipe that may have tensor arguments (onednn.qconv_prepack takes the weight scales
    as a tensor): each tensor argument is saved beside the plain weight as "<const>.arg<i>" and
    written in the recipe as {"tensor": "<const>.arg<i>"} (load_conv.py resolves it);
  - conv_prepack.json: for each opaque constant, its layout, the recorded op and arguments, and
    whether re-running the op on the plain weight in this process gives the same to_dense() and nbytes.

usage: produce_conv.py OUTDIR
"""

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import produce  # noqa: E402


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 10),
        )

    def forward(self, x):
        return self.net(x)


def make(name):
    if name != "conv":
        return common.make(name)
    torch.manual_seed(0)
    model = ConvNet().eval()
    example = (torch.randn(8, 3, 32, 32),)
    calib = [(torch.randn(8, 3, 32, 32),) for _ in range(8)]
    test = (torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(123)),)
    return model, example, calib, test


def describe(a):
    if isinstance(a, torch.Tensor):
        return {"tensor": True, "dtype": str(a.dtype), "shape": list(a.shape), "layout": str(a.layout)}
    return a


def mkldnn_recipe(name, t, tensors):
    """produce.mkldnn_recipe, allowing tensor arguments (saved as '<name>.arg<i>')."""
    calls = [c for c in produce.PREPACKS if c[2] is t]
    assert len(calls) == 1, (name, len(calls), len(produce.PREPACKS))
    op, overload, _, args, kwargs = calls[0]
    assert args[0].layout == torch.strided
    tensors[f"{name}.weight"] = args[0].contiguous()
    rest = []
    for i, a in enumerate(args[1:], 1):
        if isinstance(a, torch.Tensor):
            assert a.layout == torch.strided and not a.is_quantized, (name, i, a.layout)
            tensors[f"{name}.arg{i}"] = a.contiguous()
            rest.append({"tensor": f"{name}.arg{i}"})
        elif isinstance(a, (list, tuple, torch.Size)):
            rest.append(list(a))
        else:
            assert a is None or isinstance(a, (int, float, str)), (name, i, type(a))
            rest.append(a)
    assert not kwargs, kwargs
    # reproducible? re-run the same op on the same plain weight here and compare
    again = getattr(getattr(torch.ops, op.split(".")[0]), op.split(".")[1])(*args)
    try:
        same_dense = bool(torch.equal(again.to_dense(), t.to_dense()))
    except Exception as e:
        same_dense = f"{type(e).__name__}: {str(e)[:200]}"
    try:
        dense_shape = list(t.to_dense().shape)
    except Exception as e:
        dense_shape = f"{type(e).__name__}: {str(e)[:200]}"
    info = {
        "mkldnn": True,
        "op": overload,
        "weight": f"{name}.weight",
        "args": rest,
        "kwargs": {},
        "dtype": str(t.dtype).removeprefix("torch."),
        "size": list(t.size()),
        "layout": str(t.layout),
        "weight_shape": list(args[0].shape),
        "weight_dtype": str(args[0].dtype),
        "arg_types": [describe(a) for a in args[1:]],
        "to_dense_equals_input": "n/a",
        "reprepack_to_dense_equal": same_dense,
        "to_dense_shape": dense_shape,
        "mkldnn_nbytes": torch.ops.mkldnn._nbytes(t),
        "reprepack_nbytes": torch.ops.mkldnn._nbytes(again),
    }
    RECIPES[name] = info
    return info


RECIPES = {}


def main():
    produce.make = make
    produce.mkldnn_recipe = mkldnn_recipe
    sys.argv = [sys.argv[0], "conv", sys.argv[1]]
    produce.main()
    outdir = Path(sys.argv[2])
    (outdir / "conv_prepack.json").write_text(
        json.dumps(
            {
                "prepack_calls": [(c[1], [describe(a) for a in c[3][1:]]) for c in produce.PREPACKS],
                "recipes": RECIPES,
            },
            indent=1,
            default=str,
        )
    )
    print(json.dumps(RECIPES, indent=1, default=str))


if __name__ == "__main__":
    main()
