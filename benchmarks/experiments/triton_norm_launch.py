"""Experiment: the triton layer_norm / rms_norm backward's launch choices (``kcourse/blas/triton/_norm.py``:
``WARPS_PER_SM``, ``BACKWARD_TILE``, ``BACKWARD_THREAD_ELEMENTS``, ``SHORT_ROW_THREAD_ELEMENTS``) at the row lengths models use,
against the shipped choice and quack's backward, each timed as a CUDA-graph replay (the kernels
alone, L2 flushed before each call).

    python -m benchmarks.experiments.triton_norm_launch OUT.txt [--quick] [--long] [--forward] [--short-rows]

``--forward``: the forward's elements a thread (``FORWARD_THREAD_ELEMENTS``) instead, at D = 1024
... 16384, against Liger's and quack's forwards where importable (y and rstd checked against the
shipped choice's).

``--short-rows``: the reach of the backward's short-row rule (``SHORT_ROW``, ``SHORT_ROW_ITEMSIZE``,
``SHORT_ROW_THREAD_ELEMENTS``) beside ``WARPS_PER_SM``, at D = 1024 ... 8192. Measured (H200,
2026-11-29): the shipped rule is the fastest or within 1% at every point but bf16 131072 x 1024,
where 8 warps an SM took 0.2246 against 0.2279 ms (rms_norm; quack 0.2028) and 0.2384 against
0.2450 (layer_norm), 1.5-2.8%, left as it is; taking 32 a thread beyond 1024 columns, or for float32,
was 1-13% slower.

``--model``: the backward at a model's shapes instead, 16384 rows (a batch of 16 x 1024 tokens) of
D = 768 (GPT-2), 1024, 2048 and 4096 (Llama-like), bfloat16, over VARIANTS and
``CENTER_PREFETCH_TILE``, beside the cute backend's backward (in a GPT-2 124M step on an H200 the
triton norm backward took 1.21 ms of GPU time, cute's 0.75: ``gpt_kernels.py --by kernel``).

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

from benchmarks.experiments import triton_rows_launch
from benchmarks.timing import graph_ms
from kcourse.blas.triton import _norm

ELEMENTS = 2**27
COLUMNS = [1024, 2048, 4096, 8192]  # rows kept on chip (the backward's ON_CHIP_BACKWARD is 8192)
VARIANTS = {  # field -> values; the product is the sweep
    "WARPS_PER_SM": [8, 16, 32],
    "BACKWARD_TILE": [4096, 8192],
    "BACKWARD_THREAD_ELEMENTS": [8, 16],
    "SHORT_ROW_THREAD_ELEMENTS": [16, 32],
}
FORWARD_COLUMNS = [1024, 2048, 4096, 8192, 16384]  # --forward: rows the forward keeps on chip
FORWARD_VARIANTS = {"FORWARD_THREAD_ELEMENTS": [4, 8, 16, 32]}
SHORT_VARIANTS = {  # --short-rows: how far the backward's short-row rule reaches (columns, dtypes)
    "WARPS_PER_SM": [8, 16],
    "SHORT_ROW": [1024, 2048, 4096],
    "SHORT_ROW_ITEMSIZE": [2, 4],
    "SHORT_ROW_THREAD_ELEMENTS": [16, 32],
}
MODEL_ROWS, MODEL_COLUMNS = 16384, [768, 1024, 2048, 4096]  # --model: tokens of a batch, model widths
MODEL_VARIANTS = {**VARIANTS, "CENTER_PREFETCH_TILE": [4096, 8192]}
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
    """``fn()`` with ``_norm``'s launch constants set to ``fields``, then restored."""
    return triton_rows_launch.with_fields(_norm, fields, fn)


def header(what: str, names) -> list:
    """The report's first lines: what is swept, the device, and each field's shipped value."""
    return [f"# triton norm {what} launch choices, {torch.cuda.get_device_name()}, graphed ms",
            "fields: " + ", ".join(f"{k} (shipped {getattr(_norm, k)})" for k in names), ""]


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


def cute_backward_ms(dy, x2, w, mean, rstd, needs) -> float:
    """The cute backend's norm backward on the same operands, graphed."""
    from kcourse.blas.cute import _norm as cute_norm
    return graph_ms(lambda: cute_norm.norm_backward(dy, x2, w, mean, rstd, needs))


