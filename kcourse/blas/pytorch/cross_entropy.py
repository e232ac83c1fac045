"""cross_entropy of logits (N, V) and class indices target (N,) with ATen's row kernels:
``torch.log_softmax`` forward, ``torch.softmax`` backward (each one fused pass over a row, float32
accumulation for half types), and gathers of the target column:

    loss_i = lse_i - x_i,target_i = -log_softmax(x_i)[target_i]     0 where target_i == ignore_index
    out    = sum_i loss_i / n_valid  (mean)  |  sum_i loss_i  (sum)  |  loss  (none)

The forward's only (N, V) pass besides log_softmax is one ``amax`` of the logits for the +inf rule:
a row holding +inf has lse +inf and loss +inf (NaN if the target logit itself is +inf), where
log_softmax alone gives NaN. The cache keeps ``lse_i = x_i,t - log_softmax(x_i)[t]`` (t the row's
target, column 0 on ignored rows; float32, float64 for float64 logits), never an (N, V) tensor.

Precision of half logits, chosen to move no more bytes than ``F.cross_entropy``:
- bfloat16: log_softmax in bfloat16 (float32 inside, each entry rounded once), so each row's loss is
  rounded to bfloat16 before the float32 sum: torch's own numerics. A row's loss and lse are exact
  to half an ulp of bfloat16 at |log p_t|.
- float16 on CUDA: ATen's log_softmax writes float32 directly from float16 (``half_to_float``); on
  the CPU, which has no such kernel, the logits are upcast first (a transient float32 copy). float16
  log-probabilities below -65504 would overflow, so float16 never keeps them in its own dtype.
The loss is summed in float32 and rounded once. n_valid = 0 gives NaN for the mean, as in torch.

A target outside [0, V) that is not ignore_index is an error, never a silent NaN: on CUDA a
device-side assert (``torch._assert_async``, no host sync) before the kernels run; on CPU the op's
argument check (``kcourse.blas._check``) raises on the host, and a direct call of this function
fails in the gather (torch's own IndexError) before anything is returned.

Backward: ``dx_ij = (softmax(x_i)_j - [j == target_i]) * g_i`` with ``g_i = dout / n_valid`` (mean),
``dout`` (sum), ``dout_i`` (none), and 0 on ignored rows. The forward keeps its log-probabilities
(the cache is ``(logits, target, lse, log_p)``, as torch's own backward keeps its log_softmax), and
the backward is ATen's log_softmax backward, ``dx = dl - exp(log_p) sum_j dl_j``, of ``dl = -g onehot``
(a zero fill and a scatter): one pass over the rows, as ``F.cross_entropy``'s backward, where ATen's
softmax over long rows runs far below bandwidth (H200, 32768 x 8192 bf16: 1.0 ms against 0.27 for
a read and a write). bf16's probabilities then come from log-probabilities rounded to bf16: an
absolute error up to p |log p| 2^-9 < 7.2e-4, as torch's. A caller that runs the backward right
after the forward and never again (``spend_log_probs``: linear_cross_entropy's chunks) has the exp
written over the log-probabilities themselves, then scaled by g in place (a mixed-dtype in-place
product runs far below bandwidth, so g is first rounded to the logits' dtype); where the cache holds
none (linear_cross_entropy's backward sweep over recomputed logits, for "none"), ``torch.softmax``
of the logits, scaled alike. The target column is then overwritten with ``(exp(x_t - lse) - 1) * g``
computed in float32 (subtracting 1 from a rounded probability near 1 would cancel its digits).
"""
import torch

from ..python._acc import acc
from ..python.cross_entropy import reduce_rows, row_weights  # the reductions, defined once


def _assert_targets(target: torch.Tensor, valid: torch.Tensor, V: int, ignore_index: int) -> None:
    """On CUDA, a device-side assert that every target other than ignore_index lies in [0, V)."""
    if target.device.type == "cuda":
        bad = valid & ((target < 0) | (target >= V))
        torch._assert_async(~bad.any(), f"cross_entropy: a target is outside [0, {V}) and is not "
                                        f"ignore_index ({ignore_index})")


