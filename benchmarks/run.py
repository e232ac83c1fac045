"""Benchmark every kcourse.blas op on every backend against ceilings measured in the same run.

    python -m benchmarks.run --out /tmp/bench                                      # full sweep, CUDA
    python -m benchmarks.run --out /tmp/b --ops gemm,dot --backends pytorch,triton --quick
    python -m benchmarks.run --out /tmp/b --ops softmax,attention --quick          # transformer primitives
    python -m benchmarks.run --out /tmp/b --device cpu --quick                      # smoke test, no GPU
    python -m benchmarks.history add /tmp/bench/results.json                       # into the history

Method
------
* Inputs are random (``torch.randn``), never zeros, and one set of inputs per (op, dtype, size) is
  shared by every backend.
* Before timing, each point runs once and its result is checked; a fast wrong kernel is reported as
  WRONG, not as fast. That first call also pays any JIT compile or autotuning (``first_call_s``;
  the configs the triton autotuner picked in it are recorded as ``autotuned``),
  so it is not in the timing.
  - BLAS ops: compared with plain PyTorch computed in float32 (``torch.dot``, ``torch.mv``,
    ``torch.addr``, ``torch.matmul``; written here, independent of the code under test) with
    ``torch.testing.assert_close`` at a tolerance per dtype, scaled by the square root of the
    reduction length.
  - Transformer primitives (softmax, log_softmax, layer_norm, rms_norm, cross_entropy, attention):
    compared, as FlashAttention's tests do, with the same ``torch.nn.functional`` op computed in
    float32 on the same inputs: the largest error may be at most twice the largest error of torch's
    own op in the run's dtype, plus ``tol * max |expected|`` (room for a different summation order
    in float32, where torch's own error is 0, and for a different rounding: Triton's CPU interpreter
    truncates to bfloat16). An element-wise tolerance does not fit bfloat16 attention gradients: their error
    comes from rounding P, dS and the output, not from the element's size.
    The forward point checks the output, the backward point every input gradient.
* Time: ``triton.testing.do_bench(fn, warmup, rep, return_mode="median")``: CUDA events around each
  call, the L2 cache flushed before each call, the median over the repetitions. Out-of-place ops
  are timed as users call them, so the time includes allocating the output, which after the first
  call is a lookup in PyTorch's caching allocator (no cudaMalloc). swap is timed in place
  (``swap_``). ``--device cpu`` uses a ``time.perf_counter`` median instead (a smoke test of this
  script, not a benchmark). ``--rounds R``: after the first round (the check and one timing per
  point), each point's call is timed R - 1 more times, interleaved with its reference's, and the
  fastest median is kept for each (the GPU's clocks drift: SDPA's own time moved up to 9% between two
  runs of one process on an H100, so a fraction of 1.00 is decided only this way).
* Forward and backward (transformer primitives): timed as in training. The differentiable inputs
  require grad, so a forward call records the graph and saves what its backward needs. The
  backward is ``torch.autograd.grad(out, inputs, grad_out, retain_graph=True)`` on a graph built
  once before timing, so the timed call runs the backward only. ``grad_out`` is random (1 for the
  scalar cross-entropy loss). ``fwd+bwd`` (``benchmarks/peers.py``) is one call of the forward
  then ``torch.autograd.grad(out, inputs, grad_out)``, checked on the output and every gradient,
  its traffic the sum of both directions'.
* Ceilings and references, measured in the same run: (1) memory bandwidth: ``dst.copy_(src)`` on
  2^28 float32 (1 GiB each way), bytes read + written; (2) ``torch.matmul`` at every gemm point's
  shape and dtype; (3) ``F.scaled_dot_product_attention`` ("F.sdpa") at every attention point, in
  both directions; (4) torch eager (``F.softmax``, ``F.log_softmax``, ``F.layer_norm``,
  ``F.rms_norm``, ``F.cross_entropy``) at every point of the memory-bound primitives, in both
  directions: not a ceiling, a time to beat (``eager_ms``, ``speedup_vs_eager``).
* Metrics: median ms; for memory-bound ops GB/s of the minimal traffic and its fraction of the copy
  bandwidth; for gemm and attention TFLOP/s and its fraction of torch.matmul's or F.sdpa's. With s
  the element size: copy 2ns, swap 4ns, scal 2ns, axpby 3ns, dot 2ns, gemv (mn+n+m)s,
  geru (2mn+m+n)s, gemm 2mnk FLOP. Row-wise primitives on N rows of D (cross_entropy: V) columns,
  (N, D) tensors only: the (D,) weights, (N,) statistics and targets are under 1% and left out:
      softmax        fwd 2NDs (read x, write y)     bwd 3NDs (read y, dy; write dx)
      log_softmax    fwd 2NDs (read x, write y)     bwd 3NDs (read y, dy; write dx)
      layer_norm     fwd 2NDs (read x, write y)     bwd 3NDs (read x, dy; write dx)
      rms_norm       fwd 2NDs (read x, write y)     bwd 3NDs (read x, dy; write dx)
      cross_entropy  fwd NVs  (read the logits)     bwd 2NVs (read logits; write dlogits)
  attention (B, H, T, D): forward 4BHT^2D FLOP (QK^T and PV), half of it when causal; backward 2.5x
  the forward (FlashAttention-2's convention: five T x T x D matmuls instead of two; recomputing
  S is not counted).
* Targets: memory-bound ops a fraction of copy bandwidth (``TARGETS``, raised for a backend by
  ``BACKEND_TARGETS``); the memory-bound primitives
  also ``speedup_vs_eager >= 1`` (both must hold); gemm and attention a fraction of their ceiling.
* Attention: head dim 128, 16 heads, B*T = 16384 tokens (B = 16 at T = 1024 ... 1 at T = 16384),
  bfloat16. Peak memory at T = 8192: ``torch.cuda.max_memory_allocated()`` over one forward +
  backward (after a warm-up one), minus what was allocated before (q, k, v and grad_out), for
  every backend and F.sdpa.
* The ``python`` backend is the elementwise reference: it runs only at small sizes
  (``PYTHON_MAX``), and runs the transformer primitives only in the CPU smoke test.

Output in ``--out``: ``results.json`` (metadata, every point, attention's peak memory),
``<op>.png``, ``summary.md`` (the target points, also printed at the end). ``summarize.py``
regenerates the last two from the JSON.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

import kcourse
from benchmarks import timing
from benchmarks.common import git
from benchmarks.summarize import plot_all, shape_text, summary_markdown
from kcourse import blas

# ----------------------------------------------------------------------------- configuration

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
ALPHA, BETA = 1.5, -0.5
LAYER_NORM_EPS, RMS_NORM_EPS = 1e-5, 1e-6

ROWWISE = ("softmax", "log_softmax", "layer_norm", "rms_norm", "cross_entropy")  # memory-bound, one row at a time
ROWS, ROW_TARGET = 32768, (32768, 8192)  # (rows, columns) of the row-wise primitives' input
HEAD_DIM, HEADS, TOKENS = 128, 16, 16384  # attention: B = TOKENS // T sequences of HEADS heads


def attention_sizes(lengths, tokens=TOKENS, heads=HEADS) -> list[tuple]:
    """(B, H, T, causal) for each T, not causal then causal. B*T is the same at every T: every point
    moves as many q, k, v bytes and its work grows as T."""
    return [(tokens // t, heads, t, causal) for t in lengths for causal in (False, True)]


# (op, dtype, sizes, target sizes) per mode. Level 1: n elements; level 2 and gemm: square side;
# row-wise primitives: (rows, columns); attention: (B, H, T, causal).
P2 = [1 << e for e in range(16, 29)]  # 2^16 ... 2^28
SWEEPS = {
    "full": [
        *[(op, F32, P2, [1 << 28]) for op in ("copy", "swap", "scal", "axpby", "dot")],
        *[(op, BF16, P2, [1 << 28] if op == "dot" else []) for op in ("copy", "axpby", "dot")],
        *[(op, F32, [1024, 2048, 4096, 8192, 16384], [16384]) for op in ("gemv", "geru")],
        *[("gemm", dt, [512, 1024, 2048, 4096, 8192], [4096, 8192]) for dt in (BF16, F16)],
        ("gemm", F32, [1024, 2048, 4096], []),
        *[(op, dt, [(ROWS, d) for d in (1024, 4096, 8192, 16384)], [ROW_TARGET])
          for op in ROWWISE for dt in (BF16, F32)],
        ("attention", BF16, attention_sizes([1024, 2048, 4096, 8192, 16384]), attention_sizes([2048, 8192])),
    ],
    "quick": [  # every target point, plus one small size per BLAS op
        *[(op, F32, [1 << 20, 1 << 28], [1 << 28]) for op in ("copy", "swap", "scal", "axpby", "dot")],
        *[(op, F32, [1024, 16384], [16384]) for op in ("gemv", "geru")],
        *[("gemm", dt, [1024, 4096, 8192], [4096, 8192]) for dt in (BF16, F16)],
        ("gemm", F32, [1024], []),
        *[(op, dt, [ROW_TARGET], [ROW_TARGET]) for op in ROWWISE for dt in (BF16, F32)],
        ("attention", BF16, attention_sizes([2048, 8192]), attention_sizes([2048, 8192])),
    ],
    "cpu": [  # tiny sizes: proves the code paths on a machine without a GPU
        *[(op, F32, [1 << 10, 1 << 14], [1 << 14]) for op in ("copy", "swap", "scal", "axpby", "dot")],
        *[(op, BF16, [1 << 10, 1 << 14], []) for op in ("copy", "axpby", "dot")],
        *[(op, F32, [32, 128], [128]) for op in ("gemv", "geru")],
        *[("gemm", dt, [32, 64], [64]) for dt in (BF16, F16, F32)],
        *[(op, dt, [(64, 128), (64, 512)], [(64, 512)]) for op in ROWWISE for dt in (BF16, F32)],
        ("attention", BF16, attention_sizes([64, 128], tokens=128, heads=2),
         attention_sizes([128], tokens=128, heads=2)),
    ],
}

# Attention's peak memory is measured at these sizes (one forward + backward each).
MEMORY_SIZES = {"cuda": attention_sizes([8192]), "cpu": attention_sizes([128], tokens=128, heads=2)}

# A point meets its target when it reaches this fraction of its ceiling (copy_ GB/s, torch.matmul
# or F.sdpa) and, for the memory-bound primitives, is also not slower than torch eager.
TARGETS = {"copy": 0.90, "swap": 0.90, "scal": 0.90, "axpby": 0.90, "dot": 0.85,
           "gemv": 0.85, "geru": 0.85, "gemm": 0.90,
           "softmax": 0.85, "log_softmax": 0.85, "layer_norm": 0.85, "rms_norm": 0.85, "cross_entropy": 0.85,
           "attention": 0.90}
BACKEND_TARGETS = {"cute": {"gemm": 0.95, "attention": 1.0}}  # where a backend's target is higher
EAGER_TARGET = 1.0  # the least speedup over torch eager

# The python backend (elementwise reference) runs on CUDA only up to these sizes: it is a
# correctness oracle, and a python gemm at 8192^3 would take seconds per call. An op's own
# ``python_max`` overrides its level's (0: not on CUDA at all).
PYTHON_MAX = {1: 1 << 24, 2: 4096, 3: 1024}
X_LABELS = {1: "n (elements)", 2: "n (square side)", 3: "n (square side)"}  # the plots' x axis, per level

# do_bench warmup / rep in ms (CUDA); the CPU timer runs a handful of calls.
TIMING = {"full": (25, 100), "quick": (10, 40)}

# Check tolerance per dtype. BLAS: rtol = tol, atol = tol * sqrt(reduction length). Transformer
# primitives: max error <= 2 * torch's own max error + tol * max |expected|.
TOL = {F32: 1e-4, F16: 1e-2, BF16: 2e-2}
EXACT = {"copy", "swap"}  # pure data movement: must be bit-exact

COPY_CEILING_ELEMENTS = {"cuda": 1 << 28, "cpu": 1 << 22}

# ----------------------------------------------------------------------------- the ops


@dataclass(frozen=True)
class Op:
    """How to benchmark one op: make inputs, run it on a backend, know the right answer and the work.

    ``n`` is the op's size as the sweep lists it; ``inputs`` the tuple ``make`` returns, the call's
    arguments in order. BLAS ops are checked against ``expect``; the transformer primitives have no
    ``expect`` and are checked against their ``reference`` run in float32."""
    name: str
    level: int
    make: Callable  # (n, dtype, device) -> tuple of random inputs
    run: Callable  # (inputs, backend) -> result: the timed call
    expect: Callable | None  # inputs -> the answer in plain PyTorch (float32 math); None: see reference
    shape: Callable  # n -> problem shape
    bytes: Callable | None = None  # (n, element size) -> minimal bytes moved
    flops: Callable | None = None  # n -> floating-point operations
    reduction: Callable = lambda n: 1  # n -> reduction length (scales the check's atol)
    reference: Callable | None = None  # inputs -> torch's own op, timed beside the backends: the
    #                                    ceiling of a compute-bound op, the eager time to beat otherwise
    reference_name: str = ""
    grads: tuple = ()  # positions of the inputs that get a gradient; non-empty: the backward is timed too
    bwd_bytes: Callable | None = None  # (n, element size) -> minimal bytes the backward moves
    bwd_flops: Callable | None = None  # n -> floating-point operations of the backward
    size: Callable = lambda n: n  # n -> the number on the plots' x axis
    tags: Callable = lambda n: {}  # n -> extra fields of each point (attention: causal)
    python_max: int | None = None  # largest size(n) the python backend runs at on CUDA; None: PYTHON_MAX[level]
    x_label: str | None = None  # the plots' x axis; None: X_LABELS[level]

    @property
    def directions(self) -> tuple[str, ...]:
        return ("fwd", "bwd") if self.grads else ("fwd",)

    @property
    def eager(self) -> bool:
        """True when the reference is torch eager, a time to beat, rather than the ceiling."""
        return self.reference is not None and self.flops is None


def randn(*shape, dtype, device):
    return torch.randn(*shape, dtype=dtype, device=device)


def vectors(count):
    return lambda n, dt, dev: tuple(randn(n, dtype=dt, device=dev) for _ in range(count))


def vector_shape(n):
    return [n]


def square(n):
    return [n, n]


def leaf(*shape, dtype, device):
    """A random input that collects a gradient."""
    return randn(*shape, dtype=dtype, device=device).requires_grad_()


def rows_and_params(count):
    """x (rows, columns) and ``count`` per-column parameters (weight, bias), all differentiable."""
    def make(n, dtype, device):
        rows, cols = n
        return leaf(rows, cols, dtype=dtype, device=device), *(leaf(cols, dtype=dtype, device=device)
                                                               for _ in range(count))
    return make


def logits_and_target(n, dtype, device):
    rows, classes = n
    return leaf(rows, classes, dtype=dtype, device=device), torch.randint(0, classes, (rows,), device=device)


def qkv(n, dtype, device):
    """(q, k, v, causal): the arguments of ``attention``, q, k, v of shape (B, H, T, HEAD_DIM)."""
    B, H, T, causal = n
    return (*(leaf(B, H, T, HEAD_DIM, dtype=dtype, device=device) for _ in range(3)), causal)


def row_traffic(passes):
    """Bytes of ``passes`` full passes over an (N, D) tensor of element size s: N * D * s each."""
    return lambda n, s: passes * n[0] * n[1] * s


def attention_flops(n):
    """4 B H T^2 D: two T x T x D matmuls per head (QK^T, PV); causal skips half of them."""
    B, H, T, causal = n
    flops = 4 * B * H * T * T * HEAD_DIM
    return flops // 2 if causal else flops


# What the row-wise primitives share: n = (rows, columns), plotted against the columns; checked
# against their reference (no expect); the python reference runs them only on the CPU.
ROW_OP = dict(shape=list, size=lambda n: n[1], python_max=0, expect=None,
              x_label=f"row length (columns; {ROWS} rows on CUDA)")

OPS = {op.name: op for op in [
    Op("copy", 1, make=vectors(1), shape=vector_shape,
       run=lambda t, b: blas.copy(t[0], backend=b),
       expect=lambda t: t[0].clone(),
       bytes=lambda n, s: 2 * n * s),
    Op("swap", 1, make=vectors(2), shape=vector_shape,
       run=lambda t, b: blas.swap_(t[0], t[1], backend=b),  # in place
       expect=lambda t: (t[1].clone(), t[0].clone()),
       bytes=lambda n, s: 4 * n * s),
    Op("scal", 1, make=vectors(1), shape=vector_shape,
       run=lambda t, b: blas.scal(t[0], ALPHA, backend=b),
       expect=lambda t: (ALPHA * t[0].float()).to(t[0].dtype),
       bytes=lambda n, s: 2 * n * s),
    Op("axpby", 1, make=vectors(2), shape=vector_shape,
       run=lambda t, b: blas.axpby(t[0], t[1], ALPHA, BETA, backend=b),
       expect=lambda t: (ALPHA * t[0].float() + BETA * t[1].float()).to(t[0].dtype),
       bytes=lambda n, s: 3 * n * s),
    Op("dot", 1, make=vectors(2), shape=vector_shape,
       run=lambda t, b: blas.dot(t[0], t[1], backend=b),
       expect=lambda t: torch.dot(t[0].float(), t[1].float()),
       bytes=lambda n, s: 2 * n * s, reduction=lambda n: n),
    Op("gemv", 2, make=lambda n, dt, dev: (randn(n, n, dtype=dt, device=dev), randn(n, dtype=dt, device=dev)),
       shape=square,
       run=lambda t, b: blas.gemv(t[0], t[1], backend=b),  # beta = 0: y is not read
       expect=lambda t: torch.mv(t[0].float(), t[1].float()).to(t[0].dtype),
       bytes=lambda n, s: (n * n + 2 * n) * s, reduction=lambda n: n),
    Op("geru", 2, make=lambda n, dt, dev: (randn(n, n, dtype=dt, device=dev), *vectors(2)(n, dt, dev)),
       shape=square,
       run=lambda t, b: blas.geru(t[0], t[1], t[2], ALPHA, backend=b),
       expect=lambda t: torch.addr(t[0].float(), t[1].float(), t[2].float(), alpha=ALPHA).to(t[0].dtype),
       bytes=lambda n, s: (2 * n * n + 2 * n) * s),
    Op("gemm", 3, make=lambda n, dt, dev: (randn(n, n, dtype=dt, device=dev), randn(n, n, dtype=dt, device=dev)),
       shape=lambda n: [n, n, n],
       run=lambda t, b: blas.gemm(t[0], t[1], backend=b),
       expect=lambda t: torch.matmul(t[0].float(), t[1].float()),
       reference=lambda t: torch.matmul(t[0], t[1]), reference_name="torch.matmul",
       flops=lambda n: 2 * n ** 3, reduction=lambda n: n),
    # Row-wise primitives: n = (N, D). Minimal traffic counts the (N, D) tensors only (module docstring).
    Op("softmax", 2, make=rows_and_params(0), **ROW_OP,
       run=lambda t, b: blas.softmax(t[0], backend=b),
       reference=lambda t: F.softmax(t[0], dim=-1), reference_name="F.softmax", grads=(0,),
       bytes=row_traffic(2),  # read x, write y
       bwd_bytes=row_traffic(3)),  # read y and dy, write dx
    Op("log_softmax", 2, make=rows_and_params(0), **ROW_OP,
       run=lambda t, b: blas.log_softmax(t[0], backend=b),
       reference=lambda t: F.log_softmax(t[0], dim=-1), reference_name="F.log_softmax", grads=(0,),
       bytes=row_traffic(2),  # read x, write y
       bwd_bytes=row_traffic(3)),  # read y and dy, write dx
    Op("layer_norm", 2, make=rows_and_params(2), **ROW_OP,  # (x, weight, bias)
       run=lambda t, b: blas.layer_norm(*t, eps=LAYER_NORM_EPS, backend=b),
       reference=lambda t: F.layer_norm(t[0], t[0].shape[-1:], t[1], t[2], eps=LAYER_NORM_EPS),
       reference_name="F.layer_norm", grads=(0, 1, 2),
       bytes=row_traffic(2),  # read x, write y (weight, bias, the saved mean and rstd: left out)
       bwd_bytes=row_traffic(3)),  # read x and dy, write dx (dweight, dbias: left out)
    Op("rms_norm", 2, make=rows_and_params(1), **ROW_OP,  # (x, weight)
       run=lambda t, b: blas.rms_norm(*t, eps=RMS_NORM_EPS, backend=b),
       reference=lambda t: F.rms_norm(t[0], t[0].shape[-1:], t[1], eps=RMS_NORM_EPS),
       reference_name="F.rms_norm", grads=(0, 1),
       bytes=row_traffic(2),  # read x, write y
       bwd_bytes=row_traffic(3)),  # read x and dy, write dx (dweight: left out)
    Op("cross_entropy", 2, make=logits_and_target, **ROW_OP,  # (logits (N, V), target (N,)), mean
       run=lambda t, b: blas.cross_entropy(t[0], t[1], backend=b),
       reference=lambda t: F.cross_entropy(t[0], t[1]), reference_name="F.cross_entropy", grads=(0,),
       bytes=row_traffic(1),  # read the logits (the targets and the scalar loss: left out)
       bwd_bytes=row_traffic(2)),  # read the logits, write dlogits
    # Attention: n = (B, H, T, causal), q, k, v (B, H, T, HEAD_DIM). Compute-bound: F.sdpa is the ceiling.
    Op("attention", 3, make=qkv, shape=lambda n: [*n[:3], HEAD_DIM], size=lambda n: n[2],
       tags=lambda n: {"causal": n[3]}, python_max=0, expect=None,
       x_label=f"T (sequence length; B*T = {TOKENS} tokens, {HEADS} heads, head dim {HEAD_DIM} on CUDA)",
       run=lambda t, b: blas.attention(*t, backend=b),
       reference=lambda t: F.scaled_dot_product_attention(t[0], t[1], t[2], is_causal=t[3]),
       reference_name="F.sdpa", grads=(0, 1, 2),
       flops=attention_flops,
       bwd_flops=lambda n: 5 * attention_flops(n) // 2),  # FlashAttention-2's convention: 2.5x the forward
]}

# ----------------------------------------------------------------------------- timing


def cuda_timer(warmup: int, rep: int) -> Callable[[Callable], float]:
    return timing.timer("cuda", warmup, rep)


cpu_timer = timing.cpu_ms


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def free(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- one case


@dataclass
class Case:
    """One (op, dtype, size): the inputs every backend shares and, for an op checked against torch
    (no ``expect``), the float32 answers and torch's own error, per direction."""
    op: Op
    dtype: torch.dtype
    n: object  # the size as the sweep lists it
    target: bool
    device: str
    inputs: tuple = ()
    grad_out: torch.Tensor | None = None  # what the backward is fed
    want: dict = field(default_factory=dict)  # direction -> the float32 answer, a tuple of tensors
    torch_error: dict = field(default_factory=dict)  # direction -> torch's largest error per result


