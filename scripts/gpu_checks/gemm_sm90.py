"""GPU self-check of the Hopper gemm kernel (kcourse/blas/cute/_gemm_sm90.py).

    python scripts/gpu_checks/gemm_sm90.py            # from the repository root (or set KCOURSE_ROOT)
    python scripts/gpu_checks/gemm_sm90.py --quick    # skip the 8192^3 timing

On a GPU: every case runs gemm_sm90 and compares with a float32 reference
(alpha * A.float() @ B.float() + beta * C.float(), TF32 off) and prints PASS/FAIL with the largest
error and the largest error / tolerance; out is pre-filled with NaN (an element the kernel forgets
to write fails), and where out is a slice of a padded buffer (padding after both its rows and its
columns) the padding must be untouched: no store may pass M or N. TMA clips its stores along the
contiguous dim only in 16-byte chunks, so "ragged" outs (contiguous extent not a multiple of 8)
are covered on both sides (n- and m-contiguous), at sizes below, at and across subtile and tile
edges, with both tiles, with C and in place.

Then one probe, reported as INFO and not counted: are TMA *loads* exact along a ragged contiguous
K? (supports() assumes not and sends such operands to the general kernel; the probe runs the
kernel anyway on operands whose padding is NaN, and says whether the rule could be lifted.)

Then 4096^3 and 8192^3 are timed with triton.testing.do_bench (median) against torch.matmul, plus
a ragged 4096 x 4095 x 4096 (its last subtile column is stored without TMA) against the aligned
4096^3. Without a GPU: every case is compiled (compile-only), nothing runs. The last line is the
verdict: ALL PASS, or the number of failures.
"""
from __future__ import annotations

import math
import os
import sys
import traceback

for root in (os.getcwd(), os.environ.get("KCOURSE_ROOT", os.getcwd())):
    if os.path.isdir(os.path.join(root, "kcourse")) and root not in sys.path:
        sys.path.insert(0, root)

import torch

from kcourse.blas.cute import _compile
from kcourse.blas.cute._gemm_sm90 import gemm_sm90, supports

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
SENTINEL = 7.0
failures = 0


def matrix(batch, rows, cols, dtype, unit="cols", ld=None, batch0=False):
    """(batch, rows, cols) with stride 1 along `unit` ("cols" or "rows"); ld pads the other stride;
    batch0: one matrix shared by the batch (batch stride 0)."""
    b = 1 if batch0 else batch
    if unit == "cols":
        t = torch.randn(b, rows, ld or cols, device=DEV, dtype=dtype)[:, :, :cols]
    else:
        t = torch.randn(b, cols, ld or rows, device=DEV, dtype=dtype)[:, :, :rows].mT  # column-major
    return t.expand(batch, rows, cols) if batch0 else t


