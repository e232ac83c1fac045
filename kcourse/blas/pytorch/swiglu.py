"""swiglu: ``y = F.silu(gate) * up``, the composition it stands for, at its cost and with its roundings.

    dgate = dy * up * silu'(gate)   (``aten.silu_backward(dy * up, gate)``)
    dup   = dy * silu(gate)

Each ATen kernel computes float16/bfloat16 in float32 and rounds its output once, so a half-type
result is rounded twice (silu(gate), then the product), as in torch; no float32 copy of an (n, m)
operand is made. Cache: ``(gate, up)``.
"""
import torch
import torch.nn.functional as F


def swiglu(gate: torch.Tensor, up: torch.Tensor):
    return F.silu(gate) * up, (gate, up)


def swiglu_backward(dout: torch.Tensor, cache, needs, out=(None, None)):
    """``(dgate, dup)``; ``out``: buffers to write them into, which may be gate's and up's own: each
    operand is read before its buffer is written."""
    gate, up = cache
    dy_up = dout * up if needs[0] else None  # up is read here, before dup may overwrite it
    s = F.silu(gate) if needs[1] else None  # gate is read here, before dgate may overwrite it
    dgate = None
    if needs[0]:
        dgate = (torch.ops.aten.silu_backward(dy_up, gate) if out[0] is None else
                 torch.ops.aten.silu_backward.grad_input(dy_up, gate, grad_input=out[0]))
    dup = None
    if needs[1]:
        dup = dout * s if out[1] is None else torch.mul(dout, s, out=out[1])
    return dgate, dup
