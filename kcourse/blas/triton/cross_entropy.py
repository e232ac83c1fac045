"""cross_entropy of logits (N, V) and class indices target (N,):

    lse_i  = log sum_j exp(x_ij)                  (float32, with the row max subtracted first)
    loss_i = lse_i - x_i,target_i                  0 where target_i == ignore_index
    out    = sum_i loss_i / n_valid  (mean)  |  sum_i loss_i  (sum)  |  loss  (none)

n_valid counts the rows whose target is not ignore_index (mean over none of them is 0/0 = NaN,
as in torch). A target outside [0, V) that is not ignore_index is never read: its row's lse and
loss are NaN (torch raises instead).

Backward, with g_i = dout / n_valid (mean), dout (sum), dout_i (none), and 0 on ignored rows:

    dx_ij = (exp(x_ij - lse_i) - [j == target_i]) * g_i       (softmax minus one-hot)

FLOPs: ~4NV forward (max, exp, sum), ~4NV backward. Bytes: forward reads the logits once
(NV * itemsize) and writes 2N float32; backward reads them again and writes dlogits (2NV *
itemsize); ignored rows read nothing. Memory bound. No second (N, V) tensor is ever made: one
program per row sweeps V in chunks with an online max/sum (``online_logsumexp``), keeping only the
row's lse (cached) and loss. The mean and sum are a second, one-program kernel (no atomics,
deterministic, on the device: no host sync).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._softmax import CHUNK, online_logsumexp

SUM_BLOCK = 1024  # rows per step of the one-program reduction


@triton.jit
def cross_entropy_kernel(x_ptr, target_ptr, lse_ptr, loss_ptr, V, stride_xn, stride_xv, stride_t, ignore_index,
                         BLOCK_V: tl.constexpr):
    # x: (N, V); target: (N,) int32/int64; lse: (N,) float32; loss: (N,), float32 or x's dtype.
    # One program per row i.
    i = tl.program_id(0).to(tl.int64)
    row = i + tl.arange(0, 1)  # (1,): this program's row, as a block of one
    t = tl.load(target_ptr + i * stride_t).to(tl.int64)
    valid = t != ignore_index
    # an ignored row (lse 0, loss 0) or an out-of-range target (NaN) reads no logits
    lse = tl.zeros([1], dtype=tl.float32) + tl.where(valid, float("nan"), 0.0)
    loss = lse
    if valid & (t >= 0) & (t < V):
        x_row = x_ptr + row[:, None] * stride_xn  # (1, 1)
        m, s = online_logsumexp(x_row, stride_xv, V, 1, BLOCK_V)
        lse = m + tl.log(s)
        # lse - x_t, without rounding lse first (at |x| ~ 1e4 its float32 ulp is 1e-3)
        loss = (m - tl.load(x_ptr + i * stride_xn + t * stride_xv).to(tl.float32)) + tl.log(s)
    tl.store(lse_ptr + row, lse)
    tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))


@triton.jit
def valid_sum_kernel(loss_ptr, target_ptr, out_ptr, N, stride_t, ignore_index, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    # loss: (N,) float32 or None; target: (N,); out: 0-d.
    # out = sum_i loss_i, divided by n_valid when MEAN; with loss None: out = n_valid.
    total = tl.zeros([BLOCK], dtype=tl.float32)
    count = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, N, BLOCK):
        i = start + tl.arange(0, BLOCK).to(tl.int64)
        valid = (i < N) & (tl.load(target_ptr + i * stride_t, mask=i < N, other=ignore_index) != ignore_index)
        count += valid.to(tl.int32)
        if loss_ptr is not None:
            total += tl.load(loss_ptr + i, mask=i < N, other=0.0)
    n_valid = tl.sum(count, axis=0).to(tl.float32)
    if loss_ptr is None:
        out = n_valid
    elif MEAN:
        out = tl.sum(total, axis=0) / n_valid
    else:
        out = tl.sum(total, axis=0)
    tl.store(out_ptr, out.to(out_ptr.dtype.element_ty))


@triton.jit
def cross_entropy_backward_kernel(x_ptr, target_ptr, lse_ptr, dout_ptr, n_valid_ptr, dx_ptr, V,
                                  stride_xn, stride_xv, stride_t, stride_dout, stride_dxn, stride_dxv, ignore_index,
                                  BLOCK_V: tl.constexpr):
    # x, dx: (N, V); target: (N,); lse: (N,) float32; dout: 0-d (stride_dout 0) or (N,);
    # n_valid: 0-d float32 for the mean, else None. One program per row i.
    i = tl.program_id(0).to(tl.int64)
    t = tl.load(target_ptr + i * stride_t).to(tl.int64)
    valid = t != ignore_index
    g = tl.load(dout_ptr + i * stride_dout).to(tl.float32)
    if n_valid_ptr is not None:
        g = g / tl.load(n_valid_ptr)
    lse = tl.load(lse_ptr + i)
    n_read = tl.where(valid, V, 0)  # an ignored row writes zeros without reading its logits
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V).to(tl.int64)  # (BLOCK_V,)
        x = tl.load(x_ptr + i * stride_xn + cols * stride_xv, mask=cols < n_read, other=0.0).to(tl.float32)
        dx = tl.where(valid, (tl.exp(x - lse) - (cols == t).to(tl.float32)) * g, 0.0)
        tl.store(dx_ptr + i * stride_dxn + cols * stride_dxv, dx.to(dx_ptr.dtype.element_ty), mask=cols < V)


def _block_v(V):
    return min(triton.next_power_of_2(max(V, 1)), CHUNK)


def _warps(block):
    return min(8, max(1, block // 512))


def _valid_sum(loss, target, ignore_index, mean, out):
    valid_sum_kernel[(1,)](loss, target, out, target.shape[0], target.stride(0), ignore_index,
                           MEAN=mean, BLOCK=SUM_BLOCK, num_warps=4)
    return out


def cross_entropy(logits, target, ignore_index, reduction):
    """``(loss, (logits, target, lse))``: the losses (reduction "none") or their mean or sum."""
    N, V = logits.shape
    lse = torch.empty(N, dtype=torch.float32, device=logits.device)
    loss = torch.empty(N, dtype=logits.dtype if reduction == "none" else torch.float32, device=logits.device)
    if N:
        BLOCK_V = _block_v(V)
        cross_entropy_kernel[(N,)](logits, target, lse, loss, V, *logits.stride(), target.stride(0), ignore_index,
                                   BLOCK_V=BLOCK_V, num_warps=_warps(BLOCK_V))
    if reduction != "none":
        loss = _valid_sum(loss, target, ignore_index, reduction == "mean",
                          torch.empty((), dtype=logits.dtype, device=logits.device))
    return loss, (logits, target, lse)


def cross_entropy_backward(dout, cache, needs, ignore_index, reduction):
    """``(dlogits, None)``: ``(softmax(logits) - onehot(target)) * g`` row by row, 0 on ignored rows."""
    logits, target, lse = cache
    if not needs[0] or logits.numel() == 0:
        return (torch.zeros_like(logits) if needs[0] else None), None
    N, V = logits.shape
    n_valid = None
    if reduction == "mean":
        n_valid = _valid_sum(None, target, ignore_index, False,
                             torch.empty((), dtype=torch.float32, device=logits.device))
    dlogits = torch.empty_like(logits)
    BLOCK_V = _block_v(V)
    cross_entropy_backward_kernel[(N,)](logits, target, lse, dout, n_valid, dlogits, V, *logits.stride(),
                                        target.stride(0), 0 if reduction != "none" else dout.stride(0),
                                        *dlogits.stride(), ignore_index, BLOCK_V=BLOCK_V, num_warps=_warps(BLOCK_V))
    return dlogits, None
