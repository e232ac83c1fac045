"""attention: fused flash attention (FlashAttention-3 on Hopper, FlashAttention-2 on mma.sync), forward and
backward, in CuTe.

Per (batch, query head h), with q (Tq, D), the kv head's k and v (Tk, D), c = scale and the causal
mask (query i sees keys j <= i, top-left aligned, also when Tq != Tk, as SDPA's ``is_causal``):

    S = c q k^T  (Tq, Tk)     P = softmax_rows(S)     out = P v  (Tq, D)     lse_i = log sum_j exp S_ij

``kv_len`` (None, or an int32 contiguous (B,) tensor on q's device: a KV cache of Tk slots of which
batch b holds kv_len[b]) hides keys j >= clamp(kv_len[b], 0, Tk) from every query of batch b, beside
the causal mask; a row that sees no key gets out = 0, lse = -inf. The mma.sync forward reads it on
the device (no host sync: a CUDA graph captures one launch for every length); the Hopper kernels do
not take it, and there is no backward with it (the op refuses gradients).

Backward, with dO = dout and delta_i = sum_d dO_id out_id:

    dV = P^T dO     dP = dO v^T     dS = P * (dP - delta)     dQ = c dS k     dK = c dS^T q

FLOPs 4 B H Tq Tk D forward; backward 10 B H Tq Tk D on Hopper, 14 with the mma.sync kernels (they
recompute S and dP in a second kernel for dQ); about half of each with the causal mask. S and P never
reach device memory: the extra memory is lse (B, H, Tq) float32, saved for the backward, and delta of
the same size (on Hopper also a float32 dQ accumulator, twice dq's size, during the backward).

Kernels (``_attention_fwd_sm90``, ``_attention_bwd_sm90``, ``_attention_fwd``, ``_attention_bwd``;
their docstrings have the details):
  - forward on Hopper, 16-bit, D = 64 or 128 (``_attention_fwd_sm90.supports``): FlashAttention-3's
    design, a TMA producer warp and two WGMMA consumer warpgroups with P kept in registers.
  - backward on Hopper, the same cases (``_attention_bwd_sm90.supports``): a work tile per 128 keys
    (causal: pairs of them on a persistent grid, every pair the same work), dK and dV in registers,
    dQ summed across key tiles in float32 by bulk reductions (the copy engine's atomic adds in L2),
    so dq's last bits vary from run to run. Under
    ``torch.use_deterministic_algorithms(True)`` the backward takes the mma.sync kernels instead.
  - forward otherwise, and every forward with kv_len: one CTA of 4 warps per (query tile, query head,
    batch); K, V tiles stream through a two-stage cp.async ring; S = Q K^T and O += P V on mma.sync
    with P kept in registers; online softmax with the row max and sum in registers (quad shuffles);
    out and lse at the end.
  - backward otherwise: delta = rowsum(dO * out); dK, dV per key tile (the group's query heads summed
    by a loop, no atomics); dQ per query tile. Deterministic: no atomics anywhere.
The cache is ``(q, k, v, out, lse)`` as the triton backend's, with q, k, v the tensors the kernels
read (see strides below).

Dtypes: float16 and bfloat16 multiply on 16-bit tensor cores (P and dS rounded to the input dtype
before their products, as FlashAttention and the triton kernels); float32 multiplies on TF32 tensor
cores with each operand split in two TF32 halves ("3xTF32", float32-level accuracy), or with one TF32
product when ``torch.backends.cuda.matmul.allow_tf32`` is on, as gemm and the triton kernels do.
Accumulation is float32 everywhere.

Head dims 1..128: the kernels are compiled for D rounded up to a multiple of 32 (32, 64, 96, 128),
the padding read as zeros (D = 16, 48, 80 work). D * itemsize must be a multiple of 4 bytes (the
smallest cp.async): an odd D in float16/bfloat16, or D > 128, is a ValueError naming the op and D.

Strides: q, k, v are read in place through their batch, head and sequence strides (e.g. the
(B, T, H, D) projection output seen through ``.transpose(1, 2)``) when their head dim has unit
stride; 16-byte vectors when the base addresses and strides allow, else 8 or 4 bytes. A tensor
whose head dim is strided (``[..., ::2]``, a transposed view of the last two dims), or whose
strides or address allow no 4-byte vector, is first copied to a contiguous tensor (``.contiguous()``,
one extra read and write of it); the copy is what the cache holds. dout comes as autograd has it
(``autograd.STRIDED_DOUT``: in a model, the transposed view of the output projection's gradient):
the Hopper backward reads it in place through its strides (TMA and the preprocess), the mma.sync
kernels take a contiguous copy. The Hopper kernels write out, dq, dk and dv laid out as q, k and v
(``_layout.heads_like``: token-major for a projection's views, else contiguous) and the backward
reads out through its strides; the mma.sync kernels write new contiguous tensors (the op's
``_conform`` copies them into its layout) and read a contiguous out.

Compile keys (``_compile``): the mma.sync forward, dK/dV and dQ each (dtype, math mode, padded head
dim, causal, vector width), the forward's with ``True`` appended where kv_len is given; delta (dtype,
padded head dim, vector width); the Hopper kernels as their modules say. Batch, heads, sequence
lengths, the real head dim, strides, the scale and kv_len's values are runtime arguments.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .. import tuning
from .._layout import heads_like, heads_strides, token_major
from . import _compile
from ._attention_bwd import _delta_factory, _dkdv_factory, _dq_factory
from ._attention_bwd_sm90 import attention_bwd_sm90, plan as sm90_bwd_plan, supports as sm90_bwd_supports
from ._attention_fwd import LOG2E, _fwd_factory
from ._attention_fwd_sm90 import attention_fwd_sm90, plan as sm90_plan, supports as sm90_supports
from ._compile import Operand, launch, pointer, stream_of
from ._reduce import sm_count_of, vector_width

MAX_HEAD_DIM = 128
_MAX_DIM = 2**31 - 2**10  # sequence lengths and B H Tq are Int32 in the kernels
_MAX_GRID = 65535  # heads and batch are grid dims y and z


@dataclass(frozen=True)
class Launch:
    """The launch choices of the Hopper attention kernels (the mma.sync kernels have none): the op's
    table (``kcourse.blas.tuning``: ``launch("attention")``, ``override("attention", ...)``). Every
    field defaults to None: the choice of ``_attention_fwd_sm90.config`` (forward) or
    ``_attention_bwd_sm90.config`` (the ``backward_`` fields) for the call's head dim, mask and
    sequence length, summarized after each field; a value fixes it for every call. Every field is
    part of the kernels' compile keys. Why these rules: docs/attention.md, "Why these defaults".

    Forward (a CTA of 128 queries; ``m`` query tiles):

    - ``tile_n``: keys per tile (128).
    - ``persistent``: one CTA per SM walking the work units, not one CTA per unit (without the mask;
      with it where ``scheduled``).
    - ``paired``: a unit is two query tiles, m and m_tiles - 1 - m, equal work under the mask (never:
      ``scheduled`` keeps the pairs but for the last rounds).
    - ``scheduled``: a persistent CTA walks its row of a host-made table (``schedule``: pairs, the
      last two rounds' tiles balanced longest first) (with the mask, up to 64 query tiles).
    - ``pingpong``: the two consumer warpgroups take turns at the tensor cores (where ``scheduled``;
      without the mask at D = 128).
    - ``overlap``: a tile's first S = Q K^T is issued beside the last P V of the tile before (D = 128,
      where ``scheduled``, or without the mask up to 8 query tiles).
    - ``q_stages``: Q buffers (2 with the overlap, else 1); ``k_stages``, ``v_stages``: the K and V
      rings (2, 2). A variant whose buffers exceed shared memory is refused by name.
    - ``tma_store``: out leaves through shared memory and TMA stores, not 4-byte stores from registers
      (D = 128 where ``scheduled`` or without the mask up to 32 query tiles; D = 64 up to 16).

    Backward (a work tile of 128 keys; ``n`` key tiles):

    - ``backward_persistent``: one CTA per SM walking the units (with the mask, up to 64 key tiles).
    - ``backward_paired``: a unit is two key tiles, n and n_blocks - 1 - n (as ``backward_persistent``).
    - ``backward_tma_store``: dK and dV leave through shared memory and TMA stores (D = 128 up to 32
      key tiles with the mask and 16 without; D = 64 up to 8).
    """

    tile_n: int | None = None
    persistent: bool | None = None
    paired: bool | None = None
    scheduled: bool | None = None
    pingpong: bool | None = None
    overlap: bool | None = None
    q_stages: int | None = None
    k_stages: int | None = None
    v_stages: int | None = None
    tma_store: bool | None = None
    backward_persistent: bool | None = None
    backward_paired: bool | None = None
    backward_tma_store: bool | None = None


LAUNCH = Launch()


def _math_mode(dtype: torch.dtype) -> str:
    if dtype != torch.float32:
        return "mma16"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "3xtf32"


def _padded_head_dim(q: torch.Tensor) -> int:
    """D rounded up to a multiple of 32; raises for a head dim the kernels cannot take."""
    D = q.shape[-1]
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"attention: the cute kernels support head dims D from 1 to {MAX_HEAD_DIM}, "
                         f"got D = {D} (q {tuple(q.shape)})")
    if D * q.element_size() % 4:
        raise ValueError(f"attention: the cute kernels need D * itemsize to be a multiple of 4 bytes (their "
                         f"smallest copy), got D = {D} in {str(q.dtype).replace('torch.', '')} (q {tuple(q.shape)})")
    if max(q.shape[0], q.shape[1]) > _MAX_GRID:
        raise ValueError(f"attention: q is {tuple(q.shape)}; the cute kernels take at most {_MAX_GRID} "
                         "batches and heads")
    return -(-D // 32) * 32


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, sequence) strides; 0 for a dim of size 1 (only ever indexed at 0, so it divides
    every vector width)."""
    return tuple(s if n > 1 else 0 for n, s in zip(t.shape[:3], t.stride()[:3]))


