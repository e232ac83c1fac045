"""embedding: ``out[n] = weight[indices[n]]``, rows of ``weight (V, D)``, shape ``(*indices.shape, D)``.

Backward: ``dweight[v] = sum of dout[n] over every n with indices[n] == v`` (repeated indices
accumulate), summed in float32 (float64 for float64) and rounded once to weight's dtype. The
indices get no gradient. Cache: ``(indices, weight)`` (weight for its shape and dtype only).

An index outside ``[0, V)`` is refused before this runs (``_check.index_range``: an IndexError
naming it, on the host for CPU tensors); on a GPU ``index_select`` asserts on the device (and
``weight[indices]`` would have wrapped -1 to the last row).
"""
import torch

from ._acc import acc


def embedding(indices: torch.Tensor, weight: torch.Tensor):
    rows = weight.index_select(0, indices.reshape(-1))  # (N, D), N = indices.numel()
    return rows.reshape(*indices.shape, weight.shape[1]), (indices, weight)


def embedding_backward(dout: torch.Tensor, cache, needs):
    indices, weight = cache
    if not needs[1]:
        return None, None
    V, D = weight.shape
    dy = acc(dout).reshape(indices.numel(), D)  # (N, D); not reshape(-1, D): D may be 0
    dweight = torch.zeros(V, D, dtype=dy.dtype, device=dy.device)
    if dy.numel():  # nothing to add at N = 0 or D = 0 (no kernel launched for an empty update)
        dweight.index_put_((indices.reshape(-1),), dy, accumulate=True)  # dweight[indices[n]] += dy[n]
    return None, dweight.to(weight.dtype)
