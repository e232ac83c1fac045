"""Race kcourse's ops against the libraries a user would pick instead, in one process, at the same
shapes, on the same inputs.

    python -m benchmarks.peers --out /tmp/peers                                     # the row-wise ops, CUDA
    python -m benchmarks.peers --out /tmp/p --ops rms_norm,softmax --backends triton,cute --quick
    python -m benchmarks.peers --out /tmp/p --ops more                              # swiglu, rope, embedding
    python -m benchmarks.peers --out /tmp/p --ops gemm                              # quack autotunes: minutes
    python -m benchmarks.peers --out /tmp/p --device cpu --quick --ops all          # smoke test, no GPU
    python -m benchmarks.peers --out /tmp/p --from /tmp/peers/peers.json            # peers.md and plots from a JSON
    python -m benchmarks.history add /tmp/peers/peers.json                          # into the history

Method
------
* Ops (``--ops``: names, or the groups ``rows`` (the default), ``more`` and ``all``; no run of this
  benchmark has been timed on a GPU yet, so how long each group takes is not known: on a device
  with a time limit per command, give each group, or op, its own command; ``peers.json`` is
  written after each op):
  - ``rows``: softmax, log_softmax, cross_entropy (mean over the rows), layer_norm (weight and
    bias), rms_norm (weight), defined once in ``benchmarks/run.py`` (``OPS``: inputs, the kcourse
    call, torch's call, minimal traffic). Shapes: ``ELEMENTS`` elements (2^27 on CUDA) in rows of
    1k, 4k, 16k, 64k and 256k columns (131072 x 1024 ... 512 x 262144), bfloat16 and float32.
  - ``more`` (``PEER_OPS``, defined here on run.py's ``Op``): swiglu, ``silu(gate) * up`` on two
    (rows, F) tensors of ``ELEMENTS`` elements, F = 2048, 5632, 11008, 14336, 28672 (an LLM's
    intermediate sizes); rope, ``blas.rope(x)`` with the default base 10000 and positions 0..T-1 on
    x (B, 32, T, 128) of ``ELEMENTS`` elements, T = 1k ... 16k (B = 32 ... 2), laid out
    (B, T, H, D) in memory as a Hugging Face model's q and k are (``x.transpose(1, 2)``
    contiguous), beside float32 cos and sin tables (T, 128) of the same angles (the peers' input;
    kcourse computes its own); embedding, ``weight[indices]`` for 16384 token ids into tables
    V x D = 50304 or 131072 x 768 or 4096, the ids drawn as text's tokens are (the
    Zipf-Mandelbrot law: the id of rank r with probability ~ 1 / (r + ZIPF_Q)^ZIPF_S, the ranks
    scattered over the table), so that the backward meets frequent rows as in training (the
    commonest id ~3% of the tokens; runs before 2026-11-29 drew them uniformly); bfloat16 and float32.
  - ``gemm``: ``blas.gemm(A, B)``, A (M, K) @ B (K, N), square 2048, 4096, 8192 and the LLM
    shapes (16384, 4096, 4096), (16384, 14336, 4096), (16384, 4096, 14336) as M x N x K; bfloat16
    only (quack's Hopper gemm has no float32); TFLOP/s of 2MNK (fwd), 4MNK (bwd).
  One set of random inputs per (op, dtype, shape) is shared by every backend and peer.
* Peers, each left out where it does not import (recorded as unavailable with the error; none is a
  dependency of kcourse); a peer without an op is "not implemented" there:
  - ``torch eager``: the torch call of the op (``F.softmax``, ``F.log_softmax``, ``F.cross_entropy``,
    ``F.layer_norm``, ``F.rms_norm``; ``F.silu(gate) * up``; Hugging Face's rope,
    ``x * cos + rotate_half(x) * sin`` with the tables cast to x's dtype, as its rotary embedding
    returns them; ``F.embedding(indices, weight)``; ``torch.matmul(A, B)``);
  - ``torch.compile``: that call compiled with ``torch.compile(dynamic=False)``, one compiled
    function per (op, dtype, direction); it recompiles per shape (``dynamic=False``), in the first,
    untimed call, and a recompile-limit hit is an error, not a silent fall back to eager;
  - ``quack`` (quack-kernels 0.6.5): ``quack.softmax.softmax``, ``quack.cross_entropy.cross_entropy``,
    ``quack.rmsnorm.rmsnorm``; quack has no differentiable layer_norm, so ``layernorm_fwd`` and
    ``layernorm_bwd`` of ``quack.rmsnorm`` run in a thin ``autograd.Function``, the weight and
    bias passed in float32 as they require; rope: ``quack.rotary.apply_rotary_emb(x.transpose(1, 2),
    cos[:, :D/2], sin[:, :D/2]).transpose(1, 2)`` (it takes (B, T, H, D) and the half tables,
    out of place; the backward is the rotation by -theta); gemm: ``quack.linear.linear_func(A, B.mT)``
    (its differentiable ``x @ weight.T``, tuned: the first call per shape and layout autotunes
    every Hopper config, each direction's gemms apart); no log_softmax, swiglu, embedding;
  - ``liger`` (liger-kernel 0.8.5, its default Triton kernels, ``LIGER_KERNEL_IMPL`` unset):
    ``LigerSoftmaxFunction``, ``LigerLayerNormFunction``, ``LigerRMSNormFunction`` (casting "llama",
    ``in_place=False``: its default writes dx into the shared grad_out), ``LigerCrossEntropyFunction``
    (its forward writes the logits' gradient into the logits); swiglu: ``LigerSiLUMulFunction.apply
    (gate, up)`` (its backward writes dgate and dup into gate and up); rope: ``rope_forward`` and
    ``rope_backward``, the two halves of ``LigerRopeFunction``, in a thin ``autograd.Function``
    that passes the first half of x's batch as q and the second as k, so that one launch rotates
    all of x: in place, x being laid out (B, T, H, D) (the gradient likewise in place where it is
    so laid out, else first copied so, as ``rope_backward`` copies), with the float32 tables (its
    kernel computes in the tables' dtype); LigerRopeFunction itself returns q and k apart, two
    results where the op has one, and joining them would add a copy Liger does not make;
    embedding: ``LigerEmbeddingFunction.apply(weight, indices)`` (the table first; its backward
    adds into a zeroed gradient of the table's dtype with atomics); no log_softmax, gemm, and no
    geglu here: Liger's ``LigerGELUMulFunction`` (tanh-gelu(a) * b) has no kcourse op to race
    (kcourse has gelu and swiglu, not their product).
    A peer that writes into its inputs (``Peer.own_inputs``: Liger's cross_entropy, swiglu and
    rope) runs on its own copy of them and of grad_out, made once per point outside the timing;
    later calls read the last call's results as inputs: the same work.
  On ``--device cpu`` quack and liger are left out (their kernels need CUDA) and torch.compile is
  skipped unless ``--cpu-compile`` (inductor builds C++ for every shape, seconds each).
* Directions: ``fwd`` is the call on inputs that require grad, as in training; ``fwd+bwd`` is one
  call of the forward then ``torch.autograd.grad(out, inputs, grad_out)``, grad_out random and
  fixed per point (1 for the scalar loss); every peer and backend is timed the same way.
* Check first, as ``benchmarks/run.py`` does: each point (peers too) runs once and is compared with
  the torch call in float32 (largest error at most twice torch's own in the run's dtype +
  tol x max |expected|; fwd+bwd: the output and every input gradient). A wrong result is reported
  as WRONG and not timed. That first call also pays JIT compiles and autotuning.
* Time: ``benchmarks/timing.py``'s timer (CUDA: ``do_bench`` median, L2 flushed before each call;
  CPU: a ``perf_counter`` median, a smoke test, not a benchmark). ``--graphed``: each call captured
  in a CUDA graph and its replay timed (``timing.graph_ms``), the kernels without the host: an eager
  forward and backward of ~0.3 ms is host-bound on some hosts for every library (on an H200 host,
  ``torch.autograd.grad`` alone took 150-250 us of a rope step's ~300), so the eager ratio there
  measures Python, not kernels; a call that cannot be captured is an error point. ``--rounds R``: every timed call
  of a point is timed R - 1 more times, in turn, and keeps its fastest median.
* Ratio: at each point the best peer is the fastest peer that ran and passed its check there; every
  point's ratio is the best peer's ms over its own (above 1: faster than every peer; a peer's is at
  most 1). GB/s counts the minimal traffic: ``run.py``'s for the row-wise ops; swiglu fwd 3ns, bwd
  5ns, rope 2ns each way, embedding fwd 2NDs, bwd NDs + VDs (as docs/<op>.md count them); fwd+bwd
  adds the two directions'. gemm's rate is TFLOP/s (2MNK fwd, 4MNK bwd).
* Targets (issue 34), the same for every op: per op and kcourse backend, over every dtype, both
  directions and every size, ratio >= 1.00 at every point except at most two, which must still be
  >= 0.95; a point without a ratio (error, WRONG, no peer ran) misses.

Output in ``--out``: ``peers.json`` (metadata, the peers and why one is missing, every point),
``peers.md`` (the targets, a table per op, problems) and ``peers_<op>.png`` (ratio against the
op's size, a line per backend, dtype and direction).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
import platform
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from benchmarks import timing
from benchmarks.common import environment, usable_backends
from benchmarks.run import (LAYER_NORM_EPS, OPS, RMS_NORM_EPS, TIMING, Case, Op, leaf, measure, new_point,
                            per_direction, randn, rates, retime)
from benchmarks.summarize import COLORS, MARKERS, notes, shape_text
from kcourse import blas

ROW_OPS = ("softmax", "log_softmax", "cross_entropy", "layer_norm", "rms_norm")
MORE_OPS = ("swiglu", "rope", "embedding")
GROUPS = {"rows": ROW_OPS, "more": MORE_OPS, "all": (*ROW_OPS, *MORE_OPS, "gemm")}  # --ops names these too
DIRECTIONS = ("fwd", "fwd+bwd")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
OP_DTYPES = {"gemm": ("bfloat16",)}  # an op's dtypes where not every one of DTYPES (quack's gemm: no float32)
ELEMENTS = {"cuda": 1 << 27, "cpu": 1 << 12}  # per (N, D) tensor: 256 MiB in bfloat16, 512 MiB in float32
COLUMNS = {  # row lengths per device and mode
    ("cuda", False): [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18],
    ("cuda", True): [1 << 10, 1 << 14, 1 << 18],
    ("cpu", False): [1 << 6, 1 << 8, 1 << 10],
    ("cpu", True): [1 << 6, 1 << 10],
}
SWIGLU_COLUMNS = {  # F: an LLM's intermediate sizes (Llama-2 7B 11008, Llama-3 8B 14336, 70B 28672)
    ("cuda", False): [2048, 5632, 11008, 14336, 28672], ("cuda", True): [2048, 14336],
    ("cpu", False): [64, 256, 1024], ("cpu", True): [64, 1024],
}
ROPE_HEADS = {"cuda": (32, 128), "cpu": (2, 16)}  # (H, D) of x (B, H, T, D); B = ELEMENTS // (H T D), even
ROPE_LENGTHS = {
    ("cuda", False): [1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14], ("cuda", True): [1 << 10, 1 << 14],
    ("cpu", False): [16, 32, 64], ("cpu", True): [16, 64],
}
ROPE_BASE = 10000.0  # blas.rope's default
TOKENS = {"cuda": 16384, "cpu": 64}  # embedding: token ids per call
TABLES = {  # embedding: (V, D) of the table
    ("cuda", False): [(50304, 768), (131072, 768), (50304, 4096), (131072, 4096)],
    ("cuda", True): [(50304, 768), (131072, 4096)],
    ("cpu", False): [(50, 16), (200, 32)], ("cpu", True): [(50, 16), (200, 32)],
}
GEMMS = {  # (M, N, K): square, then an LLM's projections at 16384 tokens (Llama-3 8B: 4096, 14336)
    ("cuda", False): [(2048,) * 3, (4096,) * 3, (8192,) * 3, (16384, 4096, 4096), (16384, 14336, 4096),
                      (16384, 4096, 14336)],
    ("cuda", True): [(4096,) * 3, (16384, 14336, 4096)],
    ("cpu", False): [(64, 64, 64), (128, 96, 64)], ("cpu", True): [(64, 64, 64), (128, 96, 64)],
}
TARGET, SLACK, SLACK_POINTS = 1.0, 0.95, 2  # ratio >= TARGET everywhere but SLACK_POINTS points >= SLACK
RECOMPILE_LIMIT = 64  # torch.compile: every (dtype, direction, shape) of one op recompiles its call


# ----------------------------------------------------------------------------- the ops beyond run.py's


def gate_and_up(n, dtype, device):
    """swiglu's gate and up, (rows, columns) each, both differentiable."""
    return leaf(*n, dtype=dtype, device=device), leaf(*n, dtype=dtype, device=device)


