"""Experiment (issue 6): the cute softmax and layer_norm forwards, the two row-wise points 0.2-0.3% behind
triton (32768 x 8192; session 17): cache hints on their loads, and how many rows an SM works on at once.

    source .cute/activate.sh && PYTHONPATH=. python benchmarks/experiments/cute_row_loads.py OUT.json \
        [--variants hints|occupancy|spread]

``--variants hints`` (the default):

Every row load goes through ``_rows.to_registers``, which copies with a plain atom (``CopyUniversalOp``:
``ld.global.v4``). Each variant swaps that function for one whose atom is a ``CopyG2ROp`` with a hint,
compiles the kernels again and keeps them (``_compile._kernels`` per variant), so that the variants'
timings interleave in one process:

    plain       the shipped kernels
    L2::256B    ld.global.L2::256B: the L2 fetches the 256-byte block around each access
    no_allocate ld.global.L1::no_allocate: the streamed rows do not take L1 lines
    nc          ld.global.nc: the read-only (texture) path

``--variants occupancy``: the shipped kernels with unused shared memory beside their reduction buffer,
so that at most 1, 2 or 3 CTAs (rows, at D = 8192) fit on an SM (``pad``; unpadded, the float32 layer_norm
forward fits 3 by its 72 registers, the softmax 4 by its 55), and the softmax forward with a row across
512 threads (16 elements a thread, as triton's kernel has it; ``512``). The theory under test: a row
takes k times as long on an SM that works on k rows at once, and at the end of the kernel the SMs
drain for about half a row's time, so the fewest rows an SM needs to keep the memory busy should win.

``--variants spread``: the forwards with ``FORWARD_ROW_THREADS`` = 512 (``512``, shipped) and 256
(``256``, as before the nineteenth session), with rms_norm too, over ``--dims``. Its predecessor, a
``threads`` mode that patched the plans before ``_rows.spread_row`` existed (a row across 512 threads,
alone and with at most 2 CTAs an SM), made the session-19 ``row-threads.json``.

The ``hints`` and ``occupancy`` results committed in session 19 were made before the spread shipped:
their "plain" was a row over 256 threads at D = 8192, and ``occupancy``'s ``512`` (which only spreads
a row still over 256 threads) now changes nothing there.

Each variant's output is compared bit for bit with the shipped kernels' (a hint changes no value) and
with triton's to torch's float32 error. do_bench medians (L2 flushed), ``--rounds`` interleaved rounds,
the fastest kept.
"""
import argparse
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import cutlass
import cutlass.cute as cute
from kcourse.blas.cute import _compile, _norm, _rows, layer_norm as cute_ln, rms_norm as cute_rms, softmax as cute_sm
from kcourse.blas.triton import layer_norm as triton_ln, rms_norm as triton_rms, softmax as triton_sm

PLAIN = _rows.to_registers
PLAIN_BUFFER = _rows.reduction_buffer
PLAIN_NORM_PLAN = _norm.plan
SMEM_PER_SM = 228 * 1024
HINTS = {"L2::256B": dict(l2_prefetch_size=cute.nvgpu.L2PrefetchSize.SIZE_256B),
         "no_allocate": dict(l1c_evict_priority=cute.nvgpu.CacheEvictionPriority.NO_ALLOCATE),
         "nc": dict(invariant=True)}


def hinted(hints):
    """``_rows.to_registers`` with a G2R atom carrying ``hints``."""
    def to_registers(tiled_copy, tXsX, pred, fill):
        rX = cute.make_rmem_tensor_like(tXsX)
        rX.fill(fill)
        bits = tXsX.element_type.width * cute.size(tXsX, mode=[0])
        atom = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), tXsX.element_type, num_bits_per_copy=bits, **hints)
        cute.copy(atom, tXsX, rX, pred=pred)
        return rX
    return to_registers


def padded(ctas):
    """``reduction_buffer`` with unused shared memory beside it: at most ``ctas`` CTAs an SM."""
    pad = SMEM_PER_SM // (ctas + 1) + 1024

    def reduction_buffer(plan_, values, stages=1):
        buffer = PLAIN_BUFFER(plan_, values, stages)
        unused = cutlass.memory.SmemAllocator().allocate_tensor(cutlass.Int8, cute.make_layout(pad), byte_alignment=16)
        unused[cute.arch.thread_idx()[0]] = cutlass.Int8(0)  # a store, so that nothing drops the allocation
        return buffer
    return reduction_buffer


