"""AdamW with update clipping (StableAdamW) and with learning-rate-decoupled weight decay.

StableAdamW is Algorithm 2 of Wortsman et al. 2023, "Stable and low-precision training for
large-scale vision-language models" (the optimizer ModernBERT was trained with); the decoupled
decay is composer's ``DecoupledAdamW`` (Loshchilov & Hutter's original proposal). One step of a
tensor ``w`` with gradient ``g``, ``t`` its own step count, ``lr`` the group's scheduled learning
rate and ``lr0`` its peak (``group["initial_lr"]``, the value the schedule scales)::

    m     = b1 m + (1 - b1) g
    v     = b2 v + (1 - b2) g^2
    m_hat = m / (1 - b1^t),   v_hat = v / (1 - b2^t)
    rms   = sqrt(mean(g^2 / max(v_hat, eps^2)))            mean over every element of the tensor
    lr_w  = lr / max(1, rms)     update clipping on (StableAdamW); lr_w = lr otherwise
    d     = lr_w * wd            AdamW's decay
          = lr_w / lr0 * wd      decouple_lr: the decay follows the schedule's shape, not its size
    w     = w (1 - d) - lr_w m_hat / (sqrt(v_hat) + eps)

The paper writes the moments with debiased betas (b_hat = b (1 - b^(t-1)) / (1 - b^t)), which
keeps m_hat and v_hat directly; the recurrences above are the same numbers. With both switches
off the step is ``torch.optim.AdamW``'s, operation for operation.

Parameters in float16 or bfloat16 keep their moments in float32 and are updated through a float32
copy rounded once at the end. Sharded parameters (FSDP2's DTensors) are updated through their
local shards, and ``rms`` is still the mean over the full tensor: the shards' sums of squares are
added over the ranks that hold them (one all-reduce per bucket of tensors), so a sharded run
clips exactly the tensors an unsharded one does. Nothing in a step reads a device value back to
the host.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable, Iterable, Optional, Sequence

import torch
from torch import Tensor

from bertforge.optim.lamb import (AdamMoments, _buckets, _full_norms, _local, _norm_dtype,
                                  _shard_groups, check_adam_args)

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _state_dtype(p: Tensor) -> torch.dtype:
    """Moments of 16-bit parameters are kept in float32 (their squares underflow float16)."""
    return torch.float32 if p.dtype in _LOW_PRECISION else p.dtype


class AdamWVariant(AdamMoments):
    """AdamW with two switches (module docstring): ``update_clipping`` scales each tensor's
    learning rate by 1 / max(1, rms) (StableAdamW), ``decouple_lr`` multiplies the weight decay by
    lr / lr0 instead of lr (composer's DecoupledAdamW). Both off: ``torch.optim.AdamW``.

    Args:
        params: parameters or parameter-group dicts (see :func:`bertforge.optim.build.param_groups`).
        lr: peak learning rate; schedulers overwrite ``group["lr"]`` and keep the peak in
            ``group["initial_lr"]``, which is what ``decouple_lr`` divides by.
        betas, eps: Adam's; ``eps`` is added to sqrt(v_hat), and eps^2 floors v_hat in the rms.
        weight_decay: per group (0 for biases and norms in :func:`param_groups`).

    Does not clip gradient norms: the train loop does (``optim.max_grad_norm``; 0 turns it off).
    """

    clips_gradients = False

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, *, update_clipping: bool = False,
                 decouple_lr: bool = False) -> None:
        check_adam_args(lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        # The behaviour belongs to the class, not to a checkpoint: load_state_dict replaces the
        # groups' entries, so the switches are attributes.
        self.update_clipping = bool(update_clipping)
        self.decouple_lr = bool(decouple_lr)
        for group in self.param_groups:
            group.setdefault("initial_lr", group["lr"])  # what torch's schedulers set as well

    def moment_dtype(self, p: Tensor) -> torch.dtype:
        return _state_dtype(p)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader, which casts every moment to its parameter's dtype (step counters
        back to the CPU: ``AdamMoments``), then: the float32 moments of 16-bit parameters are
        taken again from ``state_dict`` (not narrowed and widened, so a resumed run is bitwise
        the uninterrupted one)."""
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        for i, p in zip(saved_ids, params):
            saved, state = state_dict["state"].get(i), self.state.get(p)
            if saved is None or state is None:
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                if key in saved and _state_dtype(p) != p.dtype:
                    state[key] = saved[key].to(device=p.device, dtype=_state_dtype(p))

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Apply one update to every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients; "
                                   "use dense embeddings (sparse=False) with this optimizer")
            states = [self._init_state(p) for p in params]
            # Buckets of one device, dtype and sharding: foreach kernels need uniform lists, and
            # the rms of one bucket's tensors is reduced over one set of process groups.
            buckets: dict[tuple, list[int]] = defaultdict(list)
            for key, idx in _buckets([_local(p) for p in params]).items():
                for i in idx:
                    buckets[(*key, _shard_groups(params[i]))].append(i)
            for (_, _, shards), idx in buckets.items():
                self._update_bucket(group, [params[i] for i in idx], [states[i] for i in idx],
                                    shards)
        return loss

    def _update_bucket(self, group: dict, params: list[Tensor], states: list[dict],
                       shards: tuple) -> None:
        """The update of tensors that share one device, dtype and sharding (``shards``: the
        process groups each is split across, ``()`` for plain tensors)."""
        beta1, beta2 = group["betas"]
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1.0)
        # Per tensor: a tensor may have missed steps without a gradient. On the CPU: no sync.
        ts = [s.item() for s in steps]
        bc1 = [1 - beta1**t for t in ts]
        bc2 = [1 - beta2**t for t in ts]
        local = [_local(p) for p in params]
        low = local[0].dtype in _LOW_PRECISION
        # 16-bit parameters: the arithmetic runs on float32 copies, rounded back once at the end.
        weights = [p.float() for p in local] if low else local
        grads = [_local(p.grad) for p in params]
        grads = [g.float() for g in grads] if low else grads
        exp_avgs = [_local(s["exp_avg"]) for s in states]
        exp_avg_sqs = [_local(s["exp_avg_sq"]) for s in states]

        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)            # m = b1 m + (1 - b1) g
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)  # v = b2 v + (1 - b2) g^2
        if self.update_clipping:
            rms = self._rms(params, grads, exp_avg_sqs, bc2, group["eps"], shards)
            self._clipped_update(group, weights, exp_avgs, exp_avg_sqs, bc1, bc2, rms)
        else:
            self._plain_update(group, weights, exp_avgs, exp_avg_sqs, bc1, bc2)
        if low:
            torch._foreach_copy_(local, weights)

    def _decay(self, group: dict, lr_w):  # float or (n,) tensor -> the same
        """The fraction ``d`` of each weight decayed: lr_w * wd, or lr_w / lr0 * wd when the
        decay is decoupled from the learning rate (composer's order of operations)."""
        if self.decouple_lr:
            return (lr_w / group.get("initial_lr", group["lr"])) * group["weight_decay"]
        return lr_w * group["weight_decay"]

    def _plain_update(self, group: dict, weights: list[Tensor], exp_avgs: list[Tensor],
                      exp_avg_sqs: list[Tensor], bc1: list[float], bc2: list[float]) -> None:
        """No update clipping: torch.optim.AdamW's foreach step, in the same order, so the
        floats agree with it exactly."""
        lr = group["lr"]
        if group["weight_decay"] != 0:
            torch._foreach_mul_(weights, 1 - self._decay(group, lr))
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, [bc**0.5 for bc in bc2])
        torch._foreach_add_(denom, group["eps"])
        torch._foreach_addcdiv_(weights, exp_avgs, denom, [(lr / bc) * -1 for bc in bc1])

    def _rms(self, params: list[Tensor], grads: list[Tensor], exp_avg_sqs: list[Tensor],
             bc2: list[float], eps: float, shards: tuple) -> Tensor:
        """(n,) sqrt(mean(g^2 / max(v_hat, eps^2))) of each full tensor, as the L2 norm of
        g / (sqrt(max(v_hat, eps^2)) sqrt(N)) with N the full tensor's size (``numel`` of a
        DTensor is the global one), so the shards' sums of squares add up over ``shards``."""
        floor = torch._foreach_div(exp_avg_sqs, bc2)                 # v_hat
        torch._foreach_clamp_min_(floor, eps * eps)
        torch._foreach_sqrt_(floor)
        torch._foreach_mul_(floor, [math.sqrt(p.numel()) for p in params])
        ratios = torch._foreach_div(grads, floor)
        del floor
        return _full_norms(ratios, _norm_dtype(grads[0].dtype), shards)

    def _clipped_update(self, group: dict, weights: list[Tensor], exp_avgs: list[Tensor],
                        exp_avg_sqs: list[Tensor], bc1: list[float], bc2: list[float],
                        rms: Tensor) -> None:
        """The step with each tensor's learning rate lr / max(1, rms): per-tensor factors are
        0-d device tensors, applied by foreach ops without reading them back."""
        dtype = weights[0].dtype
        lr_w = (group["lr"] / torch.clamp(rms, min=1.0)).to(dtype)  # (n,)
        if group["weight_decay"] != 0:
            keep = 1 - self._decay(group, lr_w)                       # (n,) 1 - d
            torch._foreach_mul_(weights, list(keep.unbind(0)))
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, [bc**0.5 for bc in bc2])
        torch._foreach_add_(denom, group["eps"])
        update = torch._foreach_div(exp_avgs, denom)                 # m / denom
        del denom
        torch._foreach_div_(update, bc1)                             # m_hat / (sqrt(v_hat) + eps)
        torch._foreach_addcmul_(weights, list((-lr_w).unbind(0)), update)


