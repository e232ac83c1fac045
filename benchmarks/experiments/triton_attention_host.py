"""Experiment (issue 3): why the runner's triton attention forward at T = 1k with the causal mask moves
between runs (0.40, 0.81, 0.55 of SDPA in three runs) while its other points hold still.

    PYTHONPATH=. python benchmarks/experiments/triton_attention_host.py OUT.json

bfloat16, 16 heads, B = 16, T = 1024, D = 128, causal and not. For each: the autotuner's pick, and the
forward timed four ways, median milliseconds:
  - ``runner``: ``do_bench`` (L2 flushed before each call) of ``kcourse.blas.attention`` on inputs that
    require grad, as benchmarks/run.py times it;
  - ``kernel``: ``do_bench`` of the backend function ``attention`` (no autograd, no validation);
  - ``graph``: the same call captured in a CUDA graph and replayed (no host work at all);
  - ``host``: wall time per call of ``kcourse.blas.attention`` over 200 calls, without synchronizing
    (what the CPU spends per call while the GPU queue is not empty).
Where ``runner`` exceeds ``graph`` by about ``host`` minus the flush, the host is what the timer sees.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import kcourse
from kcourse.blas.triton import attention as A


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    B, H, T, D = 16, 16, 1024, 128
    rows = []
    for causal in (True, False):
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        qd, kd, vd = (t.detach() for t in (q, k, v))
        scale = D ** -0.5
        run = lambda: kcourse.blas.attention(q, k, v, causal=causal, backend="triton")
        kernel = lambda: A.attention(qd, kd, vd, causal, scale)
        run()  # autotunes
        row = {"causal": causal, "config": str(A.attention_fwd_tma_kernel.best_config)
               if A.use_tma(qd, causal) else str(A.attention_fwd_kernel.best_config)}
        row["sdpa"] = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                               return_mode="median")
        row["runner"] = do_bench(run, return_mode="median")
        row["kernel"] = do_bench(kernel, return_mode="median")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            kernel()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kernel()
        row["graph"] = do_bench(graph.replay, return_mode="median")
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            run()
        row["host"] = (time.perf_counter() - start) / 200 * 1e3
        torch.cuda.synchronize()
        row = {key: round(val, 4) if isinstance(val, float) else val for key, val in row.items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d"), "shape": [B, H, T, D], "dtype": "bfloat16"}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
