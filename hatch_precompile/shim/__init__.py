"""The wheel's own shim: AOTInductor's C shim without torch, for the torch-free form.

`shim.h` (its tensors), `tensors.cpp` (the tensor functions), `blas.cpp` (matrix
products on NumPy's BLAS) and `operators.cpp` (what a torch-free library may
call) are its source; `build.py` compiles them at wheel-build time, with the
vector math (`Sleef_*`) the wheel's libraries reference generated beside them.
Build side only: the compiled library ships, this package does not.
"""
