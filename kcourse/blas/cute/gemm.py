"""gemm: out <- alpha * A B + beta * C for A (m, k), B (k, n), C and out (m, n), or a batch of them.

FLOPs: 2mnk per matrix. Bytes, at least: (mk + kn + 2mn) * itemsize per matrix (mn once if beta == 0).

Two CuTe kernels, one contract (3-D operands: a 2-D call is a batch of one):
  - ``_gemm_sm90``: Hopper's warpgroup MMA fed by TMA through a multi-stage shared-memory pipeline,
    for float16/bfloat16 operands laid out the way TMA needs (a unit stride, 16-byte aligned base
    and strides). The fast path: the large products of a model's Linear layers.
  - ``_gemm_general``: everything else, exactly: float32 (IEEE products, or TF32 tensor cores when
    ``torch.backends.cuda.matmul.allow_tf32`` is on, as torch and the triton kernel do), any
    strides, odd sizes and unaligned views (``x[1:]``), other GPUs.
Both read every operand through its own strides (transposed and sliced views, a batch stride of 0
for a matrix shared by the batch, a bias row broadcast as C with strides (0, 0, 1)): nothing is
copied. Both accumulate in float32 and round once: out = round(alpha * acc + beta * C).
"""
from __future__ import annotations

from ._gemm_general import gemm_general
from ._gemm_sm90 import gemm_sm90, supports as sm90_supports


def gemm(A, B, C, alpha, beta, out):
    """``out <- alpha * A B + beta * C`` for 2-D or (same-batch) 3-D operands; ``C`` is None when
    ``beta == 0`` (it is then never read). ``out`` may be ``C`` itself. Returns ``out``."""
    if out.dim() == 2:  # a batch of one; [None] adds a leading dim to the view, nothing is copied
        gemm(A[None], B[None], None if C is None else C[None], alpha, beta, out[None])
        return out
    if out.numel() == 0:
        return out
    if sm90_supports(A, B, C, out):
        return gemm_sm90(A, B, C, alpha, beta, out)
    return gemm_general(A, B, C, alpha, beta, out)
