"""rope: rotary position embedding of ``x (..., T, D)``, the Hugging Face ``rotate_half`` form.

    theta[t, i] = p_t * base^(-2i/D)   (T, D/2),   x = [x1, x2] (halves of D)
    y  = [x1 cos - x2 sin,  x2 cos + x1 sin]      (x cos(emb) + rotate_half(x) sin(emb))
    dx = [dy1 cos + dy2 sin,  dy2 cos - dy1 sin]  (the rotation by -theta: it is orthogonal)

theta is float64 (a float32 angle at position p is off by up to p * 2^-24; the frequencies are
``_rope.radians``, cached per (D, base, device)); its cos and sin are written in float32 (float64 for
float64), where the rotation is computed: each half is one product and one ``addcmul`` written
straight into the output's dtype, rounded once. Eight small kernels a call, where a decode step makes
two calls a layer. Cache: ``(positions,)``.
"""
import torch

from .. import _rope


def _rotate(x: torch.Tensor, positions, base: float, sign: float) -> torch.Tensor:
    """``x`` rotated by ``sign * theta``."""
    T, D = x.shape[-2:]
    acc = torch.promote_types(x.dtype, torch.float32)
    p = torch.arange(T, dtype=torch.float64, device=x.device) if positions is None else positions.double()
    theta = torch.outer(p, _rope.radians(D, base, x.device))  # (T, D/2) float64
    cos = torch.cos(theta, out=torch.empty(theta.shape, dtype=acc, device=x.device))
    sin = torch.sin(theta, out=torch.empty(theta.shape, dtype=acc, device=x.device))
    y = torch.empty_like(x)  # laid out as x where x is dense (a permuted q or k: no copy)
    (x1, x2), (y1, y2) = x.chunk(2, dim=-1), y.chunk(2, dim=-1)
    torch.addcmul(x1 * cos, x2, sin, value=-sign, out=y1)  # x1 * cos is in acc: the sum is formed there
    torch.addcmul(x2 * cos, x1, sin, value=sign, out=y2)
    return y


def rope(x: torch.Tensor, positions, base: float):
    return _rotate(x, positions, base, 1.0), (positions,)


def rope_backward(dout: torch.Tensor, cache, needs, base: float):
    (positions,) = cache
    return (_rotate(dout, positions, base, -1.0) if needs[0] else None), None
