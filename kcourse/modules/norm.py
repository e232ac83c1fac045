"""LayerNorm and RMSNorm over the last dimension: the parameters of torch.nn.LayerNorm / RMSNorm."""
from __future__ import annotations

import torch
import torch.nn as nn

from .. import blas
from .base import Module


class LayerNorm(Module):
    """``(x - mean) / sqrt(var + eps) * weight + bias``; ``weight`` ones and ``bias`` zeros at start."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, backend=None, device=None, dtype=None):
        super().__init__(backend)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return blas.layer_norm(x, self.weight, self.bias, self.eps, backend=self.backend)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(self(h), h)`` for ``h = x + residual``, one op (``blas.add_layer_norm``)."""
        return blas.add_layer_norm(x, residual, self.weight, self.bias, self.eps, backend=self.backend)


class RMSNorm(Module):
    """``x / sqrt(mean(x^2) + eps) * weight``; ``weight`` ones at start."""

    def __init__(self, dim: int, eps: float = 1e-6, backend=None, device=None, dtype=None):
        super().__init__(backend)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return blas.rms_norm(x, self.weight, self.eps, backend=self.backend)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(self(h), h)`` for ``h = x + residual``, one op (``blas.add_rms_norm``)."""
        return blas.add_rms_norm(x, residual, self.weight, self.eps, backend=self.backend)
