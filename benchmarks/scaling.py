"""Weak scaling of GPT-2 124M training from one GPU to several: DDP and FSDP2, each kcourse backend
and the torch.nn baseline, every run a real ``examples/train_gpt.py`` started by torchrun.

    python -m benchmarks.scaling --out DIR                                   # 1 vs 2 GPUs, ddp and fsdp, every model
    python -m benchmarks.scaling --out DIR --backends torch.nn,triton --steps 15 --time-limit 420
    python -m benchmarks.scaling --out DIR --dists ddp --batch-per-gpu 16
    python -m benchmarks.scaling --out DIR --dists ddp --rounds 3             # x1 and x2 interleaved three times
    python -m benchmarks.scaling --out DIR --dists ddp --cuda-graph          # each step a CUDA graph replay
    python -m benchmarks.scaling --out /tmp/s --tiny --device cpu --backends pytorch --dists ddp --steps 2  # smoke test
    python -m benchmarks.history add DIR/scaling.json                       # into the benchmark history

Each configuration is one run of ``examples/train_gpt.py`` in fresh processes: ``x1`` is one
process on one GPU (no --dist), ``ddp xN`` and ``fsdp xN`` are ``torchrun --standalone
--nproc_per_node N ... --dist ddp|fsdp`` (one process per GPU; on the CPU, gloo). The model is GPT-2
124M (12 layers, width 768, 12 heads, vocabulary 50304, T = 1024; ``--tiny``: a 2-layer toy) on
train_gpt.py's byte corpus; every GPU takes ``--batch-per-gpu`` sequences a step (weak scaling: N
GPUs train a global batch N times as large), with train_gpt.py's defaults otherwise: float32 master
weights and the forward under bfloat16 autocast on CUDA (``--no-amp``, ``--dtype bfloat16``: the
other ways), AdamW, gradient clipping, lr 6e-4 with warm-up and cosine decay. The torch.nn model
(``tests/torch_reference.py``, loaded with the initial weights of kcourse's GPT) runs through the
same training code, with the model class swapped (``--torch-nn-worker``); it has no FSDP2 run,
since ``kcourse.distributed.wrap`` shards per kcourse ``Block``.

train_gpt.py --metrics writes each step's wall-clock time (the step ends when the all-reduced loss
reaches the host, so every step is synchronized on every rank), the losses (rank 0's global-batch
loss) and every rank's peak memory (torch.cuda.max_memory_allocated: weights, gradients, optimizer
state, activations; not NCCL's buffers). Per run: tokens/s per GPU = batch per GPU * T / (median
time of the ``--steps`` steps after ``--warmup`` untimed ones, the first included), scaling
efficiency = (tokens/s per GPU on N GPUs) / (tokens/s on 1 GPU) of the same model, the peak memory
per GPU (the max over ranks), the host's issue time (``host ms``: the slowest rank's median time
from a step's start until the host has launched it, before the loss is read; near the step time,
the host sets the pace), the first step's time (kernel compiling and autotuning: triton tunes
in each process, ~50 s for GPT-2 on an H100 unless its disk cache already holds the picks, which
the first triton run writes) and the whole run's wall time. Targets: DDP's efficiency >= 0.90 on 2
GPUs; FSDP2's peak memory per GPU below DDP's.

DIR/scaling.json is rewritten after every run (``python -m benchmarks.history add`` takes it); a
failing run is recorded with its log's tail and the others still run; ``--time-limit`` starts no
run after so many seconds. DIR/scaling.png has each model's loss curves, 1 GPU beside N; each run's
log, metrics and train_gpt.py's own loss.png are in DIR/runs/<run>/. Runs go model by model, 1 GPU
first (a model's first run compiles and tunes its kernels on one GPU, its later runs read the disk
caches). ``--rounds R`` runs that plan R times over: each configuration keeps the median of its
rounds, and each efficiency is the median of the rounds' ratios, a run over its model's 1-GPU run
of the same round. That host's step times drift by tens of percent between minutes, which one round
puts straight into the ratio.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import kcourse
from benchmarks import common
from benchmarks import gpt
from kcourse import distributed
from kcourse.modules import GPT

ROOT = Path(__file__).resolve().parents[1]
LR = 6e-4  # nanoGPT's for GPT-2 124M
EFFICIENCY_TARGET = 0.90  # DDP on 2 GPUs


def train_gpt():
    """examples/train_gpt.py."""
    return common.load("examples/train_gpt.py")


def twin_of(kcourse_gpt):
    """A builder of the torch.nn twin (``tests/torch_reference.py``) with the initial weights that
    ``kcourse_gpt(config, backend)`` would have (the same seed: it builds one first and loads them)."""
    def twin(config, backend=None):
        initial = kcourse_gpt(config, backend=backend).state_dict()
        model = gpt.torch_reference().GPT(config)
        model.load_state_dict(initial)
        model.config = config
        return model
    return twin


def torch_nn_worker(argv: list[str]) -> None:
    """One process of a torch.nn run: train_gpt.py's ``train`` with the torch.nn twin in place of
    kcourse's GPT (``twin_of``)."""
    tg = train_gpt()
    tg.GPT = twin_of(tg.GPT)
    try:
        tg.train(tg.parse_args(argv))
    finally:
        distributed.finish()


