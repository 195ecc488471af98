"""LAMB (layer-wise adaptive moments) with NVIDIA FusedLAMB's semantics, in plain PyTorch.

One step, with g the gradients of all parameters of all groups::

    n      = ||concat(g)||_2                                   (global, pre-clip; kept for logging)
    g      = g / max(n / max_grad_norm, 1)                     (max_grad_norm <= 0: no clipping)
    m      = b1 * m + (1 - b1) * g
    v      = b2 * v + (1 - b2) * g^2
    u      = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * w
    r      = ||w|| / ||u||  if wd != 0 and both norms > 0, else 1
    w      = w - lr * r * u

The trust ratio is skipped for groups without weight decay: that is what FusedLAMB does by default
(``use_nvlamb=False``) and what NVIDIA's BERT recipe relies on for biases and LayerNorm.

Everything runs on lists of tensors with ``torch._foreach_*`` ops, bucketed by (device, dtype), so
a step launches a fixed number of kernels per bucket instead of several per parameter, and nothing
in it reads a value back to the host.

Sharded parameters (FSDP2's DTensors, ``train.fsdp``) are updated through their local shards; every
norm (the global gradient norm, each trust ratio's ||w|| and ||u||) is still the norm of the full
tensor: the shards' squared norms are summed over the ranks that hold them, one all-reduce per
kind of norm. Plain tensors take exactly the code path they always did.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from typing import Callable, Iterable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from bertforge.core import limits

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed support has no sharded tensors
    DTensor = None  # type: ignore[assignment,misc]


def _buckets(tensors: Sequence[Tensor]) -> dict[tuple[torch.device, torch.dtype], list[int]]:
    """Indices of ``tensors`` grouped by (device, dtype): foreach kernels need uniform lists."""
    out: dict[tuple[torch.device, torch.dtype], list[int]] = defaultdict(list)
    for i, t in enumerate(tensors):
        out[(t.device, t.dtype)].append(i)
    return out


def _norm_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for 16- and 32-bit tensors, float64 for float64 (a norm never narrows its input)."""
    return torch.promote_types(dtype, torch.float32)


def _local(t: Tensor) -> Tensor:
    """This rank's shard of a DTensor (a view: in-place ops change the DTensor); ``t`` otherwise."""
    return t.to_local() if DTensor is not None and isinstance(t, DTensor) else t


def _shard_groups(t: Tensor) -> tuple:
    """Process groups across which ``t``'s elements are split (``()``: this rank holds it all)."""
    if DTensor is None or not isinstance(t, DTensor):
        return ()
    if any(p.is_partial() for p in t.placements):
        raise ValueError("norms of a DTensor with Partial placement need a reduction first; "
                         "redistribute it to Shard or Replicate")
    return tuple(t.device_mesh.get_group(d) for d, p in enumerate(t.placements) if p.is_shard())


def _full_norms(local: list[Tensor], dtype: torch.dtype, groups: tuple) -> Tensor:
    """(n,) L2 norms of the full tensors whose shards on this rank are ``local``, all split
    across the same process ``groups`` (from :func:`_shard_groups`; ``()``: held whole): the
    shards' squared norms summed over those groups, one all-reduce per group."""
    norms = torch.stack(torch._foreach_norm(local, 2, dtype=dtype))  # (n,)
    if not groups:
        return norms
    squares = norms.square()
    for group in groups:
        dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=group)
    return squares.sqrt()


def global_grad_norm(grads: Sequence[Tensor]) -> Tensor:
    """L2 norm of all ``grads`` taken together, as a 0-d tensor on the first grad's device:
    float32, or float64 when any grad is float64.

    Per-tensor norms are accumulated in float32 even for half-precision grads, whose squares
    would overflow float16 long before a BERT gradient becomes unusual.
    """
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    if DTensor is not None and any(isinstance(g, DTensor) for g in grads):
        return _sharded_global_norm(grads)
    device = grads[0].device
    norms: list[Tensor] = []
    for (_, dtype), idx in _buckets(grads).items():
        bucket_norms = torch._foreach_norm([grads[i] for i in idx], 2, dtype=_norm_dtype(dtype))
        norms.extend(n.to(device) for n in bucket_norms)  # no-op on the same device
    wide = functools.reduce(torch.promote_types, (n.dtype for n in norms))
    return torch.linalg.vector_norm(torch.stack([n.to(wide) for n in norms]))


