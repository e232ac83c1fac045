"""scal: out <- alpha * x, elementwise, for a tensor of any shape and strides.

FLOPs: numel. Bytes: 2 * numel * itemsize (read x, write out; out may be x itself).

``_elementwise``'s kernel loads x in vectors of up to 128 bits, forms the product in float32 on
the register fragment and rounds it once to the tensor's dtype. ``alpha`` is a float32 runtime
argument, so every value of it runs the same compiled kernel.
"""
from __future__ import annotations

from ._elementwise import Elementwise, run

SCAL = Elementwise("scal", inputs=1, outputs=1, scalars=1, math=lambda x, alpha: (alpha * x,), float32=True)


def scal(x, alpha, out):
    """``out <- alpha * x``; returns ``out``."""
    run(SCAL, (x, out), (alpha,))
    return out