def config_name(dist: str | None, n: int) -> str:
    """``x1`` (one process, no --dist), ``ddp x2``, ``fsdp x2`` ..."""
    return f"x{n}" if n == 1 else f"{dist} x{n}"


def plan(args) -> tuple[list[tuple[str, str | None, int]], dict[str, str]]:
    """The runs, (model, dist, processes) in order, and what is skipped with the reason."""
    info = kcourse.backend.backends()
    runs, skipped = [], {}
    for model in args.backends:
        if model != "torch.nn" and model not in info:
            raise SystemExit(f"unknown backend {model!r}; valid: torch.nn, {', '.join(info)}")
        if model == "python" and args.cuda:
            skipped[model] = "too slow for this benchmark on CUDA"
            continue
        if model != "torch.nn" and not info[model].available:
            skipped[model] = f"{info[model].reason} (fix: {info[model].fix})"
            continue
        for n in args.gpus:
            for dist in [None] if n == 1 else args.dists:
                if dist == "fsdp" and args.cuda_graph:
                    skipped[f"{model} {config_name(dist, n)}"] = "--cuda-graph captures DDP's all-reduces, not FSDP2's"
                elif model == "torch.nn" and dist == "fsdp":
                    skipped[f"{model} {config_name(dist, n)}"] = \
                        "kcourse.distributed.wrap shards per kcourse Block, not the torch.nn twin's blocks"
                else:
                    runs.append((model, dist, n))
    return runs, skipped


def command(model: str, dist: str | None, n: int, args, c, run_dir: Path) -> list[str]:
    """The command line of one run: train_gpt.py (or the torch.nn worker) in one process or under torchrun."""
    launch = [sys.executable] if n == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                              "--nproc_per_node", str(n)]
    entry = ["-m", "benchmarks.scaling", "--torch-nn-worker"] if model == "torch.nn" else ["examples/train_gpt.py"]
    train = ["--backend", "pytorch" if model == "torch.nn" else model, "--device", args.device,
             "--batch-size", args.batch_per_gpu * n, "--block-size", c.block_size, "--n-layer", c.n_layer,
             "--n-head", c.n_head, "--n-embd", c.n_embd, "--vocab-size", c.vocab_size, "--dtype", args.dtype,
             "--lr", LR, "--steps", args.warmup + args.steps, "--sample", 0, "--quiet", "--no-save",
             "--out", run_dir, "--metrics", run_dir / "metrics.json"]
    if dist:
        train += ["--dist", dist]
    if args.amp is not None:
        train.append("--amp" if args.amp else "--no-amp")
    if args.compile:  # on one GPU too, each Block compiled and the rest eager, as --dist compiles
        train += ["--compile"] + ["--compile-blocks"] * (dist is None)
    if args.cuda_graph:
        train.append("--cuda-graph")
    return launch + entry + [str(a) for a in train]


