"""Multi-head and grouped-query self-attention through kcourse.blas.attention.

The heads are views of the projection, never copies: ``qkv (B, T, (H + 2 Hkv) hd)`` is viewed as
``(B, T, H + 2 Hkv, hd)``, split along the heads and transposed to ``(B, heads, T, hd)``. The op
lays its output and gradients out as these token-major views (``_layout.heads_like``): the output
reshapes to the ``(B, T, H hd)`` rows of ``c_proj`` without a copy, and the backward is one pass
too: the three head gradients are concatenated straight into the row-major ``(B, T, H + 2 Hkv,
hd)`` gradient of the projection (splitting the feature dim first and reshaping each part would
make autograd copy each part once more before concatenating).

With a ``KVCache`` (see generate.py) the keys and values of earlier positions are read from the
cache: a prompt fills an empty cache (causal over its own positions), then each token attends to
every cached position (``Tq = 1``, no mask: the op's causal mask is top-left aligned, so it would
hide all but the first key). A static cache (``KVCache(static=True)``) hands over its whole buffer
and each row's key count (``kv_len``) instead of the written slice.
"""
from __future__ import annotations

import torch

from .. import blas
from .base import Module
from .linear import Linear


class Attention(Module):
    """Self-attention of ``x (B, T, dim)`` with ``n_head`` query heads sharing ``n_kv_head`` key/value
    heads (``n_kv_head = n_head``: multi-head; fewer: grouped-query), optional rotary embedding
    (angles ``p * rope_base^(-2i/head_dim)``).

    ``c_attn`` projects to ``[q | k | v]`` (``(n_head + 2 n_kv_head) * head_dim`` features), ``c_proj``
    from ``n_head * head_dim`` back to ``dim``; ``head_dim`` defaults to ``dim // n_head``.
    """

    def __init__(self, dim: int, n_head: int, n_kv_head: int | None = None, causal: bool = True,
                 rope: bool = False, bias: bool = False, rope_base: float = 10000.0, backend=None,
                 head_dim: int | None = None):
        super().__init__(backend)
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        if (head_dim is None and dim % n_head) or n_head % n_kv_head:
            raise ValueError(f"Attention: dim ({dim}) must be a multiple of n_head ({n_head}) unless head_dim "
                             f"is given, and n_head of n_kv_head ({n_kv_head})")
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.head_dim = dim // n_head if head_dim is None else head_dim
        self.causal, self.rope, self.rope_base = causal, rope, rope_base
        self.c_attn = Linear(dim, (n_head + 2 * n_kv_head) * self.head_dim, bias, backend)
        self.c_proj = Linear(n_head * self.head_dim, dim, bias, backend)

    def forward(self, x: torch.Tensor, cache=None, layer: int = 0) -> torch.Tensor:
        """``x (B, T, dim)``; with ``cache`` (a ``KVCache``), its ``layer``-th keys and values at
        positions ``cache.pos ..`` are written, and the queries attend to every cached position."""
        B, T, dim = x.shape
        H, Hkv, hd = self.n_head, self.n_kv_head, self.head_dim
        qkv = self.c_attn(x).view(B, T, H + 2 * Hkv, hd)  # (B, T, H + 2 Hkv, hd)
        q, k, v = (t.transpose(1, 2) for t in qkv.split([H, Hkv, Hkv], dim=2))  # (B, H | Hkv, T, hd)
        pos = 0 if cache is None else cache.pos
        if pos and T > 1 and self.causal:
            raise ValueError(f"Attention: {T} new positions after {pos} cached ones; a cached causal forward "
                             "takes a whole prompt into an empty cache, then one token at a time")
        if self.rope:
            positions = None if pos == 0 else cache.positions(T)  # None: 0..T-1
            q = blas.rope(q, self.rope_base, positions, backend=self.backend)
            k = blas.rope(k, self.rope_base, positions, backend=self.backend)
        kv_len = None
        if cache is not None:
            if cache.decoding:  # a static cache: the whole buffer, kv_len keys of it per row
                kv_len = cache.kv_len  # (B,)
            k, v = cache.append(layer, k, v, backend=self.backend)  # (B, Hkv, pos + T | max_len, hd)
        y = blas.attention(q, k, v, causal=self.causal and pos == 0, kv_len=kv_len, backend=self.backend)  # (B, H, T, hd)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, H * hd))  # (B, T, dim): a view of y
