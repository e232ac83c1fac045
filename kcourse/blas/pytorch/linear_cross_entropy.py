"""linear_cross_entropy: the LM head and its loss (``_host.linear_cross_entropy_ops``) over this
backend's kernels, a chunk of rows at a time: the logits by ``torch.addmm`` (cuBLAS), the loss by
ATen's log_softmax (``cross_entropy.py``), dlogits from its output, dbias by ``torch.addmv``; each
row's weight (dout, 0 on ignored rows) scales the (rows, K) operands, not the (rows, V) dlogits.
Each chunk's backward follows its forward at once and spends the log-probabilities the forward kept
(``spend_log_probs``: dlogits is their exp, written over them). Peak memory: two
(rows, V) chunks (the logits and the log-probabilities, then dlogits) instead of the whole (N, V) twice.
"""
import functools

from .. import _host
from .cross_entropy import cross_entropy, cross_entropy_backward
from .gemm import gemm
from .gemv import gemv

linear_cross_entropy, linear_cross_entropy_backward = _host.linear_cross_entropy_ops(
    gemm=gemm, gemv=gemv, cross_entropy=cross_entropy,
    cross_entropy_backward=functools.partial(cross_entropy_backward, spend_log_probs=True), weights_on_operands=True)
