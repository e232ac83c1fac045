"""examples/train_gpt.py on two processes, set up as torchrun sets up its workers (gloo on the CPU,
NCCL on two GPUs): DDP and FSDP2 give the one-process losses at the same global batch; a sharded
checkpoint resumes exactly on 2 ranks and on 1, a one-process checkpoint on 2; a bad launch is a
clear error on every rank."""
import functools
import importlib.util
import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import kcourse
from kcourse import distributed

ROOT = Path(__file__).resolve().parents[1]
STEPS, STOP = 4, 2
# The two ranks' gradients are summed by an all-reduce (DDP) or a reduce-scatter (FSDP2): float32
# sums in another order than one process's.
LOSS_RTOL = 1e-5
# FSDP2 with --amp computes with bfloat16 copies of every weight; one process under autocast keeps
# the norms' and the embeddings' weights in float32.
AMP_RTOL = 2e-3
# A tiny GPT whose gradient norm exceeds 1 at every step: clip_grad_norm_ acts, on sharded gradients too.
# float32 unless a run adds --amp (the last of --no-amp and --amp counts).
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "8",
        "--corpus-bytes", "20000", "--steps", str(STEPS), "--sample", "0", "--quiet", "--no-amp"]


@functools.cache
def train_gpt():
    spec = importlib.util.spec_from_file_location("train_gpt", ROOT / "examples" / "train_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.plot = lambda *_: None  # drawing the loss curve (0.25 s a run) is not what these tests check
    return module


def train(*argv) -> list[float]:
    """The losses of examples/train_gpt.py on the tiny GPT with the further arguments ``argv``."""
    return train_gpt().train(train_gpt().parse_args([*TINY, *map(str, argv)]))


def _rank(rank: int, port: int, device: str, backends: tuple[str, ...], extra: tuple[str, ...], tmp: Path) -> None:
    """Rank ``rank`` of 2: every distributed run of the test (with the further arguments ``extra``),
    in one process group; what it saw goes to ``tmp/rank<rank>.json``."""
    _as_torchrun_rank(rank, 2, port)
    torch.set_num_threads(1)
    seen = {}
    for backend in backends:
        for mode in distributed.MODES:
            seen[f"{backend} {mode}"] = train("--device", device, "--backend", backend, "--dist", mode,
                                              *extra, "--out", tmp / f"{backend}-{mode}")
    last = ["--device", device, "--backend", backends[-1], *extra]
    for mode in distributed.MODES:
        train(*last, "--dist", mode, "--stop-at", STOP, "--out", tmp / f"{mode}-stopped")
    if rank == 0:
        shutil.copytree(tmp / "fsdp-stopped", tmp / "fsdp-for-one")
    torch.distributed.barrier()
    for mode in distributed.MODES:
        seen[f"{mode} resumed"] = train(*last, "--dist", mode, "--resume", "--out", tmp / f"{mode}-stopped")
    seen["one resumed on two"] = train(*last, "--dist", "fsdp", "--resume", "--out", tmp / "one")
    seen["fsdp amp"] = train(*last, "--dist", "fsdp", "--amp", "--out", tmp / "amp")
    try:
        train("--device", device, "--backend", ("python", "pytorch")[rank], "--dist", "ddp", "--out", tmp / "bad")
    except ValueError as e:
        seen["mismatched backends"] = str(e)
    (tmp / f"rank{rank}.json").write_text(json.dumps(seen))
    _leave(rank, 2, tmp)


def _as_torchrun_rank(rank: int, world: int, port: int) -> None:
    """This process's environment as torchrun sets it for rank ``rank`` of ``world`` on this host."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def _leave(rank: int, world: int, tmp: Path) -> None:
    """Leave the process group once every rank is done with its collectives. Rank 0's process holds
    the group's TCPStore: it exits only once the others have left (a rank aborted now and then in its
    teardown, "terminate called without an active exception", when the store went away first)."""
    torch.distributed.barrier()
    distributed.finish()
    (tmp / f"left{rank}").touch()
    for _ in range(600 if rank == 0 else 0):
        if all((tmp / f"left{r}").exists() for r in range(1, world)):
            break
        time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(device: str, backends: tuple[str, ...], extra: tuple[str, ...], tmp: Path) -> dict:
    """Run ``_rank`` on two processes; returns what rank 0 saw, after checking rank 1 saw the same."""
    mp.spawn(_rank, args=(_free_port(), device, backends, extra, tmp), nprocs=2)  # a failing rank stops the other
    seen = [json.loads((tmp / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert seen[0] == seen[1], "the ranks disagree on the global losses"
    return seen[0]


def check_two_ranks(device: str, backends: tuple[str, ...], tmp: Path, extra: tuple[str, ...] = ()) -> None:
    """Each backend's losses on 2 ranks (DDP, FSDP2) against 1 process; on the last backend, runs
    resumed on 2 ranks in each mode, a sharded checkpoint resumed on 1 rank and a one-process one on 2,
    FSDP2's mixed precision; mismatched backends."""
    one = {b: train("--device", device, "--backend", b, *extra, "--out", tmp / f"{b}-one") for b in backends}
    last = ["--device", device, "--backend", backends[-1], *extra]
    train(*last, "--stop-at", STOP, "--out", tmp / "one")
    seen = two_ranks(device, backends, extra, tmp)
    for backend in backends:
        for mode in distributed.MODES:
            torch.testing.assert_close(seen[f"{backend} {mode}"], one[backend], rtol=LOSS_RTOL, atol=0,
                                       msg=lambda m: f"{backend} {mode} on 2 ranks against 1 process: {m}")
    for mode in distributed.MODES:  # on CUDA, kernels that add with atomics may round differently run to run
        torch.testing.assert_close(seen[f"{mode} resumed"], seen[f"{backends[-1]} {mode}"], atol=0,
                                   rtol=0 if device == "cpu" else LOSS_RTOL, msg=f"a {mode} run resumed on 2 ranks")
    expected = one[backends[-1]]
    torch.testing.assert_close(seen["one resumed on two"], expected, rtol=LOSS_RTOL, atol=0)
    resumed_on_one = train(*last, "--resume", "--out", tmp / "fsdp-for-one")
    assert resumed_on_one[:STOP] == seen["fsdp resumed"][:STOP]  # the steps run on 2 ranks, from the checkpoint
    torch.testing.assert_close(resumed_on_one, expected, rtol=LOSS_RTOL, atol=0)
    assert "the backend differs across ranks (rank 0: 'python', rank 1: 'pytorch')" in \
        seen.get("mismatched backends", "no error")
    amp = train(*last, "--amp", "--out", tmp / "amp-one")
    torch.testing.assert_close(seen["fsdp amp"], amp, rtol=AMP_RTOL, atol=0)


