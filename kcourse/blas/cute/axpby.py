"""axpby: out <- alpha * x + beta * y, elementwise, for same-shape tensors of any strides.

FLOPs: 3 * numel. Bytes: 3 * numel * itemsize (read x and y, write out; out may be y itself),
2 * numel * itemsize when beta == 0.

With beta == 0 the caller passes y = None and the kernel compiled for that case has no y operand
at all, so NaN or Inf in y cannot reach the result (the BLAS convention). ``_elementwise``'s
kernel loads the operands in vectors of up to 128 bits, forms the sum in float32 (the compiler
fuses it into ``fma(alpha, x, beta * y)``) and rounds it once to the tensor's dtype.
"""
from __future__ import annotations

from ._elementwise import Elementwise, run

AXPBY = Elementwise("axpby", inputs=2, outputs=1, scalars=2, float32=True,
                    math=lambda x, y, alpha, beta: (alpha * x + beta * y,))
AX = Elementwise("axpby", inputs=1, outputs=1, scalars=1, float32=True,  # beta == 0: y is not an operand
                 math=lambda x, alpha: (alpha * x,))


def axpby(x, y, alpha, beta, out):
    """``out <- alpha * x + beta * y`` (``y`` is None when ``beta == 0``); returns ``out``."""
    if y is None:
        run(AX, (x, out), (alpha,))
    else:
        run(AXPBY, (x, y, out), (alpha, beta))
    return out
