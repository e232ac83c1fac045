"""gemm on Hopper: TMA tensor descriptors, a persistent grid, split K for products of few tiles.

out <- alpha * A B + beta * C, as ``gemm.py`` (2 mnk FLOPs per matrix), for float16/bfloat16
operands that TMA can read (``tma_plan``; everything else runs the pointer kernel of ``gemm.py``).

Why a second kernel: a 4096^3 bfloat16 product is 137 GFLOP over ~100 MB, ~1400 FLOP per byte,
compute-bound; the pointer kernel reaches ~0.85 of cuBLAS there, its time lost to address
arithmetic, per-tile launch and prologue/epilogue bubbles. Here:
  - TMA: one descriptor per operand (``triton.tools.tensor_descriptor.TensorDescriptor``, built
    on the host, so no ``triton.set_allocator``); the copy engine computes the addresses, swizzles
    the tile into shared memory for WGMMA and zero-fills what lies outside the matrix, so the
    M, N and K tails need no masks. A transposed operand is read in place: the descriptor
    describes its transpose (the dim with stride 1 last) and the tile is ``.T``-ed in the kernel,
    which WGMMA takes from shared memory as it is (16-bit types read either major-ness).
  - A persistent grid: min(#SMs, #tiles) programs, each looping over tiles ``NUM_SMS`` apart in
    grouped order (``grouped_tile``); ``tl.range(flatten=True)`` fuses the tile and k loops into
    one software pipeline, so the next tile's loads fly during this tile's epilogue.
  - Tiles up to 128 x 256 x 64 with 8 warps (two warpgroups of m64n256k16 WGMMAs: 85 FLOP per
    byte staged), 3-4 stages; the epilogue stores the tile in two 128 x (BLOCK_N / 2) halves
    (``SUBTILE``), halving its shared-memory buffer (without it 128 x 256 x 64 in 3 stages ran out
    of shared memory at two layouts on the H200; a 4th stage does not fit at several).
  - Split K: a 2-D product with fewer 128 x 128 tiles than SMs (the weight gradient dW = dY^T X of
    a Linear layer: (in, tokens) @ (tokens, out), K = 8192 tokens, 16 to 64 tiles on 132 SMs)
    would leave most SMs idle. ``split_k`` cuts K into S ranges (a multiple of ``SPLIT_ALIGN``
    each); the kernel writes S float32 partial products (S, M, N), one more batch dim, and
    ``splitk_sum_kernel`` adds them in a fixed order (deterministic) with alpha and beta C:
    2 * S * mn * 4 extra bytes, against K / S fewer k-steps per program.
The epilogue forms alpha * acc + beta * C in float32 and rounds once, as the pointer kernel does
(``scale_and_add``, shared with it); C is read through pointers (any strides: a stride-0 bias).

TMA rules (``tma_layout``): a 16-byte aligned base, one matrix dim of stride 1, the other stride
a positive multiple of 16 bytes and not below the contiguous extent, and the contiguous extent a
multiple of 8 elements. The last rule is stricter than TMA's own: TMA bounds-checks the
contiguous dim in 16-byte chunks, so a box crossing an edge that is not on a 16-byte boundary
stores (and, assumed, loads) past it (docs/gemm.md, "TMA clips in 16-byte chunks"). A batch stride
is 0 (the operand is shared by the batch: a 2-D descriptor) or a multiple of 16 bytes not below
the matrix strides; out must be n-contiguous with a real batch stride. Sizes below 2^31 (TMA
coordinates are int32).

Autotuning: ``CONFIGS`` (H100, tried per (M, N, K, batch or splits, layout) key; float16 and
bfloat16 share a key, as their speeds do). A config's ``pre_hook`` sets the descriptors' block
shapes. A config whose buffers do not fit in shared memory for a layout is skipped; one that fails
otherwise is skipped with a warning (the GPU check compiles every config and reports failures). When out is C
(``gemm_`` with beta != 0), each tuning run would fold its result back into C: the autotuner hooks
keep out before a run and put it back after. The tuned configs are readable as
``tuned.best_config`` after a call; the GPU sweep swaps ``tuned`` for ``autotuned([config])``.
"""
from __future__ import annotations

import copy
import math
import warnings

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import _host
from ._launch import INTERPRET, _specialization, cdiv, is_hopper, launch, launch_tuned, next_power_of_2
from ._pointwise import activate

