"""Train a character-level GPT built from kcourse.modules on any backend.

The corpus is on every machine: the Python standard library's own source files. Characters are
bytes (vocabulary 256). The script prints the unigram entropy of the training text (the loss of
the best model that ignores context) beside the model's loss, shows a progress bar, writes a loss
curve and a checkpoint into --out, and samples some text at the end.

    python examples/train_gpt.py --backend pytorch --steps 300 --out runs/gpt
    python examples/train_gpt.py --backend pytorch --steps 600 --out runs/gpt --resume   # continue
    python examples/train_gpt.py --backend triton --device cuda --dtype bfloat16 --steps 2000 --out runs/gpt-gpu

--resume continues from the checkpoint and produces exactly the losses an uninterrupted run
would have produced: the model, the optimizer, every random generator and the step are saved.

--cuda-graph runs the first WARMUP steps as usual (on a side stream, as CUDA graphs require), then
captures one whole step -- forward, backward, gradient clipping, AdamW -- in a CUDA graph and
replays it for every later step, with the batch copied into static input buffers: the same
kernels on the same values, without Python or launch overhead per kernel. It gives the same
losses as a run without it: on CUDA the optimizer keeps its step counts and learning rate on the
device (AdamW(capturable=True), a tensor lr filled in each step) with or without the flag, so the
flag changes how the step is launched, never what it computes. With --dist ddp the graph holds the
gradients' all-reduces too (NCCL collectives are capturable): DDP is built, warmed up (DDP_WARMUP
steps, as PyTorch's CUDA-graph notes ask) and captured on one side stream; every rank replays its
graph each step. --dist fsdp does not combine with it (FSDP2's hooks run Python between its
collectives every step).

    python examples/train_gpt.py --backend triton --device cuda --steps 2000 --out runs/gpt-gpu --cuda-graph
    torchrun --nproc_per_node 2 examples/train_gpt.py --dist ddp --cuda-graph --backend cute --batch-size 32

--amp runs the forward under torch.autocast(bfloat16) with float32 master weights (how nanoGPT
trains): matrix products and attention in bfloat16, softmax, norms and the loss in float32. It is on
by default on CUDA with the default --dtype float32 (--no-amp turns it off) and off on the CPU
(--amp turns it on there too). --compile runs the training step's forward and backward through
torch.compile(model, fullgraph=True); --compile-mode reduce-overhead (CUDA only; implies --compile)
lets inductor replay them as CUDA graphs, the compiled counterpart of --cuda-graph, which cannot be
combined with --compile. Evaluation and sampling run the model uncompiled (under autocast with --amp).

    python examples/train_gpt.py --backend triton --device cuda --steps 2000 --out runs/gpt-gpu --compile

Under torchrun, one process per GPU (or per CPU rank, over gloo) trains the same model with
--dist ddp (each rank a whole replica, gradients all-reduced) or --dist fsdp (FSDP2: each rank a
shard of every parameter, fully_shard per Block and then the root; with --amp, bfloat16 parameters
for compute and float32 gradient reduction). --batch-size is the global batch: every rank draws the
same windows and takes every world-th one (DistributedSampler's split), so the losses are those of
one process at the same batch. Rank 0 alone prints, plots and writes losses.json; --dist fsdp
checkpoints into --out/checkpoint/ (torch.distributed.checkpoint: every rank writes its shards),
the other modes into --out/checkpoint.pt, and --resume reads either with any number of ranks.
--compile compiles each Block's forward (DDP's and FSDP2's hooks around it stay eager; without
--dist, --compile-blocks does the same, a one-process baseline for it). Every rank
must resolve the same backend (--backend, else KCOURSE_BACKEND): a mismatch stops every rank.
On several nodes, the same command on each (and --out on a file system they all see):

    torchrun --nproc_per_node 2 examples/train_gpt.py --dist ddp --backend triton --batch-size 32 --out runs/ddp
    torchrun --nproc_per_node 8 examples/train_gpt.py --dist fsdp --backend cute --batch-size 64 --out runs/fsdp --resume
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
        examples/train_gpt.py --dist fsdp --backend cute --batch-size 128 --out /shared/runs/fsdp
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sysconfig
import time
import warnings
from pathlib import Path

import torch

import kcourse
from kcourse import distributed
from kcourse.modules import GPT, GPTConfig

WARMUP = 3  # eager steps before --cuda-graph captures one: kernels compiled and tuned, optimizer state made
DDP_WARMUP = 11  # the same under --dist ddp: DDP has settled its gradient buckets (PyTorch's CUDA-graph notes)
# FSDP2 warns that a module's output is a view (GPT's logits); nothing here writes into them in place.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def corpus(max_bytes: int) -> torch.Tensor:
    """The standard library's .py files, sorted by path, concatenated: a uint8 tensor."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        size += len(data)
        if size >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8).long()


