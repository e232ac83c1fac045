"""GPT: token (and learned position) embeddings, ``n_layer`` blocks, a final norm and the LM head."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import blas
from .base import Module
from .block import Block, make_norm
from .generate import KVCache, generate, spans
from .linear import Embedding, Linear


@dataclass
class GPTConfig:
    vocab_size: int = 50304
    block_size: int = 1024  # the most positions: the position table's rows, the KV cache's length
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int | None = None  # None: as many as n_head (multi-head); fewer: grouped-query
    n_embd: int = 768
    mlp: str = "gelu"  # "gelu" | "swiglu": the feed-forward when activation is None
    norm: str = "layernorm"  # "layernorm" | "rmsnorm"
    pos: str = "learned"  # "learned" | "rope"
    bias: bool = True  # the norms' bias, and attn_bias, mlp_bias where those are None
    tie_weights: bool = True
    mlp_hidden: int | None = None  # None: 4 * n_embd
    activation: str | None = None  # "gelu" | "gelu_tanh" | "relu" | "silu" (an MLP) | "swiglu"; None: mlp
    norm_eps: float | None = None  # None: 1e-5 (layernorm), 1e-6 (rmsnorm)
    rope_theta: float = 10000.0  # rope's base: angles p * rope_theta^(-2i/head_dim)
    head_dim: int | None = None  # None: n_embd // n_head
    attn_bias: bool | None = None  # biases of c_attn and c_proj; None: bias
    mlp_bias: bool | None = None  # biases of the feed-forward's projections; None: bias
    fused: bool = True  # kcourse's fused ops: an MLP's first projection and activation as one blas.linear
    #                     (SwiGLU's gate and up projections and the unit as one linear_swiglu), a block's
    #                     first residual add and second norm as one add_layer_norm / add_rms_norm;
    #                     False: each op on its own (for teaching and comparison), the loss's too
    fused_loss: bool = True  # with targets: the LM head and the loss as one op (blas.linear_cross_entropy)


class GPT(Module):
    """A decoder-only transformer; GPT-2-like (gelu, layernorm, learned positions, bias) or
    Llama-like (swiglu, rmsnorm, rope, grouped-query, no bias) through ``GPTConfig``. ``from_hf`` and
    ``to_hf`` convert transformers' GPT-2 and Llama (hf.py); ``generate`` decodes with a KV cache
    (generate.py)."""

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
        self.ln_f = make_norm(c.norm, c.n_embd, c.bias, c.norm_eps, backend)
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

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, return_logits: bool | None = None):
        """``idx (B, T)`` token ids -> ``(logits (B, T, V), loss)``; loss is the mean cross-entropy
        against ``targets (B, T)`` (entries -100 ignored), or None without targets.

        With targets, ``config.fused`` and ``config.fused_loss`` the LM head and the loss run as one op
        (``blas.linear_cross_entropy``: the (B*T, V) logits are never made whole) and logits is None,
        unless ``return_logits=True`` asks for them (then the head, then cross_entropy).

        ``attention_mask (B, T)``: 1 for a token, 0 for padding, each row's tokens one contiguous run
        (left or right padding). Each row's tokens are computed as if alone, at positions 0, 1, ...
        (transformers' ``position_ids = cumsum(mask) - 1``); padding gets logits 0 and no loss."""
        if return_logits is None:
            return_logits = (targets is None or not (self.config.fused and self.config.fused_loss)
                             or attention_mask is not None)
        if attention_mask is not None:
            if not return_logits:
                raise ValueError("GPT: a padded batch (attention_mask) returns its logits; pass return_logits=True "
                                 "or leave it None")
            logits = self._padded_logits(idx, attention_mask)
            targets = None if targets is None else targets.masked_fill(attention_mask == 0, -100)
        elif return_logits:
            logits = self.lm_head(self.hidden_states(idx))  # (B, T, V)
        else:  # the fused head and loss: no logits
            B, T = idx.shape
            x = self.hidden_states(idx).reshape(B * T, -1)  # (B*T, C)
            return None, blas.linear_cross_entropy(x, self.lm_head.weight, targets.reshape(B * T),
                                                   backend=self.backend)
        loss = None
        if targets is not None:
            B, T = idx.shape
            loss = blas.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T), backend=self.backend)
        return logits, loss

    def hidden_states(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """The final norm's output ``(B, T, C)`` for ``idx (B, T)``, what the head reads; with ``cache``
        (see ``kv_cache``), ``idx`` holds the tokens at positions ``cache.pos ..``, which it appends."""
        B, T = idx.shape
        pos = 0 if cache is None else cache.pos
        if pos + T > self.config.block_size:
            raise ValueError(f"GPT: sequence length {pos + T} exceeds block_size {self.config.block_size}")
        if cache is not None:
            cache.begin(B, T)
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            at = cache.positions(T) if cache is not None and cache.decoding else self.positions[pos:pos + T]
            p = self.wpe(at)  # (T, C)
            x = blas.axpby(x, p.expand_as(x), backend=self.backend)  # tokens + positions
        residual = None  # fused: each block's output as the pair (x, residual), added by the next norm
        for i, block in enumerate(self.h):
            if self.config.fused:
                x, residual = block(x, cache, i, residual=residual, defer=True)
            else:
                x = block(x, cache, i)
        if cache is not None:
            cache.advance(T)
        return self.ln_f(x) if residual is None else self.ln_f.add(x, residual)[0]

    def _padded_logits(self, idx: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, V)`` of each span of tokens, the rows of one span as one batch; 0 at padding."""
        B, T = idx.shape
        logits = None
        for (start, length), rows in spans(attention_mask, idx.shape).items():
            if length:
                part = self.lm_head(self.hidden_states(idx[rows, start:start + length]))  # (rows, length, V)
                logits = part.new_zeros(B, T, part.shape[-1]) if logits is None else logits
                logits[rows, start:start + length] = part
        return self.wte.weight.new_zeros(B, T, self.config.vocab_size) if logits is None else logits

    def kv_cache(self, max_len: int, static: bool = False) -> KVCache:
        """An empty ``KVCache`` of ``max_len`` positions for ``hidden_states(idx, cache)``; ``static``:
        its length kept on the device as well, for a decode step replayed as a CUDA graph."""
        if not 0 < max_len <= self.config.block_size:
            raise ValueError(f"GPT.kv_cache: max_len ({max_len}) must be in 1..block_size "
                             f"({self.config.block_size}), the positions the model has")
        return KVCache(len(self.h), max_len, self.wte.weight.device, static=static)

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 use_cache: bool = True, attention_mask: torch.Tensor | None = None,
                 cuda_graph: bool = False) -> torch.Tensor:
        """``idx (B, T)`` followed by ``max_new_tokens`` sampled tokens: ``(B, T + max_new_tokens)``.

        ``temperature`` 0 is greedy; ``top_k`` keeps the k most likely tokens. ``use_cache``: a
        ``KVCache`` of up to ``block_size`` positions, so each step computes only its new token
        (``T + max_new_tokens > block_size`` is a ValueError); without it each step recomputes the
        last ``block_size`` tokens, past ``block_size`` the context cropped.
        ``attention_mask (B, T)``: left padding (0s, then 1s), each row generated as if unpadded.
        ``cuda_graph`` (CUDA, with the cache): a static cache, and the decode step captured once as a
        CUDA graph and replayed per token (``GraphedStep``): the same tokens, without the host's cost
        per op."""
        return generate(self, idx, max_new_tokens, temperature, top_k, use_cache, attention_mask, cuda_graph)

    @classmethod
    def from_hf(cls, model, backend=None) -> "GPT":
        """The GPT of a transformers ``GPT2LMHeadModel``, ``LlamaForCausalLM`` or their base models
        (``GPT2Model``; ``LlamaModel`` with tied embeddings): its config and a copy of its weights."""
        from .hf import from_hf
        return from_hf(model, backend)

    def to_hf(self):
        """This model as a transformers ``GPT2LMHeadModel`` or ``LlamaForCausalLM``, weights copied."""
        from .hf import to_hf
        return to_hf(self)
