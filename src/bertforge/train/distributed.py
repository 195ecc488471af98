"""torch.distributed set-up for torchrun or srun (one node or many) and plain single-process runs.

The model knows nothing of this: ``init_distributed`` reads torchrun's environment (or srun's,
one task per GPU), and
``wrap_ddp`` applies DDP from outside, or ``shard_model`` FSDP2 (``train.fsdp``: every transformer
layer, then the root, sharded with ``fully_shard``). NCCL on GPUs, gloo on CPU.

A rank that stops answering (stopped, hung, its node gone) must not hang the others for long:
every collective waits at most the process group's timeout (``train.dist_timeout_s``), then
raises; :func:`collective_failure` turns that into one error line per rank. Work that only rank
0 should do but every rank depends on goes through :func:`on_rank0`, which hands rank 0's result
*or its error* to every rank, so no rank waits for an answer that never comes.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterable, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from bertforge.core.numbers import ascii_int
from bertforge.errors import CollectiveTimeout, ConfigError, DataError, RunError, UserError

log = logging.getLogger(__name__)
T = TypeVar("T")
GLOO_TIMEOUT_S = 300.0   # CPU runs: a few minutes is long enough for any collective we issue
NCCL_TIMEOUT_S = 600.0   # torch's own NCCL default; a big checkpoint save waits at a barrier


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    timeout_s: float = GLOO_TIMEOUT_S  # how long any collective waits for the other ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
_SLURM_STEP_VARS = ("SLURM_STEP_ID", "SLURM_STEPID")  # srun's tasks have them, the batch step not


def _env_int(name: str, default: int) -> int:
    """A launcher's variable as an int (``default`` when unset); garbage is a one-line error
    naming the variable rather than a ValueError traceback."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value = ascii_int(raw, negative=True)
    if value is None:
        raise ConfigError(f"{name}={raw!r} is not a whole number written with the digits 0-9 "
                          "(torchrun or srun sets it; unset it to run one process)")
    return value


def _detect_launch() -> tuple[str, int, int, int]:
    """(launcher, rank, world size, local rank) of this process.

    torchrun's variables win: under ``srun torchrun`` (one torchrun per node) SLURM_PROCID
    numbers the torchrun task, not this worker. SLURM's count only in an srun task (a job step
    sets SLURM_STEP_ID): the batch script's own shell has SLURM_PROCID=0 and the job's
    SLURM_NTASKS too, and a bertforge started there must not wait for ranks that never come.
    """
    if any(name in os.environ for name in _TORCHRUN_VARS):
        launch = ("torchrun", _env_int("RANK", 0), _env_int("WORLD_SIZE", 1),
                  _env_int("LOCAL_RANK", 0))
    elif "SLURM_PROCID" in os.environ and any(v in os.environ for v in _SLURM_STEP_VARS):
        launch = ("srun", _env_int("SLURM_PROCID", 0), _env_int("SLURM_NTASKS", 1),
                  _env_int("SLURM_LOCALID", 0))
    else:
        launch = ("none", 0, 1, 0)
    launcher, rank, world, local_rank = launch
    if world < 1 or not 0 <= rank < world or local_rank < 0:
        names = ("RANK, WORLD_SIZE, LOCAL_RANK" if launcher == "torchrun"
                 else "SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID")
        raise ConfigError(f"{names} give rank {rank} of {world} (local rank {local_rank}), "
                          f"which cannot be: let {launcher} set them")
    if launcher != "none":
        log.info("launcher: %s; rank %d of %d, local rank %d", *launch)
    elif "SLURM_PROCID" in os.environ:
        log.info("launcher: none (SLURM variables but no job step: the batch script itself, "
                 "not an srun task); one process")
    return launch


def _export_srun_rank(rank: int, world: int, local_rank: int) -> None:
    """Give torch's env:// rendezvous what torchrun would have set: RANK, WORLD_SIZE and
    LOCAL_RANK from srun's numbering, and MASTER_ADDR/MASTER_PORT, which only the job script
    can know (srun does not set them), so their absence is the user's to fix."""
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"srun started {world} tasks but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: export MASTER_ADDR (the job's "
            'first host: $(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)) and '
            "MASTER_PORT (a free port, e.g. 29500) before srun (scripts/pretrain.sbatch does "
            "so with LAUNCHER=srun)")
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank))


def _gpu_index(local_rank: int) -> int:
    """This process's GPU: its local rank, except where each process is shown only its own GPU,
    as cuda:0 (srun's per-task binding, --gpus-per-task or --gpu-bind)."""
    if local_rank > 0 and torch.cuda.device_count() == 1:
        return 0
    return local_rank