def as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def float32_copy(x):
    """A float32 leaf copy of a floating-point tensor (wanting a gradient if ``x`` does); others as they are."""
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().float().requires_grad_(x.requires_grad)
    return x


def max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.detach().float() - want).abs().max().item()


def timed_call(case: Case, call: Callable, direction: str) -> Callable:
    """What the timer calls. fwd: the op on the case's inputs. bwd: the backward alone, on a graph
    that the forward builds here, once. fwd+bwd: the forward then its backward, in one call that
    returns the output and the input gradients."""
    if direction == "fwd":
        return lambda: call(case.inputs)
    wrt = [case.inputs[i] for i in case.op.grads]
    if direction == "fwd+bwd":
        def step():
            out = call(case.inputs)
            return (out, *torch.autograd.grad(out, wrt, case.grad_out))
        return step
    out = call(case.inputs)
    return lambda: torch.autograd.grad(out, wrt, case.grad_out, retain_graph=True)


def prepare(case: Case) -> None:
    """Make the inputs. For an op checked against torch: the answers in float32 (forward and input
    gradients), the gradient fed to the backward, and how far torch's own op in the case's dtype
    is from those answers."""
    op = case.op
    case.inputs = op.make(case.n, case.dtype, case.device)
    if op.expect is not None:  # BLAS: the answer is computed before each check (swap_ changes its inputs)
        return
    exact = tuple(float32_copy(x) for x in case.inputs)
    out = op.reference(exact)
    case.grad_out = torch.randn_like(out, dtype=case.dtype) if out.dim() else torch.ones_like(out, dtype=case.dtype)
    case.want["fwd"] = (out.detach(),)
    if op.grads:
        case.want["bwd"] = torch.autograd.grad(out, [exact[i] for i in op.grads], case.grad_out.float())
    del exact, out
    for direction, want in case.want.items():
        got = timed_call(case, op.reference, direction)()
        case.torch_error[direction] = [max_error(g, w) for g, w in zip(as_tuple(got), want, strict=True)]
    if op.grads:  # one call of both: the output, then every input gradient
        case.want["fwd+bwd"] = case.want["fwd"] + case.want["bwd"]
        case.torch_error["fwd+bwd"] = case.torch_error["fwd"] + case.torch_error["bwd"]


