"""Experiment (issue 6): where the host time of a cute attention forward goes, layer by layer.

    source .cute/activate.sh && PYTHONPATH=. python benchmarks/experiments/cute_host_calls.py OUT_DIR

At the runner's T = 1k shape (bfloat16, B = H = 16, D = 128, SDPA's layout, inputs that require grad),
causal and not, the host microseconds per call (``attention_host.host_us``: calls without
synchronizing) of each layer of ``kcourse.blas.attention(..., backend="cute")``, outermost first:

    blas (autograd)        the public call, recording an autograd node (as the runner times it)
    blas (no grad)         the same under torch.no_grad()
    backend function      kcourse.blas.cute.attention.attention
    fwd_sm90              _attention_fwd_sm90.attention_fwd_sm90 (config, table, pointers, launch)
    Kernel.__call__       the compiled kernel called on its last arguments (fill the block + C call)
    C call                Kernel._run: the compiled host function alone (TMA descriptors, launch)

beside SDPA (autograd, no grad) and, for scale, the C call of a small cute kernel without TMA (the
softmax of 4 x 128). Then a torch.profiler trace of 20 autograd calls (CPU and the CUDA API calls
that CUPTI sees: which driver/runtime calls the compiled host function makes, and their time):
``profile-{causal,full}.txt``. Results: ``host-calls.json``.

    ... OUT_DIR --ops: the host microseconds of a forward (kcourse.blas, inputs that require grad) and
    of a backward (torch.autograd.grad on a graph built once, as the runner times it) of the cute
    transformer primitives at small sizes (their kernels take a few microseconds: the host is what
    is timed), torch's own beside them: ``host-ops.json``. Run it on two versions of kcourse (their
    PYTHONPATH) to compare.
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from attention_host import host_us  # noqa: E402

import kcourse  # noqa: E402
from kcourse.blas.cute import _attention_fwd_sm90, _compile  # noqa: E402
from kcourse.blas.cute import attention as cute_attention  # noqa: E402


def last_launch(fn):
    """(kernel, args) of the last ``_compile.launch`` that ``fn`` makes."""
    seen = {}
    original = _compile.launch

    def spy(factory, key, *args):
        seen["kernel"], seen["args"] = _compile.compile_only(factory, key, *args), args
        return original(factory, key, *args)

    _compile.launch = spy
    try:
        fn()
    finally:
        _compile.launch = original
    torch.cuda.synchronize()
    return seen["kernel"], seen["args"]


def layers(causal: bool) -> dict:
    B, H, T, D = 16, 16, 1024, 128
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
               for _ in range(3))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = torch.empty(B, H, T, D, device="cuda", dtype=q.dtype), torch.empty(B, H, T, device="cuda")
    scale = D ** -0.5
    kernel, args = last_launch(lambda: cute_attention.attention(qd, kd, vd, causal, scale))
    x = torch.randn(4, 128, device="cuda")
    small, small_args = last_launch(lambda: kcourse.blas.softmax(x, backend="cute"))
    fns = {
        "blas (autograd)": lambda: kcourse.blas.attention(q, k, v, causal=causal, backend="cute"),
        "blas (no grad)": lambda: kcourse.blas.attention(qd, kd, vd, causal=causal, backend="cute"),
        "backend function": lambda: cute_attention.attention(qd, kd, vd, causal, scale),
        "fwd_sm90": lambda: _attention_fwd_sm90.attention_fwd_sm90(qd, kd, vd, out, lse, causal, scale),
        "Kernel.__call__": lambda: kernel(*args),
        "C call": lambda: kernel._run(),
        "sdpa (autograd)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "sdpa (no grad)": lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal),
        "softmax 4x128 C call": lambda: small._run(),
        "softmax 4x128 blas": lambda: kcourse.blas.softmax(x, backend="cute"),
        "empty (B,H,T,D)": lambda: torch.empty(B, H, T, D, device="cuda", dtype=q.dtype),
    }
    row = {"causal": causal}
    for _ in range(3):
        for name, fn in fns.items():
            row.setdefault(name, []).append(host_us(fn, 400))
    return row


def profile(causal: bool, path: str) -> None:
    B, H, T, D = 16, 16, 1024, 128
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
               for _ in range(3))
    fn = lambda: kcourse.blas.attention(q, k, v, causal=causal, backend="cute")  # noqa: E731
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    with open(path, "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=70))
    prof.export_chrome_trace(path.replace(".txt", ".json"))


def ops() -> dict:
    """{op: {"cute fwd", "cute bwd", "torch fwd", "torch bwd"}} host microseconds, three rounds each."""
    import torch.nn.functional as F
    c = lambda *shape, dtype=torch.bfloat16: torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)  # noqa
    x, w, b = c(64, 1024), c(1024), c(1024)
    logits, target = c(64, 4096, dtype=torch.float32), torch.randint(0, 4096, (64,), device="cuda")
    q, k, v = (c(1, 1, 128, 128) for _ in range(3))
    blas = kcourse.blas
    cases = {
        "softmax": ((x,), lambda: blas.softmax(x, backend="cute"), lambda: F.softmax(x, -1)),
        "layer_norm": ((x, w, b), lambda: blas.layer_norm(x, w, b, backend="cute"),
                       lambda: F.layer_norm(x, (1024,), w, b)),
        "rms_norm": ((x, w), lambda: blas.rms_norm(x, w, backend="cute"), lambda: F.rms_norm(x, (1024,), w)),
        "cross_entropy": ((logits,), lambda: blas.cross_entropy(logits, target, backend="cute"),
                          lambda: F.cross_entropy(logits, target)),
        "gelu": ((x,), lambda: blas.gelu(x, backend="cute"), lambda: F.gelu(x)),
        "attention": ((q, k, v), lambda: blas.attention(q, k, v, causal=True, backend="cute"),
                      lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    }
    rows = {}
    for name, (inputs, ours, theirs) in cases.items():
        row = rows[name] = {}
        for _ in range(3):
            for who, fn in (("cute", ours), ("torch", theirs)):
                out = fn()
                grad = torch.ones_like(out)
                row.setdefault(f"{who} fwd", []).append(host_us(fn, 1000))
                row.setdefault(f"{who} bwd", []).append(host_us(
                    lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True), 1000))
        print(name, json.dumps(row), flush=True)
    return rows


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    if "--ops" in sys.argv:
        with open(os.path.join(out, "host-ops.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "kcourse": os.path.dirname(kcourse.__file__), "date": time.strftime("%Y-%m-%d"),
                       "rows": ops()}, f, separators=(",", ":"))
        return
    rows = []
    for causal in (True, False):
        rows.append(layers(causal))
        print(json.dumps(rows[-1]), flush=True)
        profile(causal, os.path.join(out, f"profile-{'causal' if causal else 'full'}.txt"))
    with open(os.path.join(out, "host-calls.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