def _vec(tensors) -> int:
    """The widest access (elements, up to 16 bytes) every tensor allows: base address, strides, D."""
    t0 = tensors[0]
    counts = [t0.shape[-1]] + [s for t in tensors for s in _strides(t)]
    return vector_width(t0.element_size(), [t.data_ptr() for t in tensors], counts)


def _readable(*tensors):
    """The tensors as the kernels read them, and the vector width: in place where the head dim has
    unit stride and a 4-byte (or wider) vector fits, else contiguous copies."""
    size = tensors[0].element_size()
    tensors = [t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous() for t in tensors]
    vec = _vec(tensors)
    if vec * size < 4:  # an odd stride or an address 2 bytes off: copy (D * size % 4 == 0 was checked)
        tensors = [t.contiguous() for t in tensors]
        vec = _vec(tensors)
    return tensors, vec


def _heads_like(t: Operand) -> Operand:
    """The stand-in of ``heads_like(t)`` (a new tensor: 16-byte aligned)."""
    return Operand(t.shape, heads_strides(t.shape, token_major(t)), t.dtype, 0)


def _check_lengths(Tq: int, Tk: int, rows: int) -> None:
    if max(Tq, Tk, rows) > _MAX_DIM:
        raise ValueError(f"attention: Tq = {Tq}, Tk = {Tk}; the cute kernels take sequences (and B H Tq) "
                         f"below {_MAX_DIM}")