def _sharded_global_norm(grads: Sequence[Tensor]) -> Tensor:
    """:func:`global_grad_norm` of DTensor (and plain) grads: the squared norms of the local
    shards, summed over the ranks that hold the other shards (one all-reduce per set of
    process groups), plus the squared norms of tensors every rank holds whole."""
    device = _local(grads[0]).device
    total: dict[tuple, Tensor] = {}
    for (_, dtype), idx in _buckets([_local(g) for g in grads]).items():
        norms = torch._foreach_norm([_local(grads[i]) for i in idx], 2, dtype=_norm_dtype(dtype))
        for i, n in zip(idx, norms):
            key = _shard_groups(grads[i])
            sq = n.to(device).double().square()  # float64: the sum of squares loses nothing
            total[key] = total[key] + sq if key in total else sq
    result = torch.zeros((), dtype=torch.float64, device=device)
    for key, sq in total.items():
        for group in key:
            dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=group)
        result = result + sq
    wide = functools.reduce(torch.promote_types, (_norm_dtype(g.dtype) for g in grads))
    return result.sqrt().to(wide)


def check_adam_args(lr: float, betas: Sequence[float], eps: float, weight_decay: float) -> None:
    """The hyper-parameters every Adam-style optimizer here shares, against the ranges of
    :mod:`bertforge.core.limits` (``ValueError`` naming the argument)."""
    limits.LEARNING_RATE.check(lr, "lr")
    if len(betas) != 2:
        raise ValueError(f"betas must be two numbers, got {list(betas)}")
    for i, beta in enumerate(betas):
        limits.BETA.check(beta, f"betas[{i}]")
    limits.EPS.check(eps, "eps")
    limits.WEIGHT_DECAY.check(weight_decay, "weight_decay")


def _clip_factor(norm: Tensor, max_norm: float) -> Tensor:
    """1 / max(norm / max_norm, 1): the factor that brings the global norm down to ``max_norm``."""
    return torch.clamp(norm / max_norm, min=1.0).reciprocal()


@torch.no_grad()
def clip_grad_norm_(params: Iterable[Tensor], max_norm: float) -> Tensor:
    """Scale the gradients of ``params`` in place so their global L2 norm is at most ``max_norm``.

    Same rule as :class:`Lamb` (grads / max(norm / max_norm, 1)), so LAMB and AdamW runs clip
    identically. ``max_norm <= 0`` only measures. Returns the pre-clip norm (0-d tensor,
    no host sync). Used by the train loop for optimizers that do not clip internally.
    """
    grads = [p.grad for p in params if p.grad is not None]
    norm = global_grad_norm(grads)
    if max_norm > 0 and grads:
        factor = _clip_factor(norm, max_norm)
        for (dev, _), idx in _buckets([_local(g) for g in grads]).items():
            torch._foreach_mul_([_local(grads[i]) for i in idx], factor.to(dev))
    return norm


class AdamMoments(torch.optim.Optimizer):
    """What the Adam-moment optimizers (LAMB, the AdamW variants) share: per-parameter state
    of a CPU step counter and two moments of ``moment_dtype``, created on demand or all at once
    (``init_state``), and step counters kept on the CPU across ``load_state_dict``."""

    def moment_dtype(self, p: Tensor) -> torch.dtype:
        """The dtype of ``p``'s moments: its own."""
        return p.dtype

    def _init_state(self, p: Tensor) -> dict:
        state = self.state[p]
        if not state:
            # ``step`` is a CPU tensor (torch's own convention), so load_state_dict leaves it on
            # the CPU and bias corrections are computed on the host without a device sync.
            state["step"] = torch.zeros((), dtype=torch.float32)
            dtype = self.moment_dtype(p)
            state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype,
                                                   memory_format=torch.preserve_format)
        return state

    def init_state(self) -> None:
        """Create every parameter's state now (zero moments, step 0), as the first step would;
        loaders of sharded checkpoints fill a complete state in place."""
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader, plus: step counters go back to the CPU whatever ``map_location`` the
        checkpoint was read with, so bias corrections never sync with the device."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            if "step" in state:
                state["step"] = state["step"].detach().to("cpu", torch.float32)


