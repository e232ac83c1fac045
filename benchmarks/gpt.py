"""Training throughput of GPT-2 124M built from kcourse.modules against the same architecture built
from torch.nn (tests/torch_reference.py), eager, torch.compile'd and under autocast, in one process.

    python -m benchmarks.gpt --out DIR                               # GPT-2 124M, T = 1024, batch 8, every variant
    python -m benchmarks.gpt --out DIR --batch 16 --backends cute    # torch.nn baselines + cute's variants
    python -m benchmarks.gpt --out DIR --variants eager,autocast     # a subset (see --variants)
    python -m benchmarks.gpt --out DIR --cuda-graph                  # also the "graphed" variants
    python -m benchmarks.gpt --out DIR --variants eager --cold-start # and each model's first step in a new process
    python -m benchmarks.gpt --out /tmp/g --device cpu --tiny --backends pytorch --variants eager,compile  # smoke test

A variant is MODEL:MODE. MODEL is torch.nn or a kcourse backend (--backends). MODE is one of
  eager              bf16 weights (--dtype), plain PyTorch eager
  compile            torch.compile(model, fullgraph=True), bf16 weights
  compile-ro         the same with mode="reduce-overhead" (CUDA graphs made by inductor)
  autocast           float32 master weights, forward under torch.autocast(bfloat16), eager
  autocast+compile   float32 master weights, the compiled model called under autocast
  graphed            bf16 weights, one whole eager step (forward, backward, AdamW(capturable=True))
                     captured by hand in a CUDA graph and replayed (--cuda-graph adds these)
The default set: torch.nn:{eager, compile, autocast+compile, autocast} and every backend x {eager,
compile, compile-ro, autocast, autocast+compile}. --variants picks the variants named, those of a
MODE (any model, torch.nn:compile-ro included) and the default ones of a MODEL, plus the torch.nn
baseline of each (--no-baselines: not those). Each variant's ratio is against its baseline:
eager and graphed against torch.nn:eager, compile and compile-ro against torch.nn:compile,
autocast against torch.nn:autocast and autocast+compile against torch.nn:autocast+compile.

Each variant builds its model afresh from the same initial weights (kcourse's GPT under seed 0; the
torch.nn twin loads its state dict), trains `--warmup` AdamW steps on random tokens (the first one,
timed alone, includes compiling, autotuning and CUDA-graph capture), then `--steps` timed steps:
tokens/s = batch * T / (median step time), each step's time from CUDA events recorded between steps
(no synchronization inside the loop) or, on the CPU, the wall clock. On CUDA, host_ms: the median
of five more steps' host time, each begun on an idle GPU (``host_times``). The peak memory
(torch.cuda.max_memory_allocated, reset before the model is built) covers weights, gradients,
optimizer state and activations. MFU: tokens/s times ``flops_per_token`` (6 per matmul weight plus
12 L d T for attention) over the device's dense bfloat16 peak (``PEAK_TFLOPS``). A variant that
fails is recorded with its error and the traceback's tail; the others still run. Between variants
the model and optimizer are freed and, after a compiled one, torch._dynamo.reset() runs: each
variant is a new model instance, and without a reset every one would be another recompilation of the
same forward (after 8, dynamo silently falls back to eager), guards of dead models would pile up,
and the CUDA graph pools of reduce-overhead would stay allocated. The reset leaves the on-disk
inductor and autotuning caches alone, so a second run on the same machine may show shorter first
steps: what --cold-start measures, each model's first eager step in a new process of this script
after the run (``cold_start`` in the JSON). DIR/gpt.json is rewritten after every variant (a run cut
short keeps what it measured); --time-limit starts no variant after so many seconds, so a run in a
bounded call still prints its table. Every variant trains the same steps on the same batches, so the
final losses agree to rounding (bf16 weights, or autocast) across models.

Cost on an H200 (16 host cores; torch 2.11), batch 8: an eager variant ~5 s; a compiled one's first
step 13-26 s (torch.nn ~25 s, kcourse ~13-23 s); triton's first variant in a process ~50 s more
(autotuning, unless its disk cache is warm), cute's ~23 s (compiles). Every default variant of the
three backends and torch.nn: ~7 minutes.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import traceback
from pathlib import Path

import torch

from benchmarks import common
from kcourse.modules import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
ARCHS = {
    "gpt2": dict(mlp="gelu", norm="layernorm", pos="learned", bias=True),
    "llama": dict(mlp="swiglu", norm="rmsnorm", pos="rope", bias=False, n_kv_head=4, tie_weights=False),
}
MODES = ("eager", "compile", "compile-ro", "autocast", "autocast+compile", "graphed")
BASELINE = {"eager": "eager", "graphed": "eager", "compile": "compile", "compile-ro": "compile",
            "autocast": "autocast", "autocast+compile": "autocast+compile"}
TORCH_NN_MODES = ("eager", "compile", "autocast+compile", "autocast")
KCOURSE_MODES = ("eager", "compile", "compile-ro", "autocast", "autocast+compile")
GRAPH_WARMUP = 2  # eager steps (of --warmup) before a graphed variant's capture
TARGETS = {"eager": 1.0, "compile": 1.0, "compile-ro": 1.0, "autocast": 0.95, "autocast+compile": 0.95, "graphed": 1.0}


def target(name: str) -> float:
    """Issue 28's target for a kcourse variant's ratio to its baseline."""
    return 0.97 if name == "pytorch:eager" else TARGETS[name.partition(":")[2]]


def torch_reference():
    """tests/torch_reference.py (the torch.nn twin of kcourse.modules)."""
    return common.load("tests/torch_reference.py")


def config(args) -> GPTConfig:
    if args.tiny:
        return GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64, **ARCHS[args.arch])
    # GPT-2 124M: 12 layers of width 768 (85M) + a 50304 x 768 embedding (39M) tied to the LM head
    return GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768, **ARCHS[args.arch])


def variant_names(args) -> tuple[list[str], dict[str, str]]:
    """The variants to run, in order, and the backends skipped with the reason."""
    backends, skipped = common.usable_backends(args.backends, args.cuda)
    models = ["torch.nn", *backends]
    names = [f"torch.nn:{m}" for m in TORCH_NN_MODES] + [f"{b}:{m}" for b in models[1:] for m in KCOURSE_MODES]
    if args.cuda_graph:
        names += [f"{b}:graphed" for b in models]
    if args.variants:
        wanted = args.variants.split(",")
        bad = [w for w in wanted if w not in MODES and w not in models and w not in ("torch.nn", *skipped)
               and w.rpartition(":")[2] not in MODES]
        if bad:
            raise SystemExit(f"--variants: unknown {', '.join(bad)}; give MODEL:MODE, a MODE ({', '.join(MODES)}) "
                             f"or a MODEL (torch.nn, {', '.join(args.backends)})")
        every = [f"{b}:{m}" for b in models for m in MODES]  # a name or a mode may pick a non-default variant
        chosen = {n for n in every if n in wanted or n.partition(":")[2] in wanted
                  or (n in names and n.partition(":")[0] in wanted)}
        if not args.no_baselines:  # each chosen variant's baseline comes along
            chosen |= {f"torch.nn:{BASELINE[n.partition(':')[2]]}" for n in chosen}
        names = [n for n in every if n in chosen]
    if not args.cuda:
        for n in [n for n in names if n.endswith((":graphed", ":compile-ro"))]:
            names.remove(n)
            skipped[n] = "CUDA graphs need CUDA"
    return names, skipped


def batches(args, c: GPTConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four (inputs, targets) pairs of random tokens, each (batch, T) and contiguous, on the device."""
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, c.vocab_size, (args.batch, c.block_size + 1), generator=gen) for _ in range(4)]
    return [(s[:, :-1].contiguous().to(args.device), s[:, 1:].contiguous().to(args.device)) for s in seqs]