def init_distributed(device: str | None = None, timeout_s: float | None = None) -> DistInfo:
    """Join the process group that torchrun or srun describes (world size > 1), else run alone.

    Rank, world size and local rank come from torchrun (RANK, WORLD_SIZE, LOCAL_RANK) when it
    set them, else from srun when this process is one of a job step's tasks (SLURM_PROCID,
    SLURM_NTASKS, SLURM_LOCALID: one task per GPU, no torchrun; MASTER_ADDR and MASTER_PORT
    must be exported), else this is the only process.
    ``device`` forces "cpu" or "cuda"; by default CUDA is used when present, one GPU per local rank.
    ``timeout_s`` bounds every collective (default: 300 s with gloo, 600 s with NCCL).
    """
    launcher, rank, world, local_rank = _detect_launch()
    joining = world > 1 and not dist.is_initialized()
    if joining and launcher == "srun":
        _export_srun_rank(rank, world, local_rank)
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    dev = torch.device("cuda", _gpu_index(local_rank)) if use_cuda else \
        torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    seconds = timeout_s or (NCCL_TIMEOUT_S if use_cuda else GLOO_TIMEOUT_S)
    if joining:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo",
                                timeout=datetime.timedelta(seconds=seconds))
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=dev,
                    timeout_s=seconds)


def wrap_ddp(model: nn.Module, info: DistInfo) -> nn.Module:
    """DDP when there is more than one rank; the bare model otherwise."""
    if not info.distributed:
        return model
    ids = [info.device.index] if info.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def shard_model(model: nn.Module, info: DistInfo, compute_dtype: torch.dtype | None = None,
                reduce_dtype: torch.dtype = torch.float32) -> bool:
    """Shard ``model`` in place with FSDP2: each of ``model.transformer_layers()`` is its own
    unit (its parameters gathered just for its forward and backward), the root holds the rest
    (embeddings, heads, so tied weights stay in one unit). True if it sharded; in one process
    there is nothing to shard and the model is left as it is.

    ``compute_dtype`` (bf16/fp16 runs): the weights are all-gathered in that dtype (half the
    traffic and memory of fp32) while each rank's shard, the optimizer's master copy, stays
    fp32; gradients are reduce-scattered in ``reduce_dtype`` (fp32 by default: a sum over many
    ranks in bf16 loses the small gradients). None: everything in fp32.

    Call before building the optimizer: parameters become DTensors (new Parameter objects).
    """
    if not info.distributed:
        log.warning("train.fsdp: one process, nothing to shard; training unsharded")
        return False
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layers = model.transformer_layers() if hasattr(model, "transformer_layers") else []
    if not layers:
        raise UserError(f"train.fsdp: {type(model).__name__} has no transformer layers to "
                        "shard (no transformer_layers()); use train.fsdp=false (DDP)")
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype,
                                  reduce_dtype=reduce_dtype if compute_dtype is not None else None)
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    # FSDP2 warns once per forward that an output is a view (an in-place op on it would skip
    # its backward hook). Our losses only read the outputs (cross-entropy, argmax).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor",
                            category=UserWarning)
    return True


def is_sharded(model: nn.Module) -> bool:
    """True for a model :func:`shard_model` sharded (also under torch.compile's wrapper)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(getattr(model, "_orig_mod", model), FSDPModule)


def no_sync(model: nn.Module, sync: bool) -> ContextManager:
    """Skip the gradient reduction on every micro-step but the last of an accumulation.

    DDP: its ``no_sync()`` context (read in forward). FSDP2 reads its flag in backward, which
    runs after this context has closed, so the flag is set here and stays set: the last
    micro-step of every step turns it back on.
    """
    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    if hasattr(inner, "set_requires_gradient_sync"):  # an FSDP2 module
        inner.set_requires_gradient_sync(sync)
        return nullcontext()
    if sync or not isinstance(model, nn.parallel.DistributedDataParallel):
        return nullcontext()
    return model.no_sync()


def local_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """``named`` with each DTensor replaced by this rank's shard (for per-rank checks)."""
    from torch.distributed.tensor import DTensor

    return [(name, t.to_local() if isinstance(t, DTensor) else t) for name, t in named]


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    """Mean of ``t`` over ranks (``t`` itself in one process); every rank gets the result."""
    if not dist.is_initialized():
        return t
    return all_reduce_sum(t) / dist.get_world_size()


def _all_gather_rows(out: torch.Tensor, t: torch.Tensor) -> None:
    """``out`` (W*B, ...) := every rank's ``t`` (B, ...) in rank order (gloo and NCCL alike).
    torch 2.13 renamed ``all_gather_into_tensor`` to ``all_gather_single``; 2.6 has only the
    former."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, t)


class _GatherWithGrad(torch.autograd.Function):
    """(W*B, ...) every rank's rows in rank order; backward: this rank's rows of the gradient
    summed over ranks (every rank's loss read every rank's rows)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        world, rank = dist.get_world_size(), dist.get_rank()
        out = t.new_empty((world * t.shape[0], *t.shape[1:]))
        _all_gather_rows(out, t.contiguous())
        ctx.rows = slice(rank * t.shape[0], (rank + 1) * t.shape[0])
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        # A SUM (not a mean): DDP then averages the parameter gradients over ranks. all_reduce
        # rather than reduce_scatter, which gloo lacks; a copy, as autograd may share ``grad``.
        total = grad.contiguous().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total[ctx.rows]