# ----------------------------------------------------------------------------- one point


def check(case: Case, direction: str, got, want) -> tuple[bool, str]:
    """Compare a result with the float32 answer; (passed, message)."""
    got, want = as_tuple(got), as_tuple(want)
    tol = 0.0 if case.op.name in EXACT else TOL[case.dtype]
    if case.op.expect is None:
        return within_torch_error(got, want, case.torch_error[direction], tol)
    atol = tol * math.sqrt(case.op.reduction(case.n))
    try:
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=atol)
    except (AssertionError, ValueError) as e:
        return False, " ".join(str(e).split())[:500]
    return True, ""


def within_torch_error(got: tuple, want: tuple, torch_error: list, tol: float) -> tuple[bool, str]:
    """FlashAttention's test: each result's largest error is at most twice torch's own in this
    dtype, plus ``tol * max |expected|``."""
    for i, (g, w, e) in enumerate(zip(got, want, torch_error, strict=True)):
        if g.shape != w.shape:
            return False, f"result {i}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        err, allowed = max_error(g, w), 2 * e + tol * w.abs().max().item()
        if not err <= allowed:  # also catches NaN
            return False, (f"result {i}: max |error| {err:.3g} > allowed {allowed:.3g} "
                           f"(2 x torch's own {e:.3g} + {tol:g} x max |expected|)")
    return True, ""