class StableAdamW(AdamWVariant):
    """StableAdamW (Wortsman et al. 2023): AdamW whose per-tensor learning rate is divided by
    max(1, rms of g^2 / v_hat). ``decouple_lr=True`` is ModernBERT's ``decoupled_stableadamw``
    (optimi's ``decouple_lr``): decay lr_w / lr0 * wd instead of lr_w * wd."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 1e-3,
                 betas: Sequence[float] = (0.9, 0.98), eps: float = 1e-6,
                 weight_decay: float = 0.01, *, decouple_lr: bool = False) -> None:
        super().__init__(params, lr, tuple(betas), eps, weight_decay, update_clipping=True,
                         decouple_lr=decouple_lr)


class DecoupledAdamW(AdamWVariant):
    """composer's DecoupledAdamW: AdamW whose weight decay is multiplied by lr / lr0 (the
    schedule's factor) instead of lr, so ``weight_decay`` is the fraction of each weight removed
    per step at the peak (ModernBERT: 1e-5). ``decouple_lr=False`` is plain AdamW."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 1e-3,
                 betas: Sequence[float] = (0.9, 0.98), eps: float = 1e-6,
                 weight_decay: float = 1e-5, *, decouple_lr: bool = True) -> None:
        super().__init__(params, lr, tuple(betas), eps, weight_decay, update_clipping=False,
                         decouple_lr=decouple_lr)
