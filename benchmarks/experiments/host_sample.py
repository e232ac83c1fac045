"""Experiment: where an eager GPT-2 124M training step's host time goes, by sampling rather than
tracing. cProfile's per-call cost inflates a step of many small Python calls (``gpt_host.py``'s
8-layer GPT at batch 16 on an H200: triton's step 45 ms plain, 118 ms under cProfile; cute's 32 and
56), and it can charge a C
call's time to the wrong Python function; here a thread reads every Python thread's stack every
``--interval`` seconds (``sys._current_frames``), so each function's share of the samples is its
share of the time, whichever thread runs it (the autograd engine runs a CUDA backward's Python
pullbacks on its own device thread).

    source .cute/activate.sh && python -m benchmarks.experiments.host_sample cute [--batch 16] [--steps 10]

Prints the step time without and with the sampler, the samples per thread, and the functions with
the most samples at the top of a stack (its own time, with the C calls it makes) and anywhere in
it (its time and its callees'). A thread blocked in C (the main thread inside ``loss.backward()``
while the engine's thread works) is sampled too, at the Python line that called into C.

Read the top-of-stack counts with the GIL in mind: the sampler runs only when it holds the GIL, and a
running thread gives it up mostly where it calls into C that releases it (torch's ATen calls do) or
after the interpreter's switch interval. So samples gather at the lines that make such calls: on an
H200, triton's and cute's ``_host._projection`` and ``_projection_grads`` (a few tensor allocations and
views each, around their gemm calls) held 13% of triton's top-of-stack samples of a step
(2026-11-29), where cProfile of the same code on a CPU (``triton_host_cpu.py``, launches stubbed,
12 layers) gives them 5.6% of the step's time of their own. Compare counts between versions, not as
absolute shares.
"""
import argparse
import collections
import sys
import threading
import time

import torch

from benchmarks import gpt as bench


def where(code) -> str:
    """``path:line(function)`` of a code object, the path from the package or repository root."""
    path = code.co_filename.split("site-packages/")[-1]
    for root in ("/kcourse/", "/benchmarks/", "/tests/"):
        if root in path:
            path = root[1:] + path.split(root, 1)[1]
    return f"{path}:{code.co_firstlineno}({code.co_name})"


class Sampler:
    """Counts, every ``interval`` seconds, each Python thread's top function and every function on its stack."""

    def __init__(self, interval: float):
        self.interval, self.top, self.anywhere = interval, collections.Counter(), collections.Counter()
        self.per_thread, self._stop = collections.Counter(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        me = threading.get_ident()
        while not self._stop.is_set():
            time.sleep(self.interval)
            for thread, frame in sys._current_frames().items():
                if thread == me:
                    continue
                stack = []
                while frame is not None:
                    stack.append(frame.f_code)
                    frame = frame.f_back
                self.per_thread[thread] += 1
                self.top[where(stack[0])] += 1
                self.anywhere.update({where(code) for code in stack})

    def __enter__(self):
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(self.interval / 2)  # the sampler gets the GIL about when it wakes
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._switch)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("backend", help="a kcourse backend, or torch.nn")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--interval", type=float, default=5e-4)
    parser.add_argument("--lines", type=int, default=40)
    args = parser.parse_args()
    config = bench.GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                             **bench.ARCHS["gpt2"])
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = bench.torch_reference().GPT(config) if args.backend == "torch.nn" else \
            bench.GPT(config, backend=args.backend)
    model = model.bfloat16()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    data = bench.batches(argparse.Namespace(batch=args.batch, device="cuda"), config)
    step = bench.make_step(model, opt, "eager", argparse.Namespace(device="cuda", allow_graph_breaks=False), data)

    def timed() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(args.steps):
            step(i)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / args.steps * 1e3

    for i in range(6):  # compiles, autotuning, the allocator's pools
        step(i)
    plain = timed()
    with Sampler(args.interval) as sampler:
        sampled = timed()
    total = sum(sampler.per_thread.values())
    print(f"{args.backend}: {plain:.1f} ms/step, {sampled:.1f} while sampled; {total} samples, per thread "
          f"{sorted(sampler.per_thread.values(), reverse=True)}")
    for title, counts in (("top of a stack", sampler.top), ("anywhere on a stack", sampler.anywhere)):
        print(f"== {title}")
        for function, n in counts.most_common(args.lines):
            print(f"{n:6d} {100 * n / total:5.1f}%  {function}")


if __name__ == "__main__":
    main()
