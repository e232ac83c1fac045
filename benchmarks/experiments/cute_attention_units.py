"""Experiment: the work-unit variants of the cute Hopper attention kernels, checked and timed
against each other and SDPA in one process.

    source .cute/activate.sh && python -m benchmarks.experiments.cute_attention_units OUT.json
    source .cute/activate.sh && python -m benchmarks.experiments.cute_attention_units OUT.json --backward
    ... --check: the checks only (with --backward: forward and backward)
    ... --api: the backward through the kernels, the backend's function and autograd, timed
    ... --only tile+p+kv3,paired+p+kv3: check only these variants (each against ``tile``)

A work unit of the forward is one query tile, or (``paired``) two, m_tiles - 1 - p and p, which together
have the same number of key tiles under the causal mask; of the backward one key tile, or (``paired``)
two, p and n_blocks - 1 - p, which together see the same number of query tiles. ``persistent``: one
CTA per SM walks the units (its producer loads the next unit's tiles during this one's last products);
otherwise one CTA a unit. The variants (``attention_fwd_sm90`` / ``attention_bwd_sm90``'s ``paired=``,
``persistent=``):

    tile        one CTA per tile (forward: longest first)
    paired      one CTA per pair
    paired+p    a persistent grid over the pairs
    tile+p      a persistent grid over the tiles
    ...+o       (forward; two K and two V stages) with the cross-tile overlap: a tile's first S = Q K^T
                issued beside the last P V of the CTA's tile before, its softmax while that runs, then the
                earlier tile's epilogue; two Q buffers (``q_stages``), so that the next tile's Q is there
                in time
    ...+o1      the overlap with one Q buffer (the next tile's Q loads only once this tile's last S is done)
    tile+p+q2   two Q buffers without the overlap
    ...+kv3     (forward) three K and V stages, one Q buffer, no overlap (at D = 128 the two Q buffers of
                the overlap and three K/V stages do not fit together)
    ...+o+k3, ...+o+v3  (forward) the overlap with three K stages and two V stages, or the reverse
                (224 KB at D = 128)
    sched...    (forward) single tiles on a persistent grid, each CTA walking its row of a host-made table
                (``scheduled``: ``_attention_fwd_sm90.schedule``)
    ...+s       (forward) the epilogue through shared memory and a TMA store (``tma_store``; two V
                stages, or three (``+s+v3``) with one Q buffer: 224 KB at D = 128 either way)
    config      the configured variant (``config``)
    config+pp   (forward) the configured variant with ``pingpong`` (the causal ``config``
                takes it); ...-o+v3, -o+k3: without the overlap, one Q buffer, a third V or K stage
    (measured with a kernel patch that was not kept)
    config+t    (forward) ``trim``: P V skips the keys none of a warpgroup's rows sees (warpgroup 0's second
                half on the causal diagonal): bit-identical and 1-3% slower at D = 128, 22% at D = 64; trimming
                S = Q K^T the same way (N = 64 WGMMAs into half the accumulator) made ptxas serialize every
                WGMMA (C7511, "insufficient register resources"), so it was not timed
    ...+s, +S   (backward, ``BACKWARD``) dK and dV through shared memory and TMA stores (``tma_store``),
                or (``+S``) from the registers (4-byte stores)
    config=     the configured variant again, under another name: how far one kernel's times spread
    (measured with kernel knobs that were not kept)
    config+sm   a tile's first key tile masked only where it needs it (adopted: the kernel does so now)
    config+eq   the producer loads the next tile's Q right after this tile's first K and V
    config+lw   the wait for P V kept after the softmax in the SASS (a never-taken branch ends the block)

Correctness first: every variant on odd shapes (tails, grouped-query heads, Tq != Tk, (B, T, H, D)
views, one token) against SDPA in float32 (out and the gradients) and a float64 logsumexp (lse), and
against the ``tile`` variant: bit for bit for out, lse, dk and dv (a tile's arithmetic does not depend
on which CTA runs it; dq's float32 sums are added in a varying order, so dq only to the tolerance).
Then bfloat16, 16 heads, B T = 16384, T = 1k..16k, D = 128 and 64, causal (and without the mask tile
and tile+p): do_bench medians over two interleaved rounds (the faster), TFLOP/s and SDPA's time / ours.
Each round times the calls in another order (a rotation). ``--paired``: many short rounds (do_bench
rep = 20 ms) and, beside the fastest, the quartiles over rounds of SDPA's time over each variant's in the
same round, which a drift of the clocks moves far less than a ratio of two fastest times (the same kernel
under two names differed by 4% in the fastest-of-six, 0.5% in the paired median).
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from benchmarks.timing import bench_ms

from kcourse.blas import tuning
from kcourse.blas._layout import heads_like
from kcourse.blas.cute import _attention_bwd_sm90 as bwd90
from kcourse.blas.cute import _attention_fwd_sm90 as fwd90

VARIANTS = {"tile": dict(paired=False, persistent=False), "paired": dict(paired=True, persistent=False),
            "paired+p": dict(paired=True, persistent=True), "tile+p": dict(paired=False, persistent=True)}
# the forward's cross-tile overlap (``overlap``): a tile's first S = Q K^T beside the last P V of the tile
# before, in a CTA that runs several tiles
OVERLAP = {"paired+o": dict(paired=True, persistent=False, overlap=True, q_stages=2, v_stages=2),
           "paired+p+o": dict(paired=True, persistent=True, overlap=True, q_stages=2, v_stages=2),
           "tile+p+o": dict(paired=False, persistent=True, overlap=True, q_stages=2, v_stages=2),
           "tile+p+o1": dict(paired=False, persistent=True, overlap=True, q_stages=1),
           "paired+p+o1": dict(paired=True, persistent=True, overlap=True, q_stages=1),
           "tile+p+q2": dict(paired=False, persistent=True, q_stages=2),
           "paired+p+kv3": dict(paired=True, persistent=True, overlap=False, q_stages=1, k_stages=3, v_stages=3),
           "tile+p+kv3": dict(paired=False, persistent=True, overlap=False, q_stages=1, k_stages=3, v_stages=3),
           "paired+p+o+k3": dict(paired=True, persistent=True, overlap=True, q_stages=2, k_stages=3, v_stages=2),
           "tile+p+o+k3": dict(paired=False, persistent=True, overlap=True, q_stages=2, k_stages=3, v_stages=2),
           "paired+p+o+v3": dict(paired=True, persistent=True, overlap=True, q_stages=2, v_stages=3),
           "tile+p+o+v3": dict(paired=False, persistent=True, overlap=True, q_stages=2, v_stages=3),
           "paired+p+o+s": dict(paired=True, persistent=True, overlap=True, q_stages=2, v_stages=2, tma_store=True),
           "tile+p+o+s": dict(paired=False, persistent=True, overlap=True, q_stages=2, v_stages=2, tma_store=True),
           "paired+p+s": dict(paired=True, persistent=True, overlap=False, q_stages=1, v_stages=2, tma_store=True),
           "tile+p+s": dict(paired=False, persistent=True, overlap=False, q_stages=1, v_stages=2, tma_store=True),
           "tile+s": dict(paired=False, persistent=False, overlap=False, q_stages=1, v_stages=2, tma_store=True),
           "paired+p+s+v3": dict(paired=True, persistent=True, overlap=False, q_stages=1, v_stages=3, tma_store=True),
           "tile+p+s+v3": dict(paired=False, persistent=True, overlap=False, q_stages=1, v_stages=3, tma_store=True),
           "tile+s+v3": dict(paired=False, persistent=False, overlap=False, q_stages=1, v_stages=3, tma_store=True),
           # single tiles in the order of a host-made table (``scheduled``): the pairs' round-robin walk but
           # for the last two rounds, whose tiles go longest first to the CTA with the least work
           "sched+p+o+s": dict(paired=False, persistent=True, scheduled=True, overlap=True, q_stages=2, v_stages=2,
                               tma_store=True),
           "sched+p+s": dict(paired=False, persistent=True, scheduled=True, overlap=False, q_stages=1, v_stages=2,
                             tma_store=True),
           "config": {},
           # the configured walk with ping-pong (taken by ``config`` with the mask),
           # and with ping-pong but neither the overlap nor its second Q buffer: a third V or K stage instead
           "config+pp": {"pingpong": True},
           "config+pp-o+v3": {"pingpong": True, "overlap": False, "q_stages": 1, "v_stages": 3},
           "config+pp-o+k3": {"pingpong": True, "overlap": False, "q_stages": 1, "k_stages": 3},
           "config=": {}}  # the configured variant again: the spread of the timing itself
# the backward's epilogue: dK and dV through shared memory and TMA stores, or directly from registers
BACKWARD = {f"{name}+{tag}": {**VARIANTS[name], "tma_store": tag == "s"}
            for name in ("tile", "paired+p", "tile+p") for tag in ("s", "S")}
# the forward variants timed (``{}``: paired with the mask, tile without; ``--timed`` names others)
FORWARD_TIMED = ["{}+p+o", "{}+p+o+v3"]
# (B, H, Hkv, Tq, Tk, D, causal, layout)
CASES = [(2, 4, 4, 257, 257, 64, True, "bhtd"), (1, 8, 2, 300, 300, 128, True, "bthd"),
         (1, 4, 2, 100, 333, 128, True, "bhtd"), (1, 4, 2, 333, 100, 64, True, "bhtd"),
         (3, 5, 5, 1000, 1000, 128, True, "bhtd"), (1, 2, 2, 1, 1, 128, True, "bhtd"),
         (2, 3, 1, 700, 700, 64, False, "bthd"), (1, 6, 3, 1153, 1153, 128, True, "bthd"),
         (1, 3, 3, 1280, 1280, 128, True, "bhtd"),
         # more units than SMs: a persistent CTA runs several (the overlap between tiles, an odd
         # query-tile count's partnerless middle tile skipped between units)
         (4, 16, 4, 1000, 1000, 128, False, "bthd"), (2, 32, 8, 777, 777, 64, True, "bhtd"),
         (8, 16, 16, 300, 300, 128, False, "bhtd"), (3, 16, 16, 1000, 1000, 128, True, "bthd")]
ATOL, RTOL = 1.6e-2, 1e-2  # the bfloat16 tolerances of the tests; gradients: atol * 4


def heads(B, H, T, D, layout):
    if layout == "bthd":
        return torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    return torch.randn(B, H, T, D, dtype=torch.bfloat16, device="cuda")


def forward(q, k, v, causal, scale, variant):
    B, H, Tq, D = q.shape
    out = heads_like(q)  # the op's layout, which the kernel writes
    lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    if "paired" in variant and "scheduled" not in variant:  # a named walk of pairs or tiles, not the config's table
        variant = {"scheduled": False, **variant}
    fwd90.attention_fwd_sm90(q, k, v, out, lse, causal, scale, tuning.launch("attention", **variant))
    return out, lse


def backward(q, k, v, out, dout, lse, causal, scale, variant):
    """The backward with the variant's ``persistent``, ``paired`` and ``tma_store`` (the table's
    ``backward_`` fields; a forward variant's other fields do not concern it)."""
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))  # contiguous
    launch = tuning.launch("attention", **{f"backward_{name}": value for name, value in variant.items()
                                           if name in ("persistent", "paired", "tma_store")})
    bwd90.attention_bwd_sm90(q, k, v, out.contiguous(), dout, lse, dq, dk, dv, causal, scale, launch)
    return dq, dk, dv


