"""gelu: y = x Phi(x) (exact, erf) or its tanh approximation, elementwise, any shape and strides.

    exact:  y = 0.5 x (1 + erf(x / sqrt 2))        dy/dx = Phi(x) + x exp(-x^2/2) / sqrt(2 pi)
    tanh:   y = 0.5 x (1 + tanh u) = x sigmoid(2u),   u = sqrt(2/pi) (x + 0.044715 x^3)
            dy/dx = s + 2 x s (1 - s) u',   s = sigmoid(2u),  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)

FLOPs: ~10-20 per element. Bytes: 2 numel * itemsize forward (read x, write y), 3 numel * itemsize
backward (read dy and x, write dx): memory bound.

Four ``Elementwise`` declarations (forward and backward of each form) run on ``_elementwise``'s
kernel: the operands' merged index space as CuTe layouts, split into vectors of up to 128 bits, each
thread loading 4 vectors per operand before the math, the math on float32 register fragments, one
vector at a time (``_activation.by_vector``: fewer live registers), and one rounding per output. The
form is a compile-time choice (each declaration is its own kernel). The tanh form is evaluated as
``x sigmoid(2u)`` (``0.5 (1 + tanh u) = sigmoid(2u)``), as triton does: it has no ``1 + tanh u``
cancellation for large negative u, and ``sigmoid`` cannot overflow. The exact form uses libdevice's
``erff``; ``exp`` is ``ex2.approx`` (its accuracy and the instruction budget: ``_activation``).
"""
from __future__ import annotations

import math

import cutlass.cute as cute

from ._activation import by_vector, exp, sigmoid, unary, unary_backward
from ._elementwise import Elementwise

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
RSQRT_2 = 1 / math.sqrt(2)
RSQRT_2PI = 1 / math.sqrt(2 * math.pi)
COEF = 0.044715


def _sigmoid_2u(x):
    """``sigmoid(2u)``, ``u = sqrt(2/pi) (x + 0.044715 x^3)``: 0.5 (1 + tanh u), without cancellation."""
    return sigmoid(2.0 * SQRT_2_OVER_PI * (x + COEF * x * x * x))


def _exact(x):
    return (0.5 * x * (1.0 + cute.math.erf(x * RSQRT_2)),)


def _exact_backward(dy, x):
    slope = 0.5 * (1.0 + cute.math.erf(x * RSQRT_2)) + x * exp(-0.5 * x * x) * RSQRT_2PI
    return (dy * slope,)


def _tanh(x):
    return (x * _sigmoid_2u(x),)


def _tanh_backward(dy, x):
    s = _sigmoid_2u(x)
    du = SQRT_2_OVER_PI * (1.0 + 3.0 * COEF * x * x)  # du/dx
    return (dy * (s + 2.0 * x * s * (1.0 - s) * du),)


FORWARD = {"none": Elementwise("gelu", inputs=1, outputs=1, math=by_vector(_exact), float32=True),
           "tanh": Elementwise("gelu", inputs=1, outputs=1, math=by_vector(_tanh), float32=True)}
BACKWARD = {  # (dy, x) -> dx
    "none": Elementwise("gelu", inputs=2, outputs=1, math=by_vector(_exact_backward), float32=True),
    "tanh": Elementwise("gelu", inputs=2, outputs=1, math=by_vector(_tanh_backward), float32=True),
}


def gelu(x, approximate):
    return unary(FORWARD[approximate], x)


def gelu_backward(dout, cache, needs, approximate, out=None):
    return unary_backward(BACKWARD[approximate], dout, cache, needs, out)
