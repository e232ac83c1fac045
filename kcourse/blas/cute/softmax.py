"""softmax along ``dim`` on the CuTe DSL: ``y_i = exp(x_i - m) / sum_j exp(x_j - m)``, ``m = max_j x_j``.

Backward: ``dx_i = y_i (dy_i - sum_j dy_j y_j)`` (the Jacobian is ``diag(y) - y y^T``).

FLOPs ~5 per element forward, 4 backward. Bytes: read x and write y (2 * numel * itemsize) for rows
of up to 16384 elements, kept in registers; a longer row is read twice. Memory bound. The kernels,
shared with log_softmax, are in ``_softmax.py``, over ``_rows.py``'s rows (along any dim, addressed
through layouts, 128-bit accesses, warp-shuffle then shared-memory row reductions, an online logsumexp).
"""
from ._softmax import softmax_rows, softmax_rows_backward


def softmax(x, dim):
    """``(y, (y,))``: ``y = softmax(x)`` along ``dim``, of ``x``'s dtype and layout."""
    return softmax_rows("softmax", x, dim, log=False)


def softmax_backward(dy, cache, needs, dim):
    """``(dx,)``: ``dx = y * (dy - sum(dy * y))`` along ``dim``."""
    return softmax_rows_backward("softmax", dy, cache, needs, dim, log=False)