def test_ddp_and_fsdp_on_two_cpu_processes(tmp_path):
    check_two_ranks("cpu", ("python", "pytorch"), tmp_path)


@pytest.mark.slow  # inductor compiles the block on each rank (~90 s on 2 cores)
def test_compiled_blocks_on_two_cpu_processes(tmp_path):
    check_two_ranks("cpu", ("pytorch",), tmp_path, ("--compile",))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL between them)")
def test_ddp_and_fsdp_on_two_gpus(tmp_path):
    backends = tuple(b for b in ("triton", "cute") if kcourse.backends()[b].available)
    if not backends:
        pytest.skip("neither triton nor cute runs here")
    check_two_ranks("cuda", backends, tmp_path)


def _graphed_rank(rank: int, world: int, port: int, backend: str, steps: int, tmp: Path) -> None:
    """Rank ``rank`` of ``world``: --dist ddp --cuda-graph on its GPU; rank 0 writes the losses."""
    _as_torchrun_rank(rank, world, port)
    losses = train("--device", "cuda", "--backend", backend, "--dist", "ddp", "--cuda-graph", "--steps", steps,
                   "--out", tmp / "graphed")
    if rank == 0:
        (tmp / "graphed.json").write_text(json.dumps(losses))
    _leave(rank, world, tmp)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2])