def peer_forward_ms(n: int, d: int, dtype: torch.dtype, center: bool) -> dict:
    """The forward's peers, graphed: Liger's and quack's kernels (torch.compile's: benchmarks/peers.py)."""
    x = torch.randn(n, d, device="cuda", dtype=dtype)
    w = torch.randn(d, device="cuda", dtype=dtype)
    b = torch.randn(d, device="cuda", dtype=dtype)
    got = {}
    try:
        if center:
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction
            got["liger"] = graph_ms(lambda: LigerLayerNormFunction.apply(x, w, b, 1e-5))
        else:
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction
            got["liger"] = graph_ms(lambda: LigerRMSNormFunction.apply(x, w, 1e-6))
    except Exception as e:  # noqa: BLE001 - not installed, or its API differs
        got["liger"] = f"{type(e).__name__}"
    try:
        if center:
            from quack.layernorm import layernorm
            got["quack"] = graph_ms(lambda: layernorm(x, w, eps=1e-5))
        else:
            from quack.rmsnorm import rmsnorm
            got["quack"] = graph_ms(lambda: rmsnorm(x, w, eps=1e-6))
    except Exception as e:  # noqa: BLE001
        got["quack"] = f"{type(e).__name__}"
    return got


def forward_sweep(dtypes, columns) -> list:
    names = list(FORWARD_VARIANTS)
    lines = header("forward", names)
    for center, dtype, d in itertools.product((True, False), dtypes, columns):
        op = "layer_norm" if center else "rms_norm"
        n = ELEMENTS // d
        x = torch.randn(n, d, device="cuda", dtype=dtype)
        w = torch.randn(d, device="cuda", dtype=dtype)
        b = torch.randn(d, device="cuda", dtype=dtype) if center else None
        run = lambda: _norm.norm_forward(x, w, b, 1e-5, center)  # noqa: E731
        shipped = run()
        shipped_ms = graph_ms(run)
        rows, seen = [], set()
        for values in itertools.product(*FORWARD_VARIANTS.values()):
            fields = dict(zip(names, values))
            plan = _norm._block(d, _norm.ON_CHIP_FORWARD, fields["FORWARD_THREAD_ELEMENTS"])
            if repr(plan) in seen:  # the same launch as a variant already timed (16 warps at most)
                continue
            seen.add(repr(plan))
            got = with_fields(fields, run)
            torch.testing.assert_close(got[0].float(), shipped[0].float(), rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(got[3], shipped[3], rtol=1e-4, atol=1e-4)
            rows.append((with_fields(fields, lambda: graph_ms(run)), values, plan))
        rows.sort(key=lambda r: r[0])
        peers = peer_forward_ms(n, d, dtype, center)
        lines.append(f"{op} {str(dtype).removeprefix('torch.')} {n} x {d}: shipped {shipped_ms:.4f} ms; " +
                     ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in peers.items()))
        for ms, values, plan in rows:
            lines.append(f"    {ms:.4f} ms  {shipped_ms / ms:.3f}x shipped  " +
                         ", ".join(f"{k}={v}" for k, v in zip(names, values)) + f"  {plan}")
        print("\n".join(lines[-1 - len(rows):]), flush=True)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--quick", action="store_true", help="bfloat16 only, D = 1024 and 8192 (with --long: 16384)")
    p.add_argument("--long", action="store_true", help="rows swept twice (LONG_COLUMNS), over LONG_VARIANTS")
    p.add_argument("--forward", action="store_true", help="the forward's choices (FORWARD_VARIANTS)")
    p.add_argument("--short-rows", action="store_true", help="the backward's short-row rule (SHORT_VARIANTS)")
    p.add_argument("--model", action="store_true", help="a model's shapes: MODEL_ROWS x MODEL_COLUMNS, bf16")
    args = p.parse_args()
    dtypes = [torch.bfloat16] if args.quick or args.model else [torch.bfloat16, torch.float32]
    if args.forward:
        text = "\n".join(forward_sweep(dtypes, [4096] if args.quick else FORWARD_COLUMNS)) + "\n"
        open(args.out, "w").write(text)
        return
    variants = LONG_VARIANTS if args.long else SHORT_VARIANTS if args.short_rows else \
        MODEL_VARIANTS if args.model else VARIANTS
    columns = LONG_COLUMNS if args.long else MODEL_COLUMNS if args.model else COLUMNS
    columns = columns[:1] if args.quick and args.long else [1024, 8192] if args.quick else columns
    names = list(variants)
    lines = header("backward", names)
    for center, dtype, d in itertools.product((False, True), dtypes, columns):
        op = "layer_norm" if center else "rms_norm"
        n = MODEL_ROWS if args.model else ELEMENTS // d
        x2, w, dy, mean, rstd = inputs(n, d, dtype, center)
        needs = (True, True, center)
        run = lambda: _norm.norm_backward(dy, x2, w, mean, rstd, needs)  # noqa: E731
        shipped = run()
        shipped_ms = graph_ms(run)
        rows, seen = [], set()
        for values in itertools.product(*variants.values()):
            fields = dict(zip(names, values))
            plan = with_fields(fields, lambda: repr((_norm._backward_options(n, d, x2.element_size(), center),
                                                     _norm.WARPS_PER_SM, _norm.LONG_ROW_STAGES, _norm.CHUNK_D)))
            if plan in seen:  # the same launch as a variant already timed
                continue
            seen.add(plan)
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
        if args.model:
            head += f", cute {cute_backward_ms(dy, x2, w, mean, rstd, needs):.4f} ms"
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
