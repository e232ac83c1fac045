"""Decoding for GPT: a static key/value cache, padding masks and sampling.

``generate`` feeds the prompt once (the prefill: causal attention over its own positions, every
layer's keys and values written into a ``KVCache``), then one token per step (the decode: the new
token's query against every cached key, ``Tq = 1``). The cache holds at most ``block_size`` positions
(the rows of GPT-2's position table; the positions a rope model was built for), so with the cache a
prompt of ``T`` tokens takes at most ``block_size - T`` new ones: more is a ``ValueError`` naming
``max_new_tokens``, ``T`` and ``block_size``. Without the cache (``use_cache=False``) each step
recomputes the whole context, cropped to its last ``block_size`` tokens as nanoGPT does, so any
number of new tokens can be drawn.

A padding mask ``(B, T)`` (1: a token, 0: padding; each row's tokens one contiguous run, e.g. left
padding) is handled by running the rows of each span of tokens as one batch without their padding,
at positions 0, 1, ..., as transformers numbers them: the attention op takes no mask, so a batch
of prompts of ``G`` different lengths costs ``G`` passes, each on its own rows.
"""
from __future__ import annotations

import torch

from .. import blas


class KVCache:
    """Keys and values of a model's ``n_layer`` attention layers at positions ``0 .. pos - 1``.

    Each layer's ``k`` and ``v`` are ``(B, Hkv, max_len, hd)`` buffers, allocated at the layer's
    first write in the dtype and on the device of its keys, never reallocated. A forward appends
    its ``T`` positions to every layer, then ``advance(T)``. Inference only: the writes are in place.
    """

    def __init__(self, n_layer: int, max_len: int, device=None):
        self.max_len, self.pos = max_len, 0
        self.k: list[torch.Tensor | None] = [None] * n_layer
        self.v: list[torch.Tensor | None] = [None] * n_layer
        self._positions = torch.arange(max_len, device=device)

    def positions(self, T: int) -> torch.Tensor:
        """The positions ``pos .. pos + T - 1`` of the next ``T`` tokens, ``(T,)`` int64."""
        self._room(T)
        return self._positions[self.pos:self.pos + T]

    def _room(self, T: int) -> None:
        if self.pos + T > self.max_len:
            raise ValueError(f"KVCache: {T} new positions after {self.pos} cached ones exceed the cache's "
                             f"max_len ({self.max_len})")

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, backend=None):
        """Write ``k, v (B, Hkv, T, hd)`` at positions ``pos ..`` of ``layer``; return the keys and
        values of positions ``0 .. pos + T - 1``, ``(B, Hkv, pos + T, hd)`` each."""
        B, Hkv, T, hd = k.shape
        end = self.pos + T
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            raise RuntimeError("KVCache: its writes are in place, not differentiable: decode under torch.no_grad() "
                               "(GPT.generate does)")
        self._room(T)
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = (k.new_empty(B, Hkv, self.max_len, hd) for _ in range(2))
        ck, cv = self.k[layer], self.v[layer]
        if (ck.shape[0], ck.shape[1], ck.shape[3], ck.dtype) != (B, Hkv, hd, k.dtype):
            raise ValueError(f"KVCache: layer {layer} caches {tuple(ck.shape)} {ck.dtype}, got keys "
                             f"{tuple(k.shape)} {k.dtype} (B, Hkv, T, hd)")
        blas.copy_(k, ck[:, :, self.pos:end], backend=backend)
        blas.copy_(v, cv[:, :, self.pos:end], backend=backend)
        if self.pos == 0:
            return k, v
        return ck[:, :, :end], cv[:, :, :end]

    def advance(self, T: int) -> None:
        self.pos += T


def spans(attention_mask: torch.Tensor, shape) -> dict[tuple[int, int], list[int]]:
    """The rows of a padding mask ``(B, T)`` grouped by their span of tokens: ``{(start, length): rows}``.

    Each row's ones must be one contiguous run (left or right padding); a row of zeros has length 0."""
    if tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(f"attention_mask is {tuple(attention_mask.shape)}; it must be (B, T) = {tuple(shape)}, "
                         "the shape of idx")
    groups: dict[tuple[int, int], list[int]] = {}
    for b, row in enumerate(attention_mask.tolist()):
        if any(m not in (0, 1) for m in row):
            raise ValueError(f"attention_mask row {b} holds {sorted(set(row))}; it must hold 0 (padding) and 1 (tokens)")
        ones = [t for t, m in enumerate(row) if m]
        start, length = (ones[0], len(ones)) if ones else (0, 0)
        if ones and ones[-1] != start + length - 1:
            raise ValueError(f"attention_mask row {b}: its tokens (ones) at {ones} are not one contiguous run")
        groups.setdefault((start, length), []).append(b)
    return groups


def sample(logits: torch.Tensor, temperature: float, top_k: int | None, backend=None) -> torch.Tensor:
    """The next token ``(B, 1)`` from ``logits (B, V)``: the argmax at ``temperature`` 0, else a draw
    from ``softmax(logits / temperature)`` restricted to the ``top_k`` largest."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = blas.scal(logits, 1.0 / temperature, backend=backend)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = blas.softmax(logits, dim=-1, backend=backend)
    return torch.multinomial(probs.float(), num_samples=1)  # (B, 1)


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             use_cache: bool = True, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``idx (B, T)`` followed by ``max_new_tokens`` tokens of ``model`` (a GPT); see GPT.generate.

    With ``use_cache``, ``T + max_new_tokens`` may not exceed ``block_size`` (a ``ValueError``);
    with ``use_cache=False`` the context is cropped to its last ``block_size`` tokens instead."""
    if max_new_tokens < 0 or temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(f"GPT.generate: max_new_tokens ({max_new_tokens}) and temperature ({temperature}) must "
                         f"be >= 0 and top_k ({top_k}) None or >= 1")
    B, T = idx.shape
    if attention_mask is not None:
        groups = spans(attention_mask, idx.shape)
        for (start, length), rows in groups.items():
            if length == 0 or start + length != T:
                raise ValueError(f"GPT.generate: attention_mask row {rows[0]} is not left padding with at least one "
                                 "token (zeros, then ones up to the last position)")
        if list(groups) != [(0, T)]:
            new = idx.new_empty(B, max_new_tokens)
            for (start, _), rows in groups.items():
                new[rows] = generate(model, idx[rows, start:], max_new_tokens, temperature, top_k, use_cache)[:, T - start:]
            return torch.cat([idx, new], dim=1)
    block = model.config.block_size
    if use_cache and T + max_new_tokens > block:
        raise ValueError(f"GPT.generate: a prompt of {T} tokens and max_new_tokens={max_new_tokens} make "
                         f"{T + max_new_tokens} positions, more than block_size ({block}), the positions the model "
                         f"and its KV cache have: ask for at most {max(block - T, 0)} new tokens, or pass "
                         "use_cache=False to crop the context to the last block_size tokens")
    fed = T + max_new_tokens - 1  # the positions fed to the model: the prompt, then each new token but the last
    cache = model.kv_cache(fed) if use_cache and T and max_new_tokens else None
    seq, context = idx, idx
    for _ in range(max_new_tokens):
        if cache is not None:
            h = model.hidden_states(context, cache)  # (B, T | 1, C)
        else:
            h = model.hidden_states(seq[:, -block:])  # without the cache: the context, cropped to block_size
        nxt = sample(model.lm_head(h[:, -1]), temperature, top_k, model.backend)  # (B, 1)
        seq, context = torch.cat([seq, nxt], dim=1), nxt
    return seq
