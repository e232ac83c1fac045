"""The two feed-forward blocks of a transformer: MLP (up, activation, down) and SwiGLU."""
from __future__ import annotations

import torch

from .. import blas
from .base import Module
from .linear import Linear

ACTIVATIONS = {"gelu": ("gelu", {}), "gelu_tanh": ("gelu", {"approximate": "tanh"}),
               "relu": ("relu", {}), "silu": ("silu", {})}  # name -> (kcourse.blas op, its arguments)


class MLP(Module):
    """``c_proj(act(c_fc(x)))``: ``dim -> hidden -> dim``. ``fused``: c_fc and the activation as one
    op (``blas.linear(..., activation)``); otherwise the activation is its own op after c_fc."""

    def __init__(self, dim: int, hidden: int, activation: str = "gelu", bias: bool = True, backend=None,
                 fused: bool = True):
        super().__init__(backend)
        if activation not in ACTIVATIONS:
            raise ValueError(f"MLP: activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        self.activation, self.fused = activation, fused
        self.c_fc = Linear(dim, hidden, bias, backend, activation=activation if fused else None)
        self.c_proj = Linear(hidden, dim, bias, backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)  # (..., hidden), the activation applied when fused
        if not self.fused:
            op, kwargs = ACTIVATIONS[self.activation]
            h = getattr(blas, op)(h, **kwargs, backend=self.backend)
        return self.c_proj(h)  # (..., dim)


class SwiGLU(Module):
    """``w_down(silu(w_gate x) * w_up x)``: ``dim -> hidden -> dim`` (Llama's feed-forward). ``fused``:
    the gate and up projections and the gated unit as one op (``blas.linear_swiglu``)."""

    def __init__(self, dim: int, hidden: int, bias: bool = False, backend=None, fused: bool = True):
        super().__init__(backend)
        self.hidden, self.fused = hidden, fused
        self.w_gate = Linear(dim, hidden, bias, backend)
        self.w_up = Linear(dim, hidden, bias, backend)
        self.w_down = Linear(hidden, dim, bias, backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            rows = x.reshape(-1, x.shape[-1])  # (N, dim)
            h = blas.linear_swiglu(rows, self.w_gate.weight, self.w_up.weight, self.w_gate.bias, self.w_up.bias,
                                   backend=self.backend).reshape(*x.shape[:-1], self.hidden)
        else:
            h = blas.swiglu(self.w_gate(x), self.w_up(x), backend=self.backend)  # (..., hidden)
        return self.w_down(h)  # (..., dim)