def rope_inputs(n, dtype, device):
    """x (B, H, T, D) laid out (B, T, H, D) in memory (``x.transpose(1, 2)`` contiguous), as a Hugging
    Face model's q and k are; and float32 cos and sin (T, D) of the angles t * base^(-2i/D) (Hugging
    Face's ``cat(freqs, freqs)`` tables), computed in float64 here, independent of kcourse."""
    B, H, T, D = n
    x = randn(B, T, H, D, dtype=dtype, device=device).transpose(1, 2).requires_grad_()
    frequencies = ROPE_BASE ** (-torch.arange(0, D, 2, dtype=torch.float64, device=device) / D)
    angles = torch.outer(torch.arange(T, dtype=torch.float64, device=device), frequencies)
    angles = torch.cat([angles, angles], dim=-1)
    return x, angles.cos().float(), angles.sin().float()


def rope_size(device: str, T: int) -> tuple[int, int, int, int]:
    """(B, H, T, D) of ``ELEMENTS[device]`` elements."""
    H, D = ROPE_HEADS[device]
    return ELEMENTS[device] // (H * T * D), H, T, D


def rope_reference(t):
    """Hugging Face's ``apply_rotary_pos_emb``: ``x * cos + rotate_half(x) * sin``, the tables in x's dtype."""
    x, cos, sin = t
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-x2, x1), dim=-1) * sin.to(x.dtype)