def close(a, b, atol):
    return (a.float() - b.float()).abs().max().item(), atol + RTOL * b.float().abs().max().item()


def check(backward_too, only=None):
    failures = 0
    for B, H, Hkv, Tq, Tk, D, causal, layout in CASES:
        torch.manual_seed(1)
        q = heads(B, H, Tq, D, layout)
        k, v = (heads(B, Hkv, Tk, D, layout) for _ in range(2))
        dout = torch.randn(B, H, Tq, D, dtype=torch.bfloat16, device="cuda")
        scale = 1 / math.sqrt(D)
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale, enable_gqa=True)
        grads = torch.autograd.grad(ref, leaves, dout.float())
        kk = k.double().repeat_interleave(H // Hkv, dim=1)
        s = (q.double() @ kk.transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        lse_ref = torch.logsumexp(s, dim=-1)
        base = forward(q, k, v, causal, scale, VARIANTS["tile"])
        base_grads = backward(q, k, v, *base[:1], dout, base[1], causal, scale, VARIANTS["tile"])
        for name, variant in {**VARIANTS, **OVERLAP}.items():
            if only and name not in only:
                continue
            out, lse = forward(q, k, v, causal, scale, variant)
            err, tol = close(out, ref, ATOL)
            lse_err = (lse.double() - lse_ref).abs().max().item()
            same = torch.equal(out, base[0]) and torch.equal(lse, base[1])
            ok = err <= tol and lse_err < 1e-3 and same
            line = f"out {err:.1e} lse {lse_err:.1e} same {same}"
            if backward_too and name in VARIANTS:  # and its two epilogues
                backward_variants = {name: variant}
                backward_variants.update({n: v for n, v in BACKWARD.items() if n.rsplit("+", 1)[0] == name})
                for b_name, b_variant in backward_variants.items():
                    got = backward(q, k, v, base[0], dout, base[1], causal, scale, b_variant)
                    line += f" [{b_name}]" if b_name != name else ""
                    for g_name, g, r, b in zip(("dq", "dk", "dv"), got, grads, base_grads):
                        err, tol = close(g, r, 4 * ATOL)
                        same = torch.equal(g, b) if g_name != "dq" else close(g, b, ATOL)[0] <= ATOL
                        ok = ok and err <= tol and same
                        line += f" {g_name} {err:.1e} same {same}"
            failures += not ok
            print(f"check {(B, H, Hkv, Tq, Tk, D, causal, layout)} {name:9s} {line} {'PASS' if ok else 'FAIL'}",
                  flush=True)
    return failures


def bench(out_path, failures, backward_too, lengths=(1024, 2048, 4096, 8192, 16384), rounds=2, head_dims=(128, 64),
          timed=None, masks=(True, False), paired=False):
    H, TOKENS = 16, 16384
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "dtype": "bfloat16", "H": H, "tokens": TOKENS, "check_failures": failures,
            "timed": "backward (attention_bwd_sm90: pre, main, post)" if backward_too else "forward"}
    print(json.dumps(meta), flush=True)
    rows = []
    for D in head_dims:
        for T in lengths:
            for causal in masks:
                B = TOKENS // T
                torch.manual_seed(0)
                q, k, v, dout = (heads(B, H, T, D, "bhtd") for _ in range(4))
                scale = 1 / math.sqrt(D)
                names = list(VARIANTS) if causal else ["tile", "tile+p"]
                if backward_too and timed:  # named backward variants ({}: paired+p with the mask, tile without)
                    names = [n.format("paired+p" if causal else "tile") for n in timed]
                if not backward_too:  # the forward: the adopted variants with and without the overlap
                    names = [n.format("paired" if causal else "tile") for n in timed or FORWARD_TIMED]
                flops = 4 * B * H * T * T * D * (0.5 if causal else 1.0)
                if backward_too:
                    flops *= 2.5
                    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                    o = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
                    out, lse = forward(q, k, v, causal, scale, {})
                    fns = {"sdpa": lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True)}
                    every = {**VARIANTS, **BACKWARD, "config": {}}
                    fns.update({n: (lambda n=n: backward(q, k, v, out, dout, lse, causal, scale, every[n]))
                                for n in names})
                    config = bwd90.config(D, causal, T)
                else:
                    fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)}
                    every = {**VARIANTS, **OVERLAP}
                    fns.update({n: (lambda n=n: forward(q, k, v, causal, scale, every[n])) for n in names})
                    config = fwd90.config(D, causal, T)
                row = {"D": D, "T": T, "causal": causal, "config": config}
                ms = {}
                order, per_round = list(fns), []
                for r in range(rounds):  # interleaved rounds, each in another order: the fastest of each
                    times = {}
                    for name in order[r % len(order):] + order[:r % len(order)]:
                        times[name] = bench_ms(fns[name], 5 if paired else 25, 20 if paired else 100)
                        ms[name] = min(ms.get(name, times[name]), times[name])
                    per_round.append(times)
                for name, t in ms.items():
                    row[name] = [round(t, 4), round(flops / t / 1e9, 1), round(ms["sdpa"] / t, 3)]
                    if paired:  # SDPA's time over this one's in the same round: median and quartiles over rounds
                        ratios = sorted(times["sdpa"] / times[name] for times in per_round)
                        q = lambda f: round(ratios[int(f * (len(ratios) - 1))], 4)  # noqa: E731
                        row[name] += [q(0.25), q(0.5), q(0.75)]
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(out_path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


def api(out_path):
    """The backward at T = 1k and 8k, causal and not, D = 128, timed at three levels: the kernels alone
    (``attention_bwd_sm90``), the backend's ``attention_backward`` (allocations, stride checks), and
    ``torch.autograd.grad`` through ``kcourse.blas.attention(backend="cute")`` as the runner times it;
    SDPA through autograd beside them; rounds interleaved, the faster of two."""
    import kcourse
    from kcourse.blas.cute import attention as cute_attention
    rows = []
    for T in (1024, 8192):
        for causal in (True, False):
            B, H, D = 16384 // T, 16, 128
            torch.manual_seed(0)
            q, k, v, dout = (heads(B, H, T, D, "bhtd") for _ in range(4))
            scale = 1 / math.sqrt(D)
            out, lse = forward(q, k, v, causal, scale, {})
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            o_sdpa = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
            o_cute = kcourse.blas.attention(*leaves, causal=causal, backend="cute")
            cache = (q, k, v, out, lse)
            fns = {"sdpa autograd": lambda: torch.autograd.grad(o_sdpa, leaves, dout, retain_graph=True),
                   "kernels": lambda: backward(q, k, v, out, dout, lse, causal, scale, {}),
                   "attention_backward": lambda: cute_attention.attention_backward(dout, cache, (True,) * 3, causal,
                                                                                   scale),
                   "cute autograd": lambda: torch.autograd.grad(o_cute, leaves, dout, retain_graph=True)}
            ms = {}
            for _ in range(2):
                for name, fn in fns.items():
                    t = bench_ms(fn)
                    ms[name] = min(ms.get(name, t), t)
            row = {"T": T, "causal": causal, **{n: round(t, 4) for n, t in ms.items()}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(out_path, "w") as f:
        json.dump({"rows": rows}, f, indent=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--check", action="store_true", help="the checks only")
    parser.add_argument("--api", action="store_true", help="kernels, attention_backward and autograd timed")
    parser.add_argument("--lengths", default="1024,2048,4096,8192,16384", help="sequence lengths to time")
    parser.add_argument("--only", default="", help="comma-separated variants to check (default: all)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds (the fastest is kept)")
    parser.add_argument("--head-dims", default="128,64", help="head dims to time")
    parser.add_argument("--paired", action="store_true", help="many short rounds (do_bench rep = 20 ms); each "
                        "variant also gets the quartiles over rounds of SDPA's time over its own in the same round")
    parser.add_argument("--masks", default="causal,full", help="the masks to time: causal, full or causal,full")
    parser.add_argument("--timed", default="", help="variants to time ({}: the forward's paired, the backward's "
                        "paired+p with the mask, tile without; default: FORWARD_TIMED, or the backward's work units)")
    args = parser.parse_args()
    if args.api:
        return api(args.out)
    failures = check(args.backward, set(filter(None, args.only.split(","))))
    if args.check:
        print(f"{failures} check failures")
        raise SystemExit(failures > 0)
    bench(args.out, failures, args.backward, [int(t) for t in args.lengths.split(",")], args.rounds,
          [int(d) for d in args.head_dims.split(",")], list(filter(None, args.timed.split(","))),
          tuple(m == "causal" for m in args.masks.split(",")), args.paired)


if __name__ == "__main__":
    main()
