"""cross_entropy of logits x (N, V) and class indices target (N,):

    lse_i  = m_i + log s_i,    s_i = sum_j exp(x_ij - m_i),  m_i = max_j x_ij
    loss_i = lse_i - x_i,target_i  (as (m_i - x_i,target_i) + log s_i)    0 where target_i == ignore_index
    out    = sum_i loss_i / n_valid  (mean)  |  sum_i loss_i  (sum)  |  loss  (none)

n_valid is the number of rows whose target is not ignore_index. A target outside [0, V) that is
not ignore_index is an IndexError (``_check.index_range``, on the host for CPU tensors; on a GPU a
device assert here, ``_check.assert_indices``), as in torch.

Non-finite logits, one rule on every backend: the shift is m_i where m_i is finite, else 0, so a
+inf logit gives s_i = lse_i = +inf and, against a finite target logit, loss_i = +inf (the value of
logsumexp(x_i) - x_i,target_i, and the limit as that logit grows; ``F.cross_entropy`` in torch 2.13
gives NaN, through its log_softmax's inf - inf); a +inf target logit gives inf - inf = NaN, a row of
-inf NaN, a NaN logit NaN.

Backward: d loss_i / d x_ij = exp(x_ij - lse_i) - [j == target_i] (softmax minus one-hot), so with
g_i = dout / n_valid (mean), dout (sum), dout_i (none), and 0 on ignored rows:

    dx_ij = (exp(x_ij - lse_i) - [j == target_i]) * g_i

The cache is ``(logits, target, lse)``, lse in float32 (float64 for float64 logits).
"""
import torch

from .. import _check
from ._acc import acc


def _onehot(target: torch.Tensor, V: int) -> torch.Tensor:
    """(N, V) bool: ``[j == target_i]``; all False for an ignored target outside [0, V)."""
    return torch.arange(V, device=target.device)[None, :] == target[:, None]


# The reductions, shared with the pytorch backend (they define the op, they are not a kernel).

def reduce_rows(loss: torch.Tensor, valid: torch.Tensor, reduction: str) -> torch.Tensor:
    """The (N,) row losses (0 on ignored rows) reduced: their sum, the sum over n_valid, or as they are."""
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / valid.sum()  # n_valid on the device; 0/0 = NaN when every row is ignored
    return loss


def row_weights(dout: torch.Tensor, valid: torch.Tensor, reduction: str) -> torch.Tensor:
    """g, the factor of row i's gradient, shaped to broadcast over (N, V): dout / n_valid (mean),
    dout (sum), dout_i (none). Ignored rows are zeroed by the caller."""
    if reduction == "mean":
        return dout / valid.sum()
    return dout[:, None] if reduction == "none" else dout


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str):
    _check.assert_indices(target, logits.shape[1], ignore_index)  # on a GPU (the host checked CPU targets)
    x = acc(logits)  # (N, V)
    m = x.amax(dim=1)  # (N,)
    m = torch.where(m.isinf(), 0, m)  # the shift: the row max where finite (a +inf max: s = lse = +inf)
    log_s = (x - m[:, None]).exp().sum(dim=1).log()  # (N,)
    onehot = _onehot(target, x.shape[1])
    valid = target != ignore_index
    picked = torch.where(onehot, x, 0).sum(dim=1)  # (N,): x[i, target_i]
    loss = torch.where(valid, (m - picked) + log_s, 0)  # lse - picked, without rounding lse first
    return reduce_rows(loss, valid, reduction).to(logits.dtype), (logits, target, m + log_s)


def cross_entropy_backward(dout: torch.Tensor, cache, needs, ignore_index: int, reduction: str):
    logits, target, lse = cache
    if not needs[0]:
        return None, None
    x = acc(logits)
    valid = target != ignore_index
    g = row_weights(acc(dout), valid, reduction)
    dx = ((x - lse[:, None]).exp() - _onehot(target, x.shape[1]).to(x.dtype)) * g
    return torch.where(valid[:, None], dx, 0).to(logits.dtype), None