TMA_DTYPES = (torch.float16, torch.bfloat16)  # the operand dtypes of this kernel
ALIGN_BYTES = 16  # TMA: base, strides and (ours) contiguous extents in multiples of 16 bytes
SPLIT_TILE = 128  # split_k counts the tiles of this edge that a product has
SPLIT_MIN_K = 512  # no split leaves a program fewer k than this (8 k-steps of 64)
MAX_SPLITS = 16
SPLIT_ALIGN = 128  # every split but the last covers a multiple of this many k: of every BLOCK_K
SUM_BLOCK_M, SUM_BLOCK_N = 16, 128  # splitk_sum_kernel's tile, 4 warps: a 512 x 512 output is 128 programs
INTERPRET_SMS = 3  # the interpreter's "SM count": few, so that programs loop over several tiles


def config(bm, bn, bk, warps, stages, subtile=True, ws=False):
    """A config of ``gemm_tma_kernel``: tile, warps, pipeline stages, a split epilogue, warp specialization."""
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SUBTILE": subtile,
                          "WARP_SPECIALIZE": ws}, num_warps=warps, num_stages=stages, pre_hook=_set_block_shapes)


def _set_block_shapes(nargs):
    """A config's hook: the descriptors' boxes are its tiles (a transposed operand's box is too)."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    lead = lambda batched: [1] if batched else []
    nargs["a_desc"].block_shape = lead(nargs["A_BATCHED"]) + ([bm, bk] if nargs["A_KMAJOR"] else [bk, bm])
    nargs["b_desc"].block_shape = lead(nargs["B_BATCHED"]) + ([bn, bk] if nargs["B_KMAJOR"] else [bk, bn])
    nargs["out_desc"].block_shape = lead(nargs["OUT_BATCHED"]) + [bm, bn // 2 if nargs["SUBTILE"] else bn]
    for twin, of in (("z_desc", "out_desc"), ("z2_desc", "out_desc"), ("b2_desc", "b_desc")):
        if nargs[twin] is not None:
            nargs[twin].block_shape = nargs[of].block_shape


if INTERPRET:  # only tests run this kernel under the interpreter (gemm.py never picks it there)
    CONFIGS = [config(32, 32, 32, 4, 1)]
else:  # H100; a config whose buffers do not fit in shared memory is skipped by the autotuner
    CONFIGS = [config(*c) for c in [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
                                     (128, 128, 64, 8, 4), (128, 128, 128, 8, 3), (128, 64, 64, 4, 4)]]
assert all(SPLIT_ALIGN % c.kwargs["BLOCK_K"] == 0 for c in CONFIGS)


PAIR_TILE = 128 * 128  # a gated pair keeps two float32 accumulators: tiles of at most this many elements


def tiles_that_fit(configs, args, **kwargs):
    """Skip tiles far larger than the output: a 7 x 33 product tunes (and compiles) only the 64-wide
    configs, and tuning a new small shape costs one or two compiles instead of all of them. A gated
    pair (a second B operand) takes tiles of at most PAIR_TILE elements: two accumulators of a
    128 x 256 tile would not fit in registers."""
    M, N = max(64, next_power_of_2(args["M"])), max(64, next_power_of_2(args["N"]))
    pair = args.get("B2_ptr", args.get("b2_desc")) is not None
    fit = [c for c in configs if c.kwargs["BLOCK_M"] <= M and c.kwargs["BLOCK_N"] <= N
           and not (pair and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] > PAIR_TILE)]
    return fit or [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]


@triton.jit
def grouped_tile(t, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(z, tile_m, tile_n) of the t-th tile of a stack of tiles_m x tiles_n grids, in grouped order:
    tiles run down GROUP_M tile-rows, then move one tile-column right, so that the A and B tiles
    that neighbouring programs share are still in L2 when they ask for them."""
    per_z = tiles_m * tiles_n
    z, t = t // per_z, t % per_z
    first_m = t // (GROUP_M * tiles_n) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)  # the last group may be shorter
    t = t % (GROUP_M * tiles_n)
    return z, first_m + t % group_m, t // group_m


@triton.jit
def scale_and_add(acc, alpha, beta, C_ptr, z, rows, cols, stride_cz, stride_cm, stride_cn, mask):
    """alpha * acc + beta * C[z, rows, cols] in float32 (int64 z, rows, cols); C_ptr is None when beta == 0."""
    out = alpha * acc
    if C_ptr is not None:  # a compile-time test
        c_ptrs = C_ptr + z * stride_cz + rows[:, None] * stride_cm + cols[None, :] * stride_cn
        out += beta * tl.load(c_ptrs, mask=mask).to(tl.float32)
    return out