def build(name: str, args, c: GPTConfig, initial: dict) -> torch.nn.Module:
    """The variant's model on the device, loaded with ``initial``; bf16 (--dtype) weights, or float32
    master weights for the autocast modes."""
    model_name, _, mode = name.partition(":")
    dtype = torch.float32 if mode.startswith("autocast") else getattr(torch, args.dtype)
    with torch.device(args.device):  # initialized there (fast), then overwritten
        model = torch_reference().GPT(c) if model_name == "torch.nn" else GPT(c, backend=model_name)
    model.load_state_dict(initial)
    return model.to(dtype)


def make_step(model, opt, mode: str, args, data):
    """``step(i)`` runs one training step on batch ``i % len(data)`` and returns the loss (a tensor)."""
    autocast = mode.startswith("autocast")
    forward = model
    if mode in ("compile", "compile-ro", "autocast+compile"):
        forward = torch.compile(model, fullgraph=not args.allow_graph_breaks,
                                mode="reduce-overhead" if mode == "compile-ro" else None)

    def train_step(x, y):
        if mode == "compile-ro":
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs may be overwritten
        with torch.autocast(torch.device(args.device).type, torch.bfloat16, enabled=autocast):
            _, loss = forward(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    if mode != "graphed":
        return lambda i: train_step(*data[i % len(data)])
    # steps 0 and 1 on a side stream (CUDA graphs require it), then capture one whole step
    static_x, static_y = (t.clone() for t in data[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(GRAPH_WARMUP):
            static_x.copy_(data[i % len(data)][0])
            static_y.copy_(data[i % len(data)][1])
            train_step(static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)  # the captured backward allocates the gradients in the graph's pool
    with torch.cuda.graph(graph):
        static_loss = train_step(static_x, static_y)

    def step(i):
        x, y = data[i % len(data)]
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        return static_loss

    return step


def warm_step(name: str, args, c: GPTConfig, initial: dict, data, warmup: int):
    """``(model, step)`` of variant ``name`` (AdamW, fused) after ``warmup`` steps, the GPU synchronized:
    for the experiments that time or profile a warm step."""
    model = build(name, args, c, initial)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step = make_step(model, opt, name.partition(":")[2], args, data)
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    return model, step


def run_variant(name: str, args, c: GPTConfig, initial: dict, data) -> dict:
    mode = name.partition(":")[2]
    cuda = args.cuda
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model = build(name, args, c, initial)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda, capturable=mode == "graphed")
    t0 = time.perf_counter()
    step = make_step(model, opt, mode, args, data)  # graphed: GRAPH_WARMUP steps and the capture
    done = GRAPH_WARMUP if mode == "graphed" else 0  # every variant trains the same steps on the same batches
    step(done)
    sync(args.device)
    first = time.perf_counter() - t0
    for i in range(done + 1, args.warmup):
        step(i)
    times = []
    if cuda:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
        events[0].record()
        for i in range(args.steps):
            loss = step(i)
            events[i + 1].record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])]
        host = host_times(step, args.steps)
    else:
        for i in range(args.steps):
            t = time.perf_counter()
            loss = step(i)
            times.append(time.perf_counter() - t)
    median = statistics.median(times)
    result = {"tokens_per_s": args.batch * c.block_size / median, "step_ms": 1e3 * median,
              "step_ms_mean": 1e3 * statistics.fmean(times), "step_ms_min": 1e3 * min(times),
              "first_step_s": first, "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
              "host_ms": 1e3 * statistics.median(host) if cuda else None, "final_loss": loss.item()}
    if args.profile:
        profile(step, args)
    return result


