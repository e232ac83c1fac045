"""Linear and Embedding: the parameters of torch.nn.Linear / torch.nn.Embedding, so state dicts load across."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .. import blas
from .base import Module


class Linear(Module):
    """``y = act(x W^T + b)`` for ``x (..., in_features)``; ``weight (out, in)``, ``bias (out,)``;
    ``activation`` None (torch.nn.Linear), "gelu", "gelu_tanh", "relu" or "silu": one op,
    ``blas.linear`` (on triton the activation runs in the gemm's epilogue)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, backend=None,
                 device=None, dtype=None, activation: str | None = None):
        super().__init__(backend)
        self.in_features, self.out_features, self.activation = in_features, out_features, activation
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:  # torch.nn.Linear's initialization
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # (N, in): the backward reads these rows, copied at most once
        y = blas.linear(rows, self.weight, self.bias, self.activation, backend=self.backend)  # (N, out)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}" + (f", activation={self.activation!r}" if self.activation else "") \
               + (f", {super().extra_repr()}" if self.backend else "")


class Embedding(Module):
    """``weight[indices]``: ``weight (num_embeddings, embedding_dim)``, initialized N(0, 1) like torch."""

    def __init__(self, num_embeddings: int, embedding_dim: int, backend=None, device=None, dtype=None):
        super().__init__(backend)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
        nn.init.normal_(self.weight)

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        return blas.embedding(indices, self.weight, backend=self.backend)  # (*indices.shape, D)
