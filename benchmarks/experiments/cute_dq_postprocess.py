"""Experiment: the cute Hopper backward's dQ postprocess (dq = c dQaccum rounded to the dtype),
its stores as the dQ product's fragment puts them (4-byte pairs, the earlier kernel, kept here as
``PostprocessPairs``) against the shipped kernel's 16-byte rows (``_attention_bwd_sm90._Postprocess``).

    source .cute/activate.sh && python -m benchmarks.experiments.cute_dq_postprocess OUT.json

bfloat16, 16 heads, B T = 16384, D = 64 and 128, T = 1k..16k: both kernels on the same dQaccum
(random float32), the results compared bit for bit, do_bench medians (L2 flushed), three interleaved
rounds, the fastest kept; beside them the device copy of as many bytes (read 4 + write 2 bytes an
element: torch's float32 -> bfloat16 conversion) as the ceiling.
"""
import argparse
import json
import time

import torch
import cutlass
import cutlass.cute as cute
from cutlass import Float32
from benchmarks.timing import bench_ms

from kcourse.blas.cute import _compile
from kcourse.blas.cute import _attention_bwd_sm90 as M
from kcourse.blas.cute._attention_fwd import mn_view


class PostprocessPairs(M._Postprocess):
    """The earlier postprocess (the host side is the shipped kernel's): thread t of warpgroup w reads
    its dQ registers back (16-byte loads, the main kernel's order) and stores them where the dQ
    product's thread-to-element map puts them."""

    @cute.kernel
    def kernel(self, mAcc: cute.Tensor, mdQ: cute.Tensor, scale: Float32):
        D = self.D
        tidx, _, _ = cute.arch.thread_idx()
        m, h, b = cute.arch.block_idx()
        Tq = mdQ.shape[0]
        thr = M.dq_mma(self.dtype, D).get_slice(tidx)
        acc = cute.make_rmem_tensor(thr.partition_shape_C((M.TILE_M, D)), Float32)
        cute.autovec_copy(M.register_order(mAcc[None, tidx // 128, m, h, b], tidx, D),
                          cute.make_tensor(acc.iterator, cute.make_layout((4, D // 16))))
        out = cute.make_rmem_tensor_like(acc, self.dtype)
        out.store((acc.load() * scale).to(self.dtype))
        rows = mn_view(out)
        coords = mn_view(thr.partition_C(cute.make_identity_tensor((M.TILE_M, D))))
        gdQ = mn_view(thr.partition_C(cute.local_tile(mdQ[None, None, h, b], (M.TILE_M, D), (m, 0))))
        for r in cutlass.range_constexpr(cute.size(rows, mode=[0])):
            if m * M.TILE_M + coords[r, 0][0] < Tq:
                cute.autovec_copy(rows[r, None], gdQ[r, None])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    rows = []
    for D in (128, 64):
        for T in (1024, 2048, 4096, 8192, 16384, 1000):
            B, H = max(1, 16384 // T), 16
            m_tiles = -(-T // M.TILE_M)
            acc = torch.randn(B * H * m_tiles * M.TILE_M * D, device="cuda", dtype=torch.float32)
            outs = {name: torch.full((B, H, T, D), float("nan"), device="cuda", dtype=torch.bfloat16)
                    for name in ("pairs", "rows")}
            kernels = {"pairs": PostprocessPairs, "rows": M._Postprocess}
            fns = {name: (lambda k=kernels[name], o=outs[name]: _compile.launch(
                k, (torch.bfloat16, D), _compile.pointer(acc, 16), _compile.pointer(o, 16), B, H, T, 0.125,
                _compile.stream_of(o))) for name in kernels}
            src = torch.randn(B * H * T * D, device="cuda")
            dst = torch.empty(B * H * T * D, device="cuda", dtype=torch.bfloat16)
            fns["copy f32->bf16"] = lambda: dst.copy_(src)
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            row = {"D": D, "T": T, "B": B, "equal": bool(torch.equal(outs["pairs"], outs["rows"])),
                   "finite": bool(outs["rows"].isfinite().all())}
            ms = {}
            for _ in range(3):
                for name, fn in fns.items():
                    t = bench_ms(fn)
                    ms[name] = min(ms.get(name, t), t)
            row.update({f"{name} us": round(t * 1e3, 2) for name, t in ms.items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "cutlass-dsl": cutlass.__version__ if hasattr(cutlass, "__version__") else None,
                   "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
