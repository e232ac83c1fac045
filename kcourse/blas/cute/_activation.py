"""What the CuTe activation ops (gelu, silu, relu, swiglu) share: sigmoid, its silu slope and a fast
exp on float32 register fragments (as triton's ``_pointwise.py``), ``by_vector``, and ``unary`` /
``unary_backward``, the host side of the one-input ops (relu, silu, gelu).

Each activation is an ``_elementwise.Elementwise`` declaration: the kernel (any shape and strides,
128-bit vectors where the layouts allow, 4 vectors per thread in flight) is ``_elementwise``'s;
the math runs on ``TensorSSA`` fragments in float32 (``float32=True``: the inputs are converted
after the loads, each result rounded once to the tensor's dtype before the store).

Registers: ``by_vector``. ``_elementwise`` hands the math all of a thread's ``(VEC, VECTORS)``
elements at once (32 at 16-bit dtypes), and an expression over whole fragments is emitted op by op
across all 32, so the compiler keeps every element's intermediates live together: ~120-180
registers for silu and swiglu at bfloat16, one or two CTAs of 256 threads per SM. ``by_vector`` runs
the math one vector (a column of the fragments) at a time, which cuts that to ~60-110 (ptxas
``-v`` on the sm_90a PTX) and so lets more CTAs share an SM to hide the memory latency.

Accuracy and cost. At 3 TB/s a bfloat16 forward moves 0.75 G elements per ms and a backward
0.5 G; the 132 SMs of an H100 issue ~30 T thread-instructions per second, so ~40 instructions per
element (forward) or ~60 (backward) would saturate them, and libdevice's ``expf`` costs ~10,
``erff`` ~27, a float32 division ~8. So:

- ``exp`` is ``cute.math.exp(fastmath=True)``: ``ex2.approx.ftz(x * log2 e)``, 2 instructions. Its
  relative error is about ``(|x| + 2) 2^-23`` (the rounding of ``x log2 e`` scaled by ``|x|``, plus
  ``ex2.approx``'s ~2 ulp): below 1.6e-6 wherever the result exceeds float32's atol of 1e-5
  (``exp(-|x|) > 1e-5`` needs ``|x| < 11.5``). Simulated in float32 against float64 over
  [-30, 30], silu, gelu and their slopes stay within 10% of the float32 tolerance. Underflow gives
  0 (``ftz``); sigmoid only takes ``exp(-|x|)``, which cannot overflow.
- ``erf`` is libdevice's ``erff`` (``cute.math.erf`` without fastmath), a few ulp: there is no
  cheap hardware form, and gelu's exact form is defined by it.
- ``sigmoid`` divides by ``1 + e`` (in [1, 2]) as a reciprocal, ``rcp.approx.ftz.f32`` (one MUFU
  op, relative error below 2^-23 there), times the numerator: IEEE division (``div.rn.f32``, ~8
  instructions and a slow path; the DSL's approximate ``/`` is scalar-only) kept ~25-55 more
  registers live (ptxas, bfloat16, IEEE -> reciprocal: silu 71 -> 48, its backward 102 -> 54,
  swiglu 102 -> 54, its backward 142 -> 88, gelu tanh 72 -> 48, its backward 102 -> 53).
"""
from __future__ import annotations

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from ._elementwise import Elementwise, run


def exp(x):
    """``e^x`` on a float32 fragment, ``ex2.approx(x log2 e)``: relative error ~(|x| + 2) 2^-23 (see above)."""
    return cute.math.exp(x, fastmath=True)


def sigmoid(x):
    """``1 / (1 + exp(-x))`` on a float32 fragment, without overflow: ``e = exp(-|x|)`` is in [0, 1],
    and ``sigmoid(x) = 1 / (1 + e)`` for x >= 0, ``e / (1 + e)`` for x < 0 (as triton's ``sigmoid``)."""
    e = exp(-cute.math.abs(x))
    return cute.where(x >= 0.0, 1.0, e) * reciprocal(1.0 + e)


@cute.jit
def reciprocal(x):
    """``1 / x`` on a float32 fragment with ``rcp.approx.ftz.f32`` (one MUFU op an element, relative
    error below 2^-23 for normal x) instead of IEEE division's ~10 instructions and slow path: the
    activations' math is a third of a thread's instruction budget at copy bandwidth."""
    frag = cute.make_rmem_tensor(x.shape, Float32)
    frag.store(x)
    for i in cutlass.range_constexpr(cute.size(x.shape)):
        frag[i] = cute.arch.rcp_approx(frag[i])
    return frag.load()


def silu_slope(x, s):
    """d silu / dx at ``x``, given ``s = sigmoid(x)``: ``s (1 + x (1 - s))``."""
    return s * (1.0 + x * (1.0 - s))


def by_vector(f):
    """``f`` (float32 fragments -> tuple of float32 fragments) applied to one vector at a time: column
    ``k`` of every ``(VEC, VECTORS)`` input gives column ``k`` of every output (see the module doc)."""

    def math(*xs):
        if len(xs[0].shape) == 1:  # a single vector already
            return f(*xs)
        vec, vectors = xs[0].shape
        outs = None
        for k in range(vectors):  # a Python loop: unrolled at trace time
            results = f(*(x[None, k] for x in xs))  # (VEC,) each
            if outs is None:
                outs = [cute.make_rmem_tensor(cute.make_layout((vec, vectors)), Float32) for _ in results]
            for out, result in zip(outs, results):
                out[None, k].store(result)
        return tuple(out.load() for out in outs)

    return math


def unary(forward: Elementwise, x: torch.Tensor):
    """``(y, (x,))``: the one-input op ``forward`` (x -> y) on x, and x cached for the backward."""
    out = torch.empty_like(x)
    run(forward, (x, out))
    return out, (x,)


def unary_backward(backward: Elementwise, dout: torch.Tensor, cache, needs, out=None):
    """``(dx,)`` from ``backward`` ((dy, x) -> dx) on the cached x; ``(None,)`` when x needs none.
    ``out``: dx's buffer, which may be x itself (each vector of x is loaded before its dx is stored)."""
    (x,) = cache
    if not needs[0]:
        return (None,)
    dx = torch.empty_like(x) if out is None else out
    run(backward, (dout, x, dx))
    return (dx,)
