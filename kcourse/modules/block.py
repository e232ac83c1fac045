"""The pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``; the first residual
add and the second norm as one op (``add_layer_norm`` / ``add_rms_norm``) unless ``config.fused`` is off."""
from __future__ import annotations

import torch

from .. import blas
from .attention import Attention
from .base import Module
from .mlp import ACTIVATIONS, MLP, SwiGLU
from .norm import LayerNorm, RMSNorm


def make_norm(kind: str, dim: int, bias: bool, eps: float | None, backend):
    """The norm named ``kind``; ``eps`` None: the module's default (1e-5 LayerNorm, 1e-6 RMSNorm)."""
    kwargs = {} if eps is None else {"eps": eps}
    if kind == "layernorm":
        return LayerNorm(dim, bias=bias, backend=backend, **kwargs)
    if kind == "rmsnorm":
        return RMSNorm(dim, backend=backend, **kwargs)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


def make_feed_forward(c, backend):
    """``c.activation`` (else ``c.mlp``): "swiglu" makes a SwiGLU, an MLP activation an MLP."""
    if c.activation is not None and c.mlp not in ("gelu", c.activation):
        raise ValueError(f"GPTConfig: mlp={c.mlp!r} and activation={c.activation!r} disagree; set activation alone")
    activation = c.activation or c.mlp
    hidden = c.mlp_hidden or 4 * c.n_embd
    bias = c.bias if c.mlp_bias is None else c.mlp_bias
    if activation == "swiglu":
        return SwiGLU(c.n_embd, hidden, bias, backend, fused=c.fused)
    if activation in ACTIVATIONS:
        return MLP(c.n_embd, hidden, activation, bias, backend, fused=c.fused)
    raise ValueError(f"activation must be 'swiglu' or one of {', '.join(ACTIVATIONS)}, got {activation!r}")


class Block(Module):
    """One transformer layer; ``config`` is a ``GPTConfig`` (see gpt.py)."""

    def __init__(self, config, backend=None):
        super().__init__(backend)
        c = config
        self.ln_1 = make_norm(c.norm, c.n_embd, c.bias, c.norm_eps, backend)
        self.attn = Attention(c.n_embd, c.n_head, c.n_kv_head, causal=True, rope=c.pos == "rope",
                              bias=c.bias if c.attn_bias is None else c.attn_bias, rope_base=c.rope_theta,
                              head_dim=c.head_dim, backend=backend)
        self.ln_2 = make_norm(c.norm, c.n_embd, c.bias, c.norm_eps, backend)
        self.mlp = make_feed_forward(c, backend)
        self.fused = c.fused

    def forward(self, x: torch.Tensor, cache=None, layer: int = 0) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        a = self.attn(self.ln_1(x), cache, layer)
        if self.fused:
            y, x = self.ln_2.add(a, x)  # x + attn(ln_1(x)), and ln_2 of it
        else:
            x = blas.axpby(a, x, backend=self.backend)  # x + attn(ln_1(x))
            y = self.ln_2(x)
        return blas.axpby(self.mlp(y), x, backend=self.backend)  # x + mlp(ln_2(x))