def stop(proc: subprocess.Popen) -> None:
    """End a run still going: SIGTERM (torchrun passes it to its workers, each started in a process
    group of its own, and waits for them), then SIGKILL after a minute."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(model: str, dist: str | None, n: int, args, c) -> dict:
    """One configuration in fresh processes; its measurements, or its error and log's tail."""
    name = f"{model} {config_name(dist, n)}"
    run_dir = args.out / "runs" / name.replace(" ", "-")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.json").unlink(missing_ok=True)
    cmd = command(model, dist, n, args, c, run_dir)
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    if not args.cuda:  # one thread a process, as torchrun gives each of several: x1 and xN alike
        env.setdefault("OMP_NUM_THREADS", "1")
    print(f"{name} ...", flush=True)
    t0 = time.perf_counter()
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            rc = f"stopped after --run-timeout {args.run_timeout:g} s"
        finally:  # a timeout, or this process interrupted or terminated: the run must not outlive it
            stop(proc)
    wall = time.perf_counter() - t0
    result = {"model": model, "dist": dist, "gpus": n, "command": shlex.join(cmd), "wall_s": wall}
    metrics = run_dir / "metrics.json"
    if rc != 0 or not metrics.exists():
        tail = (run_dir / "log.txt").read_text(errors="replace")[-3000:]
        print(f"  failed ({rc}):\n{tail}", flush=True)
        return {**result, "error": rc if isinstance(rc, str) else f"exit status {rc}", "log_tail": tail}
    m = json.loads(metrics.read_text())
    timed = m["step_s"][args.warmup:]
    median = statistics.median(timed)
    issues = [statistics.median(r[args.warmup:]) for r in m.get("issue_s_per_rank", []) if r[args.warmup:]]
    peaks = m["peak_memory_bytes"]
    mode = "+".join(["autocast"] * m["amp"] + ["compile-blocks"] * (m["compile"] == "blocks")
                    + ["compile"] * (m["compile"] == "model") + ["graphed"] * bool(m.get("cuda_graph")))
    result.update(
        mode=f"{mode} {config_name(dist, n)}" if mode else config_name(dist, n), device=m["device"],
        parameters=m["parameters"], dtype=m["dtype"], amp=m["amp"], compile=m["compile"],
        tokens_per_s_per_gpu=m["tokens_per_step"] / n / median, tokens_per_s=m["tokens_per_step"] / median,
        step_ms=1e3 * median, step_ms_mean=1e3 * statistics.fmean(timed), step_ms_min=1e3 * min(timed),
        host_ms=1e3 * max(issues) if issues else None, first_step_s=m["step_s"][0],
        peak_memory_gib=max(peaks) / 2**30 if peaks[0] is not None else None,
        peak_memory_gib_per_rank=[p / 2**30 for p in peaks] if peaks[0] is not None else None,
        step_s=m["step_s"], losses=m["losses"], final_loss=m["losses"][-1])
    print(f"  {result['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, first step {result['first_step_s']:.1f} s, "
          f"run {wall:.0f} s", flush=True)
    return result


def merge_rounds(rounds: list[dict]) -> dict:
    """One configuration's runs over ``--rounds`` as one result: the first measured round's record with
    the median step time and tokens/s of the measured rounds, and each round's in ``rounds``."""
    measured = [r for r in rounds if "tokens_per_s_per_gpu" in r]
    if not measured:
        return rounds[-1]
    if len(rounds) == 1:
        return rounds[0]
    merged = dict(measured[0])
    for key in ("tokens_per_s_per_gpu", "tokens_per_s", "step_ms", "host_ms"):
        values = [r[key] for r in measured if r.get(key) is not None]
        merged[key] = statistics.median(values) if values else None
    merged["rounds"] = [{k: r.get(k) for k in ("tokens_per_s_per_gpu", "step_ms", "host_ms", "first_step_s", "wall_s",
                                               "error")
                         if r.get(k) is not None} for r in rounds]
    return merged