def test_ddp_replayed_as_a_cuda_graph(world, tmp_path):
    """--dist ddp --cuda-graph (the all-reduces captured in each rank's graph) gives the one-process
    eager losses, the captured steps included; on 1 GPU too (a group of one rank, NCCL all the same)."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    backend = next((b for b in ("triton", "cute", "pytorch") if kcourse.backends()[b].available), "pytorch")
    steps = train_gpt().DDP_WARMUP + 3
    eager = train("--device", "cuda", "--backend", backend, "--steps", steps, "--out", tmp_path / "eager")
    mp.spawn(_graphed_rank, args=(world, _free_port(), backend, steps, tmp_path), nprocs=world)
    graphed = json.loads((tmp_path / "graphed.json").read_text())
    assert len(graphed) == steps
    torch.testing.assert_close(graphed, eager, rtol=LOSS_RTOL, atol=0)


@pytest.mark.slow  # 15-25 s on 2 cores; the GPU runs include it
def test_scaling_benchmark_on_cpu(tmp_path):
    """benchmarks/scaling.py launches train_gpt.py once per configuration (1 process; torchrun with 2,
    DDP over gloo) and writes rows benchmarks/history.py takes (15-25 s on 2 cores: four Python processes
    start, each importing torch)."""
    from benchmarks import history, scaling

    scaling.main(["--out", tmp_path, "--tiny", "--device", "cpu", "--gpus", "1,2", "--dists", "ddp",
                  "--backends", "pytorch", "--steps", "2", "--warmup", "1"])
    rows = history.rows_from_file(tmp_path / "scaling.json")
    assert sorted(r["mode"] for r in rows) == ["ddp x2", "x1"]
    assert all(r["rate"] > 0 and r["unit"] == "tokens/s per GPU" for r in rows)
    assert all(0 < r["host_ms"] <= r["ms"] * 1.5 for r in rows)  # the slowest rank's issue time, within its step
    assert next(r for r in rows if r["gpus"] == 2)["efficiency"] > 0
    assert (tmp_path / "scaling.png").is_file()


def test_scaling_with_cuda_graphs_plans_ddp_runs_only(tmp_path):
    """benchmarks.scaling --cuda-graph: every run gets train_gpt.py's --cuda-graph, no FSDP2 run is
    planned (it is not captured), and the eager steps before the capture are never timed."""
    import argparse

    from benchmarks import scaling

    args = argparse.Namespace(backends=["torch.nn", "pytorch"], gpus=[1, 2], dists=["ddp", "fsdp"], cuda=True,
                              cuda_graph=True, compile=False, amp=None, batch_per_gpu=2, device="cuda",
                              dtype="float32", steps=3, warmup=13)
    runs, skipped = scaling.plan(args)
    assert ("pytorch", "ddp", 2) in runs and not any(dist == "fsdp" for _, dist, _ in runs)
    assert "pytorch fsdp x2" in skipped
    c = scaling.gpt.GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=1, n_embd=8)
    assert "--cuda-graph" in scaling.command("pytorch", "ddp", 2, args, c, tmp_path)
    with pytest.raises(SystemExit):  # --compile replays no eager step
        scaling.main(["--out", tmp_path, "--device", "cpu", "--cuda-graph", "--compile"])


def test_scaling_rounds_pair_each_run_with_its_own_round():
    """--rounds: a configuration keeps its rounds' median, and an efficiency is the median of each
    round's ratio to the 1-GPU run of the same round (a drift of the host between rounds cancels)."""
    from benchmarks import scaling

    def measured(tps, ms):
        return {"model": "cute", "tokens_per_s_per_gpu": tps, "tokens_per_s": tps, "step_ms": ms, "wall_s": 1.0}

    one = scaling.merge_rounds([measured(100.0, 10.0), measured(50.0, 20.0), measured(80.0, 12.5)])
    two = scaling.merge_rounds([measured(95.0, 10.5), measured(40.0, 25.0), measured(76.0, 13.2)])
    assert one["tokens_per_s_per_gpu"] == 80.0 and one["step_ms"] == 12.5 and len(one["rounds"]) == 3
    results = {"runs": {"cute x1": {**one, "gpus": 1}, "cute ddp x2": {**two, "gpus": 2}}}
    scaling.efficiencies(results)
    ratios = results["runs"]["cute ddp x2"]["efficiency_rounds"]
    assert ratios == [0.95, 0.8, 0.95] and results["runs"]["cute ddp x2"]["efficiency"] == 0.95
    assert scaling.merge_rounds([{"error": "boom"}]) == {"error": "boom"}  # nothing measured: the failure


def test_compiled_blocks_run_eagerly_outside_training():
    """Under --dist --compile each Block's forward is compiled for the training step only:
    evaluation and sampling (no_grad) run it eagerly rather than compiling graphs of their own."""
    calls = []
    forward = train_gpt().when_training(lambda x: calls.append("compiled") or x, lambda x: calls.append("eager") or x)
    forward(1)
    with torch.no_grad():
        forward(2)
    assert calls == ["compiled", "eager"]


def test_bad_launches_are_clear_errors(monkeypatch, capsys):
    """Each rank reads the same environment, so each one stops with the same message."""
    parse = train_gpt().parse_args
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit):
        parse(["--dist", "ddp"])
    assert "start it with torchrun --nproc_per_node N" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "1")  # rank 1 of torchrun --nproc_per_node 3
    monkeypatch.setenv("WORLD_SIZE", "3")
    for argv, message in [
            (["--dist", "fsdp", "--batch-size", "8"], "--batch-size 8 is the global batch: it must be a multiple of "
                                                      "the 3 processes"),
            (["--batch-size", "9"], "torchrun started 3 processes: pass --dist ddp or --dist fsdp"),
            (["--dist", "fsdp", "--batch-size", "9", "--device", "cuda", "--cuda-graph"],
             "--cuda-graph captures DDP's all-reduces, not FSDP2's gathers: use it with --dist ddp or alone")]:
        with pytest.raises(SystemExit):
            parse(argv)
        assert message in capsys.readouterr().err
    assert parse(["--dist", "fsdp", "--batch-size", "9"]).batch_size == 9


def test_the_backend_follows_the_switch(monkeypatch):
    parse = train_gpt().parse_args
    monkeypatch.setenv("KCOURSE_BACKEND", "python")
    assert parse([]).backend == "python" and parse(["--backend", "pytorch"]).backend == "pytorch"
    monkeypatch.delenv("KCOURSE_BACKEND")
    assert parse([]).backend == "pytorch"
