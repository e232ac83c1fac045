"""What the row-wise kernels share on the CuTe DSL (softmax and log_softmax: ``_softmax``;
cross_entropy; layer_norm and rms_norm: ``_norm``): the rows of an n-D tensor, the threads over a
row, a row over a cluster of CTAs (its shares kept in registers or staged in shared memory, its
partial results exchanged through distributed shared memory), the online logsumexp and the row
reductions.

Rows
----
A softmax along ``dim`` normalises every 1-D fibre in which ``dim`` varies. As in the triton
backend (``_softmax.launch_rows``) the other dims, merged by ``_layout.strided_layout`` jointly for
every operand (at most 4 after merging), number the rows; nothing is copied but a view of 6+ dims
that do not merge (``.contiguous()``, as triton does). Each operand becomes one CuTe tensor

    (N, (r_{k-1}, ..., r_0)) : (stride(dim), (d_{k-1}, ..., d_0))     the row dims innermost first

so ``tensor[None, coordinate(row)]`` is row ``row`` as an (N,) tensor: its start is a dot product of
the row's coordinate (a div/mod per merged dim, 64-bit) with the operand's strides, and the column
stride is the operand's own -- a transposed, sliced or expanded view is read in place. A unit
column stride is compiled in (``Plan.units``), any other is a runtime argument.

Threads over a row (``plan``)
-----------------------------
A CTA of 256 threads is ``ROWS = 256 / TPR`` rows of ``TPR`` threads (a power of two). A row is
swept in chunks of ``CHUNK = TPR * VPT * VEC`` columns: a 1-D TiledCopy of TPR threads by VEC
values gives the thread of lane ``k`` in its row the VPT vectors at columns ``k VEC + j TPR VEC``,
j < VPT, so a warp's j-th accesses cover 32 consecutive vectors (512 bytes at 16-byte vectors: fully
coalesced). TPR grows with N so that a thread holds about ``VALUES = 32`` elements (all 256 threads
on one row past N = 4096); short rows put many rows in a CTA (TPR = 1: a row per thread). With
scalar accesses (VEC = 1: a non-unit column stride, or an odd N) a thread holds about 16. The
softmax backward's CTAs over rows kept in registers, at most ``VALUES`` elements a thread, have
``BACKWARD_THREADS = 512`` threads (``Plan.threads``): twice the rows, the same work per thread,
0.5-1% faster (docs/softmax.md; the forward's float32 rows ran 1-2% slower as two rows of 256 in a CTA);
the norm backward picks its own (``_norm.backward_launch``). The forwards of softmax, log_softmax,
layer_norm and rms_norm instead spread a row that exactly fills a 256-thread CTA (8192 elements in 16
and 32 bits) over ``FORWARD_ROW_THREADS = 512`` (``spread_row``: half the values a thread, as
triton's kernels have it), 0.2-0.6% faster.

- N <= ``MAX_ONE_PASS`` (16384; 8192 with scalar accesses): one chunk covers the row (VPT rounded
  up to a power of two, at most 64 elements per thread); the row is read once and kept in
  registers (2Nb forward, 3Nb backward).
- longer rows: TPR = 256, chunks of ``STREAM_VALUES = 64`` elements per thread (16 with scalar
  accesses), and the row is swept twice: first an online logsumexp (forward) or the row sum
  (backward), then the output.
- rows adjacent in memory whose columns are strided (a softmax along dim 0 of a contiguous
  matrix, a transposed logits): ``Plan.across`` puts 32 rows in a CTA with a row's 8 threads 32
  apart, so a warp reads 32 neighbouring rows at each column (coalesced); the row's values meet in
  shared memory (``across_allreduce``).

A cluster of CTAs per row (``split_rows``, sm_90+)
--------------------------------------------------
A row longer than MAX_ONE_PASS is spread over C CTAs (``Plan.cluster``; C <= 8, the largest portable
cluster, or up to 16 on Hopper where an op measured it faster: ``split_rows``) when there are too few
rows to give every SM a CTA, or when C CTAs can each keep their share on chip where one CTA would
sweep the row twice (softmax: shares of at most 16384 elements forward, 8192 backward). CTA ``r``
of a row's C (consecutive along x, launched as one thread block cluster) takes its consecutive
share of the row's chunks (``chunk_range``); a share kept on chip is one chunk, so the row is read
once. Where the share is kept:

- in registers: the float32 forwards, the backwards, the 16-bit softmax forward up to 8 shares
  (131072 columns). The float32 norm forwards keep shares of up to 32768 (262144 columns over 8
  CTAs) in CTAs of ``SHARE_THREADS = 512`` threads, 64 elements a thread;
- in shared memory (``Plan.staged``, ``split_rows``'s ``stage``): the 16-bit norm forwards past
  16384 columns and the 16-bit softmax forward past 131072, over up to 16 CTAs of 256 threads.
  Each thread copies its vectors of the share by cp.async (``stage_chunk``: every load in flight
  at once, none occupying registers) and reads them back a vector at a time (``reduce_staged``,
  ``store_staged``): at most 80 registers (``row_launch`` asks ptxas for 3 CTAs an SM), so three
  32 KB shares an SM. The softmax keeps its exponentials in registers after the one read (one exp
  an element). H200, bf16, graphed, against the same shares in registers or swept: rms_norm 512 x
  262144 0.158 against 0.207 ms, layer_norm 4096 x 32768 0.159 against 0.191, softmax 512 x
  262144 0.155 against 0.172 (quack 0.136 / 0.260 / 0.141; experiments/cluster_16.py,
  2026-11-29). Float32 shares (64 KB) measured 0.7-1.0x staged and stay in registers.

The CTAs' partial results meet through distributed shared memory (``cluster_allreduce``), with no
barrier inside a CTA: each warp combines its lanes (``butterfly``), then lane ``p`` of every warp
stores the warp's (m, s) -- or row sum, or (count, mean, M2) -- into its slot [rank, warp] of CTA
``p``'s buffer (``mapa`` + ``st.async``), each store counted by that CTA's mbarrier, which expects
all the slots' bytes; each CTA waits on its own mbarrier, and its lanes combine the C x warps slots
in a fixed order (``cluster_allreduce``): the same bits in every thread of every CTA, and on every
run. A relaxed cluster arrive at the kernel's start (``cluster_started``, after thread 0 set up the
mbarrier), waited for before the first remote store, guarantees that every CTA of the cluster runs.
Against a cluster barrier pair after one CTA-wide reduction, this exchange took the 16-bit softmax
forward at 1024 x 131072 (8 CTAs keeping their shares in registers) from 0.178 to 0.135 ms (H200).
Measured on an H100 (docs/softmax.md), with the barrier pair: 8 x 262144 bfloat16 softmax forward
8.4 us against 38 us with a CTA per row; 8192 x 65536, 0.74 ms against 1.05 ms.

Keys: the dtype, the number of merged row dims, the ``Plan`` (VEC, TPR, VPT, one pass or two, which
operands have a unit column stride, CTAs per row) and the log flag; M, N and every stride are
runtime arguments.

``VEC`` is 16 bytes' worth of elements when every operand has a unit column stride, its rows start
16-byte aligned (base address and row strides) and N is a multiple of VEC; else 8, 4 bytes, or
single elements (any strides). The kernel learns the divisibility through ``cute.assume``.

Reductions (``row_allreduce``)
------------------------------
A row's TPR threads combine their partial results with butterfly shuffles inside the warp (every
lane ends with the row's result); with TPR > 32 the warps of a row then meet in shared memory: lane
0 of each warp writes, one barrier, each lane reads the row's warp ``lane % W`` (W warps per row)
and a butterfly over W lanes finishes. The order of the operations depends only on thread ids: the
same bits on every run.

Online logsumexp: a thread's partial is the pair (m, s) with s = sum exp(x - m) over its elements;
two pairs combine as m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m), and across chunks the
running sum is rescaled the same way when the max rises (one exp per element). Where m = -inf (all
-inf so far) the shift is 0 instead, so no -inf - -inf is formed; a row of -inf ends with m = -inf,
s = 0 and a NaN softmax, as in torch. Exponentials are ``exp2((x - m) * log2 e)`` (ex2.approx,
relative error ~2^-22), with x - m formed first so that logits of +-1e4 lose nothing.

"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from . import _compile, _reduce

THREADS = 256  # threads per CTA
VALUES = 32  # elements a thread holds of a row kept in registers (twice that at most)
STREAM_VALUES = 64  # elements a thread loads per chunk of a row swept in a loop (not kept)
MAX_ONE_PASS = 16384  # the longest row kept in registers: 64 elements per thread at 256 threads
MAX_N = 2**31 - 2**24  # row lengths (and column indices) are 32-bit
ACROSS_ROWS = 32  # rows per CTA when a row's threads are spread across warps (Plan.across)
CLUSTER_MAX = 8  # the most CTAs a row is spread over: the largest portable cluster
# ... and where an op asks (``split_rows``'s ``most``), Hopper's largest cluster (non-portable: the CuTe
# DSL allows it on every kernel), for a row whose shares fit the registers only over 16 CTAs
CLUSTER_MAX_SM90 = 16
STAGED_CTAS_PER_SM = 3  # a staged plan's CTAs an SM: 3 x 64 KB float32 shares fit in shared memory
SHARE_THREADS = 512  # a float32 norm forward's CTA whose share of a clustered row exceeds MAX_ONE_PASS (split_rows)
FORWARD_ROW_THREADS = 512  # forwards: a row kept in registers that fills a CTA is spread over this many (spread_row)
LOG2E = math.log2(math.e)
NEG_INF = float("-inf")


# ----------------------------------------------------------------------------- host: rows and plans

class Plan(NamedTuple):
    """How a CTA covers rows of N elements (see the module doc); every field is compiled in."""

    vec: int  # elements per access
    tpr: int  # threads per row, a power of two <= THREADS
    vpt: int  # vectors per thread per chunk, a power of two
    one_pass: bool  # one chunk covers the row: it is read once and kept in registers
    units: tuple = ()  # per operand: its column stride is 1 (a compile-time 1, the others are runtime)
    across: bool = False  # a row's threads are ROWS apart (consecutive threads on consecutive rows)
    cluster: int = 1  # CTAs per row (a cluster of them, see split_rows); each sweeps its share of the chunks
    threads: int = THREADS  # threads per CTA
    staged: bool = False  # a clustered row's one-chunk shares go through shared memory (cp.async: stage_chunk)

    @property
    def rows(self) -> int:  # rows per CTA (1 with a cluster per row)
        return self.threads // self.tpr

    @property
    def chunk(self) -> int:  # columns per chunk
        return self.tpr * self.vpt * self.vec


def plan(n: int, vec: int, col_strides, max_one_pass: int = MAX_ONE_PASS, stream: int = STREAM_VALUES,
         across: bool = False) -> Plan:
    """The plan for rows of ``n`` elements read ``vec`` at a time, of operands with ``col_strides``:
    up to ``max_one_pass`` one chunk covers the row (about ``VALUES`` elements per thread, fewer than
    ``2 VALUES``, and never more than 32 when ``max_one_pass <= 256 * 32``), else 256 threads a row
    and chunks of ``stream`` elements per thread. With scalar accesses (vec 1) about 16 elements per
    thread (kept or per chunk), and rows of more than 8192 are swept. ``across`` (rows adjacent in
    memory, columns strided: a softmax along a dim of non-unit stride): rows that would take more
    than one thread get ``ACROSS_ROWS`` rows per CTA with their threads ``ACROSS_ROWS`` apart, so that
    a warp reads 32 neighbouring rows at each column (coalesced)."""
    vectors = -(-n // vec)
    units = tuple(c == 1 for c in col_strides)
    values = VALUES
    if vec == 1:  # scalar accesses cost a 64-bit address and a predicate per element: fewer of them
        values, stream, max_one_pass = VALUES // 2, VALUES // 2, min(max_one_pass, THREADS * VALUES)
    tpr = min(THREADS, _reduce.pow2_at_least(-(-n // values)), _reduce.pow2_at_least(vectors))
    if across and vec == 1 and tpr > 1:
        tpr = THREADS // ACROSS_ROWS
        if n <= tpr * values:  # up to 128: one pass, at most 16 elements per thread
            return Plan(1, tpr, _reduce.pow2_at_least(-(-n // tpr)), True, units, True)
        return Plan(1, tpr, stream, False, units, True)
    if n <= max_one_pass:
        return Plan(vec, tpr, _reduce.pow2_at_least(-(-vectors // tpr)), True, units)
    return Plan(vec, THREADS, max(1, stream // vec), False, units)


def clusters_supported() -> bool:
    """Whether the GPU kernels compile for has thread block clusters (sm_90 and newer)."""
    return int(_compile.target()[len("sm_"):].rstrip("a")) >= 90


def split_rows(plan_: Plan, m: int, n: int, sms: int, share: int = 0, cluster: int | None = None,
               wide: bool = False, most: int = CLUSTER_MAX, stage: bool = False) -> Plan:
    """``plan_`` (for ``m`` rows of ``n`` elements) with each row spread over several CTAs -- a
    cluster, whose CTAs combine their partial results through distributed shared memory -- where
    that pays: for rows longer than one CTA keeps in registers (shorter rows are left alone),

    - fill: with fewer rows than SMs, ``sms // m`` CTAs per row (a power of two), so that every SM
      gets a CTA;
    - keep: with ``share`` > 0, enough CTAs that each takes at most ``share`` elements of the row
      (softmax: ``MAX_ONE_PASS``, so that each keeps its share in registers and the row is read
      once; its backward, which holds y and dy, half that; the cross_entropy forward, which reads a
      row once anyway: 0; its backward, which needs no reduction, 8192: more CTAs, more loads in
      flight);

    the larger of the two, fill at most ``CLUSTER_MAX`` (8), keep at most ``most`` (8, or Hopper's 16,
    ``CLUSTER_MAX_SM90``, where an op's measurements chose it: docs/softmax.md). A share that fits in
    registers is one chunk (the CTA count is then the number of chunks); so is a share of up to twice
    that where ``wide`` asks (the float32 norm forwards), over CTAs of ``SHARE_THREADS``; a longer one
    is swept in chunks. The rule and its
    measurements: docs/softmax.md, "A few long rows, or many very long ones". ``cluster`` (an op's
    ``Launch.cluster``): instead of the rule, that many CTAs for any row of at least as many vectors,
    short rows included. ``stage`` (vector accesses only): shares of up to ``MAX_ONE_PASS`` over up to
    ``CLUSTER_MAX_SM90`` CTAs of ``THREADS``, each share copied into shared memory by cp.async and read
    from there (``Plan.staged``, ``stage_chunk``) rather than held in registers. Before sm_90 (no
    clusters): ``plan_``."""
    longest = MAX_ONE_PASS if plan_.vec > 1 else THREADS * VALUES  # as plan(): 8192 with scalar accesses
    if plan_.across or (n <= longest and cluster is None) or not clusters_supported():
        return plan_
    stage = stage and plan_.vec > 1
    if stage:
        most, wide = CLUSTER_MAX_SM90, False
    if cluster is None:
        fill = 1 << (max(sms // max(m, 1), 1).bit_length() - 1)
        keep = -(-n // min(share, longest)) if share else 1
        cluster = max(min(CLUSTER_MAX, fill), min(most, keep))
    else:
        cluster = min(cluster, -(-n // plan_.vec))
    if cluster < 2:
        return plan_
    per_cta = -(-n // cluster)
    threads = THREADS
    if wide and plan_.vec > 1 and longest < per_cta <= SHARE_THREADS // THREADS * longest:
        threads = SHARE_THREADS  # twice the threads keep twice as much
    if per_cta <= threads // THREADS * longest:
        vpt = _reduce.pow2_at_least(-(-per_cta // (plan_.vec * threads)))
        plan_ = plan_._replace(tpr=threads, vpt=vpt, one_pass=True, threads=threads)
        cluster = -(-n // plan_.chunk)  # the chunk was rounded up: as many CTAs as chunks
    return plan_._replace(cluster=cluster, staged=stage and plan_.one_pass) if cluster > 1 else plan_


def row_vector_width(tensors, n: int, row_strides, col_strides) -> int:
    """The widest access every operand allows along its rows: unit column strides, 16-byte aligned
    bases, n and every row stride multiples of the vector (so every row starts aligned)."""
    if any(c != 1 for c in col_strides):
        return 1
    counts = [n, *(d for s in row_strides for d in s)]
    return _reduce.vector_width(tensors[0].element_size(), [t.data_ptr() for t in tensors], counts)


def check_sizes(op: str, name: str, t: torch.Tensor, n: int, rows: int) -> None:
    """A ``ValueError`` naming op, argument and shape where the kernels' 32-bit indices do not reach:
    rows of ``MAX_N`` elements or more, or ``2^31`` rows or more (the grid and the row blocks)."""
    if n >= MAX_N or rows >= 2**31:
        raise ValueError(f"{op}: {name} is {tuple(t.shape)}, {rows} rows of {n}; the cute kernels take rows "
                         f"of fewer than {MAX_N} elements and fewer than 2^31 rows (32-bit indices)")


def row_arguments(row_shape, row_strides, col_strides) -> list:
    """The runtime arguments describing the operands' rows, as ``row_views`` takes them: the row
    shape, then per operand its row strides and its column stride unless it is 1 (``Plan.units``)."""
    args = list(row_shape)
    for strides, col in zip(row_strides, col_strides):
        args += strides
        if col != 1:
            args.append(col)
    return args


# ----------------------------------------------------------------------------- device: rows

def row_views(pointers, n, rank: int, plan_: Plan, args) -> tuple[list, list]:
    """``(views, sizes)``: each pointer as an ``(N, (row dims))`` tensor (see the module doc), and the
    row index space's extents but the outermost, innermost first, for ``coordinate``. ``args`` is
    ``row_arguments``'s list; a unit column stride (``plan_.units``) is a compile-time 1."""
    vec = plan_.vec
    shape, args = args[:rank], args[rank:]
    views = []
    for pointer, unit in zip(pointers, plan_.units):
        strides, args = args[:rank], args[rank:]
        col, n_cols = 1, n
        if const_expr(vec > 1):
            strides = [cute.assume(d, divby=vec) for d in strides]
            n_cols = cute.assume(n, divby=vec)
        if const_expr(not unit):
            col, args = args[0], args[1:]
        layout = cute.make_layout((n_cols, tuple(reversed(shape))), stride=(col, tuple(reversed(strides))))
        views.append(cute.make_tensor(pointer, layout))
    return views, list(reversed(shape[1:]))


def spread_row(plan_: Plan, n: int, threads: int) -> Plan:
    """``plan_`` with a row of ``n`` elements that exactly fills a CTA of ``THREADS`` (kept in registers,
    vector accesses, at most ``VALUES`` elements a thread) spread over a CTA of ``threads``, the vectors
    a thread divided accordingly; other plans as they are. It pays only there: 0.2-0.6% faster at
    8192 columns, -9 to +8% at other lengths (docs/softmax.md, "Why these defaults")."""
    if (threads == THREADS or not plan_.one_pass or plan_.across or plan_.cluster > 1 or plan_.tpr != THREADS
            or plan_.vec == 1 or plan_.vpt * plan_.vec > VALUES or n != plan_.chunk or plan_.vpt * THREADS < threads):
        return plan_
    return plan_._replace(tpr=threads, vpt=plan_.vpt * THREADS // threads, threads=threads)


def row_copy(dtype, plan_: Plan, to_shared: bool = False) -> cute.TiledCopy:
    """The TiledCopy of one row's TPR threads: VEC consecutive elements per access (see the module
    doc); ``to_shared``: as cp.async into shared memory."""
    atom = _reduce.async_copy_atom(dtype, plan_.vec) if to_shared else _reduce.copy_atom(dtype, plan_.vec)
    return cute.make_tiled_copy_tv(atom, cute.make_layout(plan_.tpr),
                                   cute.make_layout(plan_.vec))


def reduction_buffer(plan_: Plan, values: int, stages: int = 1):
    """Shared memory for ``row_allreduce`` across warps: (stages, warps, values) float32, or for a plan
    ``across`` (TPR, ROWS, values); None when a row fits in a warp. Call before any branch."""
    if const_expr(plan_.tpr <= _reduce.WARP and not plan_.across):
        return None
    smem = cutlass.memory.SmemAllocator()
    warps = plan_.threads // _reduce.WARP
    shape = (plan_.tpr, plan_.rows, values) if const_expr(plan_.across) else (stages, warps, values)
    return smem.allocate_tensor(Float32, cute.make_ordered_layout(shape, order=(2, 1, 0)), byte_alignment=16)


def staging_buffer(plan_: Plan, dtype):
    """Shared memory for this CTA's share of a row (``Plan.staged``): (chunk,) of ``dtype``; None for
    a plan not staged. Call before any branch."""
    if const_expr(not plan_.staged):
        return None
    smem = cutlass.memory.SmemAllocator()
    return smem.allocate_tensor(dtype, cute.make_layout((plan_.chunk,)), byte_alignment=16)


def stage_chunk(dtype, plan_: Plan, lane, row: cute.Tensor, index, pred: cute.Tensor, sX: cute.Tensor) -> cute.Tensor:
    """Copy chunk ``index`` of ``row`` into ``sX`` by cp.async (this thread's vectors on ``pred``) and
    wait for it; returns this thread's slice of ``sX``, ``((VEC, 1), VPT)``, for ``reduce_staged`` and
    ``store_staged``. Each
    thread reads back only the vectors it copied, so no barrier: the loads are all in flight at
    once, and nothing of them occupies registers between the reads."""
    g2s = row_copy(dtype, plan_, to_shared=True).get_slice(lane)
    tXsX = g2s.partition_D(sX)
    cute.copy(g2s, g2s.partition_S(cute.local_tile(row, (plan_.chunk,), (index,))), tXsX, pred=pred)
    cute.arch.cp_async_commit_group()
    cute.arch.cp_async_wait_group(0)
    return tXsX


def chunk_predicate(tXcX: cute.Tensor, limit, vpt: cutlass.Constexpr[int]) -> cute.Tensor:
    """One flag per vector of a thread's chunk: its first column (``tXcX``, chunk-local) is below
    ``limit`` (the columns left in the row; 0 or less for a row past the end)."""
    pred = cute.make_rmem_tensor((1, vpt), cutlass.Boolean)
    for j in range(vpt):  # unrolled while tracing
        pred[0, j] = tXcX[(0, 0), j][0] < limit
    return pred


def load_chunk(tiled_copy: cute.TiledCopy, thr, row: cute.Tensor, index, chunk: cutlass.Constexpr[int],
               pred: cute.Tensor, fill) -> cute.Tensor:
    """Chunk ``index`` of ``row`` into registers, ``((VEC, 1), VPT)``; vectors off ``pred`` hold ``fill``."""
    return to_registers(tiled_copy, thr.partition_S(cute.local_tile(row, (chunk,), (index,))), pred, fill)


def to_registers(tiled_copy: cute.TiledCopy, tXsX: cute.Tensor, pred: cute.Tensor, fill) -> cute.Tensor:
    """A thread's slice ``tXsX`` of a chunk (in global or shared memory) in registers; vectors off
    ``pred`` hold ``fill``."""
    rX = cute.make_rmem_tensor_like(tXsX)
    rX.fill(fill)
    cute.copy(tiled_copy, tXsX, rX, pred=pred)
    return rX


def store_chunk(tiled_copy: cute.TiledCopy, thr, values, row: cute.Tensor, index, chunk: cutlass.Constexpr[int],
                pred: cute.Tensor):
    """Round the float32 ``values`` (a TensorSSA shaped like a chunk fragment) to ``row``'s dtype and
    store the vectors on ``pred`` into chunk ``index`` of ``row``."""
    tYgY = thr.partition_D(cute.local_tile(row, (chunk,), (index,)))
    rY = cute.make_rmem_tensor_like(tYgY)
    rY.store(values.to(row.element_type))
    cute.copy(tiled_copy, rY, tYgY, pred=pred)


@cute.jit
def reduce_staged(staged: cute.Tensor, pred: cute.Tensor, vpt: cutlass.Constexpr[int], fn: cutlass.Constexpr,
                  vals: tuple) -> tuple:
    """``vals`` (a tuple of Float32) updated to ``fn(vals, x)`` for each vector x (float32 TensorSSA)
    of this thread's staged chunk (``stage_chunk``) on ``pred``, one vector at a time (as
    ``store_staged``, so that few values are live at once)."""
    for j in cutlass.range_constexpr(vpt):
        if pred[0, j]:
            vals = fn(vals, _vector_values(staged[None, j]))
    return vals


def _vector_values(v: cute.Tensor):
    """One vector ``v`` (in registers, shared or global memory) as a float32 TensorSSA."""
    r = cute.make_rmem_tensor_like(v)
    cute.autovec_copy(v, r)
    return r.load().to(Float32)


@cute.jit
def store_staged(tiled_copy: cute.TiledCopy, thr, staged: cute.Tensor, row: cute.Tensor, index,
                 chunk: cutlass.Constexpr[int], pred: cute.Tensor, vpt: cutlass.Constexpr[int], fn: cutlass.Constexpr,
                 params: tuple = ()):
    """Store ``fn(x, *p)`` into chunk ``index`` of ``row`` (rounded to its dtype), the vectors on
    ``pred``, one vector at a time: x is this thread's vector of the staged chunk (``staged``, from
    ``stage_chunk``) and each p the same vector of a parameter's slice, ``((VEC, 1), VPT)`` in
    registers (loaded already) or in global memory (read here), or None; both as float32. A
    vector's values are all that is live at once, not the thread's whole chunk (whose 64 float32
    values, beside a parameter's, would take about 120 registers and cost a CTA per SM)."""
    tYgY = thr.partition_D(cute.local_tile(row, (chunk,), (index,)))
    for j in cutlass.range_constexpr(vpt):
        if pred[0, j]:
            ps = tuple(None if const_expr(p is None) else _vector_values(p[None, j]) for p in params)
            rY = cute.make_rmem_tensor_like(tYgY[None, j])
            rY.store(fn(_vector_values(staged[None, j]), *ps).to(row.element_type))
            cute.autovec_copy(rY, tYgY[None, j])


@cute.jit
def masked(values, pred: cute.Tensor, vpt: cutlass.Constexpr[int]):
    """``values`` (a float32 TensorSSA shaped like a chunk fragment) with the vectors off ``pred`` set to 0."""
    frag = cute.make_rmem_tensor(values.shape, Float32)
    frag.store(values)
    for j in cutlass.range_constexpr(vpt):
        if not pred[0, j]:
            frag[None, j].fill(0.0)
    return frag.load()


@cute.jit
def shift_of(m: Float32) -> Float32:
    """The shift for exponentials relative to a max ``m``: m itself, or 0 where m = -inf (no -inf - -inf)."""
    shift = m
    if m == Float32(NEG_INF):
        shift = Float32(0.0)
    return shift


@cute.jit
def exp2f(x):
    """2^x, ex2.approx (scalar or TensorSSA)."""
    return cute.math.exp2(x, fastmath=True)


@cute.jit
def combine_lse(a: tuple, b: tuple) -> tuple:
    """Two (max, sum of exp(x - max)) pairs as one."""
    m = cute.arch.fmax(a[0], b[0])
    shift = shift_of(m)
    return m, a[1] * exp2f((a[0] - shift) * LOG2E) + b[1] * exp2f((b[0] - shift) * LOG2E)


@cute.jit
def combine_max(a: tuple, b: tuple) -> tuple:
    """Elementwise maxima of two tuples."""
    return tuple(cute.arch.fmax(x, y) for x, y in zip(a, b))


@cute.jit
def combine_sum(a: tuple, b: tuple) -> tuple:
    """Elementwise sums of two tuples."""
    return tuple(x + y for x, y in zip(a, b))


@cute.jit
def chunk_lse(x) -> tuple:
    """``(m, s, e)`` of a float32 TensorSSA: its max, the sum of e = exp(x - shift_of(m)), and e."""
    m = x.reduce(cute.ReductionOp.MAX, init_val=NEG_INF, reduction_profile=0)
    e = exp2f((x - shift_of(m)) * LOG2E)
    return m, e.reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0), e


@cute.jit
def online_lse(state: tuple, x) -> tuple:
    """The running (m, s) after one more chunk ``x`` (float32 TensorSSA; -inf where masked)."""
    m_new = cute.arch.fmax(state[0], x.reduce(cute.ReductionOp.MAX, init_val=NEG_INF, reduction_profile=0))
    shift = shift_of(m_new)
    s = state[1] * exp2f((state[0] - shift) * LOG2E) \
        + exp2f((x - shift) * LOG2E).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
    return m_new, s


@cute.jit
def row_allreduce(vals: tuple, combine: cutlass.Constexpr, tpr: cutlass.Constexpr[int], buffer, stage=0) -> tuple:
    """``vals`` (a tuple of Float32) combined over the ``tpr`` threads of each row (consecutive
    threads, a power of two), returned to all of them; see the module doc. With ``tpr`` > 32 every
    thread of the CTA must call it (a barrier); ``buffer[stage]`` must not be in use by another
    call that a warp may still be reading (alternate stages in a loop)."""
    vals = butterfly(vals, combine, min(tpr, _reduce.WARP))
    if const_expr(tpr > _reduce.WARP):
        warps = tpr // _reduce.WARP  # warps per row
        lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
        if lane == 0:
            for k in cutlass.range_constexpr(len(vals)):
                buffer[stage, warp, k] = vals[k]
        cute.arch.barrier()
        source = warp - warp % warps + lane % warps  # lanes l and l + W read the same warp's values
        vals = butterfly(tuple(buffer[stage, source, k] for k in range(len(vals))), combine, warps)
    return vals


@cute.jit
def butterfly(vals: tuple, combine: cutlass.Constexpr, width: cutlass.Constexpr[int]) -> tuple:
    """``vals`` combined over each ``width`` consecutive lanes of a warp (a power of two), by
    butterfly shuffles: at every level a lane and its partner combine the same two values (in
    swapped order), so with a commutative ``combine`` all of them end with the same bits."""
    for level in cutlass.range_constexpr(int(math.log2(width))):
        offset = width >> (level + 1)
        vals = combine(vals, tuple(cute.arch.shuffle_sync_bfly(v, offset=offset) for v in vals))
    return vals


@cute.jit
def across_allreduce(vals: tuple, combine: cutlass.Constexpr, plan_: cutlass.Constexpr, buffer) -> tuple:
    """``row_allreduce`` for a plan ``across``: thread ``lane * ROWS + slot`` holds lane ``lane`` of
    row slot ``slot``; every thread writes its values, one barrier, and each thread combines its row's
    TPR values in lane order (the same order, so the same bits, in all of them)."""
    tidx, _, _ = cute.arch.thread_idx()
    slot, lane = tidx % plan_.rows, tidx // plan_.rows
    for k in cutlass.range_constexpr(len(vals)):
        buffer[lane, slot, k] = vals[k]
    cute.arch.barrier()
    out = tuple(buffer[0, slot, k] for k in range(len(vals)))
    for other in cutlass.range_constexpr(1, plan_.tpr):
        out = combine(out, tuple(buffer[other, slot, k] for k in range(len(vals))))
    return out


def row_launch(M, plan_: Plan, stream) -> dict:
    """The launch of a kernel over ``M`` rows as ``plan_`` covers them: grid (``row_grid``), block,
    cluster (``row_cluster``), stream; a staged plan asks ptxas for ``STAGED_CTAS_PER_SM`` CTAs an SM
    (``.minnctapersm``: at most 80 registers a thread) and the largest shared-memory carveout."""
    launch = dict(grid=row_grid(M, plan_), block=[plan_.threads, 1, 1], cluster=row_cluster(plan_), stream=stream)
    if const_expr(plan_.staged):
        launch.update(min_blocks_per_mp=STAGED_CTAS_PER_SM, preferred_smem_carveout=100)
    return launch


def row_grid(M, plan_: Plan) -> list:
    """The grid of a kernel over ``M`` rows: a CTA per ``plan_.rows`` rows, ``plan_.cluster`` per row."""
    return [cute.ceil_div(M, plan_.rows) * plan_.cluster, 1, 1]


def row_cluster(plan_: Plan):
    """The launch's cluster shape: ``plan_.cluster`` consecutive CTAs (a row's), or None."""
    return [plan_.cluster, 1, 1] if const_expr(plan_.cluster > 1) else None


def cluster_rank(plan_: Plan) -> Int32:
    """This CTA's rank among the CTAs of its row (0 without a cluster)."""
    if const_expr(plan_.cluster == 1):
        return Int32(0)
    bidx, _, _ = cute.arch.block_idx()
    return Int32(bidx % plan_.cluster)  # the cluster's CTAs are consecutive along x: the cluster rank


def chunk_range(N, plan_: Plan) -> tuple:
    """``(first, count)``: the chunks of a row this CTA sweeps -- all of them, or with a cluster per
    row its rank's consecutive share (chunks past the row's end are predicated off)."""
    chunks = cute.ceil_div(N, plan_.chunk)
    if const_expr(plan_.cluster == 1):
        return Int32(0), chunks
    share = cute.ceil_div(chunks, plan_.cluster)
    return cluster_rank(plan_) * share, share


def cluster_buffer(plan_: Plan, values: int, stages: int = 1):
    """Shared memory for ``cluster_allreduce``: ``(slots, barriers)``, per stage a (cluster x warps,
    values) float32 slot per warp of every CTA of the row and the mbarrier that counts the bytes
    stored into them; None without a cluster. A kernel that exchanges once takes one stage, one
    that exchanges row after row two (``cluster_allreduce``'s ``use``). Call before any branch,
    then ``cluster_started``."""
    if const_expr(plan_.cluster == 1):
        return None
    smem = cutlass.memory.SmemAllocator()
    warps = plan_.threads // _reduce.WARP
    slots = smem.allocate_tensor(Float32, cute.make_ordered_layout((stages, plan_.cluster * warps, values),
                                                                   order=(2, 1, 0)), byte_alignment=16)
    return slots, smem.allocate_tensor(Int64, cute.make_layout((stages,)), byte_alignment=8)


@cute.jit
def cluster_started(plan_: cutlass.Constexpr, peers) -> None:
    """With a cluster per row: thread 0 sets up the CTA's mbarriers (``peers``, one a stage), each to
    expect a stage's slots' bytes, and every thread arrives on the cluster barrier whose wait, in
    ``cluster_allreduce``, guarantees that every CTA of the cluster runs and has its mbarriers set
    up before a remote store; the row's loads go on meanwhile."""
    if const_expr(plan_.cluster > 1):
        slots, barriers = peers
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            for stage in cutlass.range_constexpr(cute.size(barriers)):
                cute.arch.mbarrier_init(barriers.iterator + stage, 1)
                cute.arch.mbarrier_arrive_and_expect_tx(barriers.iterator + stage, cute.size(slots[0, None, None]) * 4)
        cute.arch.mbarrier_init_fence()
        cute.arch.cluster_arrive_relaxed()


@dsl_user_op
def store_to_peer(smem: cute.Pointer, barrier: cute.Pointer, rank, value: Float32, *, loc=None, ip=None) -> None:
    """Store ``value`` at the address of ``smem`` (a float32 in this CTA's shared memory) in the
    shared memory of the cluster's CTA ``rank``, counted by that CTA's mbarrier at the address of
    ``barrier``: ``mapa`` gives both addresses there, ``st.async`` writes the value and completes its
    4 bytes on the mbarrier."""
    llvm.inline_asm(
        None, [smem.toint(loc=loc, ip=ip).ir_value(), barrier.toint(loc=loc, ip=ip).ir_value(),
               Int32(rank).ir_value(), Float32(value).ir_value()],
        "{ .reg .b32 peer, bar; mapa.shared::cluster.u32 peer, $0, $2; mapa.shared::cluster.u32 bar, $1, $2; "
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [peer], $3, [bar]; }",
        "r,r,r,f", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@cute.jit
def cluster_allreduce(vals: tuple, combine: cutlass.Constexpr, plan_: cutlass.Constexpr, peers, use=0,
                      waited: cutlass.Constexpr[bool] = False) -> tuple:
    """``vals`` (a warp's result, the same in all its lanes; ``combine`` commutative) combined over
    the warps of the row's cluster (every thread of each CTA on the row), returned to every thread.
    No barrier inside the CTA: once the cluster runs (``cluster_started``'s barrier, waited for here
    unless ``waited``), lane ``r`` of each warp stores the warp's values into its slot [rank, warp]
    of CTA ``r``'s buffer (``st.async`` through ``mapa``), each store counted by CTA ``r``'s
    mbarrier; every warp waits on its CTA's mbarrier for all the slots' bytes (T = cluster x warps
    slots), then lane l combines the slots l, l + W, l + 2W, ... (W the largest power of two <=
    min(T, 32)) in order, and a butterfly over W lanes finishes: the same order, so the same bits,
    in every thread of every CTA. Each CTA is written once a use by each warp of the cluster and
    waits for all of them, so none is written after it exits.

    ``use``: the exchange's number in a kernel that exchanges row after row (``waited``: its caller
    waited for the cluster barrier once, before its loop), through two stages: use u fills stage
    u % 2, whose mbarrier completes its phase (u / 2) % 2, and thread 0 re-arms it for use u + 2.
    A warp's stores of use u + 1 follow its reads of use u, and a CTA's of use u + 2 follow all of
    use u + 1 from every warp of the peers -- so no stage is written while it is read, nor before
    it is re-armed."""
    if const_expr(plan_.cluster > 1):
        slots, barriers = peers
        stages = cute.size(barriers)
        lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
        warps = plan_.threads // _reduce.WARP
        total = plan_.cluster * warps
        width = min(1 << (total.bit_length() - 1), _reduce.WARP)
        slot = cluster_rank(plan_) * warps + warp
        stage, parity = Int32(0), Int32(0)
        if const_expr(stages > 1):
            stage, parity = Int32(use % stages), Int32((use // stages) % 2)
        stage_slots = slots[stage, None, None]
        if const_expr(not waited):
            cute.arch.cluster_wait()  # the peers run, their mbarriers set up (cluster_started)
        if lane < plan_.cluster:
            for k in cutlass.range_constexpr(len(vals)):
                store_to_peer(stage_slots.iterator + slot * len(vals) + k, barriers.iterator + stage, lane, vals[k])
        cute.arch.mbarrier_wait(barriers.iterator + stage, parity)  # every warp's values are here
        first = lane % width
        out = tuple(stage_slots[first, k] for k in range(len(vals)))
        for i in cutlass.range_constexpr(1, -(-total // width)):
            if first + i * width < total:
                out = combine(out, tuple(stage_slots[first + i * width, k] for k in range(len(vals))))
        vals = butterfly(out, combine, width)
        if const_expr(stages > 1):
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 0:  # this stage's next use
                cute.arch.mbarrier_arrive_and_expect_tx(barriers.iterator + stage, total * len(vals) * 4)
    return vals


def rows_allreduce(vals: tuple, combine, plan_: Plan, buffer, stage=0, peers=None) -> tuple:
    """``vals`` combined over the threads of each row, as ``plan_`` lays them out (every thread of the
    CTA calls it when a row spans warps); ``stage``: as ``row_allreduce`` (not for a plan ``across``).
    With a cluster per row, over the row's CTAs as well: each warp's ``butterfly``, then
    ``cluster_allreduce`` through ``peers`` (``combine`` commutative)."""
    if const_expr(plan_.cluster > 1):
        return cluster_allreduce(butterfly(vals, combine, _reduce.WARP), combine, plan_, peers)
    if const_expr(plan_.across):
        return across_allreduce(vals, combine, plan_, buffer)
    return row_allreduce(vals, combine, plan_.tpr, buffer, stage)


def row_thread(tiled_copy: cute.TiledCopy, plan_: cutlass.Constexpr):
    """``(row, lane, thr, tXcX)`` of this thread: its row (64-bit), its lane in the row, its slice of
    the row's TiledCopy and the chunk-local columns of its values, ``((VEC, 1), VPT)``. A row's
    threads are consecutive, or (``plan_.across``) ROWS apart; with a cluster per row, CTAs
    ``row * cluster ... row * cluster + cluster - 1`` share row ``row``."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    lane, slot = tidx % plan_.tpr, tidx // plan_.tpr
    if const_expr(plan_.across):
        lane, slot = tidx // plan_.rows, tidx % plan_.rows
    block = bidx
    if const_expr(plan_.cluster > 1):
        block = bidx // plan_.cluster
    row = Int64(block) * plan_.rows + slot
    thr = tiled_copy.get_slice(lane)
    tXcX = thr.partition_S(cute.make_identity_tensor((plan_.chunk,)))
    return row, lane, thr, tXcX