def efficiencies(results: dict) -> None:
    """Each multi-GPU run's tokens/s per GPU over its model's 1-GPU run's (``efficiency``), in place.
    Over several rounds: the median of each round's ratio, a run over the 1-GPU run of its own round
    (nearest in time, so a drift in the host's speed between rounds cancels out)."""
    runs = results["runs"]
    for r in runs.values():
        base = runs.get(f"{r['model']} x1", {})
        if "tokens_per_s_per_gpu" not in r or r["gpus"] == 1 or not base.get("tokens_per_s_per_gpu"):
            continue
        pairs = [(a.get("tokens_per_s_per_gpu"), b.get("tokens_per_s_per_gpu"))
                 for a, b in zip(r.get("rounds", []), base.get("rounds", []))]
        ratios = [a / b for a, b in pairs if a and b]
        one = base["tokens_per_s_per_gpu"]
        r["efficiency"] = statistics.median(ratios) if ratios else r["tokens_per_s_per_gpu"] / one
        if ratios:
            r["efficiency_rounds"] = ratios


def meta(args, c, runs: dict) -> dict:
    """benchmarks/gpt.py's metadata (versions, commit, shape), the device as the runs saw it."""
    with torch.device("meta"):
        n_params = sum(p.numel() for p in GPT(c).parameters())
    fields = argparse.Namespace(cuda=False, device="cpu", arch="gpt2", dtype=args.dtype, batch=args.batch_per_gpu,
                                steps=args.steps, warmup=args.warmup, allow_graph_breaks=False)
    m = gpt.meta(fields, c, n_params)
    del m["fullgraph"]
    devices = [r["device"] for r in runs.values() if "device" in r]
    m.update(device=devices[0] if devices else m["device"], date_utc=args.date,
             batch_per_gpu=args.batch_per_gpu, amp=args.amp, compile=args.compile,
             cuda_graph=args.cuda_graph)
    return m


