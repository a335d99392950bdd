"""Models and inputs for the dynamic-batch follow-up (deterministic), built on common.py.

make_dynamic(name) -> (model,  [name: mlp, bert, or conv (produce_conv.ConvNet)]
                       example at batch 8, calibration batches (<= 16 rows each),
                       {1: test, 7: test, 16: test}, static example at batch 8)
quantize_dynamic(model, example, calib): torch.export with Dim("batch", min=1, max=16) on dim 0 of
every input, then prepare_pt2e / calibrate / convert_pt2e with X86InductorQuantizer's default config.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import make  # noqa: E402

BATCHES = (1, 7, 16)


def make_dynamic(name):
    if name != "conv":
        model, _, calib, _ = make(name)
    if name == "mlp":
        example = (torch.randn(8, 1024, generator=torch.Generator().manual_seed(7)),)
        calib = [(c[0][i : i + 16],) for c in calib for i in range(0, 64, 16)]  # the same rows, 16 at a time
        full = (torch.randn(16, 1024, generator=torch.Generator().manual_seed(123)),)
    elif name == "bert":
        example = tuple(x[:8] for x in calib[0])
        calib = calib[1:]
        gen = torch.Generator().manual_seed(123)
        ids = torch.randint(0, 30522, (16, 128), generator=gen)
        mask = torch.ones(16, 128, dtype=torch.long)
        mask[4:8, 100:] = 0
        mask[12:, 60:] = 0
        full = (ids, mask)
    elif name == "conv":
        from produce_conv import make as make_conv

        model, _, calib, _ = make_conv("conv")
        example = (torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(7)),)
        full = (torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(123)),)
    else:
        raise ValueError(name)
    tests = {b: tuple(x[:b].contiguous() for x in full) for b in BATCHES}
    return model, example, calib, tests, example


def quantize_dynamic(model, example, calib, dynamic=True):
    from produce import quantize

    batch = torch.export.Dim("batch", min=1, max=16)
    return quantize(model, example, calib, tuple({0: batch} for _ in example) if dynamic else None)
