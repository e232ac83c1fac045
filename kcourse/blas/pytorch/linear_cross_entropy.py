"""linear_cross_entropy: the LM head and its loss (``_host.linear_cross_entropy_ops``) over this
backend's kernels, a chunk of rows at a time: the logits by ``torch.addmm`` (cuBLAS), the loss by
ATen's log_softmax (``cross_entropy.py``), dlogits from its output, dbias by ``torch.addmv``; each
row's weight (dout, 0 on ignored rows) scales the (rows, K) operands, not the (rows, V) dlogits.
The forward keeps each chunk's log-probabilities for its backward (``keep_log_probs``: dlogits is
their exp, in place, rather than a second, slower softmax over the logits). Peak memory: two
(rows, V) chunks (the logits and the log-probabilities, then dlogits) instead of the whole (N, V) twice.
"""
import functools

from .. import _host
from .cross_entropy import cross_entropy, cross_entropy_backward
from .gemm import gemm
from .gemv import gemv

linear_cross_entropy, linear_cross_entropy_backward = _host.linear_cross_entropy_ops(
    gemm=gemm, gemv=gemv, cross_entropy=functools.partial(cross_entropy, keep_log_probs=True),
    cross_entropy_backward=cross_entropy_backward, weights_on_operands=True)
