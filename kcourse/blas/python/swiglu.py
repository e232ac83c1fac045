"""swiglu: ``y = silu(gate) * up``, silu(g) = g sigmoid(g).

    dgate = dy * up * silu'(gate),   silu'(g) = s (1 + g (1 - s)),  s = sigmoid(g)
    dup   = dy * silu(gate)

Cache: ``(gate, up)``.
"""
import torch

from ._acc import acc, into
from .silu import silu_slope


def swiglu(gate: torch.Tensor, up: torch.Tensor):
    g = acc(gate)
    return (g * torch.sigmoid(g) * acc(up)).to(gate.dtype), (gate, up)


def swiglu_backward(dout: torch.Tensor, cache, needs, out=(None, None)):
    gate, up = cache
    g, dy = acc(gate), acc(dout)
    dgate = (dy * acc(up) * silu_slope(g)).to(gate.dtype) if needs[0] else None
    dup = (dy * g * torch.sigmoid(g)).to(up.dtype) if needs[1] else None
    return (None if dgate is None else into(dgate, out[0])), (None if dup is None else into(dup, out[1]))
