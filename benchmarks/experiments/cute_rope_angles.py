"""Experiment: what holds the cute rope kernel below copy bandwidth (``kcourse/blas/cute/rope.py``:
146 us against triton's 133 at 2^27 bfloat16 elements on an H200). Each thread computes the cos
and sin of its pairs' angles for one row (float64 turns, a float32 cos.approx / sin.approx), where
triton's program computes them once for 16 rows. Variants, each timed as a CUDA-graph replay (the
kernel alone, L2 flushed before each call) on x of (B, H, T, D) = (32, 32, 1024, 128) contiguous and
the (B, T, H, D) layout attention's q/k have, transposed to (B, H, T, D):

- ``ROWS`` = 1 (shipped), 2, 4, 8: each angle serves that many rows;
- ``float32 angles``: the angle in float32 alone (p * turns, no float64), a bound on the float64
  work's cost (less accurate at large positions: not a candidate as it stands);
- ``no angles``: cos = 1, sin = 0 (y = x): the kernel's memory traffic alone, a lower bound.

    KCOURSE_CACHE_DIR=0 python -m benchmarks.experiments.cute_rope_angles OUT.txt

The variants swap ``rope._angles`` (a new factory object) or set the module's constants, compiled afresh (in this
process only: ``KCOURSE_CACHE_DIR=0`` keeps them off the disk cache, whose key names the module's
source, not the swapped helper). Each variant's y is checked against the reference except where
the angles are replaced.
"""
import argparse
import types

import torch

from benchmarks.timing import graph_ms
from kcourse import blas
from kcourse.blas.cute import rope

SHAPE = (32, 32, 1024, 128)


def f32_angles(mTurns, p, c, sign, vec):
    import cutlass.cute as cute
    from cutlass import Float32
    cos = cute.make_rmem_tensor(cute.make_layout((vec,)), Float32)
    sin = cute.make_rmem_tensor(cute.make_layout((vec,)), Float32)
    for j in range(vec):
        turns = Float32(p) * Float32(mTurns[c * vec + j])
        turns = turns - cute.math.floor(turns + 0.5)
        theta = turns * rope.TWO_PI
        cos[j] = cute.math.cos(theta, approx=True)
        sin[j] = sign * cute.math.sin(theta, approx=True)
    return cos.load(), sin.load()


def no_angles(mTurns, p, c, sign, vec):
    import cutlass.cute as cute
    from cutlass import Float32
    cos = cute.make_rmem_tensor(cute.make_layout((vec,)), Float32)
    sin = cute.make_rmem_tensor(cute.make_layout((vec,)), Float32)
    cos.fill(1.0)
    sin.fill(0.0)
    return cos.load(), sin.load()


def variant_factory(angles):
    """A new ``rope_kernel`` whose ``_angles`` is ``angles`` (a new function object: compiled afresh)."""
    glob = dict(rope.rope_kernel.__globals__)
    glob["_angles"] = angles
    return types.FunctionType(rope.rope_kernel.__code__, glob, f"rope_kernel_{angles.__name__}")


def timed(x, factory=None, fields=None):
    """``(y, ms)`` of the cute rope with ``rope_kernel`` replaced by ``factory`` and the module's
    constants set to ``fields`` (both restored after)."""
    fields = fields or {}
    saved = rope.rope_kernel, {k: getattr(rope, k) for k in fields}
    try:
        if factory is not None:
            rope.rope_kernel = factory
        for k, v in fields.items():
            setattr(rope, k, v)
        run = lambda: blas.rope(x, backend="cute")  # noqa: E731
        y = run()
        return y, graph_ms(run)
    finally:
        rope.rope_kernel = saved[0]
        for k, v in saved[1].items():
            setattr(rope, k, v)


VARIANTS = [  # (name, factory or None, module constants, checked against triton's y)
    ("shipped", None, None, True),
    ("ROWS=2", None, {"ROWS": 2}, True),
    ("ROWS=4", None, {"ROWS": 4}, True),
    ("ROWS=8", None, {"ROWS": 8}, True),
    ("float32 angles", variant_factory(f32_angles), None, False),
    ("no angles", variant_factory(no_angles), None, False),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    args = p.parse_args()
    lines = [f"# cute rope variants, {torch.cuda.get_device_name()}, graphed ms, (B, H, T, D) = {SHAPE}"]
    with torch.no_grad():
        for dtype in (torch.bfloat16, torch.float32):
            for layout in ("contiguous", "q layout"):
                B, H, T, D = SHAPE
                x = torch.randn(B, H, T, D, device="cuda", dtype=dtype) if layout == "contiguous" else \
                    torch.randn(B, T, H, D, device="cuda", dtype=dtype).transpose(1, 2)
                expected = blas.rope(x, backend="triton")
                triton_ms = graph_ms(lambda: blas.rope(x, backend="triton"))
                lines.append(f"{str(dtype).removeprefix('torch.')} {layout}: triton {triton_ms:.4f} ms")
                for name, factory, fields, check in VARIANTS:
                    try:
                        y, ms = timed(x, factory, fields)
                    except Exception as e:  # noqa: BLE001 - a variant that does not compile: say why
                        lines.append(f"    {name}: {type(e).__name__}: {str(e)[:200]}")
                        continue
                    err = (y.float() - expected.float()).abs().max().item()
                    lines.append(f"    {name}: {ms:.4f} ms ({triton_ms / ms:.3f}x triton), max |y - triton| {err:.3g}"
                                 + ("" if check else " (angles replaced)"))
                    if check:
                        torch.testing.assert_close(y, expected, rtol=2e-2, atol=2e-2)
                print("\n".join(lines[-1 - len(VARIANTS):]), flush=True)
    open(args.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
