"""linear_cross_entropy: the LM head and its loss (``_host.linear_cross_entropy_ops``) over this
backend's kernels, a chunk of rows at a time: the logits by ``torch.addmm`` (cuBLAS), the loss by
ATen's log_softmax (``cross_entropy.py``), dlogits from its output, dbias by ``torch.addmv``; each
row's weight (dout, 0 on ignored rows) scales the (rows, K) operands, not the (rows, V) dlogits.
Each chunk's backward follows its forward at once (``cross_entropy_grad``: the two share the target
columns) and spends the log-probabilities the forward kept (dlogits is their exp, written over
them); the targets are checked once for all chunks (on CUDA a device-side assert). Peak memory: two
(rows, V) chunks (the logits and the log-probabilities, then dlogits) instead of the whole (N, V) twice.
"""
import functools

from .. import _host
from .cross_entropy import _assert_targets, cross_entropy, cross_entropy_backward, cross_entropy_grad
from .gemm import gemm
from .gemv import gemv

_linear_cross_entropy, linear_cross_entropy_backward = _host.linear_cross_entropy_ops(
    gemm=gemm, gemv=gemv, cross_entropy=cross_entropy, cross_entropy_grad=cross_entropy_grad,
    cross_entropy_backward=functools.partial(cross_entropy_backward, spend_log_probs=True), weights_on_operands=True)


def linear_cross_entropy(x, weight, target, bias, ignore_index, reduction, grads, float32_loss):
    _assert_targets(target, target != ignore_index, weight.shape[0], ignore_index)  # all at once, not per chunk
    return _linear_cross_entropy(x, weight, target, bias, ignore_index, reduction, grads, float32_loss)
