"""The pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""
from __future__ import annotations

import torch

from .. import blas
from .attention import Attention
from .base import Module
from .mlp import MLP, SwiGLU
from .norm import LayerNorm, RMSNorm


def make_norm(kind: str, dim: int, bias: bool, backend):
    if kind == "layernorm":
        return LayerNorm(dim, bias=bias, backend=backend)
    if kind == "rmsnorm":
        return RMSNorm(dim, backend=backend)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


class Block(Module):
    """One transformer layer; ``config`` is a ``GPTConfig`` (see gpt.py)."""

    def __init__(self, config, backend=None):
        super().__init__(backend)
        c = config
        self.ln_1 = make_norm(c.norm, c.n_embd, c.bias, backend)
        self.attn = Attention(c.n_embd, c.n_head, c.n_kv_head, causal=True, rope=c.pos == "rope",
                              bias=c.bias, backend=backend)
        self.ln_2 = make_norm(c.norm, c.n_embd, c.bias, backend)
        hidden = c.mlp_hidden or 4 * c.n_embd
        if c.mlp == "gelu":
            self.mlp = MLP(c.n_embd, hidden, "gelu", c.bias, backend)
        elif c.mlp == "swiglu":
            self.mlp = SwiGLU(c.n_embd, hidden, c.bias, backend)
        else:
            raise ValueError(f"mlp must be 'gelu' or 'swiglu', got {c.mlp!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        x = blas.axpby(self.attn(self.ln_1(x)), x, backend=self.backend)  # x + attn(ln_1(x))
        return blas.axpby(self.mlp(self.ln_2(x)), x, backend=self.backend)  # x + mlp(ln_2(x))
