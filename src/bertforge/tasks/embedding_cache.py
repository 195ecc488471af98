"""Embeddings of a large contrastive batch at the memory of a small one (GradCache).

A contrastive loss wants many in-batch negatives, but the encoder's activations grow with the
batch. :func:`cached_embeddings` splits the problem in two (Gao et al., 2021, "Scaling Deep
Contrastive Learning Batch Size under Memory Limited Setup"):

1. forward: encode the rows ``chunk`` at a time without autograd, keeping only the (n, D)
   embeddings and each chunk's random-generator state;
2. the loss runs on those embeddings as usual, and its backward delivers d loss / d embeddings;
3. backward: encode each chunk again, with autograd, the same dropout masks (the generator
   state replayed) and the same autocast and matmul precision as the forward, and push that
   chunk's slice of the gradient through it into the parameters.

Memory: one chunk's activations plus the (n, D) embeddings, for one extra forward pass. The
parameter gradients equal those of encoding all chunks with autograd at once.

Distributed: the train loop runs the forward inside ``no_sync(model, sync=last_micro_step)``
and ``loss.backward()`` after that context closed, so the backward here re-creates it: every
chunk but the last accumulates without communication, and the last one syncs as the outer
forward would have (DDP: ``require_backward_grad_sync`` seen at forward time; FSDP2: its
gradient-sync flag, restored after).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterator

import torch
from torch import nn

from bertforge.runtime.precision import float32_matmul

Encode = Callable[[dict[str, torch.Tensor]], torch.Tensor]  # (m, S) inputs -> (m, D)
RngState = tuple[torch.Tensor, torch.Tensor | None]         # (CPU state, CUDA state)


def _fsdp_sync(module: nn.Module) -> bool:
    """The gradient-sync flag ``set_requires_gradient_sync`` last set on an FSDP2 module (FSDP2
    has no public getter: read from its parameter groups; True where there are none)."""
    try:
        groups = module._get_fsdp_state()._fsdp_param_groups  # type: ignore[operator]
    except AttributeError:
        return True
    return all(group.reduce_grads for group in groups)


@dataclass
class _Replay:
    """What the backward needs to run the forward again, chunk by chunk."""

    encode: Encode
    parts: list[dict[str, torch.Tensor]]   # the inputs, chunk by chunk: (m, S) each
    model: nn.Module
    device: torch.device
    autocast: tuple[bool, torch.dtype]     # (enabled, dtype) on the inputs' device type
    matmul: str                            # torch.get_float32_matmul_precision() at forward
    sync: bool                             # the outer forward's gradient sync (DDP or FSDP2)
    rng: list[RngState] = field(default_factory=list)  # each chunk's generator state

    def capture_rng(self) -> None:
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        self.rng.append((torch.get_rng_state(), cuda))

    def restore_rng(self, i: int) -> None:
        cpu, cuda = self.rng[i]
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, self.device)

    def numerics(self) -> ContextManager:
        """The forward's autocast and fp32 matmul precision, and the generators given back as
        they were on leaving (the replay must not shift later draws)."""
        stack = ExitStack()
        cuda = [self.device] if self.device.type == "cuda" else []
        stack.enter_context(torch.random.fork_rng(devices=cuda))
        stack.enter_context(float32_matmul(self.matmul))
        enabled, dtype = self.autocast
        stack.enter_context(torch.autocast(self.device.type, dtype=dtype, enabled=enabled))
        return stack

    @contextmanager
    def chunk_sync(self, last: bool) -> Iterator[None]:
        """Around one chunk's forward and backward: gradient sync only for the last chunk, and
        only if the outer forward had it."""
        inner = getattr(self.model, "_orig_mod", self.model)  # torch.compile's wrapper
        sync = self.sync and last
        if hasattr(inner, "set_requires_gradient_sync"):  # FSDP2 reads its flag in backward
            inner.set_requires_gradient_sync(sync)
            try:
                yield
            finally:
                inner.set_requires_gradient_sync(self.sync)
            return
        ddp = next((m for m in (self.model, inner)
                    if isinstance(m, nn.parallel.DistributedDataParallel)), None)
        with ddp.no_sync() if ddp is not None and not sync else nullcontext():
            yield


def _outer_sync(model: nn.Module) -> bool:
    inner = getattr(model, "_orig_mod", model)
    if hasattr(inner, "set_requires_gradient_sync"):
        return _fsdp_sync(inner)
    for m in (model, inner):
        if isinstance(m, nn.parallel.DistributedDataParallel):
            return bool(m.require_backward_grad_sync)
    return True


class _CachedEncode(torch.autograd.Function):
    """forward: (n, D) embeddings without activations kept; backward: re-encode and push the
    gradient into the parameters chunk by chunk. The dummy leaf only makes the output require
    grad (the parameters are not inputs of this function)."""

    @staticmethod
    def forward(ctx, dummy: torch.Tensor, replay: _Replay) -> torch.Tensor:  # type: ignore[override]
        outs = []
        for part in replay.parts:  # grad mode is off inside Function.forward
            replay.capture_rng()
            outs.append(replay.encode(part))                      # (m, D)
        ctx.replay = replay
        return torch.cat(outs)                                     # (n, D)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        replay: _Replay = ctx.replay
        start, last = 0, len(replay.parts) - 1
        with replay.numerics(), torch.enable_grad():
            for i, part in enumerate(replay.parts):
                replay.restore_rng(i)
                with replay.chunk_sync(last=i == last):
                    out = replay.encode(part)                      # (m, D), with autograd
                    torch.autograd.backward(out, grad[start:start + out.shape[0]])
                start += out.shape[0]
        ctx.replay = None  # drop the inputs and states once used
        return None, None


def _split(inputs: dict[str, torch.Tensor], chunk: int) -> list[dict[str, torch.Tensor]]:
    if chunk < 1:
        raise ValueError(f"cached_embeddings: chunk must be at least 1, got {chunk}")
    if not inputs:
        raise ValueError("cached_embeddings: no inputs")
    flat = [name for name, t in inputs.items() if t.dim() == 0]
    if flat:
        raise ValueError(f"cached_embeddings: {', '.join(flat)} has no rows (a 0-d tensor); "
                         "pass only per-row inputs such as input_ids and attention_mask (n, S)")
    rows = {name: t.shape[0] for name, t in inputs.items()}
    n = next(iter(rows.values()))
    if any(r != n for r in rows.values()):
        raise ValueError(f"cached_embeddings: inputs differ in rows: {rows}")
    return [{name: t[i:i + chunk] for name, t in inputs.items()} for i in range(0, n, chunk)]


def cached_embeddings(encode: Encode, inputs: dict[str, torch.Tensor], chunk: int,
                      model: nn.Module) -> torch.Tensor:
    """(n, D) embeddings of ``inputs`` (each (n, S): input_ids, attention_mask, ...), computed
    ``chunk`` rows at a time, holding one chunk's activations at once in forward and backward.

    ``encode(sub_inputs) -> (m, D)`` runs the (possibly DDP-wrapped or FSDP2-sharded) ``model``
    and pools. The result behaves like ``torch.cat([encode(c) for c in chunks])``: the same
    values and, once a loss on it is backpropagated, the same parameter gradients (dropout
    included: each chunk's generator state is replayed). ``model`` is the module ``encode``
    calls, for the gradient-sync handling (see the module docstring). Without grad mode the
    chunks are simply encoded and concatenated.

    Every input is split by rows, so pass per-row tensors only (no packed-batch layout such
    as ``cu_seqlens``). Make one call per micro-step (queries and documents concatenated, at
    the same padded length): the backward of every call syncs gradients on its last chunk,
    which two calls would do twice (right, but twice the communication).
    """
    parts = _split(inputs, chunk)
    if not torch.is_grad_enabled():
        return torch.cat([encode(part) for part in parts])
    device = next(iter(inputs.values())).device
    replay = _Replay(
        encode=encode, parts=parts, model=model, device=device,
        autocast=(torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type)),
        matmul=torch.get_float32_matmul_precision(), sync=_outer_sync(model))
    dummy = torch.empty(0, device=device, requires_grad=True)
    return _CachedEncode.apply(dummy, replay)


__all__ = ["cached_embeddings"]
