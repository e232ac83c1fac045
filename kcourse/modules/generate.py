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
at positions 0, 1, ..., as transformers numbers them: a batch of prompts of ``G`` different
lengths costs ``G`` passes, each on its own rows.

A static cache (``KVCache(static=True)``) keeps its length on the device too: a decode step then
writes its keys and values at that position (``index_copy_``), reads its positions from it, and
attends over the whole buffer with ``kv_len`` (the attention op's per-row key count, read by the
kernels) instead of over a slice whose length grows. Every shape and address is then the same at
every step, so ``generate(cuda_graph=True)`` captures one decode step as a CUDA graph and replays it
per token: the host's cost of the step's ~100 ops is paid once, at capture (``GraphedStep``).
"""
from __future__ import annotations

import torch

from .. import blas


class KVCache:
    """Keys and values of a model's ``n_layer`` attention layers at positions ``0 .. pos - 1``.

    Each layer's ``k`` and ``v`` are ``(B, Hkv, max_len, hd)`` views of token-major ``(B, max_len, Hkv,
    hd)`` buffers (the layout flash attention's variable-length kernel reads), allocated at the layer's
    first write in the dtype and on the device of its keys, never reallocated. A forward appends
    its ``T`` positions to every layer, then ``advance(T)``. Inference only: the writes are in place.
    ``static``: the length is kept on the device too (``length``), and every forward after the
    prompt reads its positions from it (``begin``), so a decode step has the same shapes and
    addresses at every position (module docstring).
    """

    def __init__(self, n_layer: int, max_len: int, device=None, static: bool = False):
        self.max_len, self.pos, self.static = max_len, 0, static
        self.k: list[torch.Tensor | None] = [None] * n_layer
        self.v: list[torch.Tensor | None] = [None] * n_layer
        self._positions = torch.arange(max_len, device=device)
        # static: pos on the device as well, and what a decode step reads of it (``begin``)
        self.length = torch.zeros((), dtype=torch.int64, device=device) if static else None
        self._at: torch.Tensor | None = None  # (T,) int64: the positions being written
        self.kv_len: torch.Tensor | None = None  # (B,) int32: the keys each row attends to

    @property
    def decoding(self) -> bool:
        """A static cache past its prompt: positions, writes and key counts come from the device."""
        return self.static and self.pos > 0

    def begin(self, B: int, T: int) -> None:
        """Before a forward of ``T`` new tokens in each of ``B`` rows: on a decoding static cache, their
        positions ``length .. length + T - 1`` and the key count ``length + T`` of every row, computed
        on the device (a CUDA graph replays them as ``length`` grows)."""
        if self.decoding:
            self._room(T)
            self._at = self.length + self._positions[:T]  # (T,)
            self.kv_len = (self.length + T).to(torch.int32).expand(B).contiguous()  # (B,)

    def positions(self, T: int) -> torch.Tensor:
        """The positions ``pos .. pos + T - 1`` of the next ``T`` tokens, ``(T,)`` int64."""
        self._room(T)
        if self.decoding:
            return self._at
        return self._positions[self.pos:self.pos + T]

    def _room(self, T: int) -> None:
        if self.pos + T > self.max_len:
            raise ValueError(f"KVCache: {T} new positions after {self.pos} cached ones exceed the cache's "
                             f"max_len ({self.max_len})")

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, backend=None):
        """Write ``k, v (B, Hkv, T, hd)`` at positions ``pos ..`` of ``layer``; return the keys and
        values of positions ``0 .. pos + T - 1``, ``(B, Hkv, pos + T, hd)`` each (on a decoding static
        cache the whole buffers, ``(B, Hkv, max_len, hd)``, of which ``kv_len`` positions are written)."""
        B, Hkv, T, hd = k.shape
        end = self.pos + T
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            raise RuntimeError("KVCache: its writes are in place, not differentiable: decode under torch.no_grad() "
                               "(GPT.generate does)")
        self._room(T)
        if self.k[layer] is None:  # token-major storage (B, max_len, Hkv, hd), seen as (B, Hkv, max_len, hd)
            self.k[layer], self.v[layer] = (k.new_empty(B, self.max_len, Hkv, hd).transpose(1, 2) for _ in range(2))
        ck, cv = self.k[layer], self.v[layer]
        if (ck.shape[0], ck.shape[1], ck.shape[3], ck.dtype) != (B, Hkv, hd, k.dtype):
            raise ValueError(f"KVCache: layer {layer} caches {tuple(ck.shape)} {ck.dtype}, got keys "
                             f"{tuple(k.shape)} {k.dtype} (B, Hkv, T, hd)")
        if self.decoding:  # at the device's positions; the whole buffer, kv_len says how much is written
            ck.index_copy_(2, self._at, k)
            cv.index_copy_(2, self._at, v)
            return ck, cv
        blas.copy_(k, ck[:, :, self.pos:end], backend=backend)
        blas.copy_(v, cv[:, :, self.pos:end], backend=backend)
        if self.pos == 0:
            return k, v
        return ck[:, :, :end], cv[:, :, :end]

    def reset(self) -> None:
        """Empty: the next forward is a prompt at position 0 (the buffers are kept and overwritten)."""
        self.pos = 0
        if self.static:
            self.length.zero_()

    def advance(self, T: int) -> None:
        self.pos += T
        if self.static:
            self.length.add_(T)


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


class GraphedStep:
    """One decode step of ``model`` (a GPT) on a static ``cache`` holding its prompt, captured as a
    CUDA graph: ``step(tok (B, 1))`` writes the token's keys and values at the cache's position and
    returns the next token's logits ``(B, V)`` (with ``greedy``, the argmax ``(B, 1)`` instead),
    replaying the captured kernels; the cache advances by one. The tensors it returns are the
    graph's: read or copy them before the next step.

    Capture: the step runs once on a side stream first (compiling and tuning kernels, which a
    capture may not do), the cache's position restored after it; the capture then records the
    kernels without running them, the cache's host position restored again. The graph reads and
    writes fixed addresses, ``tok``, the cache's buffers and its device length, whatever the step."""

    def __init__(self, model, cache: KVCache, B: int, greedy: bool):
        if not cache.decoding:
            raise ValueError("GraphedStep: the cache must be static and hold the prompt (a prefill first)")
        self.cache = cache
        self.tok = torch.zeros(B, 1, dtype=torch.long, device=cache.length.device)

        def step():
            logits = model.lm_head(model.hidden_states(self.tok, cache)[:, -1])  # (B, V)
            return logits.argmax(dim=-1, keepdim=True) if greedy else logits

        pos, length = cache.pos, cache.length.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        cache.pos = pos
        cache.length.copy_(length)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = step()
        cache.pos = pos

    def __call__(self, tok: torch.Tensor) -> torch.Tensor:
        self.cache._room(1)
        self.tok.copy_(tok)
        self.graph.replay()
        self.cache.pos += 1
        return self.out


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             use_cache: bool = True, attention_mask: torch.Tensor | None = None,
             cuda_graph: bool = False) -> torch.Tensor:
    """``idx (B, T)`` followed by ``max_new_tokens`` tokens of ``model`` (a GPT); see GPT.generate.

    With ``use_cache``, ``T + max_new_tokens`` may not exceed ``block_size`` (a ``ValueError``);
    with ``use_cache=False`` the context is cropped to its last ``block_size`` tokens instead."""
    if max_new_tokens < 0 or temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(f"GPT.generate: max_new_tokens ({max_new_tokens}) and temperature ({temperature}) must "
                         f"be >= 0 and top_k ({top_k}) None or >= 1")
    if cuda_graph and (not use_cache or idx.device.type != "cuda"):
        raise ValueError(f"GPT.generate: cuda_graph replays decode steps on a static KV cache: it needs "
                         f"use_cache=True (got {use_cache}) and a CUDA model (idx is on {idx.device})")
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
                new[rows] = generate(model, idx[rows, start:], max_new_tokens, temperature, top_k, use_cache,
                                     cuda_graph=cuda_graph)[:, T - start:]
            return torch.cat([idx, new], dim=1)
    block = model.config.block_size
    if use_cache and T + max_new_tokens > block:
        raise ValueError(f"GPT.generate: a prompt of {T} tokens and max_new_tokens={max_new_tokens} make "
                         f"{T + max_new_tokens} positions, more than block_size ({block}), the positions the model "
                         f"and its KV cache have: ask for at most {max(block - T, 0)} new tokens, or pass "
                         "use_cache=False to crop the context to the last block_size tokens")
    fed = T + max_new_tokens - 1  # the positions fed to the model: the prompt, then each new token but the last
    if cuda_graph and T and max_new_tokens > 1:
        return _generate_graphed(model, idx, max_new_tokens, temperature, top_k)
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