def new_point(case: Case, backend: str, direction: str) -> dict:
    op = case.op
    return dict(op=op.name, level=op.level, dtype=str(case.dtype).removeprefix("torch."), size=op.size(case.n),
                shape=op.shape(case.n), **op.tags(case.n), direction=direction, backend=backend,
                target=case.target, status="ok", checked=False, ms=None, gbs=None, tflops=None, fraction=None,
                target_fraction=BACKEND_TARGETS.get(backend, {}).get(op.name, TARGETS.get(op.name)),
                ceiling_name=op.reference_name if op.flops else "copy_ bandwidth")


def work(op: Op, direction: str) -> tuple[Callable | None, Callable | None]:
    """``(flops, bytes)`` of one direction of ``op`` (None where it does not apply); fwd+bwd: the sums."""
    if direction != "fwd+bwd":
        return (op.flops, op.bytes) if direction == "fwd" else (op.bwd_flops, op.bwd_bytes)
    both = lambda f, b: None if f is None else (lambda *n: f(*n) + b(*n))  # noqa: E731
    return both(op.flops, op.bwd_flops), both(op.bytes, op.bwd_bytes)


def rates(p: dict, case: Case, ms: float, ceiling: float) -> None:
    """Fill GB/s or TFLOP/s and the fraction of the ceiling into point ``p``."""
    op, n = case.op, case.n
    flops, traffic = work(op, p["direction"])
    p["ms"] = ms
    if flops:
        p["flops"] = flops(n)
        p["tflops"] = p["flops"] / (ms * 1e-3) / 1e12
        p["fraction"] = p["tflops"] / ceiling if ceiling else None
    else:
        p["bytes"] = traffic(n, case.dtype.itemsize)
        p["gbs"] = p["bytes"] / (ms * 1e-3) / 1e9
        p["fraction"] = p["gbs"] / ceiling if ceiling else None