def unigram_entropy(data: torch.Tensor) -> float:
    """Entropy (nats) of the byte distribution: the loss of a model that ignores context."""
    p = torch.bincount(data, minlength=256).double() / data.numel()
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def batch(data: torch.Tensor, batch_size: int, block: int, gen: torch.Generator, device,
          group: distributed.Group = distributed.Group()):
    """This rank's share of a batch of ``batch_size`` random windows: every rank draws the same
    windows from ``gen`` and takes rows rank, rank + world, ... (DistributedSampler's split)."""
    starts = torch.randint(0, data.numel() - block - 1, (batch_size,), generator=gen)[group.rank::group.world]
    offsets = starts[:, None] + torch.arange(block + 1)  # (B, T + 1)
    seq = data[offsets].to(device)
    return seq[:, :-1], seq[:, 1:]  # inputs, targets: (B, T) each


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default=None, choices=kcourse.backend.NAMES,
                   help="default: the KCOURSE_BACKEND environment variable, else pytorch")
    p.add_argument("--dist", default=None, choices=distributed.MODES,
                   help="under torchrun: ddp (a whole model per rank) or fsdp (FSDP2: a shard per rank)")
    p.add_argument("--steps", type=int, default=300, help="total optimizer steps (a resumed run continues to it)")
    p.add_argument("--out", type=Path, default=Path("runs/gpt"))
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument("--stop-at", type=int, default=None,
                   help="stop (and checkpoint) after this step, as an interruption would; --resume continues")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--batch-size", type=int, default=16,
                   help="the global batch: under torchrun each rank takes an equal share")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=3)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=256,
                   help="the model's vocabulary (the corpus's bytes use the first 256; 50304 is GPT-2's)")
    p.add_argument("--llama", action="store_true", help="swiglu, rmsnorm, rope, 2 kv heads, no bias")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--corpus-bytes", type=int, default=2_000_000)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--sample", type=int, default=300, help="bytes to sample at the end (0: none)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--metrics", type=Path, default=None,
                   help="write each step's seconds, the losses and the peak GPU memory of every rank to this "
                        "JSON file (benchmarks/scaling.py reads it)")
    p.add_argument("--no-save", action="store_true", help="write no checkpoint at the end")
    p.add_argument("--cuda-graph", action="store_true",
                   help=f"replay the training step as a CUDA graph after {WARMUP} eager steps ({DDP_WARMUP} "
                        "under --dist ddp; same losses)")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="forward under torch.autocast(bfloat16), float32 master weights "
                        "(default: on on CUDA with --dtype float32, else off)")
    p.add_argument("--compile", action="store_true", help="torch.compile(model, fullgraph=True) for training")
    p.add_argument("--compile-blocks", action="store_true",
                   help="compile each Block's forward only (implies --compile), the rest eager, as under "
                        "--dist: the one-process baseline of a --dist --compile run")
    p.add_argument("--compile-mode", default=None,
                   choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                   help="torch.compile's mode (implies --compile); reduce-overhead and max-autotune need CUDA")
    args = p.parse_args(argv)
    args.backend = args.backend or kcourse.get_backend()
    cuda = torch.device(args.device).type == "cuda"
    world = distributed.world_size()
    if args.dist and not distributed.launched():
        p.error(f"--dist {args.dist} runs one process per GPU: start it with "
                f"torchrun --nproc_per_node N examples/train_gpt.py --dist {args.dist} ...")
    if world > 1 and not args.dist:
        p.error(f"torchrun started {world} processes: pass --dist ddp or --dist fsdp")
    if args.batch_size % world:
        p.error(f"--batch-size {args.batch_size} is the global batch: it must be a multiple of the {world} processes")
    if args.dist == "fsdp" and args.cuda_graph:
        p.error("--cuda-graph captures DDP's all-reduces, not FSDP2's gathers: use it with --dist ddp or alone")
    if args.cuda_graph and not cuda:
        p.error("--cuda-graph needs a CUDA --device")
    if args.amp is None:
        args.amp = cuda and args.dtype == "float32"
    elif args.amp and args.dtype != "float32":
        p.error("--amp keeps float32 master weights: use it with --dtype float32 (the default), or pass --no-amp")
    if args.compile_mode is not None or args.compile_blocks:
        args.compile = True
    if args.compile_mode in ("reduce-overhead", "max-autotune") and not cuda:
        p.error(f"--compile-mode {args.compile_mode} makes CUDA graphs: it needs a CUDA --device")
    if args.compile and args.cuda_graph:
        p.error("--cuda-graph captures an eager step; with --compile use --compile-mode reduce-overhead instead")
    return args


