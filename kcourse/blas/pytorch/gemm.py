"""gemm: ``out = alpha * A B + beta * C`` with ``torch.addmm`` (2-D) or ``torch.baddbmm`` (3-D).

``C`` is None when ``beta == 0``: ``out.addmm_(A, B, beta=0)`` ignores ``out``'s old values.
cuBLAS may reduce float16/bfloat16 split-K partial sums in half precision (PyTorch allows it by
default); kcourse promises float32 accumulation, so those reductions are switched off for the call
and the user's setting is given back after it, whole (``reduced_precision_off``).
"""
import threading

import torch

# the cuBLAS flag of each half type, through torch's C functions rather than the Python properties of
# ``torch.backends.cuda.matmul``, which parse their value on every set (host time: this runs for every
# gemm of a step); its state is (allow_reduced_precision, allow_splitk) on recent torch, a bool before
_FLAGS = {torch.float16: (torch._C._get_cublas_allow_fp16_reduced_precision_reduction,
                          torch._C._set_cublas_allow_fp16_reduced_precision_reduction),
          torch.bfloat16: (torch._C._get_cublas_allow_bf16_reduced_precision_reduction,
                           torch._C._set_cublas_allow_bf16_reduced_precision_reduction)}


def reduced_precision_off(dtype: torch.dtype) -> tuple | None:
    """Switch cuBLAS's half-precision reductions off for ``dtype``'s products; returns the state to
    give back (``restore``), or None where they were off already."""
    get, set_ = _FLAGS[dtype]
    state = get()
    state = state if isinstance(state, tuple) else (state,)
    if not state[0]:
        return None
    set_(False, *state[1:])
    return state


def restore(dtype: torch.dtype, state: tuple | None) -> None:
    if state is not None:
        _FLAGS[dtype][1](*state)


class _Backward(threading.local):
    def __init__(self):
        self.states = []  # per thread: the settings to give back, pushed before a node's products, popped after


_BACKWARD = _Backward()


def _node_hooks(dtype: torch.dtype):
    """The pre- and post-hook of an autograd node whose products must sum ``dtype`` in float32."""
    def off(grad_outputs):
        _BACKWARD.states.append(reduced_precision_off(dtype))

    def on(grad_inputs, grad_outputs):
        restore(dtype, _BACKWARD.states.pop())

    return off, on


_HOOKS = {dtype: _node_hooks(dtype) for dtype in _FLAGS}


def sums_in_float32(z: torch.Tensor) -> torch.Tensor:
    """``z``, made by ATen's autograd from a product (``torch.mm``, ``torch.addmm``): its node's backward
    products then run with cuBLAS's half-precision reductions off, as this module's gemm does (a pre-hook
    switches them off, a post-hook gives the setting back; the autograd engine runs a node's hooks on
    the thread that runs the node). A node whose backward raises (out of memory) runs no post-hook:
    the reductions then stay off, the stricter setting, until the user sets them again."""
    if z.is_cuda and z.dtype in _FLAGS and z.grad_fn is not None:
        off, on = _HOOKS[z.dtype]
        z.grad_fn.register_prehook(off)
        z.grad_fn.register_hook(on)
    return z


def gemm(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor | None, alpha: float, beta: float,
         out: torch.Tensor) -> torch.Tensor:
    if not (A.is_cuda and A.dtype in _FLAGS):  # the reductions concern half operands on CUDA only
        return _gemm(A, B, C, alpha, beta, out)
    state = reduced_precision_off(A.dtype)  # inline rather than a context manager: host time per gemm
    try:
        return _gemm(A, B, C, alpha, beta, out)
    finally:
        restore(A.dtype, state)


def _gemm(A, B, C, alpha, beta, out):
    batched = A.dim() == 3
    if C is None:
        return (out.baddbmm_ if batched else out.addmm_)(A, B, beta=0, alpha=alpha)
    if not batched and C.stride() == (0, 1):  # a bias row broadcast down the rows (linear's C): as the
        C = C[0]  # vector itself, which cuBLASLt adds in the product's epilogue on CUDA (beta = 1), as
        # F.linear's bias; a broadcast matrix would be copied into out first and read back by the gemm
    return (torch.baddbmm if batched else torch.addmm)(C, A, B, beta=beta, alpha=alpha, out=out)
