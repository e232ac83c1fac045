"""Multi-head and grouped-query self-attention through kcourse.blas.attention."""
from __future__ import annotations

import torch
from einops import rearrange

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
        hd, kv = self.head_dim, self.n_kv_head * self.head_dim
        qkv = self.c_attn(x)  # (B, T, (H + 2 Hkv) hd)
        q, k, v = qkv.split([self.n_head * hd, kv, kv], dim=-1)
        q = rearrange(q, "b t (h d) -> b h t d", d=hd)  # (B, H, T, hd)
        k = rearrange(k, "b t (h d) -> b h t d", d=hd)  # (B, Hkv, T, hd)
        v = rearrange(v, "b t (h d) -> b h t d", d=hd)  # (B, Hkv, T, hd)
        if self.rope:
            q = blas.rope(q, self.rope_base, backend=self.backend)
            k = blas.rope(k, self.rope_base, backend=self.backend)
        y = blas.attention(q, k, v, causal=self.causal, backend=self.backend)  # (B, H, T, hd)
        return self.c_proj(rearrange(y, "b h t d -> b t (h d)"))  # (B, T, dim)