def padded_out(batch, m, n, dtype, unit="cols"):
    """out as a slice of a larger buffer holding SENTINEL: 8 more rows than out and a leading dim
    padded to a multiple of 8 plus 8 (so 8 to 15 more columns), so that a store past the M or the
    N edge shows up. unit "rows": out is m-contiguous (the transpose of such a slice)."""
    if unit == "cols":
        ld = -(-n // 8) * 8
        buf = torch.full((batch, m + 8, ld + 8), SENTINEL, device=DEV, dtype=dtype)
        return buf, buf[:, :m, :n]
    ld = -(-m // 8) * 8
    buf = torch.full((batch, n + 8, ld + 8), SENTINEL, device=DEV, dtype=dtype)
    return buf, buf[:, :n, :m].mT


def check(name, A, B, C, alpha, beta, out, buf=None, inplace=False, **kw):
    global failures
    if not supports(A, B, C, out):
        print(f"SKIP  {name}: not supported by the sm90 kernel (goes to the fallback)")
        return
    try:
        if not GPU:
            with _compile.compiling_only():
                gemm_sm90(A, B, C, alpha, beta, out, **kw)
            print(f"COMPILED {name}")
            return
        C_ref = None if C is None else C.float().clone()  # before an in-place call overwrites it
        if not inplace:
            out.fill_(float("nan"))
        keep = None if buf is None else buf.clone()
        gemm_sm90(A, B, C, alpha, beta, out, **kw)
        torch.cuda.synchronize()
        ref = alpha * torch.matmul(A.float(), B.float())
        if C_ref is not None:
            ref = ref + beta * C_ref
        k = A.shape[-1]
        err = (out.float() - ref).abs()
        # one rounding of the float32 result (eps * |ref|), plus float32 accumulation-order noise
        tol = EPS[A.dtype] * ref.abs() + 8 * math.sqrt(k) * 2.0**-23 * ref.abs().max() + 1e-6
        ratio = (err / tol).nan_to_num(float("inf")).max().item()
        ok = ratio <= 1.0
        note = ""
        if buf is not None:
            pad = buf != keep
            pad_view = torch.ones_like(buf, dtype=torch.bool)
            offset = out.storage_offset() - buf.storage_offset()
            pad_view.as_strided(out.shape, out.stride(), offset).fill_(False)  # now True only outside out
            if (pad & pad_view).any():
                ok, note = False, "  (wrote outside out: the padding changed)"
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: max err {err.max().item():.3g}, "
              f"max err/tol {ratio:.3g}{note}")
    except Exception as e:  # noqa: BLE001 - report and go on to the next case
        failures += 1
        print(f"FAIL  {name}: {type(e).__name__}: {e}")
        traceback.print_exc(limit=3)


def cases():
    for dt in (torch.bfloat16, torch.float16):
        d = str(dt).replace("torch.", "")
        # the brief's shapes; padded leading dims where n is not a multiple of 8
        for m, n, k in [(128, 128, 64), (1000, 1003, 1000), (257, 129, 72), (4096, 4096, 4096)]:
            buf, out = padded_out(1, m, n, dt)
            A = matrix(1, m, k, dt, ld=-(-k // 8) * 8)
            B = matrix(1, k, n, dt, unit="rows", ld=-(-k // 8) * 8)  # k-contiguous: its ld is k's
            check(f"{d} {m}x{n}x{k} A k-contig, B k-contig, out padded", A, B, None, 1.0, 0.0, out, buf)
        # ragged outs (contiguous extent not a multiple of 8; the TMA store would write past it):
        # below one subtile (1, 3, 7), just past one (33), past a 128 tile (129), 8 * odd (264,
        # not ragged: the 16-byte edge is exact), large (1003, 4095)
        for m, n, k in [(64, 1, 64), (200, 3, 64), (130, 7, 72), (96, 33, 64), (257, 129, 72),
                        (300, 264, 64), (1000, 1003, 520), (256, 4095, 128)]:
            for uo in ("cols", "rows"):  # n-contiguous out ragged in N, m-contiguous out in M
                mm, nn = (m, n) if uo == "cols" else (n, m)
                buf, out = padded_out(1, mm, nn, dt, uo)
                A, B = matrix(1, mm, k, dt), matrix(1, k, nn, dt, ld=-(-nn // 8) * 8)
                check(f"{d} ragged {mm}x{nn}x{k} out unit {uo}", A, B, None, 1.0, 0.0, out, buf)
        for tile in ((128, 256), (128, 128)):  # every subtile position of both tiles
            buf, out = padded_out(2, 300, 1003, dt)
            check(f"{d} ragged batch 2 300x1003x64 tile {tile}", matrix(2, 300, 64, dt),
                  matrix(2, 64, 1003, dt, unit="rows"), None, 1.0, 0.0, out, buf, tile=tile)
        for uo in ("cols", "rows"):  # C read and out written through the direct path, and in place
            buf, out = padded_out(2, 257, 1003, dt, uo)
            A, B = matrix(2, 257, 136, dt), matrix(2, 136, 1003, dt, unit="rows")
            check(f"{d} ragged 257x1003x136 with C (bias), out unit {uo}", A, B,
                  torch.randn(1003, device=DEV, dtype=dt).expand(2, 257, 1003), 0.5, 1.0, out, buf)
            out.copy_(torch.randn(2, 257, 1003, device=DEV, dtype=dt))
            check(f"{d} ragged 257x1003x136 in-place out is C, out unit {uo}", A, B, out, 1.0, -0.5, out,
                  buf, inplace=True)
        # every orientation of A, B and out, with tails in m, n and k
        m, n, k = 264, 200, 136
        for ua in ("cols", "rows"):
            for ub in ("cols", "rows"):
                for uo in ("cols", "rows"):
                    A, B = matrix(2, m, k, dt, ua), matrix(2, k, n, dt, ub)
                    buf, out = padded_out(2, m, n, dt, uo)
                    check(f"{d} batch 2 {m}x{n}x{k} A unit {ua}, B unit {ub}, out unit {uo}",
                          A, B, None, 1.0, 0.0, out, buf)
        # small and odd sizes
        for m, n, k in [(1, 8, 8), (7, 16, 64), (8, 8, 1), (300, 8, 520), (129, 264, 65)]:
            buf, out = padded_out(1, m, n, dt)
            A = matrix(1, m, k, dt, unit="rows" if k % 8 else "cols", ld=-(-m // 8) * 8 if k % 8 else None)
            check(f"{d} {m}x{n}x{k}", A, matrix(1, k, n, dt), None, 1.0, 0.0, out, buf)
        # alpha, beta and C
        b, m, n, k = 3, 384, 320, 256
        A, B = matrix(b, m, k, dt), matrix(b, k, n, dt)
        new = lambda: torch.empty(b, m, n, device=DEV, dtype=dt)  # noqa: E731
        for beta in (1.0, 0.5):
            check(f"{d} batch 3 alpha 0.75 beta {beta} with C", A, B, matrix(b, m, n, dt), 0.75, beta, new())
        check(f"{d} batch 3 alpha 2 beta 0 (C None)", A, B, None, 2.0, 0.0, new())
        bias = torch.randn(n, device=DEV, dtype=dt).expand(b, m, n)  # strides (0, 0, 1)
        check(f"{d} batch 3 C = bias row broadcast", A, B, bias, 1.0, 1.0, new())
        col = torch.randn(m, 1, device=DEV, dtype=dt).expand(b, m, n)  # strides (0, 1, 0)
        check(f"{d} batch 3 C = column broadcast", A, B, col, 1.0, 1.0, new())
        check(f"{d} batch 3 C m-contiguous", A, B, matrix(b, m, n, dt, unit="rows"), 1.0, -1.0, new())
        C = matrix(b, 1000, 1000, dt)
        A2, B2 = matrix(b, 1000, 520, dt), matrix(b, 520, 1000, dt)
        check(f"{d} batch 3 in-place out is C, 1000x1000x520", A2, B2, C, 1.0, 1.0, C, inplace=True)
        # stride-0 batches: one A (or B) for the whole batch
        check(f"{d} batch 3 A shared (batch stride 0)", matrix(b, m, k, dt, batch0=True), B, None, 1.0, 0.0,
              torch.empty(b, m, n, device=DEV, dtype=dt))
        check(f"{d} batch 3 B shared, k-contiguous", A, matrix(b, k, n, dt, unit="rows", batch0=True), None,
              1.0, 0.0, torch.empty(b, m, n, device=DEV, dtype=dt))
        # both tiles on one shape
        for tile in ((128, 256), (128, 128)):
            buf, out = padded_out(1, 1000, 1000, dt)
            check(f"{d} 1000^3 tile {tile}", matrix(1, 1000, 1000, dt), matrix(1, 1000, 1000, dt), None,
                  1.0, 0.0, out, buf, tile=tile)


def probe_ragged_k():
    """INFO only: does a TMA load of a k-contiguous operand whose K is not a multiple of 8 bring
    in zeros past K (then supports() could take such operands) or the padding (its NaN)?"""
    import kcourse.blas.cute._gemm_sm90 as sm90

    m, n, k, ld = 256, 256, 65, 72
    for dt in (torch.bfloat16, torch.float16):
        bufA = torch.full((1, m, ld), float("nan"), device=DEV, dtype=dt)
        bufB = torch.full((1, n, ld), float("nan"), device=DEV, dtype=dt)
        bufA[:, :, :k] = torch.randn(1, m, k, device=DEV, dtype=dt)
        bufB[:, :, :k] = torch.randn(1, n, k, device=DEV, dtype=dt)
        A, B = bufA[:, :, :k], bufB[:, :, :k].mT  # both k-contiguous, K = 65 ragged
        out = torch.empty(1, m, n, device=DEV, dtype=dt)
        rule = sm90._tma_matrix
        sm90._tma_matrix = lambda t, k_dim=None: rule(t)  # without the K % 8 rule
        try:
            gemm_sm90(A, B, None, 1.0, 0.0, out)
            torch.cuda.synchronize()
        finally:
            sm90._tma_matrix = rule
        ref = torch.matmul(A.float(), B.float())
        err = (out.float() - ref).abs().max().item()
        tol = EPS[dt] * ref.abs().max().item() + 1e-3
        verdict = ("exact: zeros past K (the K % 8 rule in supports() could be lifted)"
                   if err <= tol else "NOT exact: the padding reached the product (keep the K % 8 rule)")
        print(f"INFO  {str(dt)[6:]} TMA loads along a ragged K ({k} of {ld}, NaN padding): max err {err:.3g}: "
              f"{verdict}")


def bench(quick):
    import triton.testing

    print("\ntiming (median of triton.testing.do_bench), torch.matmul = cuBLAS")
    for dt in (torch.bfloat16, torch.float16):
        for s in (4096,) if quick else (4096, 8192):
            A = torch.randn(s, s, device=DEV, dtype=dt)
            B = torch.randn(s, s, device=DEV, dtype=dt)
            out = torch.empty(s, s, device=DEV, dtype=dt)
            t_ref = triton.testing.do_bench(lambda: torch.matmul(A, B, out=out), return_mode="median")
            flops = 2 * s**3
            line = (f"{str(dt)[6:]:8s} {s}^3  torch.matmul {t_ref * 1e3:8.1f} us "
                    f"({flops / t_ref / 1e9:6.1f} TFLOP/s)")
            for tile in (None, (128, 256), (128, 128)):
                try:
                    fn = lambda: gemm_sm90(A[None], B[None], None, 1.0, 0.0, out[None], tile=tile)
                    fn()
                    t = triton.testing.do_bench(fn, return_mode="median")
                    line += f" | sm90 {tile or 'auto'} {t * 1e3:8.1f} us = {t_ref / t:.3f} of torch"
                except Exception as e:  # noqa: BLE001
                    line += f" | sm90 {tile}: {type(e).__name__}: {e}"
            print(line, flush=True)
        # a ragged out: a column slice N = 4095 of a 4104-wide buffer; its last subtile column is
        # stored by the threads (no TMA): compare with the aligned product
        s = 4096
        A = torch.randn(1, s, s, device=DEV, dtype=dt)
        B = torch.randn(1, s, s + 8, device=DEV, dtype=dt)[:, :, :s - 1]  # ld 4104: TMA-able
        out = torch.empty(1, s, s + 8, device=DEV, dtype=dt)[:, :, :s - 1]
        B_full, out_full = torch.randn(1, s, s, device=DEV, dtype=dt), torch.empty(1, s, s, device=DEV, dtype=dt)
        t_full = triton.testing.do_bench(lambda: gemm_sm90(A, B_full, None, 1.0, 0.0, out_full),
                                         return_mode="median")
        t_rag = triton.testing.do_bench(lambda: gemm_sm90(A, B, None, 1.0, 0.0, out), return_mode="median")
        print(f"{str(dt)[6:]:8s} ragged 4096x4095x4096 (out a column slice): sm90 {t_rag * 1e3:8.1f} us "
              f"vs {t_full * 1e3:8.1f} us aligned 4096^3 = {t_full / t_rag:.3f} of aligned", flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference must be a true float32 product
    name = torch.cuda.get_device_name() if GPU else "none (compile-only)"
    print(f"device: {name}, target {_compile.target()}")
    cases()
    if GPU:
        try:
            probe_ragged_k()
        except Exception as e:  # noqa: BLE001 - a probe, not a case: report and go on
            print(f"INFO  the ragged-K probe failed: {type(e).__name__}: {e}")
        bench("--quick" in sys.argv)
    print("ALL PASS" if failures == 0 else f"{failures} FAILURES")
