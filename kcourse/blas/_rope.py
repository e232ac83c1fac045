"""What the rope kernels of every backend share on the host: the frequency table."""
from __future__ import annotations

import math

import torch

from . import _cache

_TURNS: dict[tuple[int, float, torch.device], torch.Tensor] = {}  # (D, base, device) -> its frequencies


def turns(D: int, base: float, device: torch.device) -> torch.Tensor:
    """The D/2 frequencies base^(-2i/D) in full turns per position, float64 (D/2,): computed on the
    device once per (D, base, device), not by five small kernels per call. A table made while a CUDA
    graph is being captured or warmed up is not cached (``_cache.keepable``)."""
    key = (D, base, device)
    table = _TURNS.get(key)
    if table is None:
        i = torch.arange(D // 2, dtype=torch.float64, device=device)
        table = base ** (-2 * i / D) / (2 * math.pi)
        if _cache.keepable(table.device):
            _TURNS[key] = table
    return table
