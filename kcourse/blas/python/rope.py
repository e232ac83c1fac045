"""rope: rotary position embedding of ``x (..., T, D)``, rotate-half convention.

With ``x1 = x[..., :D/2]``, ``x2 = x[..., D/2:]`` and the angle ``theta[t, i] = p_t * base^(-2i/D)``
(``p = positions``, default ``0..T-1``), each pair ``(x1_i, x2_i)`` is rotated by ``theta``:

    y = [x1 cos(theta) - x2 sin(theta),  x2 cos(theta) + x1 sin(theta)]

Backward: the rotation is orthogonal, so dx rotates dy by ``-theta``:

    dx = [dy1 cos(theta) + dy2 sin(theta),  dy2 cos(theta) - dy1 sin(theta)]

The angles, and their cos and sin, are computed in float64 and then rounded to the accumulation
dtype: at position p a float32 angle is off by up to p * 2^-24 radians (6e-5 at p = 1000), which
would make the reference itself the least accurate backend. Cache: ``(positions,)``.
"""
import torch

from ._acc import acc


def _rotate(x: torch.Tensor, positions, base: float, sign: float) -> torch.Tensor:
    """``x`` rotated by ``sign * theta``."""
    T, D = x.shape[-2:]
    p = torch.arange(T, device=x.device) if positions is None else positions
    i = torch.arange(D // 2, dtype=torch.float64, device=x.device)
    theta = p.double()[:, None] * base ** (-2 * i / D)  # (T, D/2)
    a = acc(x)
    cos, sin = theta.cos().to(a.dtype), sign * theta.sin().to(a.dtype)
    x1, x2 = a[..., : D // 2], a[..., D // 2:]  # (..., T, D/2) each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def rope(x: torch.Tensor, positions, base: float):
    return _rotate(x, positions, base, 1.0), (positions,)


def rope_backward(dout: torch.Tensor, cache, needs, base: float):
    (positions,) = cache
    return (_rotate(dout, positions, base, -1.0) if needs[0] else None), None