ZIPF_S, ZIPF_Q = 1.0, 2.7  # embedding: the ids' rank-frequency law 1 / (r + Q)^S (fits English text's words)


def token_ids(tokens: int, V: int, device) -> torch.Tensor:
    """``tokens`` ids in [0, V) with the Zipf-Mandelbrot rank-frequency law: rank r (from 0) drawn with
    probability proportional to 1 / (r + 1 + ZIPF_Q)^ZIPF_S, rank r being id ``perm[r]`` of a random
    permutation."""
    weights = (torch.arange(1, V + 1, dtype=torch.float64, device=device) + ZIPF_Q).pow(-ZIPF_S)
    ranks = torch.multinomial(weights, tokens, replacement=True)
    return torch.randperm(V, device=device)[ranks]


def embedding_inputs(n, dtype, device):
    """(token ids (N,), the table (V, D), differentiable)."""
    tokens, V, D = n
    return token_ids(tokens, V, device), leaf(V, D, dtype=dtype, device=device)


def gemm_inputs(n, dtype, device):
    """A (M, K) and B (K, N), both differentiable."""
    M, N, K = n
    return leaf(M, K, dtype=dtype, device=device), leaf(K, N, dtype=dtype, device=device)


def gemm_flops(n) -> int:
    """2MNK: one multiply and one add per (m, n, k)."""
    return 2 * math.prod(n)


def elementwise(passes):
    """Bytes of ``passes`` full passes over a tensor of size(n) = prod(n) elements of size s."""
    return lambda n, s: passes * math.prod(n) * s


