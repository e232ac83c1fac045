"""The reference's one convention: compute in float32 (float64 for float64 inputs), round once."""
import torch


def acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the accumulation dtype: float64 stays, everything else becomes float32."""
    return t.double() if t.dtype == torch.float64 else t.float()
