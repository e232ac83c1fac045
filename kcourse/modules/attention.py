"""Multi-head and grouped-query self-attention through kcourse.blas.attention.

The heads are views of the projection, never copies: ``qkv (B, T, (H + 2 Hkv) hd)`` is viewed as
``(B, T, H + 2 Hkv, hd)``, split along the heads and transposed to ``(B, heads, T, hd)``. In that
order the backward is one pass too: the three head gradients are concatenated straight into the
row-major ``(B, T, H + 2 Hkv, hd)`` gradient of the projection (splitting the feature dim first
and reshaping each part would make autograd copy each part once more before concatenating).
"""
from __future__ import annotations

import torch

from .. import blas
from .base import Module
from .linear import Linear


class Attention(Module):
    """Self-attention of ``x (B, T, dim)`` with ``n_head`` query heads sharing ``n_kv_head`` key/value
    heads (``n_kv_head = n_head``: multi-head; fewer: grouped-query), optional rotary embedding.

    ``c_attn`` projects to ``[q | k | v]`` (``(n_head + 2 n_kv_head) * head_dim`` features), ``c_proj``
    back to ``dim``.
    """

    def __init__(self, dim: int, n_head: int, n_kv_head: int | None = None, causal: bool = True,
                 rope: bool = False, bias: bool = False, rope_base: float = 10000.0, backend=None):
        super().__init__(backend)
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        if dim % n_head or n_head % n_kv_head:
            raise ValueError(f"Attention: dim ({dim}) must be a multiple of n_head ({n_head}), "
                             f"and n_head of n_kv_head ({n_kv_head})")
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, dim // n_head
        self.causal, self.rope, self.rope_base = causal, rope, rope_base
        self.c_attn = Linear(dim, (n_head + 2 * n_kv_head) * self.head_dim, bias, backend)
        self.c_proj = Linear(dim, dim, bias, backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, dim = x.shape
        H, Hkv, hd = self.n_head, self.n_kv_head, self.head_dim
        qkv = self.c_attn(x).view(B, T, H + 2 * Hkv, hd)  # (B, T, H + 2 Hkv, hd)
        q, k, v = (t.transpose(1, 2) for t in qkv.split([H, Hkv, Hkv], dim=2))  # (B, H | Hkv, T, hd)
        if self.rope:
            q = blas.rope(q, self.rope_base, backend=self.backend)
            k = blas.rope(k, self.rope_base, backend=self.backend)
        y = blas.attention(q, k, v, causal=self.causal, backend=self.backend)  # (B, H, T, hd)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, dim))  # (B, T, dim)
