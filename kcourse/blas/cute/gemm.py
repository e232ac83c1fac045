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

Host time: which kernel, its key and its launch numbers follow from the operands' layouts alone
(dtype, shapes, strides, addresses modulo 16, the GPU, the TF32 switch), so ``_plan`` works them
out once per layout and a call only reads those facts, looks the plan up and launches.
"""
from __future__ import annotations

import torch

from . import _compile, _gemm_general, _gemm_sm90

View = _compile.View


def _view(shape, stride, misalignment) -> View:
    """A 2-D or 3-D operand as a 3-D View: a 2-D one is a batch of one (whose batch stride is never used)."""
    if len(shape) == 2:
        return View((1, *shape), (0, *stride), misalignment)
    return View(tuple(shape), stride, misalignment)


@_compile.plan_cache
def _plan(dtype: torch.dtype, arch: str, device_index: int | None, tf32: bool, a: tuple, b: tuple,
          c: tuple | None, o: tuple):
    """``(factory, key, pointer alignments (A, B, C, out), C's pointer is out's, numbers)``: the
    launch on ``arch`` for operands (all 2-D or all 3-D) given as (shape, strides, address % 16)."""
    a, b, o = _view(*a), _view(*b), _view(*o)
    c = None if c is None else _view(*c)
    if arch == "sm_90a" and dtype in (torch.float16, torch.bfloat16):
        sm90 = _gemm_sm90.plan(dtype, a, b, c, o, device_index)
        if sm90 is not None:
            key, numbers = sm90
            return _gemm_sm90._GemmSm90, key, _gemm_sm90.ALIGN, c is None, numbers
    key, aligns, numbers = _gemm_general.plan(dtype, tf32, a, b, c, o)
    return _gemm_general._factory, key, aligns, False, numbers


def gemm(A, B, C, alpha, beta, out):
    """``out <- alpha * A B + beta * C`` for 2-D or (same-batch) 3-D operands; ``C`` is None when
    ``beta == 0`` (it is then never read). ``out`` may be ``C`` itself. Returns ``out``."""
    if out.numel() == 0:
        return out
    dtype = A.dtype
    a, b, o = A.data_ptr(), B.data_ptr(), out.data_ptr()
    c = None if C is None else C.data_ptr()
    factory, key, align, c_is_out, numbers = _plan(
        dtype, _compile.target(), out.get_device() if out.is_cuda else None,
        dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32,
        (A.shape, A.stride(), a % 16), (B.shape, B.stride(), b % 16),
        None if C is None else (C.shape, C.stride(), c % 16), (out.shape, out.stride(), o % 16))
    element = _compile.DTYPES[dtype]
    pointer = _compile.PointerArg
    if c_is_out:
        c = o
    _compile.launch(factory, key, pointer(a, element, align[0]), pointer(b, element, align[1]),
                    None if c is None else pointer(c, element, align[2]), pointer(o, element, align[3]),
                    *numbers, alpha, beta, _compile.stream_of(out))
    return out