def host_times(step, steps: int, most: int = 5) -> list[float]:
    """The host's time for a step, in seconds, for up to ``most`` steps: each begun on an idle GPU
    (after a synchronization), timed until ``step`` returns, so it measures the Python and launches
    alone, never a wait for the GPU (a step enqueues far fewer kernels than CUDA's launch queue
    holds). Near the step's GPU time or above it, the host sets the pace. An upper bound: on H200
    hosts a step begun after a synchronization has taken up to 30% longer on the host than the
    steps of the pipelined loop took in all (host_ms 49 ms for 37.7 ms steps, 2026-11-29)."""
    times = []
    for i in range(min(steps, most)):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return times


def measure(name: str, args, c: GPTConfig, initial: dict, data) -> dict:
    """``run_variant``, with an error reported rather than raised; frees everything afterwards."""
    print(f"{name} ...", flush=True)
    try:
        result = run_variant(name, args, c, initial, data)
    except Exception as e:  # one failing variant must not hide the others
        tail = "".join(traceback.format_exc().splitlines(keepends=True)[-25:])[-4000:]
        print(f"  failed: {type(e).__name__}: {e}\n{tail}", flush=True)
        result = {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": tail}
    gc.collect()  # the model, optimizer, graphs and (after an error) the traceback's frames
    if "compile" in name:
        torch._dynamo.reset()
    if args.cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    if "error" not in result:
        print(f"  {result['tokens_per_s']:,.0f} tokens/s, first step {result['first_step_s']:.2f} s", flush=True)
    return result


def profile(step, args, steps: int = 3) -> None:
    """``steps`` more steps under torch.profiler; prints the kernels and ops that take the most GPU
    time, those that take the most host time, and whether the step waits on the host: the GPU's
    busy time per step (its kernels' self time) against the step's wall time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sync(args.device)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(steps):
            step(i)
        sync(args.device)
    wall_ms = (time.perf_counter() - start) / steps * 1e3
    events = prof.key_averages()
    if args.cuda:
        print(events.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=60))
    print(events.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))
    line = f"  profiled: {wall_ms:.1f} ms a step (the profiler's own cost included)"
    if args.cuda:
        gpu_ms = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        gpu_ms /= 1e3 * steps
        line += f", GPU busy {gpu_ms:.1f} ms of it ({gpu_ms / wall_ms:.0%}: well below 100%, the host sets the pace)"
    print(line, flush=True)


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


PEAK_TFLOPS = {"H100 80GB HBM3": 989.4, "H200": 989.4}  # dense bfloat16 tensor-core peak (SXM parts): MFU's denominator


def flops_per_token(model: torch.nn.Module, c: GPTConfig) -> float:
    """Training FLOPs per token, forward and backward: 6 per weight of every matmul (each 2-D weight
    but the embeddings', and the LM head, tied or not) plus 12 L d T for attention's two products
    over the whole T x T (PaLM's appendix B convention; the causal half is not subtracted)."""
    named = dict(model.named_parameters())  # a tied head appears once, as wte.weight
    matmul = sum(p.numel() for n, p in named.items() if p.dim() == 2 and not n.startswith(("wte.", "wpe.")))
    if "lm_head.weight" not in named:
        matmul += c.vocab_size * c.n_embd
    return 6 * matmul + 12 * c.n_layer * c.n_embd * c.block_size


def ratios(results: dict) -> None:
    """Each variant's tokens/s over its baseline's (``ratio``) and over torch.nn:eager's, and its MFU
    (model FLOPs per second over the device's peak, where known), in place."""
    eager = results["variants"].get("torch.nn:eager", {}).get("tokens_per_s")
    m = results["meta"]
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in m.get("device", "")), None)
    for name, r in results["variants"].items():
        if "tokens_per_s" not in r:
            continue
        r["mfu"] = r["tokens_per_s"] * m["flops_per_token"] / (peak * 1e12) if peak else None
        mode = name.partition(":")[2]
        base_name = f"torch.nn:{BASELINE[mode]}"
        base = results["variants"].get(base_name, {}).get("tokens_per_s")
        r["baseline"] = base_name
        r["ratio"] = r["tokens_per_s"] / base if base else None
        r["vs_torch_nn_eager"] = r["tokens_per_s"] / eager if eager else None


def meta(args, c: GPTConfig, n_params: int) -> dict:
    return {**common.environment(args.device),
            "arch": args.arch, "dtype": args.dtype, "autocast_dtype": "bfloat16", "batch": args.batch,
            "block_size": c.block_size, "n_layer": c.n_layer, "n_embd": c.n_embd, "parameters": n_params,
            "steps": args.steps, "warmup": args.warmup, "fullgraph": not args.allow_graph_breaks}


def table(results: dict) -> str:
    m = results["meta"]
    lines = [f"{m['parameters'] / 1e6:.1f}M-parameter {m['arch']} GPT, T={m['block_size']}, batch {m['batch']}, "
             f"{m['device']}, torch {m['torch']}, triton {m['triton']}",
             f"  {'variant':26s} {'tokens/s':>11s} {'ratio':>6s}  {'baseline':23s} {'ms/step':>8s} {'host ms':>7s} "
             f"{'peak GiB':>8s} "
             f"{'1st step s':>10s} {'loss':>7s} {'MFU':>6s}"]
    for name, r in results["variants"].items():
        if "error" in r:
            lines.append(f"  {name:26s} FAILED: {r['error'].splitlines()[0][:150]}")
            continue
        ratio = f"{r['ratio']:.2f}x" if r.get("ratio") else "-"
        if r.get("ratio") and not name.startswith("torch.nn:") and r["ratio"] < target(name):
            ratio += "!"
        mem = f"{r['peak_memory_gib']:.2f}" if r["peak_memory_gib"] is not None else "-"
        host = f"{r['host_ms']:.1f}" if r.get("host_ms") is not None else "-"
        lines.append(f"  {name:26s} {r['tokens_per_s']:>11,.0f} {ratio:>7s} {r.get('baseline', ''):23s} "
                     f"{r['step_ms']:8.1f} {host:>7s} {mem:>8s} {r['first_step_s']:10.2f} {r['final_loss']:7.4f} "
                     f"{format(r['mfu'], '.1%') if r.get('mfu') is not None else '-':>6s}")
    if results.get("cold_start"):
        lines.append("  first eager step in a new process (caches on disk from this run): " + ", ".join(
            f"{m} {r['first_step_s']:.2f} s" if "first_step_s" in r else f"{m} failed"
            for m, r in results["cold_start"].items()))
    for b, why in results["skipped"].items():
        lines.append(f"  {b if ':' in b else b + ':*':26s} skipped: {why}")
    lines.append("  targets (ratio to baseline): eager >= 1.0 (pytorch backend >= 0.97), compile >= 1.0, "
                 "autocast >= 0.95; ! marks a miss")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="writes OUT/gpt.json")
    p.add_argument("--backends", default="pytorch,triton,cute", help="kcourse backends (comma list)")
    p.add_argument("--backend", dest="backends", help=argparse.SUPPRESS)  # the old spelling
    p.add_argument("--variants", default=None,
                   help="comma list of MODEL:MODE names, MODEs or MODELs (all variants matching any); "
                        "default: every default variant of every backend")
    p.add_argument("--arch", default="gpt2", choices=list(ARCHS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="weights of the non-autocast variants (autocast ones keep float32 master weights)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them, the first one included (>= 1)")
    p.add_argument("--tiny", action="store_true", help="a tiny model: a smoke test of this script")
    p.add_argument("--cuda-graph", action="store_true", help="add the graphed variants (a hand-captured CUDA graph)")
    p.add_argument("--no-baselines", action="store_true",
                   help="with --variants: run only the variants named, not their torch.nn baselines too")
    p.add_argument("--time-limit", type=float, default=None,
                   help="start no variant after this many seconds (the rest are recorded as not run)")
    p.add_argument("--allow-graph-breaks", action="store_true", help="torch.compile without fullgraph=True")
    p.add_argument("--profile", action="store_true", help="print where each variant's step time goes (torch.profiler)")
    p.add_argument("--cold-start", action="store_true",
                   help="after the variants, each backend's first eager step in a new process (compiled-kernel and "
                        "autotuning caches as this run left them)")
    args = p.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    args.cuda = torch.device(args.device).type == "cuda"
    if args.cuda_graph and not args.cuda:
        p.error("--cuda-graph needs --device cuda")
    if args.warmup < 1 or args.steps < 1:
        p.error("--warmup and --steps must be >= 1")
    if args.cuda_graph or (args.variants and "graphed" in args.variants):
        if args.warmup <= GRAPH_WARMUP:
            p.error(f"graphed variants need --warmup > {GRAPH_WARMUP} (eager steps before the capture)")
    names, skipped = variant_names(args)

    c = config(args)
    torch.manual_seed(0)
    model = GPT(c)
    initial = model.state_dict()  # float32 on the CPU; every variant starts from these weights
    n_params, flops = sum(t.numel() for t in model.parameters()), flops_per_token(model, c)
    del model
    data = batches(args, c)
    results = {"meta": {**meta(args, c, n_params), "flops_per_token": flops}, "skipped": skipped, "variants": {}}
    for b, why in skipped.items():
        print(f"{b}: skipped: {why}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for name in names:
        if args.time_limit and time.perf_counter() - start > args.time_limit:
            results["variants"][name] = {"error": f"not run: --time-limit {args.time_limit:g} s reached"}
            continue
        results["variants"][name] = measure(name, args, c, initial, data)
        ratios(results)
        (args.out / "gpt.json").write_text(json.dumps(results, indent=1) + "\n")
    if args.cold_start:
        results["cold_start"] = cold_start(args, sorted({n.partition(":")[0] for n in names}))
        (args.out / "gpt.json").write_text(json.dumps(results, indent=1) + "\n")
    print(table(results), flush=True)
    return results


def cold_start(args, models: list[str]) -> dict:
    """Each model's first eager step (its model built, one AdamW step, synchronized) in a new Python
    process, as a user's next run meets it: the kernels compiled and the autotuning picks made by
    this run are on disk (Triton's cache and its autotuning picks; kcourse's cute kernels,
    ``kcourse.blas.cute._disk``), nothing is in memory."""
    import subprocess
    import sys
    import tempfile
    found = {}
    for model in models:
        with tempfile.TemporaryDirectory() as out:
            command = [sys.executable, "-m", "benchmarks.gpt", "--out", out, "--backends",
                       model if model != "torch.nn" else "pytorch", "--variants", f"{model}:eager", "--no-baselines",
                       "--steps", "1", "--warmup", "1", "--arch", args.arch, "--device", args.device,
                       "--dtype", args.dtype, "--batch", str(args.batch), *(["--tiny"] if args.tiny else [])]
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
            wall = time.perf_counter() - start
            try:
                first = json.loads((Path(out) / "gpt.json").read_text())["variants"][f"{model}:eager"]["first_step_s"]
                found[model] = {"first_step_s": first, "process_s": wall}
            except (OSError, KeyError, ValueError):
                found[model] = {"error": (done.stderr or done.stdout)[-2000:]}
        first = found[model].get("first_step_s", float("nan"))
        print(f"{model}: first step in a new process {first:.2f} s", flush=True)
    return found


if __name__ == "__main__":
    main()