def _facts(q: torch.Tensor) -> tuple:
    """What the plans depend on besides the operands: the target, the device (-1: the CPU), the math mode."""
    return _compile.target(), q.get_device(), _math_mode(q.dtype)


class _Forward(NamedTuple):
    """A forward call's plan: which of q, k, v are copied first (``_readable``), and the launch."""

    copies: tuple  # (q, k, v): made contiguous first
    sm90: bool  # the Hopper kernel (``key``, ``numbers``, ``walk`` as its ``plan`` says), else mma.sync
    key: tuple
    align: int  # bytes promised for q, k, v, out (mma.sync)
    numbers: tuple  # the runtime numbers after the pointers (mma.sync: and before the stream)
    walk: tuple | None  # the Hopper kernel's schedule_table arguments, where it walks one


@_compile.plan_cache
def _forward_plan(q: Operand, k: Operand, v: Operand, has_kv_len: bool, causal: bool, scale: float, launch: Launch,
                  arch: str, device: int, mode: str) -> _Forward | None:
    """The forward's plan for operands laid out as q, k, v (None: nothing to compute, no query or no
    key) under the op's table ``launch``; ``has_kv_len``: the call passes kv_len (the mma.sync kernel
    compiled for it, whatever its values). ``arch``, ``mode``: ``_compile.target()`` and ``_math_mode``,
    which the planning reads too."""
    Dp = _padded_head_dim(q)
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    _check_lengths(Tq, Tk, B * H * Tq)
    if B * H * Tq * D == 0 or Tk == 0:
        return None
    read, vec = _readable(q, k, v)
    copies = tuple(r is not t for r, t in zip(read, (q, k, v)))
    q, k, v = read
    if not has_kv_len and sm90_supports(q, k, v, scale):  # Hopper, 16-bit, D = 64 or 128: TMA + WGMMA
        key, numbers, walk = sm90_plan(q, k, v, causal, scale, sm_count_of(device), launch)
        return _Forward(copies, True, key, 16, numbers, walk)
    out = Operand.new((B, H, Tq, D), q.dtype)
    vec = min(vec, _vec([out]))
    numbers = (B, H, Hkv, Tq, Tk, D, *_strides(q), *_strides(k), *_strides(v), *_strides(out), scale * LOG2E)
    key = (q.dtype, mode, Dp, causal, vec) + ((True,) if has_kv_len else ())
    return _Forward(copies, False, key, vec * q.element_size(), numbers, None)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len: torch.Tensor | None, causal: bool,
              scale: float):
    """``(out, (q, k, v, out, lse))``: out (B, H, Tq, D) in q's dtype (the Hopper kernel's laid out as
    ``heads_like(q)``, the others' contiguous), lse (B, H, Tq) float32. ``kv_len``: None, or an int32
    contiguous (B,) tensor on q's device, read by the kernel (never on the host)."""
    table = tuning.launch("attention")
    plan = _forward_plan(Operand.of(q), Operand.of(k), Operand.of(v), kv_len is not None, causal, scale, table,
                         *_facts(q))
    B, H, Tq, D = q.shape
    lse = q.new_empty((B, H, Tq), dtype=torch.float32)
    if plan is None:  # no keys: an empty sum, zeros (as scaled_dot_product_attention)
        out = q.new_zeros((B, H, Tq, D))
        return out, (q, k, v, out, lse.fill_(float("-inf")))
    if any(plan.copies):
        q, k, v = (t.contiguous() if copy else t for t, copy in zip((q, k, v), plan.copies))
    # the Hopper kernel writes the op's layout (token-major for token-major q); mma.sync a contiguous out
    out = heads_like(q) if plan.sm90 else q.new_empty((B, H, Tq, D))
    if plan.sm90:
        attention_fwd_sm90(q, k, v, out, lse, causal, scale, table, planned=(plan.key, plan.numbers, plan.walk))
    else:
        align = plan.align
        launch(_fwd_factory, plan.key, pointer(q, align), pointer(k, align), pointer(v, align), pointer(out, align),
               pointer(lse, 4), None if kv_len is None else pointer(kv_len, 4), *plan.numbers, stream_of(q))
    return out, (q, k, v, out, lse)