def autotuners(op: str) -> dict:
    """Every ``triton.autotune``d kernel of the kcourse.blas.triton modules (``op``'s imported first),
    by ``module.kernel`` name (none without triton)."""
    try:
        from triton.runtime.autotuner import Autotuner
        importlib.import_module(f"kcourse.blas.triton.{op}")
    except ImportError:
        return {}
    return {f"{name.rsplit('.', 1)[1]}.{attr}": value for name, module in list(sys.modules.items())
            if name.startswith("kcourse.blas.triton.") for attr, value in vars(module).items()
            if isinstance(value, Autotuner)}


def measure(case: Case, label: str, call: Callable, direction: str, timer, ceiling: float,
            timed: list | None = None, time_wrong: bool = True) -> dict:
    """Check once, then time, one point: ``call(inputs)`` (a backend or torch's reference) in one
    direction; never raises. A point that ran is appended to ``timed`` with the call its timer took.
    ``time_wrong=False``: a point that fails its check is not timed (``ms`` stays None)."""
    p = new_point(case, label, direction)
    try:
        want = case.op.expect(case.inputs) if case.op.expect else case.want[direction]
        tuners = autotuners(case.op.name)
        tuned_before = {name: set(tuner.cache) for name, tuner in tuners.items()}
        t0 = time.perf_counter()
        fn = timed_call(case, call, direction)
        got = fn()
        sync(case.device)
        p["first_call_s"] = time.perf_counter() - t0
        picks = {name: str(config) for name, tuner in tuners.items() for key, config in tuner.cache.items()
                 if key not in tuned_before[name]}  # what the autotuner chose in that first call
        if picks:
            p["autotuned"] = picks
        p["checked"], p["check_error"] = check(case, direction, got, want)
        del want, got
        if p["checked"] or time_wrong:
            rates(p, case, timer(fn), ceiling)
            if timed is not None:
                timed.append((p, fn))
    except NotImplementedError as e:
        p.update(status="not implemented", error=str(e))
    except Exception as e:  # noqa: BLE001 - record every failure and keep going
        p.update(status="error", error=f"{type(e).__name__}: {' '.join(str(e).split())[:500]}")
        free(case.device)
    return p


