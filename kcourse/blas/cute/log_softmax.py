"""log_softmax along ``dim`` on the CuTe DSL: ``y_i = (x_i - m) - log sum_j exp(x_j - m)``, ``m = max_j x_j``.

Backward: ``dx_i = dy_i - exp(y_i) sum_j dy_j`` (``exp(y)`` is the softmax).

FLOPs ~5 per element forward, 3 backward. Bytes: read x and write y (2 * numel * itemsize) for rows
of up to 16384 elements, kept in registers; a longer row is read twice. Memory bound. The kernels,
shared with softmax, are in ``_softmax.py``.
"""
from ._softmax import softmax_rows, softmax_rows_backward


def log_softmax(x, dim):
    """``(y, (y,))``: ``y = log_softmax(x)`` along ``dim``, of ``x``'s dtype and layout."""
    return softmax_rows("log_softmax", x, dim, log=True)


def log_softmax_backward(dy, cache, needs, dim):
    """``(dx,)``: ``dx = dy - exp(y) * sum(dy)`` along ``dim``."""
    return softmax_rows_backward("log_softmax", dy, cache, needs, dim, log=True)