class _Backward(NamedTuple):
    """A backward call's plan: which of q, k, v, dout are copied first, and the launches."""

    copies: tuple  # (q, k, v, dout): made contiguous first
    sm90: tuple | None  # the Hopper kernels' ``plan``, else the mma.sync kernels:
    keys: tuple  # (delta, dK/dV, dQ) compile keys
    align: int  # bytes promised for q, k, v, dout, out, dq, dk, dv
    numbers: tuple  # the dK/dV and dQ kernels' numbers after their pointers


@_compile.plan_cache
def _backward_plan(q: Operand, k: Operand, v: Operand, dout: Operand, out: Operand, causal: bool, scale: float,
                   deterministic: bool, launch: Launch, arch: str, device: int, mode: str) -> _Backward | None:
    """The backward's plan for operands laid out as q, k, v, dout and the forward's out (None:
    every gradient is zero, no query or no key) under the op's table ``launch``."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if q.numel() == 0 or k.numel() == 0:
        return None
    Dp = _padded_head_dim(q)
    _check_lengths(Tq, Tk, B * H * Tq)
    # Hopper, 16-bit, D = 64 or 128: TMA + WGMMA, dQ summed by float32 bulk reductions (their order
    # varies: the last bits of dq may differ run to run). Deterministic mode takes the mma.sync kernels.
    # dout is read in place through its strides when TMA can describe them (a model's transposed view,
    # say: its copy took ~0.1 ms at 16k tokens, 16 heads, D = 128); the other kernels want it contiguous.
    originals = (q, k, v, dout)
    (q, k, v, dout), vec = _readable(q, k, v, dout)
    if sm90_bwd_supports(q, k, v, dout, scale) and not deterministic:
        copies = tuple(r is not t for r, t in zip((q, k, v, dout), originals))
        dk, dv = (_heads_like(t) for t in originals[1:3])  # the gradients in the op's layout (of the inputs)
        return _Backward(copies, sm90_bwd_plan(q, k, v, dout, causal, scale, sm_count_of(device), launch, dk, dv),
                         (), 16, ())
    if not dout.is_contiguous():  # the delta kernel reads dout (and out) as contiguous rows
        dout = dout.contiguous()
        vec = _vec([q, k, v, dout])
    copies = tuple(r is not t for r, t in zip((q, k, v, dout), originals))
    vec = min(vec, _vec([out.contiguous()]))  # (the forward's own out: already contiguous)
    keys = ((q.dtype, Dp, vec), (q.dtype, mode, Dp, causal, vec), (q.dtype, mode, Dp, causal, vec))
    numbers = (B, H, Hkv, Tq, Tk, D, *_strides(q), *_strides(k), *_strides(v), *_strides(dout), scale * LOG2E, scale)
    return _Backward(copies, None, keys, vec * q.element_size(), numbers)


def attention_backward(dout: torch.Tensor, cache, needs, causal: bool, scale: float):
    """``(dq, dk, dv)``, each None where ``needs`` says no. On Hopper (16-bit, D = 64 / 128, not in
    deterministic mode) one pass computes all three (dq's conversion only when needed); otherwise delta
    first, then dK and dV together when either is needed, then dQ when needed."""
    q, k, v, out, lse = cache
    table = tuning.launch("attention")
    plan = _backward_plan(Operand.of(q), Operand.of(k), Operand.of(v), Operand.of(dout), Operand.of(out), causal,
                          scale, torch.are_deterministic_algorithms_enabled(), table, *_facts(q))
    if plan is None:  # no query or no key: every gradient is zero
        return tuple(torch.zeros(t.shape, dtype=t.dtype, device=t.device) if n else None
                     for t, n in zip((q, k, v), needs))
    if plan.sm90 is not None:  # the gradients in the op's layout, laid out as the inputs; out read in place
        dq = heads_like(q) if needs[0] else None
        dk, dv = heads_like(k), heads_like(v)
        if any(plan.copies):
            q, k, v, dout = (t.contiguous() if copy else t for t, copy in zip((q, k, v, dout), plan.copies))
        attention_bwd_sm90(q, k, v, out, dout, lse, dq, dk, dv, causal, scale, table, planned=plan.sm90)
        return dq, dk if needs[1] else None, dv if needs[2] else None
    out = out.contiguous()  # (the delta kernel reads its rows as contiguous)
    if any(plan.copies):
        q, k, v, dout = (t.contiguous() if copy else t for t, copy in zip((q, k, v, dout), plan.copies))
    dq = q.new_empty(q.shape) if needs[0] else None
    align, (delta_key, dkdv_key, dq_key), dev = plan.align, plan.keys, stream_of(q)
    B, H, Tq, D = q.shape
    delta = torch.empty_like(lse)
    launch(_delta_factory, delta_key, pointer(out, align), pointer(dout, align), pointer(delta, 4), B * H * Tq, D, dev)
    inputs = (pointer(q, align), pointer(k, align), pointer(v, align), pointer(dout, align),
              pointer(lse, 4), pointer(delta, 4))
    dk = dv = None
    if needs[1] or needs[2]:
        dk, dv = k.new_empty(k.shape), v.new_empty(v.shape)
        launch(_dkdv_factory, dkdv_key, *inputs, pointer(dk, align), pointer(dv, align), *plan.numbers, dev)
    if needs[0]:
        launch(_dq_factory, dq_key, *inputs, pointer(dq, align), *plan.numbers, dev)
    return dq, dk if needs[1] else None, dv if needs[2] else None
