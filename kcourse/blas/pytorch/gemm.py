"""gemm: ``out = alpha * A B + beta * C`` with ``torch.addmm`` (2-D) or ``torch.baddbmm`` (3-D).

``C`` is None when ``beta == 0``: ``out.addmm_(A, B, beta=0)`` ignores ``out``'s old values.
cuBLAS may reduce float16/bfloat16 split-K partial sums in half precision (PyTorch allows it by
default); kcourse promises float32 accumulation, so those reductions are switched off for the call.
"""
import torch

HALVES = (torch.float16, torch.bfloat16)


def gemm(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor | None, alpha: float, beta: float,
         out: torch.Tensor) -> torch.Tensor:
    # cuBLAS's reduced-precision reductions concern half operands on CUDA only; they are switched
    # off for the call and restored after it (inline, not a context manager: this runs for every
    # gemm of a step, and a generator-based context costs the host a few microseconds each)
    if not (A.is_cuda and A.dtype in HALVES):
        return _gemm(A, B, C, alpha, beta, out)
    flags = torch.backends.cuda.matmul
    saved = flags.allow_fp16_reduced_precision_reduction, flags.allow_bf16_reduced_precision_reduction
    if not any(saved):
        return _gemm(A, B, C, alpha, beta, out)
    flags.allow_fp16_reduced_precision_reduction = flags.allow_bf16_reduced_precision_reduction = False
    try:
        return _gemm(A, B, C, alpha, beta, out)
    finally:
        flags.allow_fp16_reduced_precision_reduction, flags.allow_bf16_reduced_precision_reduction = saved


def _gemm(A, B, C, alpha, beta, out):
    batched = A.dim() == 3
    if C is None:
        return (out.baddbmm_ if batched else out.addmm_)(A, B, beta=0, alpha=alpha)
    return (torch.baddbmm if batched else torch.addmm)(C, A, B, beta=beta, alpha=alpha, out=out)
