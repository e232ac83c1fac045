"""The pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``. Unless
``config.fused`` is off, each residual add runs in the op of the norm that reads its sum
(``add_layer_norm`` / ``add_rms_norm``): the attention's in the block's second norm, the MLP's in
the next block's first norm (``GPT`` passes it on: ``defer``) or the final norm."""
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

    def forward(self, x: torch.Tensor, cache=None, layer: int = 0, residual: torch.Tensor | None = None,
                defer: bool = False):
        """``x (B, T, C)`` -> the block's output ``(B, T, C)``. With ``residual``, the block's input is
        ``x + residual``, added in ln_1's op; with ``defer``, the output is returned as the pair ``(m,
        h)`` of its sum ``m + h``, for the next norm to add in its op."""
        if residual is None:
            n, h = self.ln_1(x), x
        else:
            n, h = self.ln_1.add(x, residual)  # ln_1(x + residual), x + residual
        a = self.attn(n, cache, layer)
        if self.fused:
            y, h = self.ln_2.add(a, h)  # h + attn(ln_1(h)), and ln_2 of it
        else:
            h = blas.axpby(a, h, backend=self.backend)  # h + attn(ln_1(h))
            y = self.ln_2(h)
        m = self.mlp(y)
        return (m, h) if defer else blas.axpby(m, h, backend=self.backend)  # h + mlp(ln_2(h))
