"""The cute backend: CuTe DSL kernels (nvidia-cutlass-dsl), one file per op.

Every kernel is a factory that returns a ``@cute.jit`` host function for a key (dtypes, layout
class, vector width, tiles); ``_compile`` compiles each key once and launches it from raw pointers.
They compile without a GPU (for sm_90a), which is how CI checks them; they run on NVIDIA GPUs of
compute capability 8.0 or newer, with the Hopper (sm_90a) gemm path using TMA and WGMMA.

Shared machinery: ``_elementwise`` (copy, swap, scal, axpby and the activations gelu, silu, relu,
swiglu, with ``_activation``), ``_reduce`` (warp and block sums: dot, gemv), ``_rows`` (softmax,
log_softmax, cross_entropy), ``_norm`` (layer_norm, rms_norm), ``_gemm_sm90`` / ``_gemm_general``
(gemm), ``_attention_fwd`` / ``_attention_bwd`` (flash attention on mma.sync).
"""
