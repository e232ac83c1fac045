"""The cute backend: CuTe DSL kernels (nvidia-cutlass-dsl), one file per op.

Every kernel is a factory that returns a ``@cute.jit`` host function for a key (dtypes, layout
class, vector width, tiles); ``_compile`` compiles each key once and launches it from raw pointers.
They compile without a GPU (for sm_90a), which is how CI checks them; they run on NVIDIA GPUs of
compute capability 8.0 or newer, with the Hopper (sm_90a) gemm path using TMA and WGMMA.
The BLAS ops have kernels; the transformer primitives do not yet (calling one raises
NotImplementedError naming the op and this backend).
"""
