"""The build's uses of torch's private internals, in one place: this package.

The loader's own uses are in `runtime/_torch_private.py`, which ships in wheels;
this package does not. Each module says what it relies on, and
`tests/test_torch_assumptions.py` checks each assumption against the installed
torch, so that a torch upgrade touches this package alone:

- `export`: decomposing an export graph, reading its constraint violations,
  pytrees and the Python custom ops it calls, a tensor's in-place version;
- `inductor`: compiling with `standalone_compile(aot=True)`, the graph counters,
  and what a compiled artifact holds (its output module, its wrapper's work);
- `kernels`: the C++ compiler's outputs: kernels built against the stable ABI
  and without this build's paths, precompiled headers, vector-ISA probes;
- `frozen`: int8 graphs compiled with their weights frozen in;
- `low_bit`: the CPU kernels for 8- and 4-bit weights (weight-only quantization);
- `aoti`: the C++ form, AOTInductor's model container, reproducible and weightless.

The rest of the worker imports the names below from here.
"""

from .aoti import TORCH_FREE_CONFIG, aliased_output, compile_container, container_constants, returned_inputs
from .export import LAZY_DECOMPOSITION_MODULES, DimFix, attention_as_float32_math, constraint_fixes, decompose, python_op_libraries, tensor_version, tree_leaves, tree_map, treespec_to_json
from .frozen import FrozenGraph, compile_frozen, is_onednn_packed, pre_grad_pass_kept
from .inductor import compile_exported, extern_kernel_is_torch_function, output_module, save_artifact, start_model, torch_key, wrapper_work
from .kernels import STABLE_ABI_PRELUDE, TORCH_PATH_MAP, captured_kernels, compiler_outputs_in, precompiled_headers_in, probe_vector_isas_in, pybinding_kernel_key, vector_isa
from .low_bit import int4_weight_matmul, int8_matmul, int8_weight_matmul

__all__ = [
    "LAZY_DECOMPOSITION_MODULES",
    "STABLE_ABI_PRELUDE",
    "TORCH_FREE_CONFIG",
    "TORCH_PATH_MAP",
    "DimFix",
    "FrozenGraph",
    "aliased_output",
    "attention_as_float32_math",
    "captured_kernels",
    "compile_container",
    "compile_exported",
    "compile_frozen",
    "compiler_outputs_in",
    "constraint_fixes",
    "container_constants",
    "decompose",
    "extern_kernel_is_torch_function",
    "int4_weight_matmul",
    "int8_matmul",
    "int8_weight_matmul",
    "is_onednn_packed",
    "output_module",
    "pre_grad_pass_kept",
    "precompiled_headers_in",
    "probe_vector_isas_in",
    "pybinding_kernel_key",
    "python_op_libraries",
    "returned_inputs",
    "save_artifact",
    "start_model",
    "tensor_version",
    "torch_key",
    "tree_leaves",
    "tree_map",
    "treespec_to_json",
    "vector_isa",
    "wrapper_work",
]
