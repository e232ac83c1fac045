"""gelu: ``y = x Phi(x)``, Phi the standard normal CDF, or its tanh approximation.

    exact:  y = 0.5 x (1 + erf(x / sqrt 2))         dy/dx = Phi(x) + x phi(x),  phi(x) = exp(-x^2/2) / sqrt(2 pi)
    tanh:   y = 0.5 x (1 + tanh u),  u = sqrt(2/pi) (x + 0.044715 x^3)
            dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2)

Backward: dx = dy * dy/dx. Cache: ``(x,)``.
"""
import math

import torch

from ._acc import acc, into

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
COEF = 0.044715


def gelu(x: torch.Tensor, approximate: str):
    a = acc(x)
    if approximate == "tanh":
        y = 0.5 * a * (1 + torch.tanh(SQRT_2_OVER_PI * (a + COEF * a ** 3)))
    else:
        y = 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))
    return y.to(x.dtype), (x,)


def gelu_backward(dout: torch.Tensor, cache, needs, approximate: str, out=None):
    (x,) = cache
    if not needs[0]:
        return (None,)
    a = acc(x)
    if approximate == "tanh":
        t = torch.tanh(SQRT_2_OVER_PI * (a + COEF * a ** 3))
        slope = 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * COEF * a * a)
    else:
        cdf = 0.5 * (1 + torch.erf(a / math.sqrt(2)))
        pdf = torch.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
        slope = cdf + a * pdf
    return (into((acc(dout) * slope).to(x.dtype), out),)
