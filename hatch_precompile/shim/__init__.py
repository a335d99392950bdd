"""The wheel's own shim: AOTInductor's C shim without torch, for the torch-free form.

`aoti_shim.cpp` implements the shim's tensors and the few operators a torch-free
library may call; `build.py` compiles it at wheel-build time, with the vector
math (`Sleef_*`) the wheel's libraries reference generated beside it. Build side
only: the compiled library ships, this package does not.
"""