def plot(results: dict, path: Path) -> None:
    """Each model's loss curves (rank 0's global-batch loss per step), one panel per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(r["model"] for r in results["runs"].values() if "losses" in r))
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False, sharey=True)
    for ax, model in zip(axes[0], models):
        for r in results["runs"].values():
            if r["model"] == model and "losses" in r:
                label = f"{config_name(r['dist'], r['gpus'])} ({r['tokens_per_s_per_gpu']:,.0f} tok/s/GPU)"
                ax.plot(r["losses"], label=label)
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("train loss (nats)")
    m = results["meta"]
    fig.suptitle(f"{m['parameters'] / 1e6:.1f}M GPT, T={m['block_size']}, batch {m['batch_per_gpu']} per GPU, "
                 f"{m['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(results: dict) -> str:
    m, runs = results["meta"], results["runs"]
    weights = f"{m['dtype']} weights" + (" + bfloat16 autocast" if any(r.get("amp") for r in runs.values()) else "")
    lines = [f"{m['parameters'] / 1e6:.1f}M-parameter GPT, T={m['block_size']}, batch {m['batch_per_gpu']} per GPU, "
             f"{weights}, {m['device']}, torch {m['torch']}, triton {m['triton']}",
             f"  {'run':18s} {'tok/s/GPU':>10s} {'tok/s':>10s} {'efficiency':>10s} {'ms/step':>8s} {'host ms':>8s} "
             f"{'peak GiB':>9s} {'1st step s':>10s} {'run s':>6s} {'loss':>7s}"]
    for name, r in runs.items():
        if "tokens_per_s_per_gpu" not in r:
            error = r["error"].splitlines()[0][:150]
            lines.append(f"  {name:18s} {error if error.startswith('not run') else 'FAILED: ' + error}")
            continue
        eff = f"{r['efficiency']:.3f}" if r.get("efficiency") is not None else "-"
        if r["dist"] == "ddp" and r.get("efficiency") is not None and r["efficiency"] < EFFICIENCY_TARGET:
            eff += "!"
        mem = f"{r['peak_memory_gib']:.2f}" if r["peak_memory_gib"] is not None else "-"
        ddp = runs.get(f"{r['model']} {config_name('ddp', r['gpus'])}", {}).get("peak_memory_gib")
        if r["dist"] == "fsdp" and r["peak_memory_gib"] is not None and ddp is not None and r["peak_memory_gib"] >= ddp:
            mem += "!"
        host = f"{r['host_ms']:.1f}" if r.get("host_ms") is not None else "-"
        lines.append(f"  {name:18s} {r['tokens_per_s_per_gpu']:>10,.0f} {r['tokens_per_s']:>10,.0f} {eff:>10s} "
                     f"{r['step_ms']:8.1f} {host:>8s} {mem:>9s} {r['first_step_s']:10.1f} {r['wall_s']:6.0f} "
                     f"{r['final_loss']:7.3f}")
    for what, why in results["skipped"].items():
        lines.append(f"  {what:18s} skipped: {why}")
    lines.append(f"  targets: DDP efficiency >= {EFFICIENCY_TARGET:.2f} (tokens/s per GPU over 1 GPU's); FSDP2 peak "
                 "memory per GPU below DDP's; ! marks a miss")
    return "\n".join(lines)


def main(argv=None) -> dict | None:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    if argv[:1] == ["--torch-nn-worker"]:
        return torch_nn_worker(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="writes OUT/scaling.json, OUT/scaling.png, OUT/runs/")
    p.add_argument("--backends", default="torch.nn,pytorch,triton,cute",
                   help="models to run, in this order: torch.nn and kcourse backends (comma list)")
    p.add_argument("--gpus", default="1,2", help="process counts (comma list); 1 is the baseline of the efficiency")
    p.add_argument("--dists", default="ddp,fsdp", help="distributed modes of the multi-GPU runs (comma list)")
    p.add_argument("--batch-per-gpu", type=int, default=8, help="sequences per GPU per step")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them, the first one included (>= 1)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the weights' dtype")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="bfloat16 autocast with float32 master weights (train_gpt.py's default: on on CUDA)")
    p.add_argument("--compile", action="store_true",
                   help="train_gpt.py --compile, each Block compiled (--compile-blocks on 1 GPU, as --dist does)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="train_gpt.py --cuda-graph: each step replayed as a CUDA graph, DDP's all-reduces in it "
                        "(no FSDP2 runs); --warmup is raised to cover the eager steps before the capture")
    p.add_argument("--tiny", action="store_true", help="a tiny model: a smoke test of this script")
    p.add_argument("--time-limit", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--run-timeout", type=float, default=600, help="kill a run after this many seconds")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the whole plan this many times, interleaved; each configuration's median is kept")
    args = p.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    args.gpus = [int(n) for n in args.gpus.split(",") if n]
    args.dists = [d for d in args.dists.split(",") if d]
    args.cuda = torch.device(args.device).type == "cuda"
    args.arch = "gpt2"
    if bad := [d for d in args.dists if d not in distributed.MODES]:
        p.error(f"--dists: unknown {', '.join(bad)}; valid: {', '.join(distributed.MODES)}")
    if args.cuda_graph:  # the eager steps before the capture, and the capture, are not timed
        args.warmup = max(args.warmup, train_gpt().DDP_WARMUP + 1)
        if args.compile:
            p.error("--cuda-graph replays eager steps: it does not combine with --compile")
    if args.warmup < 1 or args.steps < 1 or args.rounds < 1 or min(args.gpus, default=0) < 1:
        p.error("--warmup, --steps, --rounds and every --gpus count must be >= 1")
    if args.cuda and max(args.gpus) > torch.cuda.device_count():
        p.error(f"--gpus {max(args.gpus)}: this machine has {torch.cuda.device_count()} GPUs")
    args.date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    c = gpt.config(args)
    runs, skipped = plan(args)
    for what, why in skipped.items():
        print(f"{what}: skipped: {why}", flush=True)
    results = {"meta": meta(args, c, {}), "skipped": skipped, "runs": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    done: dict[str, list[dict]] = {}
    for model, dist, n in [r for _ in range(args.rounds) for r in runs]:
        name = f"{model} {config_name(dist, n)}"
        if args.time_limit and time.perf_counter() - start > args.time_limit:
            if name not in done:
                results["runs"][name] = {"model": model, "dist": dist, "gpus": n,
                                         "error": f"not run: --time-limit {args.time_limit:g} s reached"}
            continue
        done.setdefault(name, []).append(run(model, dist, n, args, c))
        results["runs"][name] = merge_rounds(done[name])
        efficiencies(results)
        results["meta"] = meta(args, c, results["runs"])
        (args.out / "scaling.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "scaling.json").write_text(json.dumps(results, indent=1) + "\n")
    try:
        plot(results, args.out / "scaling.png")
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
    print(table(results), flush=True)
    return results


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` or a scheduler: the run in flight stops too
    main()
