"""linear_cross_entropy: the LM head and its loss (``_host.linear_cross_entropy_ops``) over this
backend's kernels, a chunk of rows at a time: the logits, dx and dweight by ``gemm.py`` (TMA and
wgmma on Hopper; each chunk's dweight added in the gemm's epilogue), the loss, lse and dlogits by
``cross_entropy.py`` (one read of each chunk's logits forward, one read and one write backward,
dlogits over the logits), dbias by ``gemv.py``, the backward's scale (dout / n_valid) by
``scal.py``, read on the device.
"""
from .. import _host
from .cross_entropy import cross_entropy, cross_entropy_backward
from .gemm import gemm
from .gemv import gemv
from .scal import scal

linear_cross_entropy, linear_cross_entropy_backward = _host.linear_cross_entropy_ops(
    gemm=gemm, gemv=gemv, cross_entropy=cross_entropy, cross_entropy_backward=cross_entropy_backward,
    dlogits_in_place=True, scal=scal)
