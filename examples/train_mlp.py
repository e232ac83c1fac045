"""Classify scikit-learn's bundled digits (8x8 images, 10 classes; no download) with kcourse.modules.MLP.

    python examples/train_mlp.py --backend pytorch
    python examples/train_mlp.py --backend triton --device cuda

The network is MLP(64 -> 256 -> 64) followed by a Linear head (64 -> 10), trained with AdamW on
the mean cross-entropy (kcourse.blas.cross_entropy); it prints the loss every 10 epochs and the test
accuracy at the end (>= 95%).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn

import kcourse
from kcourse import blas
from kcourse.modules import MLP, Linear


def digits(device):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    mean, std = X_tr.mean(0), X_tr.std(0) + 1e-6  # standardize with the training statistics
    as_x = lambda a: torch.tensor((a - mean) / std, dtype=torch.float32, device=device)  # noqa: E731
    as_y = lambda a: torch.tensor(a, dtype=torch.long, device=device)  # noqa: E731
    return as_x(X_tr), as_y(y_tr), as_x(X_te), as_y(y_te)


def main(argv=None) -> float:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="pytorch", choices=kcourse.backend.NAMES)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    X_tr, y_tr, X_te, y_te = digits(args.device)
    model = nn.Sequential(MLP(64, 256, "gelu", backend=args.backend), Linear(64, 10, backend=args.backend))
    model.to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(args.seed)
    for epoch in range(args.epochs):
        order = torch.randperm(len(X_tr), generator=gen).to(args.device)
        for i in range(0, len(order), args.batch_size):
            rows = order[i:i + args.batch_size]
            loss = blas.cross_entropy(model(X_tr[rows]), y_tr[rows], backend=args.backend)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if epoch % 10 == 9 or epoch == args.epochs - 1:  # a line every 10 epochs (~10 s on 2 CPU cores)
            print(f"epoch {epoch + 1:3d}/{args.epochs}: batch loss {loss.item():.4f}", flush=True)
    with torch.no_grad():
        accuracy = (model(X_te).argmax(-1) == y_te).float().mean().item()
    print(f"backend {args.backend}: final batch loss {loss.item():.4f}, test accuracy {accuracy:.2%} "
          f"({len(y_te)} held-out digits)")
    return accuracy


if __name__ == "__main__":
    main()
