"""dot: ``x^T y`` with ``torch.dot`` (float32 accumulation for half types).

cuBLAS takes vectors of fewer than 2^31 elements; longer ones are summed in float32 chunk by chunk.
"""
import torch

CHUNK = 1 << 30


def dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if x.numel() < 2**31:
        return torch.dot(x, y)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    parts = [torch.dot(x[i:i + CHUNK].to(acc), y[i:i + CHUNK].to(acc)) for i in range(0, x.numel(), CHUNK)]
    return torch.stack(parts).sum().to(x.dtype)