def as_reference(p: dict, op: Op) -> dict:
    """Mark torch's own point: the ceiling (its fraction is 1) or the eager time to beat."""
    p["target_fraction"] = None
    if op.eager:
        p["eager_point"] = True
    else:
        p.update(ceiling_point=True, fraction=1.0 if p["status"] == "ok" else None)
    return p


def compare_with_eager(p: dict, eager_ms: float | None) -> dict:
    """A memory-bound primitive's point must also not be slower than torch eager."""
    p.update(eager_ms=eager_ms, target_speedup=EAGER_TARGET,
             speedup_vs_eager=eager_ms / p["ms"] if eager_ms and p["ms"] else None)
    return p


def python_skip(op: Op, n, device: str) -> str | None:
    """Why the python backend does not run this point, or None when it does."""
    limit = PYTHON_MAX[op.level] if op.python_max is None else op.python_max
    if device != "cuda" or op.size(n) <= limit:
        return None
    if limit == 0:
        return "the python reference runs this op only in the CPU smoke test"
    return f"python reference runs only up to n={limit}"


# ----------------------------------------------------------------------------- ceilings


def copy_bandwidth(device: str, timer) -> tuple[float, int]:
    """GB/s of ``dst.copy_(src)`` on a large float32 buffer (bytes read + written)."""
    bytes_per_s, n = timing.copy_bandwidth(device, timer, COPY_CEILING_ELEMENTS[device])
    free(device)
    return bytes_per_s / 1e9, n


def peak_memory(call: Callable, inputs: tuple, grads: tuple, grad_out: torch.Tensor, device: str) -> int | None:
    """Bytes allocated at the peak of one forward + backward above those allocated before it (the
    inputs and grad_out); None on the CPU, which has no such counter. A first, unmeasured step
    pays compilation and autotuning."""
    def step():
        out = call(inputs)
        torch.autograd.grad(out, [inputs[i] for i in grads], grad_out)

    step()
    if device != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    sync(device)
    return torch.cuda.max_memory_allocated() - before