@triton.jit
def _load_tile(desc, z, r, c, R: tl.constexpr, C: tl.constexpr, TRANSPOSED: tl.constexpr, BATCHED: tl.constexpr):
    """The (R, C) tile at (r, c) of matrix z of an operand; TRANSPOSED: desc holds the operand's
    transpose (its rows are contiguous); BATCHED: desc is 3-D, else the matrix is shared by the batch."""
    if TRANSPOSED:
        if BATCHED:
            tile = tl.reshape(desc.load([z, c, r]), (C, R)).T
        else:
            tile = desc.load([c, r]).T
    else:
        if BATCHED:
            tile = tl.reshape(desc.load([z, r, c]), (R, C))
        else:
            tile = desc.load([r, c])
    return tile


@triton.jit
def _store_tile(desc, tile, z, m0, n0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, OUT_BATCHED: tl.constexpr):
    """desc[z, m0:, n0:] <- the float32 tile, rounded to desc's dtype; TMA drops what lies past M and N."""
    tile = tile.to(desc.dtype)
    if OUT_BATCHED:
        desc.store([z, m0, n0], tl.reshape(tile, (1, BLOCK_M, BLOCK_N)))
    else:
        desc.store([m0, n0], tile)


@triton.jit
def _store_part(out_desc, z_desc, z2_desc, acc, acc2, C_ptr, C2_ptr, z, m0, n0, M, N, stride_cz, stride_cm,
                stride_cn, alpha, beta, ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                OUT_BATCHED: tl.constexpr):
    """out[z, m0:, n0:] <- act(alpha * acc + beta * C) for one (BLOCK_M, BLOCK_N) accumulator, and
    the pre-activation into z_desc's tensor unless it is None; with a second accumulator (a gated
    pair) out gets act(...) * (alpha * acc2 + beta * C2), and that factor goes to z2_desc's tensor."""
    rows = (m0 + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    out = scale_and_add(acc, alpha, beta, C_ptr, z.to(tl.int64), rows, cols, stride_cz, stride_cm, stride_cn, mask)
    if z_desc is not None:
        _store_tile(z_desc, out, z, m0, n0, BLOCK_M, BLOCK_N, OUT_BATCHED)
    y = activate(out, ACTIVATION)
    if acc2 is not None:
        up = scale_and_add(acc2, alpha, beta, C2_ptr, z.to(tl.int64), rows, cols, stride_cz, stride_cm, stride_cn,
                           mask)
        if z2_desc is not None:
            _store_tile(z2_desc, up, z, m0, n0, BLOCK_M, BLOCK_N, OUT_BATCHED)
        y = y * up
    _store_tile(out_desc, y, z, m0, n0, BLOCK_M, BLOCK_N, OUT_BATCHED)


@triton.jit
def _halves(acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The (BLOCK_M, BLOCK_N / 2) left and right halves of a tile. (Triton 3.6 cannot return None
    from a jitted function: the caller keeps a None accumulator as it is.)"""
    return tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))


@triton.jit
def gemm_tma_kernel(a_desc, b_desc, out_desc, z_desc, b2_desc, z2_desc, C_ptr, C2_ptr, M, N, K, Z, k_split,
                    stride_cz, stride_cm, stride_cn,
                    alpha, beta, ACTIVATION: tl.constexpr, A_KMAJOR: tl.constexpr, A_BATCHED: tl.constexpr,
                    B_KMAJOR: tl.constexpr, B_BATCHED: tl.constexpr, OUT_BATCHED: tl.constexpr, SPLIT: tl.constexpr,
                    NUM_SMS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    SUBTILE: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    # A: (Z?, M, K) [(Z?, K, M) when not A_KMAJOR]; B: (Z?, K, N) [(Z?, N, K) when B_KMAJOR];
    # out: (Z?, M, N), z_desc: None or out's twin (the pre-activation); C: (Z, M, N) or None. Z is the
    # batch, or with SPLIT the number of k ranges (A and B are then 2-D, out is the (Z, M, N) float32
    # partial sums and C is None). b2_desc (B's layout), C2 (C's strides), z2_desc (out's): None, or a
    # gated pair: out = act(z) * z2, z2 = alpha A B2 + beta C2 from the same A tiles (never with SPLIT).
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(k_split, BLOCK_K)  # the same for every tile: the fused loop needs that
    # the epilogue recomputes its tile from a counter of its own, so that the software pipeline
    # does not keep the mainloop's tile coordinates alive across the fused loop's stages
    done = tl.program_id(0) - NUM_SMS
    for t in tl.range(tl.program_id(0), Z * tiles_m * tiles_n, NUM_SMS, flatten=True,
                      warp_specialize=WARP_SPECIALIZE):
        z, tile_m, tile_n = grouped_tile(t, tiles_m, tiles_n, GROUP_M)
        if SPLIT:
            k0 = z * k_split  # the last range may run past K: TMA reads zeros there
        else:
            k0 = 0
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if b2_desc is not None:
            acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        else:
            acc2 = None
        for i in range(k_steps):
            k = k0 + i * BLOCK_K
            a = _load_tile(a_desc, z, tile_m * BLOCK_M, k, BLOCK_M, BLOCK_K, not A_KMAJOR, A_BATCHED)  # (BM, BK)
            b = _load_tile(b_desc, z, k, tile_n * BLOCK_N, BLOCK_K, BLOCK_N, B_KMAJOR, B_BATCHED)  # (BK, BN)
            acc = tl.dot(a, b, acc)
            if b2_desc is not None:
                acc2 = tl.dot(a, _load_tile(b2_desc, z, k, tile_n * BLOCK_N, BLOCK_K, BLOCK_N, B_KMAJOR, B_BATCHED),
                              acc2)

        done += NUM_SMS
        z, tile_m, tile_n = grouped_tile(done, tiles_m, tiles_n, GROUP_M)
        m0, n0 = tile_m * BLOCK_M, tile_n * BLOCK_N
        if SUBTILE:  # two (BM, BN / 2) halves: half the shared-memory staging buffer
            left, right = _halves(acc, BLOCK_M, BLOCK_N)
            left2 = acc2  # None without a gated pair (Triton 3.6 cannot unpack a tuple of Nones)
            right2 = acc2
            if b2_desc is not None:
                left2, right2 = _halves(acc2, BLOCK_M, BLOCK_N)
            _store_part(out_desc, z_desc, z2_desc, left, left2, C_ptr, C2_ptr, z, m0, n0, M, N, stride_cz, stride_cm,
                        stride_cn, alpha, beta, ACTIVATION, BLOCK_M, BLOCK_N // 2, OUT_BATCHED)
            _store_part(out_desc, z_desc, z2_desc, right, right2, C_ptr, C2_ptr, z, m0, n0 + BLOCK_N // 2, M, N,
                        stride_cz, stride_cm, stride_cn, alpha, beta, ACTIVATION, BLOCK_M, BLOCK_N // 2, OUT_BATCHED)
        else:
            _store_part(out_desc, z_desc, z2_desc, acc, acc2, C_ptr, C2_ptr, z, m0, n0, M, N, stride_cz, stride_cm,
                        stride_cn, alpha, beta, ACTIVATION, BLOCK_M, BLOCK_N, OUT_BATCHED)


@triton.jit
def splitk_sum_kernel(partial_ptr, C_ptr, out_ptr, Z_ptr, M, N, S, stride_cm, stride_cn, stride_om, stride_on,
                      alpha, beta, ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # partial: (S, M, N) float32, contiguous; C, out: (M, N), any strides; C_ptr is None when beta == 0;
    # Z: None or (M, N) with out's strides (the pre-activation)
    tiles_n = tl.cdiv(N, BLOCK_N)
    rows = (tl.program_id(0) // tiles_n).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    cols = (tl.program_id(0) % tiles_n).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    ptrs = partial_ptr + rows[:, None] * N + cols[None, :]
    plane = tl.cast(M, tl.int64) * N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(S):  # in order: the same bits every run
        acc += tl.load(ptrs, mask=mask, other=0.0)
        ptrs += plane
    out = scale_and_add(acc, alpha, beta, C_ptr, 0, rows, cols, 0, stride_cm, stride_cn, mask)
    offsets = rows[:, None] * stride_om + cols[None, :] * stride_on
    if Z_ptr is not None:
        tl.store(Z_ptr + offsets, out.to(Z_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + offsets, activate(out, ACTIVATION).to(out_ptr.dtype.element_ty), mask=mask)


TUNE_WARMUP_MS, TUNE_REP_MS = 25, 100  # the autotuner's timing of each config (Triton's defaults)
_kept = {}


def _time_or_skip(kernel_call, quantiles):
    """The autotuner's timer: a config that raises (a compiler error, not only too little shared
    memory, which the autotuner itself catches) times as infinite, so another one is picked."""
    try:
        return triton.testing.do_bench(kernel_call, warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS, quantiles=quantiles)
    except OutOfResources:  # expected: the epilogue's buffers depend on the layout
        return [math.inf] * len(quantiles)
    except Exception as e:  # noqa: BLE001 - any other failure of one config: skip it, say why
        warnings.warn(f"gemm_tma_kernel: a config failed and is skipped: {type(e).__name__}: {e}")
        return [math.inf] * len(quantiles)


def _keep_out(nargs, reset_only=False):
    """Autotuner hook, before each tuning run: keep out when it is C (gemm_ with beta != 0)."""
    C, out = nargs["C_ptr"], nargs["out_desc"].base
    if not reset_only and C is not None and C.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
        _kept["out"] = out.clone()


def _restore_out(nargs, exception):
    """Autotuner hook, after each tuning run: put back what ``_keep_out`` kept."""
    kept = _kept.pop("out", None)
    if kept is not None:
        nargs["out_desc"].base.copy_(kept)


def autotuned(configs):
    """``gemm_tma_kernel`` autotuned over ``configs``."""
    return triton.autotune(configs=configs, key=["M", "N", "K", "Z", "k_split", "A_KMAJOR", "B_KMAJOR", "SPLIT"],
                           prune_configs_by={"early_config_prune": tiles_that_fit},
                           pre_hook=_keep_out, post_hook=_restore_out, do_bench=_time_or_skip)(gemm_tma_kernel)


tuned = autotuned(CONFIGS)


def tma_layout(x: torch.Tensor, batch: int):
    """How TMA reads the (batch, rows, cols) operand x: (cols have stride 1, one matrix per batch
    entry), or None when it cannot (the rules in the module docstring)."""
    align = ALIGN_BYTES // x.element_size()
    _, rows, cols = x.shape
    s_batch, s_row, s_col = x.stride()
    if s_col == 1 and s_row >= cols and s_row % align == 0 and cols % align == 0:
        cols_unit = True
    elif s_row == 1 and s_col >= rows and s_col % align == 0 and rows % align == 0:
        cols_unit = False
    else:
        return None
    batched = batch > 1 and s_batch != 0
    if (batched and (s_batch % align or s_batch < max(s_row, s_col))) or x.data_ptr() % ALIGN_BYTES:
        return None
    return cols_unit, batched


def tma_plan(A, B, out):
    """(A k-contiguous, A batched, B k-contiguous, B batched) for the (batch, m, k) A, (batch, k, n)
    B and (batch, m, n) out when this kernel takes them, else None: float16/bfloat16 on an sm_90 GPU
    (never under the interpreter), k > 0, sizes below 2^31, every operand TMA-readable and out
    n-contiguous."""
    if INTERPRET or A.dtype not in TMA_DTYPES or not A.is_cuda or not is_hopper(A.device.index):
        return None
    return tma_layouts(A, B, out)


_LAYOUTS: dict = {}  # the operands' shapes, strides, dtypes and addresses mod 16 -> tma_layouts' answer


def tma_layouts(A, B, out):
    """``tma_plan`` without the device checks (the interpreter tests call the kernel through it),
    worked out once per layout: what it reads of the operands is in the key."""
    key = (A.shape, A.stride(), B.shape, B.stride(), out.shape, out.stride(), A.dtype, B.dtype, out.dtype,
           A.data_ptr() % ALIGN_BYTES, B.data_ptr() % ALIGN_BYTES, out.data_ptr() % ALIGN_BYTES)
    plan = _LAYOUTS.get(key, _LAYOUTS)
    if plan is _LAYOUTS:
        if len(_LAYOUTS) > 4096:
            _LAYOUTS.clear()
        plan = _LAYOUTS[key] = _layouts(A, B, out)
    return plan


def _layouts(A, B, out):
    batch, M, K = A.shape
    N = B.shape[2]
    if K == 0 or max(M, N, K) >= 2**31 - 2**10 or batch * cdiv(M, 64) * cdiv(N, 64) >= 2**31:
        return None
    a, b, o = tma_layout(A, batch), tma_layout(B, batch), tma_layout(out, batch)
    if a is None or b is None or o != (True, batch > 1):
        return None
    return a[0], a[1], not b[0], b[1]


def num_sms(device: torch.device) -> int:
    """The GPU's SM count (``_host.sm_count``), ``INTERPRET_SMS`` in the interpreter."""
    return _host.sm_count(device, off_gpu=INTERPRET_SMS)


def split_k(batch, M, N, K, sms):
    """(S, k per split): S > 1 for a 2-D product with at most half as many SPLIT_TILE-square tiles
    as SMs, as many splits as fill the SMs once (at most MAX_SPLITS, at least SPLIT_MIN_K each)."""
    tiles = cdiv(M, SPLIT_TILE) * cdiv(N, SPLIT_TILE)
    splits = min(MAX_SPLITS, sms // tiles, K // SPLIT_MIN_K) if batch == 1 else 1
    if splits < 2:
        return 1, K
    k_split = cdiv(cdiv(K, splits), SPLIT_ALIGN) * SPLIT_ALIGN
    return cdiv(K, k_split), k_split


_DESCRIPTORS: dict = {}  # (shape, strides, dtype) -> a TensorDescriptor of such a tensor, validated, with no base


def _descriptor(x, batched):
    """A TMA descriptor of the (batch, rows, cols) x with cols of stride 1: 3-D, or 2-D of x[0]
    (a matrix shared by the batch); the config's pre_hook sets the block shape. Triton validates a
    descriptor as it is made (a few microseconds of the host's time, three or more per gemm); here
    it validates one per shape, strides and dtype, which the others copy, with their own base
    (16-byte aligned, as ``tma_layout`` checked, or validated afresh)."""
    x = x if batched else x[0]
    key = (x.shape, x.stride(), x.dtype)
    template = _DESCRIPTORS.get(key)
    if template is None or x.data_ptr() % ALIGN_BYTES:
        made = TensorDescriptor(x, list(x.shape), list(x.stride()), [1] * x.dim())
        if template is None:
            if len(_DESCRIPTORS) > 4096:
                _DESCRIPTORS.clear()
            _DESCRIPTORS[key] = _template(made)
        return made
    return _with_base(template, x)


KEPT: dict = {}  # gemm's arguments' signature (``signature``) -> its ``Kept`` launch


def signature(A, B, C, alpha, beta, out, activation, z, B2, C2, z2):
    """What gemm's arguments fix about its TMA launch: the kernel's specialization (layouts, 16-byte
    alignment, dtypes, the scalars' kinds), the autotuner's pick, the grid and every integer argument
    (sizes, C's strides), so that a launch kept under it (``Kept``) runs any arguments of the same
    signature."""
    return (A.shape, A.stride(), B.shape, B.stride(), out.shape, out.stride(), A.dtype, B.dtype, out.dtype,
            A.data_ptr() % ALIGN_BYTES, B.data_ptr() % ALIGN_BYTES, out.data_ptr() % ALIGN_BYTES,
            _operand(C), _operand(C2), _operand(z), _operand(B2), _operand(z2), activation,
            _specialization(alpha), _specialization(beta), A.device.index)


class Kept:
    """A gemm signature's launch, kept: the picked config's compiled kernel (``Again``), the
    descriptors' templates (shape, strides, block), the grid and the integer arguments.
    ``kept(A, B, C, out, z, B2, C2, z2, alpha, beta)`` launches it on new tensors of the signature;
    a descriptor's base is the operand as gemm got it (its 3-D or transposed view starts at the same
    address, and the launcher reads only ``base.data_ptr()``)."""

    __slots__ = ("again", "templates", "grid", "sizes")

    def __init__(self, again, descriptors, grid, sizes):
        self.again, self.grid, self.sizes = again, grid, sizes
        self.templates = [None if d is None else _template(d) for d in descriptors]

    def __call__(self, A, B, C, out, z, B2, C2, z2, alpha, beta):
        a, b, o, zt, b2, z2t = self.templates
        self.again(self.grid, _with_base(a, A), _with_base(b, B), _with_base(o, out),
                   None if z is None else _with_base(zt, z), None if B2 is None else _with_base(b2, B2),
                   None if z2 is None else _with_base(z2t, z2), C, C2, *self.sizes, alpha, beta)


def _launch(A, B, C, alpha, beta, out, plan, Z, k_split, split, activation="none", z=None, B2=None, C2=None,
            z2=None, keep=None):
    """The kernel on the 3-D operands; with ``keep`` (gemm's signature of the arguments), the launch
    is kept under it when it ran the picked config's compiled kernel."""
    a_kmajor, a_batched, b_kmajor, b_batched = plan
    M, K, N = A.shape[1], A.shape[2], B.shape[2]
    sms = num_sms(A.device)
    grid = lambda meta: (min(sms, Z * cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])),)
    # the autotuner's pick for these sizes, layouts and dtypes, reused without its per-call dispatch
    key = (M, N, K, Z, k_split, plan, split, sms, A.dtype, out.dtype, None if C is None else C.dtype, z is None,
           B2 is None)
    # descriptor operands: (batch, rows, cols) with unit-stride cols, as the kernel reads them
    operands = (A if a_kmajor else A.mT, B.mT if b_kmajor else B, out, z, None if B2 is None else
                (B2.mT if b_kmajor else B2), z2)
    batched = (a_batched, b_batched, Z > 1, Z > 1, b_batched, Z > 1)
    descriptors = [None if x is None else _descriptor(x, d) for x, d in zip(operands, batched)]
    sizes = (M, N, K, Z, k_split, *(C.stride() if C is not None else (0, 0, 0)))
    again = launch_tuned(tuned, grid, key, *descriptors, C, C2, *sizes, alpha, beta,
                         ACTIVATION=activation, A_KMAJOR=a_kmajor, A_BATCHED=a_batched, B_KMAJOR=b_kmajor,
                         B_BATCHED=b_batched, OUT_BATCHED=Z > 1, SPLIT=split, NUM_SMS=sms)
    if keep is not None and again is not None and all(x is None or x.data_ptr() % ALIGN_BYTES == 0
                                                      for x in operands):
        # the picked config's kernel, on TMA-aligned operands: its descriptors' block shapes are set
        if len(KEPT) > 4096:
            KEPT.clear()
        KEPT[keep] = Kept(again, descriptors, grid(again.kwargs), sizes)


