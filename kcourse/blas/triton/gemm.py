"""gemm: out <- alpha * A B + beta * C for A (m, k), B (k, n), C and out (m, n), or a batch of them.

FLOPs: 2mnk per matrix. Bytes, at least: (mk + kn + 2mn) * itemsize per matrix (mn once if beta == 0).

Two kernels; the choice depends only on the arguments (dtype, device, sizes, strides, alignment):
  - ``_gemm_tma.gemm_tma`` (Hopper: TMA descriptors, a persistent grid, split K for products of
    few tiles; see that module) when ``_gemm_tma.tma_plan`` accepts the operands: float16 or
    bfloat16 on an sm_90 GPU (never under the interpreter), k > 0, A and B each with a unit
    stride in one matrix dim, a 16-byte aligned base, the other stride and a real batch stride
    multiples of 16 bytes and the contiguous extent a multiple of 8; out n-contiguous, likewise.
    Linear's products qualify (x W^T, dY W, dY^T X) whenever the feature sizes are multiples of 8.
  - the pointer kernel below for everything else: float32, any strides, misaligned views, odd sizes.
Both accumulate in float32 and round once (alpha * acc + beta * C), so they agree to rounding.

Each program of the pointer kernel computes one (BLOCK_M, BLOCK_N) tile of out: it walks k BLOCK_K
at a time, loading a (BLOCK_M, BLOCK_K) tile of A and a (BLOCK_K, BLOCK_N) tile of B and adding
their product (``tl.dot``, tensor cores on a GPU) into a float32 accumulator. Details worth reading
the kernel for:
  - every operand is addressed through its own strides (batch, row, column), so transposed and
    sliced views, stride-0 batches (one matrix shared by the batch) and a broadcast C (a bias
    row expanded to (m, n) arrives with strides (0, 1)) are read in place: nothing is copied;
  - grouped ordering (``grouped_tile``): consecutive programs take GROUP_M tile-rows of one column
    band, so the A and B tiles they share are still in L2 when the neighbours ask for them;
  - one grid axis covers batch x tiles (the other axes are capped at 65535 programs);
  - float32 operands use exact float32 products (input_precision "ieee") unless
    torch.backends.cuda.matmul.allow_tf32 is on ("tf32"). Triton's CPU interpreter multiplies
    bfloat16 tiles wrongly, so there (UPCAST) the tiles are converted to float32 before tl.dot.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import _gemm_tma
from ._gemm_tma import gemm_tma, grouped_tile, scale_and_add, tiles_that_fit, tma_layout, tma_plan
from ._launch import INTERPRET, cdiv, launch_tuned
from ._pointwise import activate

if INTERPRET:  # one small config: the interpreter would take minutes to autotune
    CONFIGS = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4)]
else:  # tuned for H100; configs that do not fit in shared memory are pruned (configs_that_fit)
    CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                             num_warps=w, num_stages=s)
               for bm, bn, bk, w, s in [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3),
                                        (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (64, 256, 32, 4, 4),
                                        (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4)]]


@functools.cache
def _shared_memory(device: int) -> int:
    """Bytes of shared memory a block may use on CUDA device ``device``."""
    return triton.runtime.driver.active.utils.get_device_properties(device)["max_shared_mem"]


def configs_that_fit(configs, args, **kwargs):
    """``tiles_that_fit``, less the configs whose pipeline (``num_stages`` tiles of A and of B) does
    not fit in the device's shared memory (float32's (128, 256, 64) x 3 stages needs 288 KiB): they
    would fail to launch, and the autotuner would compile each only to skip it."""
    fit = tiles_that_fit(configs, args, **kwargs)
    if INTERPRET:
        return fit
    size, smem = args["A_ptr"].element_size(), _shared_memory(args["A_ptr"].device.index)
    b_tiles = 1 if args["B2_ptr"] is None else 2

    def need(c):
        return c.num_stages * (c.kwargs["BLOCK_M"] + b_tiles * c.kwargs["BLOCK_N"]) * c.kwargs["BLOCK_K"] * size
    return [c for c in fit if need(c) <= smem] or [min(configs, key=need)]


@triton.autotune(configs=CONFIGS, key=["M", "N", "K", "PRECISION"], restore_value=["out_ptr"],
                 prune_configs_by={"early_config_prune": configs_that_fit})
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def gemm_kernel(A_ptr, B_ptr, C_ptr, out_ptr, Z_ptr, B2_ptr, C2_ptr, Z2_ptr, M, N, K,
                stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                stride_cb, stride_cm, stride_cn, stride_ob, stride_om, stride_on, alpha, beta,
                ACTIVATION: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    # A: (batch, M, K); B: (batch, K, N); C, out: (batch, M, N); C_ptr is None when beta == 0;
    # Z: None, or (batch, M, N) with out's strides: z = alpha A B + beta C there, act(z) in out.
    # B2 (B's strides), C2 (C's), Z2 (out's): None, or a gated pair: out = act(z) * z2 for the second
    # product z2 = alpha A B2 + beta C2, from the same A tiles (stored in Z2 when given)
    batch, tile_m, tile_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    batch = batch.to(tl.int64)  # int64 offsets: a huge tensor must not overflow them
    rows = tile_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    cols = tile_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    ks = tl.arange(0, BLOCK_K).to(tl.int64)  # (BLOCK_K,)
    row_mask, col_mask = rows < M, cols < N
    # loads wrap the tile's overhanging rows and columns back into range (rows % M): every load is
    # in bounds and needs no mask; the store below drops those rows and columns
    a_rows, b_cols = rows % M, cols % N
    a_ptrs = A_ptr + batch * stride_ab + a_rows[:, None] * stride_am + ks[None, :] * stride_ak  # (BLOCK_M, BLOCK_K)
    b_offsets = batch * stride_bb + ks[:, None] * stride_bk + b_cols[None, :] * stride_bn  # (BLOCK_K, BLOCK_N)
    b_ptrs = B_ptr + b_offsets
    a_step = BLOCK_K * tl.cast(stride_ak, tl.int64)
    b_step = BLOCK_K * tl.cast(stride_bk, tl.int64)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if B2_ptr is not None:
        acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        b2_ptrs = B2_ptr + b_offsets
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:  # K is a multiple of BLOCK_K: no mask at all in the main loop
            k_mask = None
        else:
            k_mask = ks < K - k * BLOCK_K
        a = _load_k(a_ptrs, k_mask, 1, EVEN_K, UPCAST)
        acc = tl.dot(a, _load_k(b_ptrs, k_mask, 0, EVEN_K, UPCAST), acc, input_precision=PRECISION)
        if B2_ptr is not None:
            acc2 = tl.dot(a, _load_k(b2_ptrs, k_mask, 0, EVEN_K, UPCAST), acc2, input_precision=PRECISION)
            b2_ptrs += b_step
        a_ptrs += a_step
        b_ptrs += b_step

    mask = row_mask[:, None] & col_mask[None, :]
    out = scale_and_add(acc, alpha, beta, C_ptr, batch, rows, cols, stride_cb, stride_cm, stride_cn, mask)
    offsets = batch * stride_ob + rows[:, None] * stride_om + cols[None, :] * stride_on
    if Z_ptr is not None:  # the pre-activation, for the backward
        tl.store(Z_ptr + offsets, out.to(Z_ptr.dtype.element_ty), mask=mask)
    y = activate(out, ACTIVATION)
    if B2_ptr is not None:  # the gated pair: act(z) * z2
        up = scale_and_add(acc2, alpha, beta, C2_ptr, batch, rows, cols, stride_cb, stride_cm, stride_cn, mask)
        if Z2_ptr is not None:
            tl.store(Z2_ptr + offsets, up.to(Z2_ptr.dtype.element_ty), mask=mask)
        y = y * up
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_k(ptrs, k_mask, AXIS: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    """A k-step's tile of an operand whose k runs along ``AXIS`` (1: A's (M, K) tile, 0: B's (K, N)),
    masked past K unless EVEN_K; upcast to float32 under the interpreter (``UPCAST``)."""
    if EVEN_K:
        tile = tl.load(ptrs)
    elif AXIS == 1:
        tile = tl.load(ptrs, mask=k_mask[None, :], other=0.0)
    else:
        tile = tl.load(ptrs, mask=k_mask[:, None], other=0.0)
    if UPCAST:
        tile = tile.to(tl.float32)
    return tile


def gemm(A, B, C, alpha, beta, out, activation="none", z=None, B2=None, C2=None, z2=None):
    """``out <- alpha * A B + beta * C`` for 2-D or (same-batch) 3-D operands; ``C`` is None when
    ``beta == 0``. With an ``activation`` ("gelu", "gelu_tanh", "relu", "silu": ``linear``'s), out
    gets act(z) of the float32 z = alpha A B + beta C, and ``z`` (out's shape and strides) z itself,
    rounded. With ``B2`` (B's shape and strides; ``C2`` C's), a gated pair: out = act(z) * z2 for
    z2 = alpha A B2 + beta C2 from the same tiles of A (``linear_swiglu``), z2 stored in ``z2``.
    Returns ``out``."""
    keep = None
    if not INTERPRET and A.dtype in _gemm_tma.TMA_DTYPES:  # a TMA launch kept for these arguments' signature
        keep = _gemm_tma.signature(A, B, C, alpha, beta, out, activation, z, B2, C2, z2)
        kept = _gemm_tma.KEPT.get(keep)
        if kept is not None:
            kept(A, B, C, out, z, B2, C2, z2, alpha, beta)
            return out
    if out.dim() == 2:  # a batch of one; [None] adds a leading dim to the view, nothing is copied
        first = lambda t: None if t is None else t[None]  # noqa: E731
        _gemm(A[None], B[None], first(C), alpha, beta, out[None], activation, first(z), first(B2), first(C2),
              first(z2), keep)
        return out
    return _gemm(A, B, C, alpha, beta, out, activation, z, B2, C2, z2, keep)


def _gemm(A, B, C, alpha, beta, out, activation, z, B2, C2, z2, keep):
    """``gemm`` on 3-D operands; ``keep``: the arguments' signature as gemm got them, or None."""
    assert all(t is None or (t.shape == out.shape and t.stride() == out.stride()) for t in (z, z2))
    assert B2 is None or (B2.shape == B.shape and (C2 is None) == (C is None))
    if B2 is not None and B2.stride() != B.stride():  # the kernel reads B2 (C2) through B's (C's) strides
        B, B2 = (t.clone(memory_format=torch.contiguous_format) for t in (B, B2))
        keep = None  # (a kept launch would not copy)
    if C2 is not None and C2.stride() != C.stride():  # (two bias rows of unlike strides: an (M, N) copy each)
        C, C2 = (t.clone(memory_format=torch.contiguous_format) for t in (C, C2))
        keep = None
    plan = tma_plan(A, B, out)
    if plan is not None and (B2 is None or tma_layout(B2, A.shape[0]) == tma_layout(B, A.shape[0])):
        return gemm_tma(A, B, C, alpha, beta, out, plan, activation, z, B2, C2, z2, keep)
    batch, M, K = A.shape
    N = B.shape[2]
    tf32 = A.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    grid = lambda meta: (batch * cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)
    precision = "tf32" if tf32 else "ieee"
    key = (M, N, K, precision, A.dtype, B.dtype, out.dtype, None if C is None else C.dtype, z is None,
           B2 is None)  # what the autotuner's pick depends on
    launch_tuned(gemm_kernel, grid, key, A, B, C, out, z, B2, C2, z2, M, N, K, *A.stride(), *B.stride(),
                 *(C.stride() if C is not None else (0, 0, 0)), *out.stride(), alpha, beta, ACTIVATION=activation,
                 PRECISION=precision, UPCAST=INTERPRET and A.dtype != torch.float32)
    return out
