"""Negative control: with load.py's fake compilers, inductor cannot build a kernel."""

import sys

sys.argv = ["x"]
sys.path.insert(0, "/tmp/int8study")
import load  # installs the fake compilers (module level), imports torch
import torch

try:
    f = torch.compile(lambda x: (x.sin() + 1).relu())
    f(torch.randn(100))
    print("compiled?!")
except Exception as e:
    print("compile failed as expected:", type(e).__name__, str(e).splitlines()[0][:200])
print(open(load.CC_LOG).read().splitlines()[:2] if load.CC_LOG.exists() else "no log")
