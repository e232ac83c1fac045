"""kcourse.modules: transformer building blocks computed only through kcourse.blas ops.

    model = GPT(GPTConfig(...), backend="triton")   # every submodule runs on triton
    set_backend(model, "python")                    # switch a built model
    with kcourse.use_backend("pytorch"): model(idx) # applies where a module's backend is None
"""
from .attention import Attention
from .base import Module, set_backend
from .block import Block
from .gpt import GPT, GPTConfig
from .linear import Embedding, Linear
from .mlp import MLP, SwiGLU
from .norm import LayerNorm, RMSNorm

__all__ = ["Module", "set_backend", "Linear", "Embedding", "LayerNorm", "RMSNorm", "MLP", "SwiGLU",
           "Attention", "Block", "GPT", "GPTConfig"]
