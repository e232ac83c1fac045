"""The pytorch backend: each op in idiomatic PyTorch (torch.addmm, torch.mv, torch.dot ...)."""