def row_of_512(plan_):
    """The softmax forward's plan with a row across 512 threads, half the vectors a thread."""
    if plan_.tpr != _rows.THREADS or not plan_.one_pass or plan_.vpt < 2:
        return plan_
    return plan_._replace(tpr=512, vpt=plan_.vpt // 2, threads=512)


def variants(which):
    """name -> (to_registers, reduction_buffer, softmax plan hook, threads a forward row that fills a CTA
    is spread over)."""
    shipped = _rows.FORWARD_ROW_THREADS
    plain = (PLAIN, PLAIN_BUFFER, None, shipped)
    if which == "hints":
        return {"plain": plain, **{name: (hinted(h), PLAIN_BUFFER, None, shipped) for name, h in HINTS.items()}}
    if which == "spread":
        return {"512": (PLAIN, PLAIN_BUFFER, None, 512), "256": (PLAIN, PLAIN_BUFFER, None, 256)}
    return {"plain": plain, **{f"pad {k}": (PLAIN, padded(k), None, shipped) for k in (1, 2, 3)},
            "512": (PLAIN, PLAIN_BUFFER, row_of_512, shipped)}


def use(variant):
    """Plan (and compile) the next calls with ``variant``'s pieces."""
    loads, buffer, hook, spread = variant
    _rows.to_registers, _rows.reduction_buffer, _norm.reduction_buffer = loads, buffer, buffer
    _rows.PLAN_OVERRIDE["_softmax_factory"] = hook
    _rows.FORWARD_ROW_THREADS = _norm.FORWARD_ROW_THREADS = spread
    _norm._forward_plan.cache_clear()  # its plans read FORWARD_ROW_THREADS, which is not among its arguments


def cases(d, rms=False):
    n = 2**28 // d
    torch.manual_seed(0)
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(n, d, device="cuda", dtype=dtype) * 3
        ref = torch.softmax(x.float(), -1)
        out.append((f"softmax fwd {str(dtype)[6:]} {n}x{d}", lambda x=x: cute_sm.softmax(x, -1)[0],
                    lambda x=x: triton_sm.softmax(x, -1)[0], ref, 2 * x.numel() * x.element_size()))
        w, b = (torch.randn(d, device="cuda", dtype=dtype) for _ in range(2))
        ref = F.layer_norm(x.float(), (d,), w.float(), b.float(), 1e-5)
        out.append((f"layer_norm fwd {str(dtype)[6:]} {n}x{d}",
                    lambda x=x, w=w, b=b: cute_ln.layer_norm(x, w, b, 1e-5)[0],
                    lambda x=x, w=w, b=b: triton_ln.layer_norm(x, w, b, 1e-5)[0], ref,
                    2 * x.numel() * x.element_size()))
        if rms:
            ref = F.rms_norm(x.float(), (d,), w.float(), 1e-5)
            out.append((f"rms_norm fwd {str(dtype)[6:]} {n}x{d}", lambda x=x, w=w: cute_rms.rms_norm(x, w, 1e-5)[0],
                        lambda x=x, w=w: triton_rms.rms_norm(x, w, 1e-5)[0], ref, 2 * x.numel() * x.element_size()))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--dims", default="8192")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default="hints", choices=("hints", "occupancy", "spread"))
    args = parser.parse_args()
    src, dst = (torch.empty(2**28, device="cuda") for _ in range(2))
    copy_ms = min(do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median") for _ in range(3))
    rows = []
    for d in map(int, args.dims.split(",")):
        for name, cute_fn, triton_fn, ref, nbytes in cases(d, rms=args.variants == "spread"):
            kernels, outputs, table = {}, {}, variants(args.variants)
            for variant in table:  # compile each variant's kernels, keep them
                _compile._kernels.clear()
                use(table[variant])
                outputs[variant] = cute_fn().clone()
                kernels[variant] = dict(_compile._kernels)

            def run(variant):
                def call():
                    _compile._kernels.update(kernels[variant])
                    use(table[variant])
                    return cute_fn()
                return call
            fns = {"triton": triton_fn, **{v: run(v) for v in kernels}}
            err = {v: (o.float() - ref).abs().max().item() for v, o in outputs.items()}
            err["triton"] = (triton_fn().float() - ref).abs().max().item()
            same = {v: bool(torch.equal(o, outputs[next(iter(outputs))])) for v, o in outputs.items()}
            ms = {}
            for _ in range(args.rounds):
                for v, fn in fns.items():
                    t = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    ms[v] = min(ms.get(v, t), t)
            row = {"case": name, "ms": {v: round(t, 5) for v, t in ms.items()},
                   "triton_over": {v: round(ms["triton"] / t, 4) for v, t in ms.items()},
                   "of_copy": {v: round(nbytes / t / (2**31 / copy_ms), 4) for v, t in ms.items()},
                   "max_error_vs_torch_f32": err, "bit_identical_to_plain": same}
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_ms_1GiB_each_way": copy_ms}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
