"""Experiment: the triton layer_norm / rms_norm backward's launch choices (``kcourse/blas/triton/_norm.py``:
``WARPS_PER_SM``, ``BACKWARD_TILE``, ``BACKWARD_THREAD_ELEMENTS``) at the row lengths models use,
against the shipped choice and quack's backward, each timed as a CUDA-graph replay (the kernels
alone, L2 flushed before each call).

    python -m benchmarks.experiments.triton_norm_launch OUT.txt [--quick] [--long]

``--long``: rows the backward sweeps twice (D = 16384, 65536), over ``CHUNK_D``,
``LONG_ROW_STAGES`` and ``WARPS_PER_SM`` instead. Per op, dtype and (N, D) of ``ELEMENTS``
elements: the backward's milliseconds for every variant (dx, dweight and, for layer_norm, dbias,
from the same forward's statistics; each variant's results checked against the shipped one's), the
fastest, and quack's backward where it is importable (``quack.rmsnorm``'s forward + backward minus
its forward). Writes OUT.txt and prints it.
"""
import argparse
import itertools

import torch

from benchmarks.timing import graph_ms
from kcourse.blas.triton import _norm

ELEMENTS = 2**27
COLUMNS = [1024, 2048, 4096, 8192]  # rows kept on chip (the backward's ON_CHIP_BACKWARD is 8192)
VARIANTS = {  # field -> values; the product is the sweep
    "WARPS_PER_SM": [8, 16, 32],
    "BACKWARD_TILE": [4096, 8192],
    "BACKWARD_THREAD_ELEMENTS": [8, 16],
}
LONG_COLUMNS = [16384, 65536]  # --long: rows the backward sweeps twice
LONG_VARIANTS = {
    "CHUNK_D": [2048, 4096, 8192],
    "LONG_ROW_STAGES": [2, 3, 4],
    "WARPS_PER_SM": [16, 32],
}


def inputs(n: int, d: int, dtype: torch.dtype, center: bool):
    """x, weight, bias (layer_norm) and dy; the forward's statistics (mean, rstd)."""
    x = torch.randn(n, d, device="cuda", dtype=dtype)
    w = torch.randn(d, device="cuda", dtype=dtype)
    b = torch.randn(d, device="cuda", dtype=dtype) if center else None
    dy = torch.randn(n, d, device="cuda", dtype=dtype)
    _, x2, mean, rstd = _norm.norm_forward(x, w, b, 1e-5, center)
    return x2, w, dy, mean, rstd


def with_fields(fields: dict, fn):
    """``fn()`` with the module's launch constants set to ``fields``, then restored."""
    saved = {k: getattr(_norm, k) for k in fields}
    try:
        for k, v in fields.items():
            setattr(_norm, k, v)
        return fn()
    finally:
        for k, v in saved.items():
            setattr(_norm, k, v)


def quack_backward_ms(n: int, d: int, dtype: torch.dtype):
    """quack's rms_norm backward: its forward + backward minus its forward (graphed), or None."""
    try:
        from quack.rmsnorm import rmsnorm
    except Exception:  # noqa: BLE001 - not installed, or not importable here
        return None
    x = torch.randn(n, d, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(d, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(n, d, device="cuda", dtype=dtype)
    fwd = graph_ms(lambda: rmsnorm(x, w, eps=1e-6))
    both = graph_ms(lambda: torch.autograd.grad(rmsnorm(x, w, eps=1e-6), (x, w), dy))
    return both - fwd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--quick", action="store_true", help="bfloat16 only, D = 1024 and 8192 (with --long: 16384)")
    p.add_argument("--long", action="store_true", help="rows swept twice (LONG_COLUMNS), over LONG_VARIANTS")
    args = p.parse_args()
    dtypes = [torch.bfloat16] if args.quick else [torch.bfloat16, torch.float32]
    variants = LONG_VARIANTS if args.long else VARIANTS
    columns = LONG_COLUMNS if args.long else COLUMNS
    columns = columns[:1] if args.quick and args.long else [1024, 8192] if args.quick else columns
    names = list(variants)
    lines = [f"# triton norm backward launch choices, {torch.cuda.get_device_name()}, graphed ms",
             "fields: " + ", ".join(f"{k} (shipped {getattr(_norm, k)})" for k in names), ""]
    for center, dtype, d in itertools.product((False, True), dtypes, columns):
        op = "layer_norm" if center else "rms_norm"
        n = ELEMENTS // d
        x2, w, dy, mean, rstd = inputs(n, d, dtype, center)
        needs = (True, True, center)
        run = lambda: _norm.norm_backward(dy, x2, w, mean, rstd, needs)  # noqa: E731
        shipped = run()
        shipped_ms = graph_ms(run)
        rows = []
        for values in itertools.product(*variants.values()):
            fields = dict(zip(names, values))
            got = with_fields(fields, run)
            for a, e in zip(got, shipped):
                if a is not None:
                    torch.testing.assert_close(a.float(), e.float(), rtol=2e-2, atol=2e-2)
            rows.append((with_fields(fields, lambda: graph_ms(run)), values))
        rows.sort()
        quack = quack_backward_ms(n, d, dtype) if not center else None
        head = f"{op} {str(dtype).removeprefix('torch.')} {n} x {d}: shipped {shipped_ms:.4f} ms"
        if quack is not None:
            head += f", quack {quack:.4f} ms (shipped at {quack / shipped_ms:.2f}x of it)"
        lines.append(head)
        for ms, values in rows[:5]:
            lines.append(f"    {ms:.4f} ms  {shipped_ms / ms:.3f}x shipped  " +
                         ", ".join(f"{k}={v}" for k, v in zip(names, values)))
        del x2, w, dy, mean, rstd, shipped
    text = "\n".join(lines) + "\n"
    open(args.out, "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