def _columns(target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(N, 1) int64: each row's target column, 0 on ignored rows. Not clamped: a bad target makes
    the gather fail rather than read another column."""
    return torch.where(valid, target, 0).long()[:, None]


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """(N, V) log-probabilities, in one pass over the logits where ATen has one: bfloat16, float32
    and float64 in their own dtype; float16 in float32 (converted on the fly on CUDA, upcast first on
    the CPU)."""
    if logits.dtype != torch.float16:
        return torch.log_softmax(logits, dim=1)
    if logits.device.type == "cuda":
        return torch._log_softmax(logits, 1, True)
    return torch.log_softmax(logits.float(), dim=1)


def log_probs_like(logits: torch.Tensor) -> torch.Tensor:
    """An empty (N, V) tensor of the dtype ``_log_softmax`` gives ``logits`` (the fake implementation's)."""
    return logits.new_empty(logits.shape, dtype=torch.float32 if logits.dtype == torch.float16 else logits.dtype)


def _rows(logits: torch.Tensor, valid: torch.Tensor, cols: torch.Tensor):
    """``(loss, lse, log_p, x_t)``: each row's loss (0 on ignored rows), lse and target logit (N,), float32,
    and the (N, V) log-probabilities."""
    log_p = _log_softmax(logits)  # (N, V)
    log_p_t = acc(log_p.gather(1, cols)).squeeze(1)  # (N,)
    x_t = acc(logits.gather(1, cols)).squeeze(1)  # (N,)
    posinf = logits.amax(dim=1) == torch.inf  # (N,): rows holding +inf (log_softmax gives NaN there)
    lse = torch.where(posinf, torch.inf, x_t - log_p_t)
    loss = torch.where(valid, torch.where(posinf, torch.inf - x_t, -log_p_t), 0)
    return loss, lse, log_p, x_t


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str):
    """``(loss, (logits, target, lse, log_p))``: the (N, V) log-probabilities kept for the backward."""
    N, V = logits.shape
    valid = target != ignore_index
    _assert_targets(target, valid, V, ignore_index)
    loss, lse, log_p, _ = _rows(logits, valid, _columns(target, valid))
    return reduce_rows(loss, valid, reduction).to(logits.dtype), (logits, target, lse, log_p)


def cross_entropy_grad(logits: torch.Tensor, target: torch.Tensor, ignore_index: int):
    """``(loss, dlogits, valid)`` of one chunk of linear_cross_entropy: each row's loss (N,) in the logits'
    dtype, ``dlogits = softmax - onehot`` (N, V) written over the log-probabilities (each row's weight
    not applied, ignored rows included), and which rows count (N,): the forward and the backward at
    once, sharing the target columns. Targets are not checked here: the caller checks them all once."""
    valid = target != ignore_index
    cols = _columns(target, valid)
    loss, lse, log_p, x_t = _rows(logits, valid, cols)
    dx = log_p.exp_().to(logits.dtype)  # (N, V) (float16's float32 log-probabilities rounded once)
    d_t = torch.exp(x_t - lse) - 1  # (N,): the target column, in float32
    return loss.to(logits.dtype), dx.scatter_(1, cols, d_t.to(dx.dtype)[:, None]), valid


def cross_entropy_backward(dout: torch.Tensor, cache, needs, ignore_index: int, reduction: str,
                           row_weighted: bool = True, spend_log_probs: bool = False):
    """``(dx, None)``. ``row_weighted=False``: dx is softmax - onehot, each row's weight g (dout,
    dout / n_valid, 0 on ignored rows) not applied, for a caller that applies it to a narrower
    tensor (linear_cross_entropy scales its (n, K) operands instead of the (n, V) dlogits).
    ``spend_log_probs``: dx is written over the cache's log-probabilities."""
    logits, target, lse, *log_p = cache  # no log_p: linear_cross_entropy's recomputing sweep (lse kept alone)
    if not needs[0]:
        return None, None
    N, V = logits.shape
    valid = target != ignore_index
    cols = _columns(target, valid)
    x_t = acc(logits.gather(1, cols)).squeeze(1)  # (N,)
    d_t = torch.exp(x_t - lse) - 1  # (N,): the target column, in float32
    g = torch.where(valid, row_weights(acc(dout), valid, reduction).reshape(-1), 0) if row_weighted else None
    if log_p and row_weighted and not spend_log_probs:  # one fused pass, as torch's own backward
        dx = _log_softmax_backward(log_p[0], cols, g, logits.dtype)
    else:
        if not log_p:
            dx = torch.softmax(logits, dim=1)  # (N, V) in the logits' dtype
        elif spend_log_probs:  # (float16's float32 log-probabilities rounded once)
            dx = log_p[0].exp_().to(logits.dtype)  # (N, V)
        else:  # a new tensor in the logits' dtype
            dx = torch.exp(log_p[0], out=torch.empty_like(logits, memory_format=torch.contiguous_format))
        if row_weighted:
            dx.mul_(g.to(dx.dtype)[:, None])
    if row_weighted:
        d_t = d_t * g
    return dx.scatter_(1, cols, d_t.to(dx.dtype)[:, None]), None


def _log_softmax_backward(log_p: torch.Tensor, cols: torch.Tensor, g: torch.Tensor, dtype: torch.dtype):
    """(N, V) ``(exp(log_p) - onehot) * g`` in ``dtype`` by ATen's log_softmax backward, ``dx = dl - exp(log_p)
    sum_j dl_j`` of the gradient ``dl = -g onehot`` (a zero fill and a scatter): one pass reading log_p and
    dl, as ``F.cross_entropy``'s backward. CUDA writes float16 from float32 log-probabilities itself."""
    dl = torch.zeros_like(log_p, memory_format=torch.contiguous_format)
    dl.scatter_(1, cols, g.to(log_p.dtype)[:, None].neg())
    if log_p.dtype == dtype or log_p.device.type == "cuda":
        return torch._log_softmax_backward_data(dl, log_p, 1, dtype)
    return torch._log_softmax_backward_data(dl, log_p, 1, log_p.dtype).to(dtype)