def _operand(x):
    """An optional operand's part of the signature: its layout, dtype and alignment."""
    return None if x is None else (x.shape, x.stride(), x.dtype, x.data_ptr() % ALIGN_BYTES)


def _template(d: TensorDescriptor) -> TensorDescriptor:
    made = copy.copy(d)
    made.base = None  # (a template keeps no tensor alive)
    return made


def _with_base(template: TensorDescriptor, x) -> TensorDescriptor:
    """``template``'s descriptor (shape, strides, block) of ``x``: its base is ``x`` itself, the batch
    view (x[0] of a 2-D descriptor, or x.mT's transpose, starts at the same address: the launcher reads
    only ``base.data_ptr()``)."""
    made = object.__new__(TensorDescriptor)
    made.__dict__.update(template.__dict__)
    made.base = x
    return made


def gemm_tma(A, B, C, alpha, beta, out, plan, activation="none", z=None, B2=None, C2=None, z2=None, keep=None):
    """``out <- alpha * A B + beta * C`` for the (batch, m, k) A, (batch, k, n) B, (batch, m, n) C
    (None when beta == 0) and out, with ``plan = tma_plan(A, B, out)``; with an ``activation``, act of
    that into out and the pre-activation into ``z``, and with ``B2`` (B's layout) the gated pair, as
    ``gemm.gemm`` (never split in K). ``keep``: see ``_launch`` (a product split in K is not kept).
    Returns ``out``."""
    batch, M, K = A.shape
    N = B.shape[2]
    splits, k_split = split_k(batch, M, N, K, num_sms(A.device)) if B2 is None else (1, K)
    if splits == 1:
        _launch(A, B, C, alpha, beta, out, plan, batch, K, False, activation, z, B2, C2, z2, keep)
        return out
    partial = torch.empty(splits, M, N, dtype=torch.float32, device=out.device)  # (S, M, N)
    _launch(A, B, None, 1.0, 0.0, partial, plan, splits, k_split, True)
    grid = (cdiv(M, SUM_BLOCK_M) * cdiv(N, SUM_BLOCK_N),)
    launch(splitk_sum_kernel, grid, partial, None if C is None else C[0], out[0], None if z is None else z[0], M, N,
           splits, *(C.stride()[1:] if C is not None else (0, 0)), *out.stride()[1:], alpha, beta,
           ACTIVATION=activation, BLOCK_M=SUM_BLOCK_M, BLOCK_N=SUM_BLOCK_N, num_warps=4)
    return out