def build(args, group: distributed.Group, device: torch.device,
          stream: torch.cuda.Stream | None = None) -> tuple[GPT, torch.optim.Optimizer]:
    """The model, wrapped for ``group`` (DDP, or sharded in place by FSDP2), and AdamW over its
    parameters. ``stream``: the side stream --cuda-graph warms up and captures on, where DDP must be
    built too."""
    extra = dict(mlp="swiglu", norm="rmsnorm", pos="rope", n_kv_head=max(1, args.n_head // 2), bias=False) \
        if args.llama else {}
    config = GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, **extra)
    model = GPT(config, backend=args.backend).to(device, getattr(torch, args.dtype))
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        model = distributed.wrap(model, group, device, amp=args.amp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    return model, optimizer


def place_optimizer(optimizer: torch.optim.Optimizer, device) -> None:
    """On CUDA, AdamW keeps its learning rate and step counts on the device (capturable=True): no host
    sync per step, and a CUDA graph of the step reads the lr that ``set_lr`` fills in. Elsewhere they
    are plain numbers on the CPU. Applied after building and loading a checkpoint (which may come
    from another device)."""
    cuda = torch.device(device).type == "cuda"
    for group in optimizer.param_groups:
        lr = float(group["lr"])
        group["lr"], group["capturable"] = (torch.tensor(lr, device=device) if cuda else lr), cuda
    for state in optimizer.state.values():
        state["step"] = state["step"].to(device if cuda else "cpu")


def lr_at(step: int, args) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to 10%."""
    warm = max(1, args.steps // 20)
    if step < warm:
        return args.lr * (step + 1) / warm
    t = (step - warm) / max(1, args.steps - warm)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)  # in place: a captured step reads this very tensor
        else:
            group["lr"] = lr


def autocast(args):
    """The context the forward runs in: torch.autocast(bfloat16) with --amp, else nothing."""
    if not args.amp:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16)


def compile_scope(args) -> str:
    """What --compile compiles: each Block's forward ("blocks": under --dist, or --compile-blocks),
    else the whole model ("model")."""
    return "blocks" if args.dist or args.compile_blocks else "model"


def when_training(compiled, eager):
    """A forward that runs ``compiled`` while autograd records (training steps) and ``eager`` under
    no_grad (evaluation, sampling), which would otherwise compile graphs of their own."""
    return lambda *args, **kwargs: (compiled if torch.is_grad_enabled() else eager)(*args, **kwargs)


def train_step(model: GPT, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               amp=contextlib.nullcontext) -> torch.Tensor:
    """One step; ``amp()`` makes the context of the forward (``lambda: autocast(args)``). Under FSDP2
    the parameters and gradients are DTensors: clip_grad_norm_ reduces the norm over the shards."""
    with amp():
        _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss


def on_side_stream(side: torch.cuda.Stream, fn, *args):
    """``fn(*args)`` run on the stream ``side``, ordered after and before the current stream's
    work: how the steps before a CUDA graph capture must run (PyTorch's CUDA graph recipe)."""
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    return out


def capture(model: GPT, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
            amp=contextlib.nullcontext, stream: torch.cuda.Stream | None = None):
    """One training step captured in a CUDA graph; returns ``step(x, y) -> loss`` that copies the
    batch into the graph's static inputs and replays it (the returned loss is the graph's own
    tensor, overwritten by the next replay). ``stream``: the side stream of the warm-up steps, captured
    on too (DDP's reducer was built on it)."""
    static_x, static_y = x.clone(), y.clone()
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)  # the captured backward allocates the gradients in the graph's pool
    with torch.cuda.graph(graph, stream=stream):
        with amp():
            _, static_loss = model(static_x, static_y)
        static_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    def step(x, y):
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        return static_loss

    return step


def run_state(gen: torch.Generator, losses: list[float], step: int) -> dict:
    """What a checkpoint keeps besides the model and the optimizer, for a resumed run to go on exactly."""
    return {"generator": gen.get_state(), "torch_rng": torch.get_rng_state(), "losses": losses, "step": step}


def train(args) -> list[float]:
    """Run (or resume) training; returns the whole loss sequence (the global batch's), one value per step."""
    group, device = distributed.init(args.dist, args.device)
    distributed.same_on_every_rank("backend", args.backend)
    args.device = str(device)  # under torchrun: this rank's GPU
    say = print if group.main else lambda *_, **__: None
    torch.manual_seed(args.seed)  # the same on every rank: FSDP2 shards the model each rank builds
    data = corpus(args.corpus_bytes)
    split = int(0.9 * data.numel())
    train_data, val_data = data[:split], data[split:]
    side = torch.cuda.Stream(device) if args.cuda_graph else None
    model, optimizer = build(args, group, device, side)
    gen = torch.Generator().manual_seed(args.seed)
    losses, start = [], 0
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt_path = args.out / "checkpoint"
    if args.resume:
        saved = distributed.load(ckpt_path, model, optimizer, run_state(gen, [], 0))
        gen.set_state(saved["generator"])
        torch.set_rng_state(saved["torch_rng"])
        losses, start = saved["losses"], saved["step"]
    place_optimizer(optimizer, device)

    entropy = unigram_entropy(train_data)
    n_params = sum(p.numel() for p in model.parameters())  # a DTensor's numel is the whole parameter's
    compiled = f", torch.compile (mode {args.compile_mode or 'default'})" if args.compile else ""
    ranks = f", {args.dist} over {group.world} process{'es' * (group.world > 1)}" if args.dist else ""
    say(f"backend {args.backend} on {args.device} ({args.dtype} weights{', autocast bfloat16' if args.amp else ''}"
        f"{compiled}{', CUDA graph' if args.cuda_graph else ''}{ranks}); {n_params / 1e6:.2f}M parameters; "
        f"corpus {data.numel():,} bytes; unigram entropy {entropy:.3f} nats", flush=True)
    end = min(args.steps, args.stop_at) if args.stop_at else args.steps
    steps = range(start, end)
    forward = model
    if args.compile:
        mode = None if args.compile_mode in (None, "default") else args.compile_mode
        if compile_scope(args) == "blocks":  # each block's forward; DDP's and FSDP2's hooks around it stay eager
            for block in distributed.unwrap(model).h:
                block.forward = when_training(torch.compile(block.forward, fullgraph=True, mode=mode), block.forward)
        else:
            forward = torch.compile(model, fullgraph=True, mode=mode)
    amp = lambda: autocast(args)  # noqa: E731
    slow_start = args.compile or args.cuda_graph or (args.backend in ("triton", "cute") and args.device != "cpu")
    if slow_start and start < end:
        what = "torch.compile" if args.compile else "compiling and tuning kernels"
        say(f"the first step{'s' if args.cuda_graph else ''} may take a minute ({what}) ...", flush=True)
    bar = None
    if not args.quiet and group.main:
        from tqdm import tqdm
        bar = tqdm(total=args.steps, initial=start)
    tokens, t0 = 0, time.perf_counter()
    step_s, last = [], t0  # each step's wall-clock seconds: the loss's .item() waits for the step
    issue_s = []  # and the host's part of it: the step issued, before the loss is read
    graphed, warmup = None, DDP_WARMUP if args.dist == "ddp" else WARMUP
    for step in steps:
        x, y = batch(train_data, args.batch_size, args.block_size, gen, device, group)
        set_lr(optimizer, lr_at(step, args))
        if args.compile:
            torch.compiler.cudagraph_mark_step_begin()  # reduce-overhead: a new step's graphs may reuse memory
        if not args.cuda_graph:
            loss = train_step(forward, optimizer, x, y, amp)
        elif step - start < warmup:
            loss = on_side_stream(side, train_step, model, optimizer, x, y, amp)
        else:
            if graphed is None:
                graphed = capture(model, optimizer, x, y, amp, side)
            loss = graphed(x, y)
        issue_s.append(time.perf_counter() - last)
        losses.append(distributed.mean(loss).item())
        step_s.append(time.perf_counter() - last)
        last = time.perf_counter()
        if step == start and slow_start:
            (bar.write if bar is not None else say)(f"first step: {time.perf_counter() - t0:.1f} s")
            tokens, t0 = 0, time.perf_counter()  # tokens/s from here: the compile time is not throughput
        else:
            tokens += x.numel() * group.world
        if bar is not None:
            bar.update(1)
            elapsed = time.perf_counter() - t0
            bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tokens / elapsed:,.0f}" if tokens else "-")
    if bar is not None:
        bar.close()

    if args.metrics:
        write_metrics(args, group, device, step_s, issue_s, losses[start:], n_params)
    if not args.no_save:
        config = vars(distributed.unwrap(model).config)
        distributed.save(ckpt_path, model, optimizer, {**run_state(gen, losses, end), "config": config},
                         sharded=args.dist == "fsdp")
    val = evaluate(model, val_data, args, group)
    tail = sum(losses[-20:]) / len(losses[-20:]) if losses else float("nan")
    say(f"train loss (last 20 steps) {tail:.3f}, validation loss {val:.3f}, unigram entropy {entropy:.3f} nats")
    if group.main:
        (args.out / "losses.json").write_text(json.dumps({"losses": losses, "val": val, "unigram_entropy": entropy}))
        plot(losses, entropy, args.out / "loss.png")
    if args.sample:  # on every rank: FSDP2 gathers each block's weights from all of them
        prompt = torch.tensor([list(b"def ")], device=device)
        with autocast(args):
            cache = prompt.shape[1] + args.sample <= args.block_size  # else the cropped context, recomputed each step
            text = distributed.gathered(model).generate(prompt, args.sample, temperature=0.8, top_k=40,
                                                        use_cache=cache)[0].tolist()
        say("--- sample ---\n" + bytes(text).decode("utf-8", errors="replace"))
    return losses


def write_metrics(args, group: distributed.Group, device: torch.device, step_s: list[float],
                  issue_s: list[float], losses: list[float], n_params: int) -> None:
    """--metrics: rank 0 writes this run's step times (seconds, the first one with any compiling and
    tuning), each rank's host issue times (seconds from a step's start until the host has launched
    it, before the loss is read: near the step time, the host sets the pace), losses, global tokens
    per step and each rank's peak GPU memory (bytes, CUDA only) to args.metrics. Every rank calls it
    (the peaks and issue times are gathered)."""
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    peaks, issues = [peak] * group.world, [issue_s] * group.world
    if group.world > 1:
        torch.distributed.all_gather_object(peaks, peak)
        torch.distributed.all_gather_object(issues, issue_s)
    if group.main:
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        args.metrics.parent.mkdir(parents=True, exist_ok=True)
        args.metrics.write_text(json.dumps({
            "device": device_name, "world": group.world, "dist": args.dist, "backend": args.backend,
            "dtype": args.dtype, "amp": args.amp, "compile": args.compile and compile_scope(args),
            "cuda_graph": args.cuda_graph, "parameters": n_params,
            "tokens_per_step": args.batch_size * args.block_size, "step_s": step_s, "losses": losses,
            "issue_s_per_rank": issues, "peak_memory_bytes": peaks}))


@torch.no_grad()
def evaluate(model: GPT, data: torch.Tensor, args, group: distributed.Group = distributed.Group(),
             batches: int = 8) -> float:
    """The mean loss over ``batches`` fixed batches of ``data``, each rank computing its share."""
    gen = torch.Generator().manual_seed(0)
    total = 0.0
    for _ in range(batches):
        x, y = batch(data, args.batch_size, args.block_size, gen, args.device, group)
        with autocast(args):
            total += distributed.mean(model(x, y)[1]).item()
    return total / batches


def plot(losses: list[float], entropy: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(losses, label="train loss")
    ax.axhline(entropy, color="gray", linestyle="--", label="unigram entropy")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    try:
        train(parse_args())
    finally:
        distributed.finish()
