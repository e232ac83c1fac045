"""What the rope kernels of every backend share on the host: the frequency table."""
from __future__ import annotations

import math

import torch

from . import _cache

_TABLES: dict[tuple[int, float, torch.device, bool], torch.Tensor] = {}  # (D, base, device, in turns) -> table


def turns(D: int, base: float, device: torch.device) -> torch.Tensor:
    """The D/2 frequencies base^(-2i/D) in full turns per position, float64 (D/2,): computed on the
    device once per (D, base, device), not by five small kernels per call. A table made while a CUDA
    graph is being captured or warmed up is not cached (``_cache.keepable``)."""
    return _frequencies(D, base, device, True)


def radians(D: int, base: float, device: torch.device) -> torch.Tensor:
    """The same frequencies in radians per position, float64 (D/2,), cached likewise."""
    return _frequencies(D, base, device, False)


def _frequencies(D: int, base: float, device: torch.device, in_turns: bool) -> torch.Tensor:
    key = (D, base, device, in_turns)
    table = _TABLES.get(key)
    if table is None:
        i = torch.arange(D // 2, dtype=torch.float64, device=device)
        table = base ** (-2 * i / D)
        if in_turns:
            table = table / (2 * math.pi)
        if _cache.keepable(table.device):
            _TABLES[key] = table
    return table
