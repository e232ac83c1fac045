"""swiglu: ``y = F.silu(gate) * up``, formed in float32 (float64 for float64) and rounded once.

    dgate = dy * up * silu'(gate)   (``aten.silu_backward(dy * up, gate)``)
    dup   = dy * silu(gate)

Cache: ``(gate, up)``.
"""
import torch
import torch.nn.functional as F


def swiglu(gate: torch.Tensor, up: torch.Tensor):
    acc = torch.promote_types(gate.dtype, torch.float32)
    return (F.silu(gate.to(acc)) * up.to(acc)).to(gate.dtype), (gate, up)


def swiglu_backward(dout: torch.Tensor, cache, needs, out=(None, None)):
    gate, up = cache
    acc = torch.promote_types(gate.dtype, torch.float32)
    g, dy = gate.to(acc), dout.to(acc)
    dgate = torch.ops.aten.silu_backward(dy * up.to(acc), g).to(gate.dtype) if needs[0] else None
    dup = (dy * F.silu(g)).to(up.dtype) if needs[1] else None
    return tuple(d if d is None or o is None else o.copy_(d) for d, o in zip((dgate, dup), out))