class Lamb(AdamMoments):
    """LAMB as in NVIDIA's BERT recipe (apex FusedLAMB, ``adam_w_mode=True``, bias correction on).

    Args:
        params: parameters or parameter-group dicts (see :func:`bertforge.optim.build.param_groups`).
        lr: learning rate (a float; schedulers overwrite ``group["lr"]``).
        betas: Adam moment coefficients (b1, b2), each in [0, 1).
        eps: added to sqrt(v_hat) in the denominator.
        weight_decay: decoupled decay added to the update; 0 in a group also turns off the trust
            ratio for that group.
        max_grad_norm: clip threshold for the global gradient norm over all groups; 0 disables.

    Any floating dtype torch.optim accepts works (float16, bfloat16, float32, float64); norms are
    taken in float32, or in float64 for float64 tensors. Arguments outside the ranges of
    :mod:`bertforge.core.limits` raise ``ValueError``.

    After each :meth:`step`, ``last_grad_norm`` holds the pre-clip global gradient norm as a
    float32 0-d tensor on the parameters' device (read it with ``.item()`` only when logging).
    """

    #: Clipping happens inside :meth:`step`; the train loop must not clip again.
    clips_gradients = True

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        max_grad_norm: float = 1.0,
    ) -> None:
        check_adam_args(lr, betas, eps, weight_decay)
        limits.MAX_GRAD_NORM.check(max_grad_norm, "max_grad_norm")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.max_grad_norm = float(max_grad_norm)
        self.last_grad_norm: Optional[Tensor] = None

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None,
             grad_norm: Optional[Tensor] = None) -> Optional[float]:
        """Apply one LAMB update to every parameter that has a gradient.

        ``grad_norm``: the global L2 norm of the current gradients when the caller has already
        computed it (the train loop does, to skip non-finite steps), saving a pass over them.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        all_grads: list[Tensor] = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients; use dense "
                                       "embeddings (sparse=False) with this optimizer")
                all_grads.append(p.grad)
        if not all_grads:
            return loss

        # The norm is global over all groups (decay and no-decay alike), like FusedLAMB's.
        norm = global_grad_norm(all_grads) if grad_norm is None else grad_norm
        self.last_grad_norm = norm
        clip = _clip_factor(norm, self.max_grad_norm) if self.max_grad_norm > 0 else None

        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._init_state(p) for p in params]
            # Buckets of one device, dtype and sharding: foreach kernels need uniform lists, and
            # the trust ratios' norms of one bucket are reduced over one set of process groups.
            buckets: dict[tuple, list[int]] = defaultdict(list)
            for key, idx in _buckets([_local(p) for p in params]).items():
                for i in idx:
                    buckets[(*key, _shard_groups(params[i]))].append(i)
            for (dev, _, shards), idx in buckets.items():
                self._update_bucket(
                    group,
                    [params[i] for i in idx],
                    [params[i].grad for i in idx],
                    [states[i] for i in idx],
                    None if clip is None else clip.to(dev),
                    shards,
                )
        return loss

    def _update_bucket(
        self,
        group: dict,
        params: list[Tensor],
        grads: list[Tensor],
        states: list[dict],
        clip: Optional[Tensor],
        shards: tuple = (),
    ) -> None:
        """LAMB update for tensors that share one device, dtype and sharding (``clip`` is 0-d
        or None; ``shards``: the process groups every one of them is split across, ``()`` for
        plain tensors). DTensors are updated through their local shards (module docstring)."""
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        params, grads = [_local(p) for p in params], [_local(g) for g in grads]
        exp_avgs = [_local(s["exp_avg"]) for s in states]
        exp_avg_sqs = [_local(s["exp_avg_sq"]) for s in states]
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1.0)
        # Steps can differ between tensors of a group (a tensor may have missed steps without a
        # grad), so the bias corrections are per tensor. ``step`` is on the CPU: no sync.
        ts = [s.item() for s in steps]
        bc1 = [1.0 - beta1**t for t in ts]
        bc2_sqrt = [math.sqrt(1.0 - beta2**t) for t in ts]

        # Clipping scales a temporary copy: p.grad stays untouched, as with FusedLAMB.
        g = torch._foreach_mul(grads, clip) if clip is not None else grads
        torch._foreach_lerp_(exp_avgs, g, 1.0 - beta1)           # m = b1 m + (1 - b1) g
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, g, g, 1.0 - beta2)  # v = b2 v + (1 - b2) g^2
        del g

        # sqrt(v_hat) + eps with v_hat = v / bc2, i.e. sqrt(v) / sqrt(bc2) + eps
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, eps)
        update = torch._foreach_div(exp_avgs, denom)             # m / denom, then / bc1 = m_hat / denom
        del denom
        torch._foreach_div_(update, bc1)

        if wd == 0:
            # No decay, no adaptation (biases, LayerNorm): a plain Adam step.
            torch._foreach_add_(params, update, alpha=-lr)
            return
        torch._foreach_add_(update, params, alpha=wd)
        # ||w|| and ||u|| of every tensor: (2n,), for shards in one all-reduce per process group
        both = _full_norms([*params, *update], _norm_dtype(params[0].dtype), shards)
        w_norm, u_norm = both[: len(params)], both[len(params):]
        # A zero weight (fresh bias-like tensor) or a zero update would give 0 or inf: use 1.
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        scale = (trust * -lr).to(params[0].dtype)                                 # (n,)
        # w += scale_i * u_i for every tensor in one pass: a foreach op whose per-tensor factor is
        # a 0-d device tensor (PyTorch fuses this form into one kernel on CUDA; a per-tensor
        # multiply would launch one kernel per parameter).
        torch._foreach_addcmul_(params, list(scale.unbind(0)), update)