class _Kept:
    """A model's kept ``GraphedStep`` and its key, as ``model.__dict__["_graphed_step"]``; copies and
    pickles of the model leave it behind (a CUDA graph copies to nothing: the copy captures its own)."""

    def __init__(self, key: tuple, step: GraphedStep):
        self.key, self.step = key, step

    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return type(None), ()


def _generate_graphed(model, idx: torch.Tensor, max_new_tokens: int, temperature: float,
                      top_k: int | None) -> torch.Tensor:
    """generate's loop with the prefill eager and every decode step a replay of one ``GraphedStep``.

    The step and its static cache (``block_size`` positions, any prompt and number of tokens that
    fit) are kept on the model for the next call of the same batch size, backend, greedy or not,
    and parameters (their addresses and dtypes: the graph reads them where they were at capture);
    anything else captures a new step in place of the kept one."""
    B = idx.shape[0]
    key = (B, temperature == 0, model.backend, tuple((p.data_ptr(), p.dtype) for p in model.parameters()))
    kept = model.__dict__.get("_graphed_step")
    step = kept.step if kept is not None and kept.key == key else None
    cache = step.cache if step is not None else model.kv_cache(model.config.block_size, static=True)
    cache.reset()
    nxt = sample(model.lm_head(model.hidden_states(idx, cache)[:, -1]), temperature, top_k, model.backend)  # (B, 1)
    if step is None:
        model.__dict__.pop("_graphed_step", None)  # the old graph's memory goes first
        step = GraphedStep(model, cache, B, greedy=temperature == 0)
        model.__dict__["_graphed_step"] = _Kept(key, step)
    new = [nxt]
    for _ in range(max_new_tokens - 1):
        out = step(nxt)
        nxt = out.clone() if temperature == 0 else sample(out, temperature, top_k, model.backend)
        new.append(nxt)
    return torch.cat([idx, *new], dim=1)
