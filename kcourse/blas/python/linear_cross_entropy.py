"""linear_cross_entropy of x (N, K), weight (V, K), target (N,) and an optional bias (V,): the
reference is the composition it fuses, on this backend's kernels, all N rows at once:

    logits = x @ weight^T + bias                       (gemm; x's dtype, rounded once)
    loss   = cross_entropy(logits, target)             (lse in float32, float64 for float64)

With a gradient wanted and a "mean" or "sum", the forward also takes the cross_entropy backward for
dout = 1, dlogits = softmax(logits) - onehot(target) (0 on ignored rows), and from it

    dx = dlogits @ weight,   dweight = dlogits^T @ x,   dbias = dlogits^T @ 1

which the backward scales by dout / n_valid (mean) or dout (sum); otherwise the backward recomputes
the logits. ``_host.linear_cross_entropy_ops`` is that algorithm, written once for every backend
(the others take the rows a chunk at a time).
"""
from .. import _host
from .cross_entropy import cross_entropy, cross_entropy_backward
from .gemm import gemm
from .gemv import gemv

linear_cross_entropy, linear_cross_entropy_backward = _host.linear_cross_entropy_ops(
    gemm=gemm, gemv=gemv, cross_entropy=cross_entropy, cross_entropy_backward=cross_entropy_backward,
    chunked=False)
