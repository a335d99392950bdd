"""Models declared with keyword inputs, constant arguments and an `example-inputs` callable,
built with the real hook, installed, and called in a fresh process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import Venv, build_wheel, no_compiler_env, write_project

pytestmark = pytest.mark.e2e

MODELS = '''
import torch
from torch import nn


class Masked(nn.Module):
    """Mean of the unmasked token vectors: a positional and a keyword input."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, 16)

    def forward(self, input_ids, attention_mask):
        mask = attention_mask.unsqueeze(-1).to(torch.float32)
        return (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)


class Pair(nn.Module):
    """Takes a tuple of two tensors: something a shape list cannot describe."""

    def forward(self, pair, scale):
        left, right = pair
        return {"sum": (left + right) * scale, "parts": [left * 2, right]}


class Scaled(nn.Module):
    """Non-tensor arguments, compiled in as constants."""

    def forward(self, x, factor: float, flip: bool = False):
        return -x * factor if flip else x * factor


def scaled():
    return Scaled().eval()


def masked():
    return Masked().eval()


def pair():
    return Pair().eval()


def pair_inputs():
    return ((torch.randn(1, 5), torch.randn(1, 5)),), {"scale": torch.randn(3, 1)}
'''

PRECOMPILE = """
fallback = "error"

[tool.hatch.build.hooks.precompile.models.masked]
factory = "sigpkg.models:masked"
inputs = [{ shape = ["batch", "length"], dtype = "int64", range = [0, 50] }]
kwargs = { attention_mask = { shape = ["batch", "length"], dtype = "int64", range = [0, 2] } }
dims = { batch = { min = 1, max = 32 }, length = { min = 2, max = 128 } }

[tool.hatch.build.hooks.precompile.models.scaled]
factory = "sigpkg.models:scaled"
inputs = [{ shape = ["batch", 4] }, { value = 2.5 }]
kwargs = { flip = { value = true } }
dims = { batch = { min = 1, max = 8 } }

[tool.hatch.build.hooks.precompile.models.pair]
factory = "sigpkg.models:pair"
example-inputs = "sigpkg.models:pair_inputs"
dims = { batch = { min = 1, max = 16, axes = ["scale:0"] } }
"""

CALLS = """
import json, torch
from sigpkg import load_compiled
from sigpkg.models import masked, pair, scaled
report = {}
ids = torch.randint(0, 50, (4, 9))
mask = (torch.rand(4, 9) > 0.3).long()
out = load_compiled("masked")(ids, attention_mask=mask)
torch.testing.assert_close(out, masked()(ids, attention_mask=mask), rtol=1e-4, atol=1e-5)
report["masked"] = list(out.shape)
try:
    load_compiled("masked")(ids, attention_mask=mask[:3])
except ValueError as error:
    report["mismatch"] = str(error)
args = ((torch.randn(1, 5), torch.randn(1, 5)), torch.randn(3, 1))
out = load_compiled("pair")(args[0], scale=torch.randn(7, 1))
report["pair_structure"] = [type(out).__name__, sorted(out), type(out["parts"]).__name__]
report["pair_shape"] = list(out["sum"].shape)
with torch.no_grad():
    eager = pair()(args[0], scale=args[1])
torch.testing.assert_close(load_compiled("pair")(args[0], scale=args[1]), eager)
x = torch.randn(3, 4)
scaled_model = load_compiled("scaled")
torch.testing.assert_close(scaled_model(x, 2.5), scaled()(x, 2.5, flip=True))
torch.testing.assert_close(scaled_model(x, 2.5, flip=True), -x * 2.5)
for call in (lambda: scaled_model(x, 3.0), lambda: scaled_model(x, 2.5, flip=False)):
    try:
        call()
    except ValueError as error:
        report.setdefault("constants", []).append(str(error))
print(json.dumps(report))
"""


def test_keyword_constant_and_example_input_models_round_trip(torch_venv: Venv, tmp_path: Path) -> None:
    wheel = build_wheel(write_project(tmp_path, "sigpkg", MODELS, PRECOMPILE))
    torch_venv.pip("--no-deps", str(wheel))

    report = json.loads(torch_venv.script(CALLS, env=no_compiler_env(tmp_path)).stdout)
    assert report["masked"] == [4, 16]
    assert report["mismatch"] == "model 'masked', input attention_mask: dim 'batch' is 3 here but 4 in input input_ids"
    assert report["pair_structure"] == ["dict", ["parts", "sum"], "list"]
    assert report["pair_shape"] == [7, 5]
    assert report["constants"] == [
        "model 'scaled', input factor: compiled for the constant 2.5, got 3.0",
        "model 'scaled', input flip: compiled for the constant True, got False",
    ]
