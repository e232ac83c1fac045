"""Training throughput of a ~50M-parameter GPT: kcourse.modules on a backend against the same
architecture built from torch.nn (eager), in one run, with peak memory beside it.

    python benchmarks/gpt.py --out DIR                         # H100: bf16, T = 1024, triton vs torch.nn
    python benchmarks/gpt.py --out DIR --arch llama --backend pytorch
    python benchmarks/gpt.py --out /tmp/g --device cpu --tiny  # smoke test of this script

Each model trains `--steps` AdamW steps on random tokens after `--warmup` steps (compiles and
autotuning); tokens/s = batch * T * steps / elapsed (CUDA-synchronized wall clock). Both models
start from the same weights (the torch.nn one loads kcourse's state dict). Writes DIR/gpt.json.
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


def throughput(model, args, c: GPTConfig) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.device == "cuda")
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, c.vocab_size, (args.batch, c.block_size + 1), generator=gen).to(args.device)
               for _ in range(4)]

    def step(i):
        seq = batches[i % len(batches)]
        _, loss = model(seq[:, :-1], seq[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for i in range(args.warmup):
        step(i)
    sync(args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(i)
    sync(args.device)
    elapsed = time.perf_counter() - t0
    if args.profile:
        profile(step, args)
    return {"tokens_per_s": args.batch * c.block_size * args.steps / elapsed, "step_ms": 1e3 * elapsed / args.steps,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None,
            "final_loss": loss.item()}


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
    p.add_argument("--profile", action="store_true", help="print where each model's step time goes (torch.profiler)")
    args = p.parse_args(argv)

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
                        "block_size": c.block_size, "parameters": n_params, "steps": args.steps},
               "torch.nn": throughput(theirs, args, c)}
    del theirs
    results[f"kcourse/{args.backend}"] = throughput(ours, args, c)
    ratio = results[f"kcourse/{args.backend}"]["tokens_per_s"] / results["torch.nn"]["tokens_per_s"]
    results["speedup_vs_torch_nn"] = ratio
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpt.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"{n_params / 1e6:.1f}M-parameter {args.arch} GPT, T={c.block_size}, batch {args.batch}, {args.dtype}:")
    for name in ("torch.nn", f"kcourse/{args.backend}"):
        r = results[name]
        mem = f", peak {r['peak_memory_gib']:.2f} GiB" if r["peak_memory_gib"] is not None else ""
        print(f"  {name:16s} {r['tokens_per_s']:>12,.0f} tokens/s  {r['step_ms']:8.1f} ms/step{mem}")
    print(f"  kcourse / torch.nn: {ratio:.2f}x (target >= 1.0)")
    return results


if __name__ == "__main__":
    main()
