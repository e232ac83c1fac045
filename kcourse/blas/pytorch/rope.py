"""rope: rotary position embedding of ``x (..., T, D)``, the Hugging Face ``rotate_half`` form.

    theta[t, i] = p_t * base^(-2i/D),  emb = [theta, theta] (T, D)
    y  = x cos(emb) + rotate_half(x) sin(emb),     rotate_half([x1, x2]) = [-x2, x1]
    dx = dy cos(emb) - rotate_half(dy) sin(emb)    (the rotation by -theta: it is orthogonal)

cos and sin are taken of float64 angles (a float32 angle at position p is off by up to p * 2^-24),
then cast to float32 (float64 for float64), where the rotation is computed and rounded once.
Cache: ``(positions,)``.
"""
import torch


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate(x: torch.Tensor, positions, base: float, sign: float) -> torch.Tensor:
    """``x`` rotated by ``sign * theta``."""
    T, D = x.shape[-2:]
    acc = torch.promote_types(x.dtype, torch.float32)
    p = torch.arange(T, device=x.device) if positions is None else positions
    inv_freq = base ** (-torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)  # (D/2,)
    emb = torch.outer(p.double(), inv_freq).repeat(1, 2)  # (T, D)
    xa = x.to(acc)
    return (xa * emb.cos().to(acc) + _rotate_half(xa) * (sign * emb.sin()).to(acc)).to(x.dtype)


def rope(x: torch.Tensor, positions, base: float):
    return _rotate(x, positions, base, 1.0), (positions,)


def rope_backward(dout: torch.Tensor, cache, needs, base: float):
    (positions,) = cache
    return (_rotate(dout, positions, base, -1.0) if needs[0] else None), None
