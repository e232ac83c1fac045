"""What every kcourse module shares: the backend its kcourse.blas ops run on."""
from __future__ import annotations

import torch.nn as nn

from ..backend import check_name


class Module(nn.Module):
    """A ``torch.nn.Module`` whose forward computes only through ``kcourse.blas`` ops, on
    ``self.backend`` (None: the innermost ``kcourse.use_backend`` block, else the default)."""

    def __init__(self, backend: str | None = None):
        super().__init__()
        self.backend = None if backend is None else check_name(backend)

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}" if self.backend else ""


def set_backend(model: nn.Module, name: str | None) -> nn.Module:
    """Run every kcourse module inside ``model`` on backend ``name`` (None: follow the context)."""
    name = None if name is None else check_name(name)
    for m in model.modules():
        if isinstance(m, Module):
            m.backend = name
    return model
