"""The index space of same-shape tensors, merged: what every backend's elementwise kernels walk;
the strides of a (B, H, T, D) attention operand as a TMA descriptor takes them, and the layout of
attention's outputs; and the rows of a (..., D) tensor as the norm kernels take them.

Elementwise ops (copy, swap, scal, axpby, ...) take same-shape tensors whose strides may all
differ. ``strided_layout`` rewrites their common index space as at most ``MAX_DIMS`` dims with one
stride tuple per tensor, merging every pair of neighbouring dims that all tensors step through as
through a single dim. When every operand is laid out the same dense way (all contiguous, say) the
result is one dim of stride 1, which a kernel can sweep with wide, vectorized accesses.
"""
from __future__ import annotations

import torch

MAX_DIMS = 4  # the most dims, after merging, that an elementwise kernel indexes


def strided_layout(op: str, *tensors: torch.Tensor) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """One ``shape`` and a ``strides`` tuple per tensor, describing the same-shape ``tensors``.

    Size-1 dims are dropped, the others ordered by the last tensor's strides (largest first), and
    neighbours d, d+1 merged wherever every tensor steps through them as through a single dim
    (``stride[d] == stride[d+1] * size[d+1]``). Contiguous tensors become ``(numel,)``, ``(1,)``.
    """
    ref = tensors[-1]
    dims = sorted((d for d in range(ref.dim()) if ref.shape[d] != 1), key=lambda d: -ref.stride(d))
    shape = [ref.shape[d] for d in dims]
    strides = [[t.stride(d) for d in dims] for t in tensors]
    for d in reversed(range(len(shape) - 1)):
        if all(s[d] == s[d + 1] * shape[d + 1] for s in strides):
            shape[d] *= shape.pop(d + 1)
            for s in strides:
                s[d] = s.pop(d + 1)
    if len(shape) > MAX_DIMS:
        described = ", ".join(f"{tuple(t.shape)} with strides {t.stride()}" for t in tensors)
        raise ValueError(f"{op}: the kernel indexes at most {MAX_DIMS} dims that cannot be merged, "
                         f"but these tensors need {len(shape)}: {described}; pass a .contiguous() copy")
    if not shape:  # a single element
        return (1,), [(1,)] * len(tensors)
    return tuple(shape), [tuple(s) for s in strides]


TMA_ALIGN = 16  # bytes: TMA's unit of base address and stride
TMA_MAX_STRIDE = 2**40  # bytes: TMA strides stay below


def tma_strides(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(batch, head, sequence) strides in elements of a (B, H, T, D) tensor as a TMA descriptor
    takes them (the head dim of stride 1 innermost), or None if TMA cannot read it.

    Strides must be positive multiples of 16 bytes below 2^40 bytes and the base 16-byte aligned; a
    dim of extent 1 is never stepped over, so its stride is replaced by a legal one (the extent of
    the dims inside it, rounded up to 16 bytes)."""
    if t.stride(-1) != 1 or t.data_ptr() % TMA_ALIGN:
        return None
    size = t.element_size()
    vec = TMA_ALIGN // size
    B, H, T, D = t.shape
    s_b, s_h, s_t, _ = t.stride()
    if T == 1:
        s_t = -(-D // vec) * vec
    if H == 1:
        s_h = -(-(s_t * T) // vec) * vec
    if B == 1:
        s_b = -(-(s_h * H) // vec) * vec
    if s_t % vec or s_h % vec or s_b % vec or min(s_b, s_h, s_t) <= 0:
        return None
    if max(s_b, s_h, s_t) * size >= TMA_MAX_STRIDE:
        return None
    return s_b, s_h, s_t


def token_major(t: torch.Tensor) -> bool:
    """Are the tokens of ``t (B, H, T, D)`` further apart in memory than its heads, as in the heads of a
    projection's ``(B, T, H * D)`` rows, viewed ``(B, T, H, D)`` and transposed?"""
    return t.stride(2) > t.stride(1)


def heads_strides(shape, token_major_order: bool) -> tuple[int, int, int, int]:
    """The strides of a new (B, H, T, D) tensor of ``shape`` in the heads layout: ``(B, T, H, D)``
    memory viewed as heads for token-major order, else contiguous."""
    B, H, T, D = shape
    return (T * H * D, D, H * D, 1) if token_major_order else (H * T * D, T * D, D, 1)


def heads_like(t: torch.Tensor, shape=None) -> torch.Tensor:
    """A new tensor of ``shape`` (default ``t``'s), (B, H, T, D), that orders its heads and tokens as
    ``t`` does (``heads_strides``): ``(B, T, H, D)`` memory viewed as heads where ``t`` is
    ``token_major`` (attention's output then reshapes to the ``(B, T, H * D)`` rows of the next
    projection without a copy, and its inputs' gradients concatenate into the projection's gradient
    in one straight pass), else contiguous."""
    shape = t.shape if shape is None else shape
    return t.new_empty_strided(shape, heads_strides(shape, token_major(t)))


def is_like_heads(x: torch.Tensor, t: torch.Tensor) -> bool:
    """Is ``x`` laid out as ``heads_like(t)`` (dims of extent 1 aside, as ``is_contiguous`` judges)?"""
    return is_like_heads_order(x, token_major(t))


def is_like_heads_order(x: torch.Tensor, token_major_order: bool) -> bool:
    """Is ``x`` in the heads layout of that order (``heads_strides``)?"""
    return x.transpose(1, 2).is_contiguous() if token_major_order else x.is_contiguous()


def laid_out_like_heads(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``x`` (of ``t``'s layout rule's shape) in ``heads_like(t)``'s layout: itself, or a copy."""
    return in_heads_order(x, token_major(t))


def in_heads_order(x: torch.Tensor, token_major_order: bool) -> torch.Tensor:
    """``x`` (B, H, T, D) in the heads layout of that order (``heads_strides``): itself, or a copy."""
    if is_like_heads_order(x, token_major_order):
        return x
    return x.new_empty_strided(x.shape, heads_strides(x.shape, token_major_order)).copy_(x)


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """x (..., D) as (N, D): a view when the leading dims merge (any strides, e.g. a transposed x), else
    a copy (the one documented copy of the triton and cute norms; their kernels take both strides)."""
    return x.reshape(x.shape[:-1].numel(), x.shape[-1])  # (not -1: ambiguous when D = 0)