def attention_memory(backends: list[str], device: str) -> list[dict]:
    """Peak memory of attention (forward + backward) at ``MEMORY_SIZES``: F.sdpa and each backend."""
    op, rows = OPS["attention"], []
    runs = [(op.reference_name, op.reference), *[(b, lambda t, b=b: op.run(t, b)) for b in backends if b != "python"]]
    for n in MEMORY_SIZES[device]:
        inputs = op.make(n, BF16, device)
        grad_out = torch.randn_like(inputs[0])
        for label, call in runs:
            row = dict(op=op.name, dtype="bfloat16", shape=op.shape(n), **op.tags(n), backend=label,
                       reference=label == op.reference_name, status="ok", peak_bytes=None)
            try:
                row["peak_bytes"] = peak_memory(call, inputs, op.grads, grad_out, device)
            except NotImplementedError as e:
                row.update(status="not implemented", error=str(e))
            except Exception as e:  # noqa: BLE001 - e.g. out of memory: record it and go on
                row.update(status="error", error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
            free(device)
            peak = "-" if row["peak_bytes"] is None else f"{row['peak_bytes'] / 2**20:.0f} MiB"
            print(f"peak memory {shape_text(row):>21s} {label:14s} {row['status']}: {peak}", flush=True)
            rows.append(row)
        del inputs, grad_out
        free(device)
    return rows


# ----------------------------------------------------------------------------- the sweep


def run_sweep(args, backends: list[str], timer, copy_gbs: float) -> list[dict]:
    """Every (op, dtype, size) of the mode's sweep, on every backend."""
    points = []
    mode = "cpu" if args.device == "cpu" else ("quick" if args.quick else "full")
    for name, dtype, sizes, targets in SWEEPS[mode]:
        if name not in args.ops:
            continue
        if args.device == "cpu" and args.quick:
            sizes = targets or sizes[-1:]
        t_op = time.perf_counter()
        for n in sizes:
            case = Case(OPS[name], dtype, n, n in targets, args.device)
            points += run_size(case, backends, timer, copy_gbs, args.rounds)
        print(f"--- {name} {str(dtype).removeprefix('torch.')}: {time.perf_counter() - t_op:.1f} s", flush=True)
    return points


def run_size(case: Case, backends: list[str], timer, copy_gbs: float, rounds: int = 1) -> list[dict]:
    """One (op, dtype, size): make the inputs once, then per direction torch's reference (when the
    op has one) and every backend."""
    return per_direction(case, backends, case.op.directions,
                         lambda d: run_direction(case, d, backends, timer, copy_gbs, rounds))


def per_direction(case: Case, labels: list[str], directions, run: Callable[[str], list[dict]]) -> list[dict]:
    """``prepare`` the case once, then the points of ``run(direction)`` for each direction; the inputs
    are freed after. Where preparing fails: an error point per direction and label instead."""
    try:
        prepare(case)
    except Exception as e:  # noqa: BLE001 - e.g. out of memory: record it and go on
        free(case.device)
        why = f"inputs or reference failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        return [dict(new_point(case, b, d), status="error", error=why) for d in directions for b in labels]
    points = []
    for direction in directions:
        points += run(direction)
    case.inputs, case.want, case.grad_out = (), {}, None
    free(case.device)
    return points


def run_direction(case: Case, direction: str, backends: list[str], timer, copy_gbs: float,
                  rounds: int = 1) -> list[dict]:
    """torch's reference (when the op has one) and every backend at one (op, dtype, size, direction).
    ``rounds`` > 1: every call that ran is timed again, rounds - 1 more times, interleaved (reference,
    backends, reference, ...), and each point keeps its fastest median; a drift of the GPU's clocks
    while one point is measured then moves the reference and the backends alike."""
    op, points, timed, ref = case.op, [], [], None
    if op.reference:
        ref = measure(case, op.reference_name, op.reference, direction, timer, 0.0, timed)
        points.append(ref)
    skipped = set()
    for backend in backends:
        why = python_skip(op, case.n, case.device) if backend == "python" else None
        if why:
            points.append(dict(new_point(case, backend, direction), status="skipped", error=why))
            skipped.add(len(points) - 1)
        else:
            points.append(measure(case, backend, lambda t: op.run(t, backend), direction, timer, 0.0, timed))
    best = retime(timed, timer, rounds)
    ceiling, eager_ms = copy_gbs, None
    if ref is not None:
        if ref["status"] == "ok":
            rates(ref, case, best[id(ref)], 0.0 if op.flops else copy_gbs)
        as_reference(ref, op)
        if op.eager:
            eager_ms = ref.get("ms")
        else:
            ceiling = ref.get("tflops") or 0.0
    for i, p in enumerate(points):
        if p is ref:
            report(p)
            continue
        if id(p) in best:
            rates(p, case, best[id(p)], ceiling)
        if op.eager:
            compare_with_eager(p, eager_ms)
        if i not in skipped:
            report(p)
    return points


def retime(timed: list, timer, rounds: int) -> dict:
    """``id(point) -> ms``: each ``(point, call)`` of ``timed`` timed ``rounds - 1`` more times, in
    turn, keeping the fastest of its ``ms`` and those."""
    best = {id(p): p["ms"] for p, _ in timed}
    for _ in range(rounds - 1):
        for p, fn in timed:
            best[id(p)] = min(best[id(p)], timer(fn))
    return best


def report(p: dict) -> None:
    """One progress line per point."""
    where = (f"{p['op']:13s} {p['direction']:3s} {p['dtype']:8s} {shape_text(p):>21s} {p['backend']:15s}")
    if p["status"] != "ok":
        print(f"{where} {p['status']}: {p.get('error', '')[:120]}", flush=True)
        return
    rate = f"{p['tflops']:8.1f} TFLOP/s" if p["tflops"] is not None else f"{p['gbs']:8.0f} GB/s   "
    frac = f"{p['fraction']:.2f}" if p["fraction"] is not None else "-"
    eager = f" {p['speedup_vs_eager']:.2f}x eager" if p.get("speedup_vs_eager") is not None else ""
    ok = "checked" if p["checked"] else f"WRONG: {p.get('check_error', '')[:80]}"
    print(f"{where} {p['ms']:9.4f} ms {rate} {frac} of ceiling{eager}  {ok}", flush=True)


# ----------------------------------------------------------------------------- metadata and main


def run_notes(args) -> list[str]:
    """How to read this run's numbers, for summary.md."""
    notes = [
        "Out-of-place ops are timed as users call them (output allocation included: a caching-"
        "allocator lookup); swap is timed in place (swap_).",
        f"The python backend (elementwise reference) runs on CUDA only up to n = 2^{PYTHON_MAX[1].bit_length() - 1} "
        f"(level 1), {PYTHON_MAX[2]} (gemv/geru), {PYTHON_MAX[3]} (gemm), and the transformer primitives "
        "only on the CPU; larger points are 'skipped'.",
        "float32 gemm is IEEE float32 on both sides unless float32_matmul_precision allows TF32; a "
        "TF32 kernel fails the float32 check.",
    ]
    if set(args.ops) & {*ROWWISE, "attention"}:
        notes += [
            "Transformer primitives: fwd is the op call with inputs that require grad (as in training); bwd is "
            "torch.autograd.grad(out, inputs, grad_out, retain_graph=True) on a graph built once. Checked against "
            "torch.nn.functional in float32: max error <= 2 x torch's own in the same dtype + tol x max |expected|.",
            f"Row-wise primitives: GB/s of the minimal traffic (fwd 2NDs, bwd 3NDs; cross_entropy fwd NVs, bwd 2NVs); "
            f"target >= {TARGETS['softmax']:.2f} of copy_ bandwidth and not slower than torch eager (F.softmax, "
            "F.log_softmax, F.layer_norm, F.rms_norm, F.cross_entropy) at the same shape, dtype and direction.",
        ]
    if "attention" in args.ops:
        notes.append(
            f"Attention: head dim {HEAD_DIM}, {HEADS} heads, B*T = {TOKENS} tokens (on CUDA); fwd 4BHT^2D FLOP, halved "
            "when causal; bwd 2.5x fwd (FlashAttention-2 convention); ceiling F.sdpa = "
            "torch.nn.functional.scaled_dot_product_attention at the same shape and direction.")
    return notes


def metadata(args, backends: list[str], timer_text: str) -> dict:
    import triton
    cuda = args.device == "cuda"
    info = kcourse.backends()
    return dict(
        device=args.device,
        device_name=torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})",
        date_utc=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
        cuda=torch.version.cuda, git_commit=git("rev-parse", "--short", "HEAD"),
        git_dirty=bool(git("status", "--porcelain", "--", "kcourse")),
        quick=args.quick, backends=backends, rounds=args.rounds,
        unavailable={n: str(i) for n, i in info.items() if not i.available},
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        sdpa_enabled={k: getattr(torch.backends.cuda, f"{k}_sdp_enabled")()
                      for k in ("flash", "mem_efficient", "cudnn", "math")},
        timer=timer_text, targets=TARGETS, backend_targets=BACKEND_TARGETS, eager_target=EAGER_TARGET,
        python_max=PYTHON_MAX,
        x_labels={name: op.x_label or X_LABELS[op.level] for name, op in OPS.items()},
        notes=run_notes(args),
    )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for results.json, <op>.png, summary.md")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    parser.add_argument("--backends", default=",".join(kcourse.backend.NAMES),
                        help="comma-separated; unavailable ones are reported and left out")
    parser.add_argument("--quick", action="store_true", help="only the target points (and one small size per BLAS op)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: tiny sizes and a perf_counter timer, a smoke test of this script")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time each point this many times, interleaved with its reference; keep the fastest")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.ops = [o for o in args.ops.split(",") if o]
    unknown = set(args.ops) - set(OPS)
    if unknown:
        parser.error(f"unknown ops {sorted(unknown)}; choose from {list(OPS)}")
    args.backends = [b for b in args.backends.split(",") if b]
    for b in args.backends:
        kcourse.backend.check_name(b)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here; use --device cpu for a smoke test")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    info = kcourse.backends()
    backends = [b for b in args.backends if info[b].available]
    for b in set(args.backends) - set(backends):
        print(f"skipping backend {info[b]}")
    if args.device == "cuda":
        warmup, rep = TIMING["quick" if args.quick else "full"]
        timer, timer_text = cuda_timer(warmup, rep), (
            f"triton.testing.do_bench(warmup={warmup}, rep={rep}, return_mode='median'), L2 flushed per call")
    else:
        timer, timer_text = cpu_timer, "time.perf_counter median of 7 calls (CPU smoke test, not a benchmark)"

    start = time.perf_counter()
    torch.manual_seed(0)
    meta = metadata(args, backends, timer_text)
    meta["copy_gbs"], meta["copy_ceiling_elements"] = copy_bandwidth(args.device, timer)
    print(f"{meta['device_name']}: copy_ bandwidth {meta['copy_gbs']:.0f} GB/s; backends {backends}", flush=True)
    points = run_sweep(args, backends, timer, meta["copy_gbs"])
    memory = attention_memory(backends, args.device) if "attention" in args.ops else []
    meta["elapsed_s"] = time.perf_counter() - start
    results = dict(meta=meta, points=points, memory=memory)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    summary = summary_markdown(results)
    (args.out / "summary.md").write_text(summary)
    try:
        plots = plot_all(results, args.out)
    except ImportError:
        plots = []
        print("matplotlib is not installed: no plots (pip install matplotlib)")
    print(f"\nwrote {args.out / 'results.json'}, {args.out / 'summary.md'} and {len(plots)} plots "
          f"in {meta['elapsed_s']:.0f} s\n")
    print(summary)
    return results


if __name__ == "__main__":
    main()
