"""swap: ``(out_x, out_y) <- (y, x)``."""
import torch


def swap(x: torch.Tensor, y: torch.Tensor, out_x: torch.Tensor, out_y: torch.Tensor):
    saved_x = x.clone()  # in place, out_x is x: keep x's values before they are overwritten
    out_x.copy_(y)
    out_y.copy_(saved_x)
    return out_x, out_y
