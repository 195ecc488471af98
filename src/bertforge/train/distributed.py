"""torch.distributed set-up for torchrun (one node or many) and plain single-process runs.

The model knows nothing of this: ``init_distributed`` reads torchrun's environment, and
``wrap_ddp`` applies DDP from outside. NCCL on GPUs, gloo on CPU.
"""

from __future__ import annotations

import datetime
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import ContextManager

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str | None = None) -> DistInfo:
    """Join the process group torchrun describes (WORLD_SIZE > 1), else run alone.

    ``device`` forces "cpu" or "cuda"; by default CUDA is used when present, one GPU per local rank.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo",
                                timeout=datetime.timedelta(minutes=30))
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=dev)


def wrap_ddp(model: nn.Module, info: DistInfo) -> nn.Module:
    """DDP when there is more than one rank; the bare model otherwise."""
    if not info.distributed:
        return model
    ids = [info.device.index] if info.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def no_sync(model: nn.Module, sync: bool) -> ContextManager:
    """Skip DDP's gradient all-reduce on every micro-step but the last of an accumulation."""
    if sync or not isinstance(model, nn.parallel.DistributedDataParallel):
        return nullcontext()
    return model.no_sync()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank if ``flag`` is True on any (used to agree on preemption)."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
