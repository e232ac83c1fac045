"""scal: out <- alpha * x, elementwise, for a tensor of any shape and strides.

FLOPs: numel. Bytes: 2 * numel * itemsize (read x, write out; out may be x itself).

``_elementwise``'s kernel loads x in vectors of up to 128 bits, forms the product in float32 on
the register fragment and rounds it once to the tensor's dtype. ``alpha`` is a float32 runtime
argument, so every value of it runs the same compiled kernel; or a 0-d float32 tensor that the
kernel reads (``SCAL_BY``).
"""
from __future__ import annotations

import torch

from ._elementwise import Elementwise, run


def _scaled(x, alpha):
    return (alpha * x,)


SCAL = Elementwise("scal", inputs=1, outputs=1, scalars=1, math=_scaled, float32=True)
SCAL_BY = Elementwise("scal", inputs=1, outputs=1, scalars=1, math=_scaled, float32=True,
                      scalars_in_memory=True)  # alpha read from a 0-d float32 tensor


def scal(x, alpha, out):
    """``out <- alpha * x``; returns ``out``. ``alpha``: a number, or a 0-d float32 tensor on x's
    device, read by the kernel (a factor computed on the GPU, without a sync)."""
    run(SCAL_BY if isinstance(alpha, torch.Tensor) else SCAL, (x, out), (alpha,))
    return out
