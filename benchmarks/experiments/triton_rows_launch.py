"""Experiment: the launch choices of the triton softmax, log_softmax and cross_entropy forwards
(``kcourse/blas/triton/_softmax.py`` and ``cross_entropy.py``: ``TILE``, the elements of a short-row
tile; ``THREAD_ELEMENTS``, the elements a thread) at the row lengths
models use, against the shipped choice and quack's kernels, each timed as a CUDA-graph replay (the
kernels alone, L2 flushed before each call).

    python -m benchmarks.experiments.triton_rows_launch OUT.txt [--ops softmax,cross_entropy,cross_entropy_backward]

``cross_entropy_backward``: its backward's block of columns (``_block_v``: at most 2048, 4096 or
8192) and warps (``_warps``: at most 4, 8 or 16, a warp per 512 columns of the block), each
variant's forward + backward timed (the forward the same in every one).

Per op, dtype and (N, D) of 2^27 elements (D = 1024, 4096, 16384): every variant's milliseconds
(its output checked against the shipped choice's), fastest first, beside quack's forward where it
is importable (cross_entropy: the mean loss, as ``kcourse.blas.cross_entropy`` gives it). Writes
OUT.txt and prints it.
"""
import argparse
import itertools

import torch

from benchmarks.timing import graph_ms
from kcourse import blas
from kcourse.blas.triton import _softmax, cross_entropy as _ce

ELEMENTS = 2**27
COLUMNS = [1024, 4096, 16384]
VARIANTS = {  # op -> (module, {field: values}); the product is the sweep
    "softmax": (_softmax, {"TILE": [4096, 8192], "THREAD_ELEMENTS": [8, 16, 32]}),
    "log_softmax": (_softmax, {"TILE": [4096, 8192], "THREAD_ELEMENTS": [8, 16, 32]}),
    "cross_entropy": (_ce, {"TILE": [1024, 2048, 4096], "THREAD_ELEMENTS": [16, 32, 64]}),
}


def _capped_block(cap: int):
    def block_v(V):
        return min(_ce.next_power_of_2(max(V, 1)), cap)
    block_v.__name__ = f"block<={cap}"
    return block_v


def _capped_warps(cap: int):
    def warps(block):
        return min(cap, max(1, block // 512))
    warps.__name__ = f"warps<={cap}"
    return warps


BACKWARD_VARIANTS = {"_block_v": [_capped_block(c) for c in (2048, 4096, 8192)],
                     "_warps": [_capped_warps(c) for c in (4, 8, 16)]}
VARIANTS["cross_entropy_backward"] = (_ce, BACKWARD_VARIANTS)


def with_fields(module, fields: dict, fn):
    """``fn()`` with ``module``'s launch constants set to ``fields``, then restored."""
    saved = {k: getattr(module, k) for k in fields}
    try:
        for k, v in fields.items():
            setattr(module, k, v)
        return fn()
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def call(op: str, n: int, d: int, dtype: torch.dtype):
    """(kcourse's triton forward, quack's or None) on fresh inputs."""
    x = torch.randn(n, d, device="cuda", dtype=dtype)
    if op == "cross_entropy_backward":
        leaf = x.requires_grad_()
        t = torch.randint(0, d, (n,), device="cuda")

        def both():
            with torch.enable_grad():
                return torch.autograd.grad(blas.cross_entropy(leaf, t, backend="triton"), leaf)[0]
        return both, None
    if op == "cross_entropy":
        t = torch.randint(0, d, (n,), device="cuda")
        ours = lambda: blas.cross_entropy(x, t, backend="triton")  # noqa: E731
        try:
            from quack.cross_entropy import cross_entropy as quack_ce
            theirs = lambda: quack_ce(x, t)  # noqa: E731
        except Exception:  # noqa: BLE001
            theirs = None
        return ours, theirs
    ours = lambda: getattr(blas, op)(x, -1, backend="triton")  # noqa: E731
    try:
        from quack.softmax import softmax as quack_softmax
        theirs = (lambda: quack_softmax(x)) if op == "softmax" else None
    except Exception:  # noqa: BLE001
        theirs = None
    return ours, theirs


def _name(value) -> str:
    return getattr(value, "__name__", None) or str(value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--ops", default="softmax,log_softmax,cross_entropy")
    args = p.parse_args()
    lines = [f"# triton row-op forward launch choices, {torch.cuda.get_device_name()}, graphed ms"]
    with torch.no_grad():
        for op in args.ops.split(","):
            module, variants = VARIANTS[op]
            names = list(variants)
            lines.append(f"## {op}: " + ", ".join(f"{k} (shipped {_name(getattr(module, k))})" for k in names))
            for dtype, d in itertools.product((torch.bfloat16, torch.float32), COLUMNS):
                n = ELEMENTS // d
                ours, theirs = call(op, n, d, dtype)
                shipped, shipped_ms = ours(), graph_ms(ours)
                rows = []
                for values in itertools.product(*variants.values()):
                    fields = dict(zip(names, values))
                    got = with_fields(module, fields, ours)
                    atol = 1e-3 * shipped.abs().max().item() if op == "cross_entropy_backward" else 1e-5
                    torch.testing.assert_close(got.float(), shipped.float(), rtol=1e-2, atol=atol)
                    rows.append((with_fields(module, fields, lambda: graph_ms(ours)), values))
                rows.sort(key=lambda r: r[0])
                head = f"{op} {str(dtype).removeprefix('torch.')} {n} x {d}: shipped {shipped_ms:.4f} ms"
                if theirs is not None:
                    head += f", quack {graph_ms(theirs):.4f} ms"
                lines.append(head)
                lines += [f"    {ms:.4f} ms  {shipped_ms / ms:.3f}x shipped  " +
                          ", ".join(f"{k}={_name(v)}" for k, v in zip(names, values)) for ms, values in rows]
                print("\n".join(lines[-1 - len(rows):]), flush=True)
    open(args.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
