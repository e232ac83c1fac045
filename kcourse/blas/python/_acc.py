"""The reference's one convention: compute in float32 (float64 for float64 inputs), round once."""
import torch


def into(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``result``, or ``out`` holding it (a backward's gradient written over a buffer it read)."""
    return result if out is None else out.copy_(result)


def acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the accumulation dtype: float64 stays, everything else becomes float32."""
    return t.double() if t.dtype == torch.float64 else t.float()
