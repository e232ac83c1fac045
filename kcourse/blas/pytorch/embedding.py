"""embedding: ``F.embedding(indices, weight)``, shape ``(*indices.shape, D)``.

Backward: ``aten.embedding_dense_backward`` (the kernel behind F.embedding's autograd) on dy in
float32 (float64 for float64), so repeated indices accumulate in float32, then one rounding to
weight's dtype. On CUDA it sums with atomics unless ``torch.use_deterministic_algorithms``.
An index outside [0, V) is refused before this runs on the CPU (``_check.index_range``: an
IndexError naming it); on a GPU F.embedding's kernel asserts on the device.
Cache: ``(indices, weight)`` (weight for its shape and dtype only).
"""
import torch
import torch.nn.functional as F


def embedding(indices: torch.Tensor, weight: torch.Tensor):
    return F.embedding(indices, weight), (indices, weight)


def embedding_backward(dout: torch.Tensor, cache, needs):
    indices, weight = cache
    if not needs[1]:
        return None, None
    if dout.numel() == 0:  # no tokens or D = 0 (CUDA's embedding_dense_backward reads out of bounds at D = 0)
        return None, torch.zeros_like(weight, memory_format=torch.contiguous_format)
    dy = dout.to(torch.promote_types(weight.dtype, torch.float32))
    dweight = torch.ops.aten.embedding_dense_backward(dy, indices, weight.shape[0], -1, False)
    return None, dweight.to(weight.dtype)