# The ops that run.py does not race against torch: n is swiglu's (rows, F), rope's (B, H, T, D),
# embedding's (N, V, D), gemm's (M, N, K). Their sizes per device and mode: ``SIZES``.
PEER_OPS = {op.name: op for op in [
    Op("swiglu", 2, make=gate_and_up, shape=list, size=lambda n: n[1], expect=None,
       run=lambda t, b: blas.swiglu(t[0], t[1], backend=b),
       reference=lambda t: F.silu(t[0]) * t[1], reference_name="F.silu(gate) * up", grads=(0, 1),
       bytes=elementwise(3),  # read gate and up, write y
       bwd_bytes=elementwise(5)),  # read dy, gate and up; write dgate and dup
    Op("rope", 2, make=rope_inputs, shape=list, size=lambda n: n[2], expect=None,
       run=lambda t, b: blas.rope(t[0], backend=b),  # base 10000, positions 0..T-1; kcourse makes its own angles
       reference=rope_reference, reference_name="x cos + rotate_half(x) sin", grads=(0,),
       bytes=elementwise(2),  # read x, write y (the (T, D) tables: left out)
       bwd_bytes=elementwise(2)),  # read dy, write dx
    Op("embedding", 2, make=embedding_inputs, shape=list, size=lambda n: n[1] * n[2], expect=None,
       run=lambda t, b: blas.embedding(t[0], t[1], backend=b),
       reference=lambda t: F.embedding(t[0], t[1]), reference_name="F.embedding", grads=(1,),
       bytes=lambda n, s: 2 * n[0] * n[2] * s,  # gather N rows, write them (the ids: left out)
       bwd_bytes=lambda n, s: (n[0] + n[1]) * n[2] * s),  # read dy, write the dense (V, D) dweight
    dataclasses.replace(  # run.py's gemm (its call, torch.matmul), of any (M, N, K), checked as the rest here
        OPS["gemm"], make=gemm_inputs, shape=list, size=gemm_flops, expect=None, grads=(0, 1),
        flops=gemm_flops, bwd_flops=lambda n: 2 * gemm_flops(n)),  # two products: dA = dC B^T, dB = A^T dC
]}
SIZES = {  # op -> (device, quick) -> the size (Case.n) of each point
    **{op: {k: [(ELEMENTS[k[0]] // d, d) for d in cols] for k, cols in COLUMNS.items()} for op in ROW_OPS},
    "swiglu": {k: [(ELEMENTS[k[0]] // f, f) for f in cols] for k, cols in SWIGLU_COLUMNS.items()},
    "rope": {k: [rope_size(k[0], t) for t in lengths] for k, lengths in ROPE_LENGTHS.items()},
    "embedding": {k: [(TOKENS[k[0]], V, D) for V, D in tables] for k, tables in TABLES.items()},
    "gemm": GEMMS,
}
OPERATIONS = tuple(SIZES)


def op_named(name: str) -> Op:
    """The op called ``name`` here: this module's own (``PEER_OPS``) or run.py's."""
    return PEER_OPS[name] if name in PEER_OPS else OPS[name]


def x_label(op: str, device: str) -> str:
    """The plots' x axis for ``op``: what its size (``Op.size``) counts."""
    if op == "rope":
        H, D = ROPE_HEADS[device]
        return f"T (sequence length; B x {H} heads x T x {D} = {ELEMENTS[device]:,} elements)"
    if op == "embedding":
        return f"table size V x D (elements; {TOKENS[device]:,} token ids a call)"
    if op == "gemm":
        return "FLOP of the product (2MNK)"
    return row_label(ELEMENTS[device])


def row_label(elements: int) -> str:
    """The x axis of a row-wise op's (and swiglu's) plot."""
    return f"row length (columns; {elements:,} elements a tensor)"


# ----------------------------------------------------------------------------- the peers


@dataclass(frozen=True)
class Peer:
    """A library a user could call instead of kcourse."""
    name: str
    load: Callable[[], Callable]  # imports it; returns (op, dtype, direction) -> call(inputs), or None: no such op
    dist: str | None = None  # its PyPI distribution (for the version); None: torch itself
    cuda_only: bool = False
    slow_on_cpu: bool = False  # skipped on --device cpu unless --cpu-compile
    own_inputs: tuple = ()  # ops it runs on its own copy of the inputs and grad_out (it writes into them)


def eager_calls() -> Callable:
    """torch eager: each op's torch call (run.py's reference, or this module's)."""
    return lambda op, dtype, direction: op_named(op).reference


def compiled_calls() -> Callable:
    """torch.compile(dynamic=False) of the torch call, one compiled function per (op, dtype, direction)."""
    compiled = {}

    def call(op, dtype, direction):
        if (op, dtype, direction) not in compiled:
            compiled[op, dtype, direction] = torch.compile(op_named(op).reference, dynamic=False)
        return compiled[op, dtype, direction]
    return call


def half_tables(t) -> tuple:
    """rope's x as (B, T, H, D) and the first halves (T, D/2) of its cos and sin tables: quack's
    ``apply_rotary_emb`` arguments (views, no copies)."""
    x, cos, sin = t
    return x.transpose(1, 2), cos[:, :cos.shape[1] // 2], sin[:, :sin.shape[1] // 2]


def quack_calls() -> Callable:
    """quack-kernels: softmax, cross_entropy, rmsnorm, layer_norm through its forward and backward
    functions, rope, and gemm through its differentiable linear."""
    from quack.cross_entropy import cross_entropy
    from quack.linear import linear_func
    from quack.rmsnorm import layernorm_bwd, layernorm_fwd, rmsnorm
    from quack.rotary import apply_rotary_emb
    from quack.softmax import softmax

    class LayerNorm(torch.autograd.Function):
        """quack's layer_norm kernels, differentiable (weight and bias in float32, as they must be)."""

        @staticmethod
        def forward(ctx, x, weight, bias, eps):
            out, rstd, mean = layernorm_fwd(x, weight.float(), bias.float(), eps, return_rstd=True, return_mean=True)
            ctx.save_for_backward(x, weight, rstd, mean)
            return out

        @staticmethod
        def backward(ctx, dout):
            x, weight, rstd, mean = ctx.saved_tensors
            dx, dw, db = layernorm_bwd(x, weight.float(), dout, rstd, mean, has_bias=True)
            return dx, dw.to(weight.dtype), db.to(weight.dtype), None

    calls = {"softmax": lambda t: softmax(t[0]),
             "cross_entropy": lambda t: cross_entropy(t[0], t[1], reduction="mean"),
             "layer_norm": lambda t: LayerNorm.apply(t[0], t[1], t[2], LAYER_NORM_EPS),
             "rms_norm": lambda t: rmsnorm(t[0], t[1], eps=RMS_NORM_EPS),
             # x (B, T, H, D), cos and sin (T, D/2), out of place -> (B, T, H, D), seen as (B, H, T, D)
             "rope": lambda t: apply_rotary_emb(*half_tables(t)).transpose(1, 2),
             "gemm": lambda t: linear_func(t[0], t[1].mT)}  # x @ weight.T with weight = B^T: A @ B
    return lambda op, dtype, direction: calls.get(op)


def liger_calls() -> Callable:
    """liger-kernel's autograd Functions, and its rope kernels in a Function of one result."""
    from liger_kernel.ops import (LigerCrossEntropyFunction, LigerEmbeddingFunction, LigerLayerNormFunction,
                                  LigerRMSNormFunction, LigerSiLUMulFunction, LigerSoftmaxFunction, rope_backward,
                                  rope_forward)

    class Rope(torch.autograd.Function):
        """Liger's rope on x (B, H, T, D) laid out (B, T, H, D): the first half of the batch as q, the
        second as k, rotated in one launch, in place (the body of LigerRopeFunction, which would return
        q and k apart). The gradient is rotated in place too, first copied into that layout unless it
        is laid out so, as rope_backward copies q's and k's."""

        @staticmethod
        def forward(ctx, x, cos, sin):
            if x.shape[0] % 2 or not x.transpose(1, 2).is_contiguous():
                raise ValueError(f"liger rope here: x {tuple(x.shape)} needs an even batch and x.transpose(1, 2) "
                                 "contiguous (else Liger copies q and k, and joining them costs one copy more)")
            half = x.shape[0] // 2
            _, _, cos, sin = rope_forward(x[:half], x[half:], cos, sin)  # (B, H, T, D) with (T, D) tables
            ctx.save_for_backward(cos, sin)
            return x

        @staticmethod
        def backward(ctx, dy):
            cos, sin = ctx.saved_tensors
            dx = dy.transpose(1, 2).contiguous().transpose(1, 2)  # dy itself where it is laid out (B, T, H, D)
            half = dx.shape[0] // 2
            rope_backward(dx[:half], dx[half:], cos, sin)
            return dx, None, None

    calls = {"softmax": lambda t: LigerSoftmaxFunction.apply(t[0]),
             # (input, target, weight, ignore_index, lse_square_scale, label_smoothing, reduction) -> (loss, ...)
             "cross_entropy": lambda t: LigerCrossEntropyFunction.apply(t[0], t[1], None, -100, 0.0, 0.0, "mean")[0],
             "layer_norm": lambda t: LigerLayerNormFunction.apply(t[0], t[1], t[2], LAYER_NORM_EPS),
             # (X, W, eps, offset, casting_mode, in_place)
             "rms_norm": lambda t: LigerRMSNormFunction.apply(t[0], t[1], RMS_NORM_EPS, 0.0, "llama", False),
             "swiglu": lambda t: LigerSiLUMulFunction.apply(t[0], t[1]),  # silu(a) * b; its backward writes a, b
             "rope": lambda t: Rope.apply(*t),
             "embedding": lambda t: LigerEmbeddingFunction.apply(t[1], t[0])}  # (embeddings, indices)
    return lambda op, dtype, direction: calls.get(op)


PEERS = {p.name: p for p in [
    Peer("torch eager", eager_calls),
    Peer("torch.compile", compiled_calls, slow_on_cpu=True),
    Peer("quack", quack_calls, dist="quack-kernels", cuda_only=True),
    Peer("liger", liger_calls, dist="liger-kernel", cuda_only=True, own_inputs=("cross_entropy", "swiglu", "rope")),
]}


def version(dist: str | None) -> str | None:
    """The installed version of a distribution (torch's for None), or None where it is not installed."""
    if dist is None:
        return torch.__version__
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_peer(peer: Peer, device: str, cpu_compile: bool) -> tuple[Callable | None, dict]:
    """(its calls, or None where it does not run here; what the JSON records of it)."""
    info = dict(available=False, version=version(peer.dist))
    if device == "cpu" and peer.slow_on_cpu and not cpu_compile:
        return None, dict(info, reason="skipped on --device cpu: inductor builds C++ for every shape, seconds "
                                       "each (--cpu-compile runs it)")
    try:
        calls = peer.load()
    except Exception as e:  # noqa: BLE001 - ImportError, or a library that fails while it loads
        return None, dict(info, reason=f"import failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    if device == "cpu" and peer.cuda_only:
        return None, dict(info, reason="its kernels need CUDA")
    return calls, dict(info, available=True)


def load_peers(names: list[str], device: str, cpu_compile: bool) -> tuple[list, dict]:
    """([(peer, its calls)] of those that run here, {name: availability, version, reason})."""
    loaded, info = [], {}
    for name in names:
        calls, info[name] = load_peer(PEERS[name], device, cpu_compile)
        if calls is not None:
            loaded.append((PEERS[name], calls))
        print(f"peer {name}: {'available' if calls else info[name]['reason']}", flush=True)
    return loaded, info


# ----------------------------------------------------------------------------- one point


def own_copy(case: Case) -> Case:
    """The case with fresh leaf copies of its floating-point inputs (in their layout) and of grad_out,
    for a peer that writes into them."""
    inputs = tuple(x.detach().clone().requires_grad_(x.requires_grad)
                   if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in case.inputs)
    grad_out = None if case.grad_out is None else case.grad_out.clone()
    return dataclasses.replace(case, inputs=inputs, grad_out=grad_out)


def measure_peer(case: Case, peer: Peer, calls: Callable, direction: str, timer, timed: list) -> dict:
    """One peer at one point, through run.py's ``measure`` (check, then time; not timed when wrong)."""
    call = calls(case.op.name, case.dtype, direction)
    if call is None:
        p = dict(new_point(case, peer.name, direction), status="not implemented",
                 error=f"{peer.name} has no {case.op.name}")
    else:
        on = own_copy(case) if case.op.name in peer.own_inputs else case
        p = measure(on, peer.name, call, direction, timer, 0.0, timed, time_wrong=False)
    p["peer"] = True
    return p


def run_point(case: Case, direction: str, backends: list[str], peers: list, timer, rounds: int) -> list[dict]:
    """Every peer, then every kcourse backend, at one (op, dtype, shape, direction); then the ratios."""
    timed = []
    points = [measure_peer(case, peer, calls, direction, timer, timed) for peer, calls in peers]
    points += [measure(case, b, lambda t, b=b: case.op.run(t, b), direction, timer, 0.0, timed, time_wrong=False)
               for b in backends]
    fastest = retime(timed, timer, rounds)
    for p, _ in timed:
        rates(p, case, fastest[id(p)], 0.0)
    rank(points)
    for p in points:
        report(p)
    return points


def rank(points: list[dict]) -> None:
    """Fill each point's best peer (the fastest peer timed here: only checked points are timed) and
    ratio (the best peer's ms over its own); kcourse's points get their target."""
    ran = [p for p in points if p.get("peer") and p.get("ms") is not None]
    best = min(ran, key=lambda p: p["ms"], default=None)
    for p in points:
        ratio = best["ms"] / p["ms"] if best and p.get("ms") else None
        p.update(best_peer=best and best["backend"], best_peer_ms=best and best["ms"], ratio=ratio,
                 fraction=ratio, ceiling_name="best peer", target=False, target_fraction=None,
                 target_ratio=None if p.get("peer") else TARGET)


def report(p: dict) -> None:
    """One progress line per point."""
    where = f"{p['op']:13s} {p['direction']:7s} {p['dtype']:8s} {shape_text(p):>16s} {p['backend']:13s}"
    if p["status"] != "ok":
        print(f"{where} {p['status']}: {p.get('error', '')[:120]}", flush=True)
    elif not p["checked"]:
        print(f"{where} WRONG (not timed): {p.get('check_error', '')[:120]}", flush=True)
    else:
        ratio = f"{p['ratio']:.2f}x best peer ({p['best_peer']})" if p["ratio"] else "no peer ran"
        rate = f"{p['tflops']:8.1f} TFLOP/s" if p.get("tflops") is not None else f"{p['gbs']:8.1f} GB/s"
        print(f"{where} {p['ms']:9.4f} ms {rate}  {ratio}", flush=True)


# ----------------------------------------------------------------------------- the sweep


def dtypes_of(name: str, dtypes: list[torch.dtype]) -> list[torch.dtype]:
    """Those of ``dtypes`` that op ``name`` runs in (``OP_DTYPES``)."""
    return [d for d in dtypes if str(d).removeprefix("torch.") in OP_DTYPES.get(name, DTYPES)]


def sizes(name: str, args) -> list:
    """The sizes of ``name``'s points in this run: ``SIZES``, a row op's only at ``--columns``."""
    every = SIZES[name][args.device, args.quick]
    return [n for n in every if not args.columns or name not in ROW_OPS or n[1] in args.columns]


def run_op(name: str, args, backends: list[str], peers: list, timer) -> list[dict]:
    """Every (dtype, size, direction) of one op, peers and backends."""
    labels = [peer.name for peer, _ in peers] + backends
    points, start = [], time.perf_counter()
    for dtype in dtypes_of(name, args.dtypes):
        for n in sizes(name, args):
            case = Case(op_named(name), dtype, n, False, args.device)
            points += per_direction(case, labels, DIRECTIONS,
                                    lambda d: run_point(case, d, backends, peers, timer, args.rounds))
    print(f"--- {name}: {time.perf_counter() - start:.1f} s", flush=True)
    return points


# ----------------------------------------------------------------------------- targets, table, plots


def verdicts(points: list[dict]) -> list[dict]:
    """Per (op, kcourse backend): the lowest ratio, the points under TARGET, and whether the target holds."""
    groups = defaultdict(list)
    for p in points:
        if not p.get("peer"):
            groups[(p["op"], p["backend"])].append(p)
    out = []
    for (op, backend), pts in groups.items():
        rated = [p for p in pts if p.get("ratio") is not None]
        below = [p for p in rated if p["ratio"] < TARGET]
        lowest = min(rated, key=lambda p: p["ratio"], default=None)
        met = (len(rated) == len(pts) and len(below) <= SLACK_POINTS and all(p["ratio"] >= SLACK for p in below))
        out.append(dict(op=op, backend=backend, points=len(pts), unrated=len(pts) - len(rated), below=len(below),
                        lowest=lowest and lowest["ratio"],
                        lowest_at=lowest and f"{shape_text(lowest)} {lowest['dtype']} {lowest['direction']}",
                        met=met))
    return out


def cell(p: dict | None) -> str:
    """A table cell: the point's ratio, or why it has none."""
    if p is None:
        return ""
    if p["status"] != "ok":
        return "-" if p["status"] == "not implemented" else p["status"]
    if not p["checked"]:
        return "WRONG"
    return f"{p['ratio']:.2f}x" if p.get("ratio") is not None else "no peer"


def op_table(points: list[dict], labels: list[str]) -> list[str]:
    """One op's markdown table: a row per (dtype, direction, shape), a column per peer and backend."""
    rows = defaultdict(dict)
    for p in points:
        rows[(p["dtype"], p["direction"], p["size"], shape_text(p))][p["backend"]] = p
    lines = ["| dtype | dir | shape | best peer | its ms | " + " | ".join(labels) + " |",
             "|---|---|---|---|---:|" + "---:|" * len(labels)]
    for (dtype, direction, _, shape), by in sorted(rows.items(), key=lambda kv: kv[0][:3]):
        first = next(iter(by.values()))
        ms = "-" if first.get("best_peer_ms") is None else f"{first['best_peer_ms']:.4f}"
        lines.append(f"| {dtype} | {direction} | {shape} | {first.get('best_peer') or '-'} | {ms} | "
                     + " | ".join(cell(by.get(label)) for label in labels) + " |")
    return lines


def summary_markdown(results: dict) -> str:
    """``peers.md``: provenance, the peers, the targets per op and backend, a table per op, problems."""
    m = results["meta"]
    versions = ", ".join(f"{k} {m[k]}" for k in ("torch", "triton", "cuda", "python") if m.get(k))
    out = [f"# kcourse against its peers: {m['device']}", "",
           f"{m['date_utc']} UTC; {versions}; kcourse {m.get('git_commit') or 'uncommitted'}"
           f"{' (dirty tree)' if m.get('git_dirty') else ''}; {m['elements']:,} elements a tensor "
           f"(row-wise ops, swiglu, rope; each table gives its shapes); "
           f"{m['elapsed_s']:.0f} s. Timing: {m['timer']}.", "",
           f"Ratio: the best peer's ms over the backend's at the same point (above 1: faster than every peer). "
           f"Target per op and backend: >= {TARGET:.2f}x at every point, >= {SLACK:.2f}x at no more than "
           f"{SLACK_POINTS} of them.", ""]
    for name, info in results["peers"].items():
        state = f"{info.get('version') or ''}" if info["available"] else f"not run: {info['reason']}"
        out.append(f"- {name}: {state}")
    out += ["", "## Targets", "", "| op | backend | result | lowest | at | points below 1.00x | without a ratio |",
            "|---|---|---|---:|---|---:|---:|"]
    for v in verdicts(results["points"]):
        low = "-" if v["lowest"] is None else f"{v['lowest']:.2f}x"
        out.append(f"| {v['op']} | {v['backend']} | {'met' if v['met'] else 'missed'} | {low} | "
                   f"{v['lowest_at'] or '-'} | {v['below']} of {v['points']} | {v['unrated']} |")
    labels = [n for n, i in results["peers"].items() if i["available"]] + m["backends"]
    for op in m["ops"]:
        pts = [p for p in results["points"] if p["op"] == op]
        out += ["", f"## {op}", "", *op_table(pts, labels)]
    problems = notes(results)
    if problems:
        out += ["", "## Problems", "", *[f"- {line}" for line in problems]]
    return "\n".join(out) + "\n"


def plot_ratios(results: dict, out_dir: Path) -> list[Path]:
    """``peers_<op>.png``: each kcourse backend's ratio against the op's size (the row length of the
    row-wise ops), a line per (backend, dtype, direction); the target and the slack as horizontal lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for op in results["meta"]["ops"]:
        pts = [p for p in results["points"] if p["op"] == op and not p.get("peer") and p.get("ratio") is not None]
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        series = sorted({(p["backend"], p["dtype"], p["direction"]) for p in pts})
        for backend, dtype, direction in series:
            line = sorted((p for p in pts if (p["backend"], p["dtype"], p["direction"]) == (backend, dtype, direction)),
                          key=lambda p: p["size"])
            ax.plot([p["size"] for p in line], [p["ratio"] for p in line], color=COLORS.get(backend, "tab:red"),
                    marker=MARKERS.get(dtype, "o"), linestyle="-" if direction == "fwd" else "--",
                    label=f"{backend} {dtype} {direction}")
        ax.axhline(TARGET, color="black", linewidth=0.8)
        ax.axhline(SLACK, color="black", linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        labels = results["meta"].get("x_labels", {})  # an older peers.json has none: all row-wise ops
        ax.set_xlabel(labels.get(op) or row_label(results["meta"]["elements"]))
        ax.set_ylabel("best peer's ms / kcourse's ms")
        ax.set_title(f"{op} against the best peer on {results['meta']['device']}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"peers_{op}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# ----------------------------------------------------------------------------- metadata and main


def metadata(args, backends: list[str], skipped: dict, timer_text: str) -> dict:
    """Where, when and with what the run ran (``common.environment``), and what it measured."""
    env = environment(args.device)
    if args.device == "cpu":
        env["device"] = f"CPU ({platform.processor() or platform.machine()})"
    return dict(env, runner="benchmarks/peers.py", ops=args.ops,
                dtypes=[str(d).removeprefix("torch.") for d in args.dtypes], elements=ELEMENTS[args.device],
                columns=[d for d in COLUMNS[args.device, args.quick] if not args.columns or d in args.columns],
                shapes={op: [op_named(op).shape(n) for n in sizes(op, args)] for op in args.ops},
                x_labels={op: x_label(op, args.device) for op in args.ops}, directions=list(DIRECTIONS),
                backends=backends, skipped_backends=skipped, quick=args.quick, rounds=args.rounds, timer=timer_text,
                graphed=args.graphed,
                target=TARGET, slack=SLACK, slack_points=SLACK_POINTS)


def names(text: str, valid, what: str, parser) -> list[str]:
    """The comma-separated names of ``text``; an unknown one is a usage error."""
    chosen = [n for n in text.split(",") if n]
    unknown = [n for n in chosen if n not in valid]
    if unknown:
        parser.error(f"unknown {what} {unknown}; choose from {list(valid)}")
    return chosen


def ungrouped(text: str) -> str:
    """``text`` with each group's name (``GROUPS``) replaced by its ops, each op once, in order."""
    return ",".join(dict.fromkeys(op for name in text.split(",") for op in GROUPS.get(name, (name,))))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for peers.json, peers.md, peers_<op>.png")
    parser.add_argument("--ops", default="rows",
                        help=f"comma-separated ops of {','.join(OPERATIONS)}, or groups: "
                             + "; ".join(f"{g} = {','.join(ops)}" for g, ops in GROUPS.items()))
    parser.add_argument("--backends", default="pytorch,triton,cute", help="kcourse backends, comma-separated")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated subset of {','.join(PEERS)}")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: bfloat16,float32")
    parser.add_argument("--quick", action="store_true",
                        help="fewer sizes: row lengths 1k, 16k, 256k; two of the others' (SIZES)")
    parser.add_argument("--columns", default="",
                        help="row lengths of the row ops to run, comma-separated (default: every one of COLUMNS)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: tiny sizes, a perf_counter timer, torch eager only: a smoke test of this script")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time each call this many times, in turn; keep the fastest")
    parser.add_argument("--cpu-compile", action="store_true", help="on --device cpu, run the torch.compile peer too")
    parser.add_argument("--graphed", action="store_true",
                        help="time each call's CUDA-graph replay: the kernels without the host (CUDA only)")
    parser.add_argument("--from", dest="source", type=Path,
                        help="run nothing: rewrite peers.md and the plots in --out from this peers.json")
    args = parser.parse_args(argv)
    args.ops = names(ungrouped(args.ops), OPERATIONS, "ops", parser)
    args.peers = names(args.peers, PEERS, "peers", parser)
    args.dtypes = [DTYPES[d] for d in names(args.dtypes, DTYPES, "dtypes", parser)]
    args.backends = [b for b in args.backends.split(",") if b]
    args.columns = [int(d) for d in args.columns.split(",") if d]
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.graphed and args.device != "cuda":
        parser.error("--graphed needs --device cuda (CUDA graphs)")
    if args.device == "cuda" and not torch.cuda.is_available() and not args.source:
        parser.error("no CUDA device here; use --device cpu for a smoke test")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.source:
        return write(json.loads(args.source.read_text()), args.out)
    backends, skipped = usable_backends(args.backends, cuda=args.device == "cuda")
    for b, why in skipped.items():
        print(f"skipping backend {b}: {why}")
    warmup, rep = TIMING["quick" if args.quick else "full"]
    timer = timing.timer(args.device, warmup, rep)
    timer_text = (f"triton.testing.do_bench(warmup={warmup}, rep={rep}, return_mode='median'), L2 flushed per call"
                  if args.device == "cuda" else "time.perf_counter median of 7 calls (CPU smoke test, not a benchmark)")
    if args.graphed:
        timer = lambda fn: timing.graph_ms(fn, warmup, rep)  # noqa: E731
        timer_text = f"each call's CUDA graph replayed, {timer_text} (the kernels without the host)"
    start = time.perf_counter()
    torch.manual_seed(0)
    meta = metadata(args, backends, skipped, timer_text)
    peers, info = load_peers(args.peers, args.device, args.cpu_compile)
    limits = {k: v for k, v in dict(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True).items()
              if hasattr(torch._dynamo.config, k)}
    results = dict(meta=meta, peers=info, points=[])
    with torch._dynamo.config.patch(**limits):
        for name in args.ops:  # peers.json after each op: a run stopped by a time limit keeps the ops it did
            results["points"] += run_op(name, args, backends, peers, timer)
            meta["elapsed_s"] = time.perf_counter() - start
            save(results, args.out)
    return write(results, args.out)


def save(results: dict, out: Path) -> None:
    """``out/peers.json``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers.json").write_text(json.dumps(results, indent=1) + "\n")


def write(results: dict, out: Path) -> dict:
    """peers.json, peers.md and the plots into ``out``; the summary printed."""
    save(results, out)
    summary = summary_markdown(results)
    (out / "peers.md").write_text(summary)
    try:
        plots = plot_ratios(results, out)
    except ImportError:
        plots = []
        print("matplotlib is not installed: no plots (pip install matplotlib)")
    print(f"\nwrote {out / 'peers.json'}, {out / 'peers.md'} and {len(plots)} plots\n")
    print(summary)
    return results


if __name__ == "__main__":
    main()