_MAX_DIMS = 8  # the shape check sends every rank's shape padded to this many dims


def _check_same_shape(t: torch.Tensor) -> None:
    """Raise a DataError naming the shapes when the ranks' ``t`` differ in shape (one tiny
    all-gather; on a GPU its answer is read back: one host sync)."""
    if not 1 <= t.dim() <= _MAX_DIMS:
        raise ValueError(f"all_gather_with_grad takes 1 to {_MAX_DIMS} dims, got {t.dim()}")
    padded = [t.dim(), *t.shape, *[-1] * (_MAX_DIMS - t.dim())]
    mine = torch.tensor(padded, dtype=torch.int64).to(t.device)  # (1 + _MAX_DIMS,)
    every = mine.new_empty(dist.get_world_size() * (_MAX_DIMS + 1))
    _all_gather_rows(every, mine)
    shapes = [tuple(row[1:row[0] + 1]) for row in every.view(-1, _MAX_DIMS + 1).tolist()]
    if any(shape != shapes[0] for shape in shapes):
        listed = ", ".join(f"rank {r} {s}" for r, s in enumerate(shapes))
        raise DataError(f"all_gather_with_grad: the ranks passed different shapes ({listed}); "
                        "every rank must pass the same: use a fixed micro-batch size and drop "
                        "the last, smaller batch (drop_last)")


def all_gather_with_grad(t: torch.Tensor, check_shapes: bool = True) -> torch.Tensor:
    """Every rank's ``t`` (B, ...) concatenated along dim 0 in rank order, (W*B, ...), with
    gradients flowing back to the rank that owns each row; ``t`` itself without
    torch.distributed (or with one rank).

    Every rank must pass the same shape. ``check_shapes`` verifies that first, with one tiny
    all-gather (a host sync on a GPU), and names the shapes when they differ; pass False where
    a fixed micro-batch guarantees it (a mismatch then fails or hangs in the collective).
    Backward sums the incoming gradient over ranks (all-reduce) and keeps this rank's rows:
    right for a loss averaged by DDP, whose mean over ranks then gives one process's gradient.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return t
    if check_shapes:
        _check_same_shape(t)
    return _GatherWithGrad.apply(t)


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


def on_rank0(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and give every rank its result, or raise its error everywhere.

    For decisions that read or change shared files once (which checkpoint to resume from). An
    error that is not a ``UserError``/``RunError`` is re-raised as is on rank 0 and reaches the
    other ranks as a ``RunError`` naming it, instead of leaving them waiting for a broadcast.
    """
    if not dist.is_initialized():
        return fn()
    payload: list = [None]
    failure: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            payload[0] = ("ok", fn())
        except BaseException as exc:  # noqa: BLE001 (re-raised below, after telling the others)
            failure = exc
            shareable = exc if isinstance(exc, (UserError, RunError)) else RunError(
                f"rank 0 failed ({type(exc).__name__}: {exc}); see its output")
            payload[0] = ("error", shareable)
    dist.broadcast_object_list(payload, src=0)
    if failure is not None:
        raise failure
    kind, value = payload[0]
    if kind == "error":
        raise value
    return value


# What gloo and NCCL say when a peer does not answer in time or has gone away.
_COLLECTIVE_FAILURE = re.compile(r"timed out|timeout|connection closed by peer|connection reset|"
                                 r"pair closure|watchdog", re.IGNORECASE)
_RANK_IN_MESSAGE = re.compile(r"\b[Rr]ank (\d+)\b")


def collective_failure(exc: BaseException, info: DistInfo) -> CollectiveTimeout | None:
    """A one-line ``CollectiveTimeout`` for an error raised by a collective whose peer stopped
    responding (None for any other error). Names the unresponsive rank when torch's message
    does, or when there is only one other rank."""
    if not info.distributed or not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    if not _COLLECTIVE_FAILURE.search(text):
        return None
    named = [int(r) for r in _RANK_IN_MESSAGE.findall(text) if int(r) != info.rank]
    peer = (f"rank {named[0]}" if named else f"rank {1 - info.rank}" if info.world_size == 2
            else "another rank")
    said = " ".join(text.split())[:200]
    return CollectiveTimeout(
        f"rank {info.rank}: {peer} stopped responding: a collective waited up to "
        f"{info.timeout_s:g} s "
        f"(train.dist_timeout_s) and failed ({said}). Checkpoints written so far are intact; "
        "once every rank is running again, restart the same command to resume")


def gather_full_model(model: nn.Module) -> nn.Module | None:
    """An unsharded CPU copy of the FSDP-sharded ``model`` on rank 0 (None on the others), to
    save as a Hugging Face directory: the model's own class (not FSDP's subclass), the full
    weights gathered from every rank. A collective: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
    if dist.get_rank() != 0:
        return None
    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    with torch.device("meta"):  # no memory and no init: every tensor is assigned below
        twin = cls(model.config)
    twin.load_state_dict(full, assign=True)
    return twin
