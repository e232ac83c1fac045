"""When a tensor made inside an op may be kept for later calls (the host-side caches of constant
tables and scratch memory: ``ones``, ``starts``, ``_rope.turns``, cute's ``workspace`` and
attention schedules)."""
from __future__ import annotations

import sys

import torch


def keepable(device: torch.device) -> bool:
    """May a tensor allocated now on ``device`` outlive this call? Not while a CUDA graph is being
    captured on the current stream (its memory belongs to the graph, and its values appear only when
    the graph replays), nor while a cudagraph tree (``torch.compile(mode="reduce-overhead")``) warms
    up: that run is eager, not captured, but allocates from the graph's memory pool, which must hold
    no tensor the graph does not return ("tensors in the cudagraph pool not tracked as outputs")."""
    if device.type != "cuda":
        return True
    if torch.cuda.is_current_stream_capturing():
        return False
    trees = sys.modules.get("torch._inductor.cudagraph_trees")  # loaded only where inductor is
    if trees is None:
        return True
    manager = trees.get_manager(device.index if device.index is not None else torch.cuda.current_device(),
                                create_if_none_exists=False)
    return manager is None or not manager.in_warmup


_ONES: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def ones(n: int, like: torch.Tensor) -> torch.Tensor:
    """``n`` ones in ``like``'s dtype and device (a row-sum's vector for gemv): a stride-0 view of one
    cached element, no allocation or fill kernel per call. One made while a CUDA graph is being
    captured or warmed up is not cached (``keepable``), and while torch.compile traces (``like`` is
    then a fake or functional tensor, not a ``torch.Tensor`` itself) the cache is neither read nor
    written: the graph makes its own."""
    if type(like) is not torch.Tensor or torch.compiler.is_compiling():
        return torch.ones(1, dtype=like.dtype, device=like.device).expand(n)
    key = (like.dtype, like.device)
    one = _ONES.get(key)
    if one is None:
        one = torch.ones(1, dtype=like.dtype, device=like.device)
        if keepable(one.device):
            _ONES[key] = one
    return one.expand(n)


_STARTS: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def starts(B: int, T: int, device: torch.device) -> torch.Tensor:
    """``0, T, 2T, ..., BT`` (int32, ``(B + 1,)``): where each of B sequences of T tokens starts in
    their packed rows (flash attention's ``cu_seqlens``), made once per (B, T, device) rather than
    by a kernel per call; cached under the same rule as ``ones``."""
    key = (B, T, device)
    table = _STARTS.get(key)
    if table is None:
        table = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=device) if T else \
            torch.zeros(B + 1, dtype=torch.int32, device=device)
        if keepable(table.device):
            if len(_STARTS) > 256:
                _STARTS.clear()
            _STARTS[key] = table
    return table
