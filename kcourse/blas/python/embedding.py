"""embedding: ``out[n] = weight[indices[n]]``, rows of ``weight (V, D)``, shape ``(*indices.shape, D)``.

Backward: ``dweight[v] = sum of dout[n] over every n with indices[n] == v`` (repeated indices
accumulate), summed in float32 (float64 for float64) and rounded once to weight's dtype. The
indices get no gradient. Cache: ``(indices, weight)`` (weight for its shape and dtype only).

``index_select`` raises for an index outside ``[0, V)``, negative ones included (``weight[indices]``
would wrap -1 to the last row).
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
    dy = acc(dout).reshape(-1, D)  # (N, D)
    dweight = torch.zeros(V, D, dtype=dy.dtype, device=dy.device)
    dweight.index_put_((indices.reshape(-1),), dy, accumulate=True)  # dweight[indices[n]] += dy[n]
    return None, dweight.to(weight.dtype)
