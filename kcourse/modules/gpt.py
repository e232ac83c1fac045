"""GPT: token (and learned position) embeddings, ``n_layer`` blocks, a final norm and the LM head."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import blas
from .base import Module
from .block import Block, make_norm
from .linear import Embedding, Linear


@dataclass
class GPTConfig:
    vocab_size: int = 50304
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int | None = None  # None: as many as n_head (multi-head); fewer: grouped-query
    n_embd: int = 768
    mlp: str = "gelu"  # "gelu" | "swiglu"
    norm: str = "layernorm"  # "layernorm" | "rmsnorm"
    pos: str = "learned"  # "learned" | "rope"
    bias: bool = True
    tie_weights: bool = True
    mlp_hidden: int | None = None  # None: 4 * n_embd


class GPT(Module):
    """A decoder-only transformer; GPT-2-like (gelu, layernorm, learned positions, bias) or
    Llama-like (swiglu, rmsnorm, rope, grouped-query, no bias) through ``GPTConfig``."""

    def __init__(self, config: GPTConfig, backend=None):
        super().__init__(backend)
        if config.pos not in ("learned", "rope"):
            raise ValueError(f"GPT: pos must be 'learned' or 'rope', got {config.pos!r}")
        self.config = c = config
        self.wte = Embedding(c.vocab_size, c.n_embd, backend)
        self.wpe = Embedding(c.block_size, c.n_embd, backend) if c.pos == "learned" else None
        if self.wpe is not None:  # 0..block_size-1 made once, not an arange kernel per forward; not in the state dict
            self.register_buffer("positions", torch.arange(c.block_size), persistent=False)
        self.h = nn.ModuleList(Block(c, backend) for _ in range(c.n_layer))
        self.ln_f = make_norm(c.norm, c.n_embd, c.bias, backend)
        self.lm_head = Linear(c.n_embd, c.vocab_size, bias=False, backend=backend)
        if c.tie_weights:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale the residual projections by depth
            if name.endswith(("c_proj.weight", "w_down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (Linear, Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """``idx (B, T)`` token ids -> ``(logits (B, T, V), loss)``; loss is the mean cross-entropy
        against ``targets (B, T)`` (entries -100 ignored), or None without targets."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"GPT: sequence length {T} exceeds block_size {self.config.block_size}")
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            pos = self.wpe(self.positions[:T])  # (T, C)
            x = blas.axpby(x, pos.expand_as(x), backend=self.backend)  # tokens + positions
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = blas.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T), backend=self.backend)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None) -> torch.Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``idx (B, T)``; ``temperature`` 0 is greedy."""
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size:]
            logits = self(context)[0][:, -1, :]  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = blas.scal(logits, 1.0 / temperature, backend=self.backend)
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]  # (B, 1)
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = blas.softmax(logits, dim=-1, backend=self.backend)
                nxt = torch.multinomial(probs.float(), num_samples=1)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
