"""The CPU kernels for 8- and 4-bit weights that `worker/linears.py` calls.

Relies on, in torch 2.13-2.15 (checked by tests/test_torch_assumptions.py):

- `torch._int_mm(a, b)`: a (m, k) int8, b (k, n) int8 -> (m, n) int32, exact; on
  CPU oneDNN's s8s8 product (VNNI where the CPU has it), fastest with b the
  transpose of an (n, k) row-major weight. Inductor calls it as an extern kernel
  (`aoti_torch_cpu__int_mm_out` in the C++ form).
- `aten._weight_int8pack_mm(x, weight, scales)`: x (m, k) bfloat16, weight (n, k)
  int8, scales (n,) bfloat16 -> (m, n). Inductor calls it as an extern kernel.
- `quantized.int4mm_packed_weight_cpu(x, packed, group_size, scales_and_zeros)`:
  x (m, k) bfloat16, packed as `aten._convert_weight_to_int4pack_for_cpu` makes
  it (torchao's Int4OpaqueTensor holds it so), group_size a 0-dim int64 tensor,
  scales_and_zeros (k / group_size, n, 2) bfloat16 -> (m, n). It is the kernel
  inductor lowers `aten._weight_int4pack_mm_for_cpu` to, with the group size made a
  tensor constant of the compiled graph; the lean form runs the output module
  alone and binds no such constant. Called directly, with the group size a
  buffer of the model, it compiles to the same call with nothing frozen in.
"""

from __future__ import annotations

import torch


def int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    result: torch.Tensor = torch._int_mm(a, b)
    return result


def int8_weight_matmul(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    result: torch.Tensor = torch.ops.aten._weight_int8pack_mm(x, weight, scales)
    return result


def int4_weight_matmul(x: torch.Tensor, packed: torch.Tensor, group_size: torch.Tensor, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    result: torch.Tensor = torch.ops.quantized.int4mm_packed_weight_cpu(x, packed, group_size, scales_and_zeros)
    return result
