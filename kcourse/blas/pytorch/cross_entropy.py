"""cross_entropy of logits (N, V) and class indices target (N,) with ``torch.logsumexp`` and indexing:

    loss_i = logsumexp(x_i) - x_i,target_i        0 where target_i == ignore_index
    out    = sum_i loss_i / n_valid  (mean)  |  sum_i loss_i  (sum)  |  loss  (none)

``F.cross_entropy`` is not used: the backward needs the row logsumexp (cached in float32), and a
target outside [0, V) must give NaN (documented on every backend) rather than a device-side assert.
Half-precision logits are upcast to float32 first: a transient float32 copy of (N, V).

Backward: ``dx_ij = (exp(x_ij - lse_i) - [j == target_i]) * g_i`` with ``g_i = dout / n_valid``
(mean), ``dout`` (sum), ``dout_i`` (none), and 0 on ignored rows.
"""
import torch

from ..python._acc import acc
from ..python.cross_entropy import reduce_rows, row_weights  # the reductions, defined once


def _safe(target: torch.Tensor, V: int) -> torch.Tensor:
    """target as int64 indices, with those outside [0, V) (ignored or invalid) replaced by 0."""
    return torch.where((target >= 0) & (target < V), target, 0).long()


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str):
    N, V = logits.shape
    valid = target != ignore_index
    lse = torch.logsumexp(acc(logits), dim=1)  # (N,)
    lse = lse.masked_fill(valid & ((target < 0) | (target >= V)), torch.nan)
    picked = logits[torch.arange(N, device=logits.device), _safe(target, V)]  # (N,)
    loss = torch.where(valid, lse - acc(picked), 0)
    return reduce_rows(loss, valid, reduction).to(logits.dtype), (logits, target, lse)


def cross_entropy_backward(dout: torch.Tensor, cache, needs, ignore_index: int, reduction: str):
    logits, target, lse = cache
    if not needs[0]:
        return None, None
    N, V = logits.shape
    valid = target != ignore_index
    dx = torch.exp(acc(logits) - lse[:, None])  # (N, V): the softmax
    dx[torch.arange(N, device=logits.device), _safe(target, V)] -= 1
    dx *= row_weights(acc(dout), valid, reduction)
    return torch.where(valid[:, None], dx, 0).to(logits.dtype), None
