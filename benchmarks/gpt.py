"""Training throughput of a ~50M-parameter GPT: kcourse.modules on a backend against the same
architecture built from torch.nn (eager), in one run, with peak memory beside it.

    python benchmarks/gpt.py --out DIR                         # H100: bf16, T = 1024, triton vs torch.nn
    python benchmarks/gpt.py --out DIR --cuda-graph            # also each model's step replayed as a CUDA graph
    python benchmarks/gpt.py --out DIR --arch llama --backend pytorch
    python benchmarks/gpt.py --out /tmp/g --device cpu --tiny  # smoke test of this script

Each model trains `--steps` AdamW steps on random tokens after `--warmup` steps (compiles and
autotuning); tokens/s = batch * T * steps / elapsed (CUDA-synchronized wall clock). Both models
start from the same weights (the torch.nn one loads kcourse's state dict), and every variant of a
model starts from its initial weights again. Writes DIR/gpt.json.

--cuda-graph adds a "graphed" variant of each model: after the warm-up steps (on a side stream, as
CUDA graphs require), one whole training step -- forward, backward, AdamW(capturable=True) -- is
captured with torch.cuda.graph on static input buffers, and each timed step copies its batch into
those buffers and replays the graph: no Python, no launch overhead, the GPU time alone. torch.nn
eager stays the baseline of the ratios; torch.nn graphed is reported beside it for honesty. A
variant that fails (a capture error, say) is reported with its error; the others still run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # torch_reference.py
import torch_reference  # noqa: E402

from kcourse.modules import GPT, GPTConfig  # noqa: E402

ARCHS = {
    "gpt2": dict(mlp="gelu", norm="layernorm", pos="learned", bias=True),
    "llama": dict(mlp="swiglu", norm="rmsnorm", pos="rope", bias=False, n_kv_head=4, tie_weights=False),
}


def config(args) -> GPTConfig:
    if args.tiny:
        return GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64, **ARCHS[args.arch])
    # 8 layers of width 512 (25M) + a 50304 x 512 embedding (26M): ~51M parameters
    return GPTConfig(vocab_size=50304, block_size=1024, n_layer=8, n_head=8, n_embd=512, **ARCHS[args.arch])


def batches(args, c: GPTConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four (inputs, targets) pairs of random tokens, each (batch, T) and contiguous, on the device."""
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, c.vocab_size, (args.batch, c.block_size + 1), generator=gen) for _ in range(4)]
    return [(s[:, :-1].contiguous().to(args.device), s[:, 1:].contiguous().to(args.device)) for s in seqs]


def train_step(model, opt, x, y) -> torch.Tensor:
    _, loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def graphed_step(model, opt, data, warmup: int):
    """Warm up on a side stream, capture one training step in a CUDA graph, and return
    ``step(i)``: copy batch ``i`` into the static inputs, replay, return the static loss."""
    static_x, static_y = (t.clone() for t in data[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            train_step(model, opt, static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)  # the captured backward allocates the gradients in the graph's pool
    with torch.cuda.graph(graph):
        _, static_loss = model(static_x, static_y)
        static_loss.backward()
        opt.step()

    def step(i):
        x, y = data[i % len(data)]
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        return static_loss

    return step


def throughput(model, args, c: GPTConfig, graphed: bool) -> dict:
    cuda = args.device == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda, capturable=graphed)
    data = batches(args, c)
    if cuda:  # from here: the peak covers a graph's capture, whose activations live in the graph's pool after it
        torch.cuda.reset_peak_memory_stats()
    if graphed:
        step = graphed_step(model, opt, data, args.warmup)
        warmup = 2  # replays: the first one uploads the graph
    else:
        step = lambda i: train_step(model, opt, *data[i % len(data)])  # noqa: E731
        warmup = args.warmup
    for i in range(warmup):
        step(i)
    sync(args.device)
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(i)
    sync(args.device)
    elapsed = time.perf_counter() - t0
    if args.profile and not graphed:
        profile(step, args)
    return {"tokens_per_s": args.batch * c.block_size * args.steps / elapsed, "step_ms": 1e3 * elapsed / args.steps,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "final_loss": loss.item()}


def measure(model, args, c: GPTConfig, graphed: bool) -> dict:
    """``throughput`` from the model's initial weights; an error is reported, not raised."""
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        return throughput(model, args, c, graphed)
    except Exception as e:  # one failing variant must not hide the others
        print(f"  failed: {type(e).__name__}: {e}", flush=True)
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        model.load_state_dict(initial)
        model.zero_grad(set_to_none=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()


def profile(step, args) -> None:
    """Three more steps under torch.profiler; prints the kernels and ops that take the most time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(3):
            step(i)
        sync(args.device)
    key = "cuda_time_total" if args.device == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=60))


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--backend", default="triton")
    p.add_argument("--arch", default="gpt2", choices=list(ARCHS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="a tiny model: a smoke test of this script")
    p.add_argument("--cuda-graph", action="store_true", help="also time each model's step captured in a CUDA graph")
    p.add_argument("--profile", action="store_true", help="print where each model's step time goes (torch.profiler)")
    args = p.parse_args(argv)
    if args.cuda_graph and args.device != "cuda":
        p.error("--cuda-graph needs --device cuda")

    c = config(args)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    ours = GPT(c, backend=args.backend).to(args.device, dtype)
    theirs = torch_reference.GPT(c).to(args.device, dtype)
    theirs.load_state_dict(ours.state_dict())
    n_params = sum(q.numel() for q in ours.parameters())
    results = {"meta": {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                        "torch": torch.__version__, "arch": args.arch, "dtype": args.dtype, "batch": args.batch,
                        "block_size": c.block_size, "parameters": n_params, "steps": args.steps}}
    kc = f"kcourse/{args.backend}"
    variants = [("torch.nn", theirs, False), (kc, ours, False)]
    if args.cuda_graph:
        variants[1:1] = [("torch.nn graphed", theirs, True)]
        variants.append((f"{kc} graphed", ours, True))
    for name, model, graphed in variants:
        print(f"{name} ...", flush=True)
        results[name] = measure(model, args, c, graphed)
    base = results["torch.nn"].get("tokens_per_s")
    ratios = {name: results[name]["tokens_per_s"] / base for name, _, _ in variants[1:]
              if base and "tokens_per_s" in results[name]}
    results["speedup_vs_torch_nn"] = ratios.get(kc)  # kcourse eager / torch.nn eager, as before --cuda-graph
    results["ratios_vs_torch_nn_eager"] = ratios
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpt.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"{n_params / 1e6:.1f}M-parameter {args.arch} GPT, T={c.block_size}, batch {args.batch}, {args.dtype}:")
    for name, _, _ in variants:
        r = results[name]
        if "error" in r:
            print(f"  {name:24s} {r['error']}")
            continue
        mem = f", peak {r['peak_memory_gib']:.2f} GiB" if r["peak_memory_gib"] is not None else ""
        ratio = f"  {ratios[name]:.2f}x torch.nn eager" if name in ratios else ""
        print(f"  {name:24s} {r['tokens_per_s']:>12,.0f} tokens/s  {r['step_ms']:8.1f} ms/step{mem}, "
              f"loss {r['final_loss']:.4f}{ratio}")
    print("  target: kcourse (graphed) / torch.nn eager >= 1.0")
    return results


if __name__ == "__main__":
    main()
