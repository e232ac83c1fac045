"""Training on several processes with PyTorch's own engine: DDP or FSDP2, one process per GPU (or
CPU rank), started by ``torchrun``; checkpoints any number of ranks can resume.

    torchrun --nproc_per_node 2 examples/train_gpt.py --dist fsdp ...

Each process holds the whole model (``ddp``: gradients all-reduced after each backward) or a shard
of each parameter (``fsdp``: ``fully_shard`` per transformer ``Block``, then the root; parameters
all-gathered before a block runs and resharded after, gradients reduce-scattered). Every rank
computes its share of the global batch on the same backend; the averaged gradient equals the
one-process gradient of the whole batch.

A checkpoint is a directory of shards written by every rank (``torch.distributed.checkpoint``) for
``fsdp``, one file ``<path>.pt`` written by rank 0 otherwise; both hold the model and optimizer by
parameter name (``get_state_dict``), so either loads into any mode with any number of ranks.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

MODES = ("ddp", "fsdp")


def launched() -> bool:
    """Whether torchrun (or a launcher that sets the same variables) started this process."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def world_size() -> int:
    """The number of processes torchrun started (1 without it), known before the group is joined."""
    return int(os.environ.get("WORLD_SIZE", 1))


@dataclass(frozen=True)
class Group:
    """This process's place: ``mode`` None (one process), ``"ddp"`` or ``"fsdp"``; ``rank`` of ``world``."""

    mode: str | None = None
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that logs, plots and writes whole files."""
        return self.rank == 0


def init(mode: str | None, device) -> tuple[Group, torch.device]:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``): NCCL on CUDA, each process on the GPU of its ``LOCAL_RANK``;
    gloo on the CPU. ``mode`` None is one process: nothing to join. Joining twice reuses the group."""
    device = torch.device(device)
    if mode is None:
        return Group(), device
    if mode not in MODES:
        raise ValueError(f"distributed mode must be one of {', '.join(MODES)}, got {mode!r}")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    return Group(mode, dist.get_rank(), dist.get_world_size()), device


def finish() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def same_on_every_rank(what: str, value) -> None:
    """Raise on every rank (rather than hang or train wrongly) unless each one has the same ``value``."""
    if not dist.is_initialized():
        return
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    if any(v != values[0] for v in values):
        ranks = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
        raise ValueError(f"the {what} differs across ranks ({ranks}); every rank must use the same one")


def wrap(model: nn.Module, group: Group, device: torch.device, amp: bool = False) -> nn.Module:
    """``model`` ready to train in ``group.mode``: as is for one process; ``DistributedDataParallel``
    for ``ddp`` (each gradient a view of its all-reduce bucket: no copy into the bucket and back);
    for ``fsdp``, ``fully_shard`` on every ``Block`` and then on the root, in place, with bfloat16
    parameters for compute and float32 gradient reduction when ``amp``. Every rank
    must have built the same model (the same seed): FSDP shards it as it is, without a broadcast."""
    if group.mode is None:
        return model
    if group.mode == "ddp":
        return nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from .modules.block import Block

    mesh = init_device_mesh(device.type, (group.world,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if amp \
        else MixedPrecisionPolicy()
    for block in [m for m in model.modules() if isinstance(m, Block)]:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def unwrap(model: nn.Module) -> nn.Module:
    """The model itself: DDP's inner module (an FSDP2 model is its own module)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def gathered(model: nn.Module) -> nn.Module:
    """The model to call other methods than forward on (``GPT.generate``): ``unwrap(model)``, and for
    FSDP2 with the root's own parameters gathered, since only a forward gathers them; the blocks
    gather theirs as they run. Every rank must call it and then the same method."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.unshard()
    return unwrap(model)


def mean(x: torch.Tensor) -> torch.Tensor:
    """The mean of ``x`` over the ranks (``x`` itself for one process): the global-batch loss from
    each rank's mean over an equal share."""
    if not dist.is_initialized():
        return x
    total = x.detach().clone()
    dist.all_reduce(total)  # SUM: gloo has no AVG
    return total / dist.get_world_size()


def _numbers(optimizer_state: dict) -> dict:
    """The optimizer's hyperparameters as numbers (an lr kept on the GPU as a 0-d tensor becomes a
    float), so the checkpoint loads on any device."""
    for group in optimizer_state["param_groups"]:
        for key, value in group.items():
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                group[key] = value.item()
    return optimizer_state


def save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, sharded: bool) -> None:
    """Write the model, the optimizer and ``state`` (numbers, lists, tensors: the same on every rank)
    in place of the previous checkpoint: with ``sharded``, the directory ``path`` (every rank writes
    its shards); else the file ``path.pt``, written by rank 0."""
    main = not dist.is_initialized() or dist.get_rank() == 0
    model_state, optimizer_state = get_state_dict(model, optimizer)
    optimizer_state = _numbers(optimizer_state)
    if main:
        shutil.rmtree(path, ignore_errors=True)
        path.with_suffix(".pt").unlink(missing_ok=True)
    if dist.is_initialized():
        dist.barrier()
    if sharded:
        dcp.save({"model": model_state, "optimizer": optimizer_state, "state": state}, checkpoint_id=path)
    elif main:
        torch.save({"model": model_state, "optimizer": optimizer_state, **state}, path.with_suffix(".pt"))
    if dist.is_initialized():
        dist.barrier()  # written before any rank reads it


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """Read what ``save`` wrote at ``path`` (either kind, from any number of ranks) into ``model`` and
    ``optimizer``, resharded to this group; returns the saved ``state``. ``state`` is its template:
    the same keys, tensors of the saved shapes."""
    if path.is_dir():
        model_state, optimizer_state = get_state_dict(model, optimizer)  # the shards to read into
        saved = {"model": model_state, "optimizer": _numbers(optimizer_state), "state": dict(state)}
        dcp.load(saved, checkpoint_id=path, no_dist=not dist.is_initialized())  # one process reads every shard
        set_state_dict(model, optimizer, model_state_dict=saved["model"], optim_state_dict=saved["optimizer"])
        return saved["state"]
    if not path.with_suffix(".pt").is_file():
        raise FileNotFoundError(f"no checkpoint to resume: neither {path}/ nor {path.with_suffix('.pt')} exists")
    saved = torch.load(path.with_suffix(".pt"), map_location="cpu", weights_only=False)
    set_state_dict(model, optimizer, model_state_dict=saved.pop("model"), optim_state_dict=saved.pop("optimizer"),
                   options=StateDictOptions(full_state_dict=True))
    return saved
