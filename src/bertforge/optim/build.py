"""What a run optimizes with: the parameter groups, the optimizer by name
(:func:`build_optimizer`) and its learning-rate schedule (:func:`build_scheduler`).

Parameter groups: BERT's recipe decays only matrices; biases and LayerNorm weights get neither
weight decay nor, with LAMB, the trust ratio. We decide by shape and owner rather than by name,
so renamed or new modules follow the same rule: anything with fewer than two dimensions, and
anything owned by a normalization layer, goes to the no-decay group. Embedding tables are
matrices and are decayed, as in NVIDIA's and Google's code.

Schedules: linear warm-up, then poly (NVIDIA's BERT), linear, constant, or warm-up-stable-decay
(ModernBERT's "trapezoidal" schedule). With ``k`` the 1-based index of an optimizer step,
``T = total_steps``, ``w`` the warm-up fraction and, for "wsd", ``d`` the decay fraction and
``r`` the final ratio, step ``k`` runs with::

    progress = k / T
    lr_k = base_lr * progress / w                      if progress < w     (warm-up)
         = base_lr * (1 - progress) ** power           "poly"   (power 0.5 in NVIDIA's recipe)
         = base_lr * (1 - progress) / (1 - w)          "linear"
         = base_lr                                     "constant"
         = base_lr                                     "wsd", while 1 - progress >= d (stable)
         = base_lr * (r + (1 - r) * f(s))              "wsd", s = 1 - (1 - progress) / d (decay)
    f(s) = 1 - s  ("linear"),  1 - sqrt(s)  ("1-sqrt", ModernBERT's)

so the last ``d * T`` steps fall from ``base_lr`` to ``r * base_lr`` at step ``T`` (and stay there
past it).

This is NVIDIA's ``PolyWarmUpScheduler`` (and its Linear/Constant siblings) from
DeepLearningExamples/PyTorch/LanguageModeling/BERT/schedulers.py. There the scheduler is stepped
*before* each optimizer step and reads FusedLAMB's step counter plus one, so the first optimizer
step uses progress = 1/T and step T uses progress = 1 (lr 0 for poly and linear). We keep those
values under PyTorch's usual order (``optimizer.step()`` then ``scheduler.step()``): the lr in the
optimizer is always the one for the *next* step, ``lr_{last_epoch + 1}``. Past ``T`` the decay
stays at 0 instead of taking a root of a negative number.

Fine-tuning counts steps the way transformers' ``Trainer`` does instead (``counting=
"transformers"``, :func:`trainer_lr`): the warm-up is ``ceil(T * w)`` whole steps and step ``k``
runs at the schedule's value after ``k - 1`` steps, so the first step has lr 0 and the last one
``base_lr / (T - W)`` (``get_linear_schedule_with_warmup``, ``get_constant_schedule_with_warmup``,
and ``get_polynomial_decay_schedule_with_warmup`` with ``lr_end`` 0). Both countings give the same
curve up to a one-step shift; the Trainer's lets a fine-tuning run reproduce a Trainer run step by
step (tests/parity/test_finetune_trainer_parity.py).

Every value is computed from the step index alone (no chained multiplications), so a scheduler
restored from ``state_dict()`` yields bit-for-bit the same sequence as one that never stopped.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from bertforge.core import limits
from bertforge.core.limits import DECAY_SHAPES, OPTIMIZERS, SCHEDULES, check_choice
from bertforge.optim.lamb import Lamb
from bertforge.optim.muon import build_muon_adamw
from bertforge.optim.stable_adamw import DecoupledAdamW, StableAdamW

_NORM_TYPES: tuple[type, ...] = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase)
if hasattr(nn, "RMSNorm"):
    _NORM_TYPES = _NORM_TYPES + (nn.RMSNorm,)


def _is_norm(module: nn.Module) -> bool:
    # Custom norm classes (e.g. a fused LayerNorm) are recognised by name as well as by type.
    return isinstance(module, _NORM_TYPES) or type(module).__name__.lower().endswith("norm")


def split_decay(model: nn.Module) -> tuple[list[str], list[str]]:
    """Names of trainable parameters that get weight decay, and of those that do not.

    Tied parameters (shared embedding / decoder weights) appear once, under their first name.
    """
    no_decay_ids: set[int] = set()
    for module in model.modules():
        if _is_norm(module):
            no_decay_ids.update(id(p) for p in module.parameters(recurse=False))
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or id(p) in no_decay_ids:
            no_decay.append(name)
        else:
            decay.append(name)
    return decay, no_decay


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Optimizer groups: ``[{"params": matrices, "weight_decay": weight_decay},
    {"params": biases/norms/1-D, "weight_decay": 0.0}]``; empty groups are left out."""
    decay, no_decay = split_decay(model)
    if not decay and not no_decay:
        raise ValueError("the model has no trainable parameters (all have requires_grad=False); "
                         "nothing to optimize")
    named = dict(model.named_parameters())
    groups = [
        {"params": [named[n] for n in decay], "weight_decay": float(weight_decay)},
        {"params": [named[n] for n in no_decay], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    weight_decay: float,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-6,
    max_grad_norm: float = 1.0,
) -> torch.optim.Optimizer:
    """The optimizer named by ``optim.name`` over :func:`param_groups` of ``model``.

    ``"lamb"`` clips the global gradient norm itself (``optimizer.clips_gradients`` is True and
    ``optimizer.last_grad_norm`` holds the pre-clip norm). ``"adamw"`` is
    ``torch.optim.AdamW`` (the fused kernel on CUDA and CPU) and does not clip: the train
    loop calls :func:`bertforge.optim.clip_grad_norm_` with ``max_grad_norm`` before stepping.
    ``"decoupled_adamw"`` (:class:`DecoupledAdamW`), ``"stableadamw"`` and
    ``"decoupled_stableadamw"`` (:class:`StableAdamW`, ``decouple_lr`` off / on) are
    composer's and ModernBERT's names; the loop clips for them as for AdamW. ``"muon"`` is
    :class:`bertforge.optim.muon.MuonAdamW`: Muon for the transformer blocks' matrices, AdamW
    for the rest, one learning rate for both; the loop clips for it too.
    """
    # Only the name is checked here (it picks the class); each optimizer checks its own
    # hyper-parameters in its constructor.
    check_choice(name, "name", OPTIMIZERS)
    groups = param_groups(model, weight_decay)
    betas = tuple(betas)
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                    max_grad_norm=max_grad_norm)
    if name == "decoupled_adamw":
        return DecoupledAdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if name in ("stableadamw", "decoupled_stableadamw"):
        return StableAdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                           decouple_lr=name == "decoupled_stableadamw")
    params = [p for g in groups for p in g["params"]]
    # Fused AdamW is one kernel for all tensors, on CUDA and (since torch 2.4) on CPU, where it
    # is ~6x faster than the per-tensor loop torch picks by default (benchmarks/finetune_bench.py:
    # 10 vs 62 ms per step for a 22.7M-parameter BERT on 2 cores).
    device_types = {p.device.type for p in params}
    fusable = len(device_types) == 1 and device_types <= {"cuda", "cpu"} and all(
        p.dtype.is_floating_point for p in params)
    if name == "muon":
        return build_muon_adamw(model, groups, lr=lr, weight_decay=weight_decay, betas=betas,
                                eps=eps, fused=fusable)
    fused = {"fused": True} if fusable else {}
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps,
                             weight_decay=weight_decay, **fused)


def needs_external_clipping(optimizer: torch.optim.Optimizer) -> bool:
    """True when the train loop must clip gradients itself before ``optimizer.step()``."""
    return not getattr(optimizer, "clips_gradients", False)


# --------------------------------------------------------------------------- schedules

# How a schedule counts steps (see the module docstring), and the schedules the Trainer's has.
COUNTINGS = ("nvidia", "transformers")
TRAINER_SCHEDULES = ("linear", "poly", "constant")


def schedule_lr(base_lr: float, step: int, total_steps: int, warmup: float,
                schedule: str = "poly", power: float = 0.5, decay: float = 0.1,
                decay_shape: str = "1-sqrt", min_lr_ratio: float = 0.0) -> float:
    """Learning rate of optimizer step ``step`` (1-based; step 0 is the value before training).
    ``decay``, ``decay_shape`` and ``min_lr_ratio`` are read by "wsd" only.

    A pure formula: the settings are checked once, when :func:`build_scheduler` builds the
    scheduler, not at every step.
    """
    progress = step / total_steps
    if progress < warmup:
        # Same operation order as NVIDIA's code, so the floats agree exactly.
        return base_lr * progress / warmup
    if schedule == "poly":
        return base_lr * (max(1.0 - progress, 0.0) ** power)
    if schedule == "linear":
        return base_lr * max((1.0 - progress) / (1.0 - warmup), 0.0)
    if schedule == "constant":
        return base_lr
    if schedule == "wsd":
        # Steps left as a fraction from integers: exact at the phase boundary (k = T - d T).
        remaining = (total_steps - step) / total_steps
        return base_lr * _wsd_factor(remaining, decay, decay_shape, min_lr_ratio)
    raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")


def trainer_warmup_steps(total_steps: int, warmup: float) -> int:
    """Whole warm-up steps of a warm-up fraction, as ``TrainingArguments.get_warmup_steps``
    computes them (the same float expression, so ``30 * 0.1`` rounds up to 4 there and here)."""
    return math.ceil(total_steps * warmup)


def trainer_lr(base_lr: float, step: int, total_steps: int, warmup: float,
               schedule: str = "linear", power: float = 1.0) -> float:
    """Learning rate of optimizer step ``step`` (1-based) as transformers' schedules give it: the
    factor of ``done = step - 1`` completed steps, with ``W`` = :func:`trainer_warmup_steps`.
    "linear" falls to 0 at step ``T + 1``; "poly" is the same with the factor raised to
    ``power``; "constant" holds ``base_lr`` after the warm-up. Step 0 (before training) is step 1.
    """
    done = max(step - 1, 0)
    warm = trainer_warmup_steps(total_steps, warmup)
    if done < warm:
        return base_lr * (float(done) / float(max(1, warm)))
    if schedule == "constant":
        return base_lr
    left = max(0.0, float(total_steps - done) / float(max(1, total_steps - warm)))
    if schedule == "linear":
        return base_lr * left
    if schedule == "poly":
        return base_lr * left ** power
    raise ValueError(f"counting='transformers' supports the linear, poly and constant schedules, "
                     f"got {schedule!r}")


def _wsd_factor(remaining: float, decay: float, shape: str, min_ratio: float) -> float:
    """The factor of "wsd" after warm-up, with ``remaining`` the fraction of steps left after
    this one: 1 while it is at least ``decay``, then down to ``min_ratio`` at 0 (and past it).
    ``decay`` 0 never decays (constant after warm-up, like "constant")."""
    if remaining >= decay or decay == 0.0:
        return 1.0
    done = min(1.0 - remaining / decay, 1.0)  # s: how far into the decay, in (0, 1]
    if shape == "linear":
        falling = 1.0 - done
    elif shape == "1-sqrt":
        falling = 1.0 - math.sqrt(done)
    else:
        raise ValueError(f"decay_shape must be one of {', '.join(DECAY_SHAPES)}, got {shape!r}")
    return min_ratio + (1.0 - min_ratio) * falling


class WarmupDecayLR(LRScheduler):
    """PyTorch scheduler for :func:`schedule_lr`. Call ``scheduler.step()`` after each
    ``optimizer.step()``; ``last_epoch`` counts the optimizer steps taken so far."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, warmup: float,
                 schedule: str = "poly", power: float = 0.5, last_epoch: int = -1, *,
                 decay: float = 0.1, decay_shape: str = "1-sqrt",
                 min_lr_ratio: float = 0.0, counting: str = "nvidia") -> None:
        _validate(schedule, total_steps, warmup, power)
        _validate_wsd(schedule, warmup, decay, decay_shape, min_lr_ratio)
        _validate_counting(counting, schedule)
        # Plain Python values only: state_dict() must load with torch.load(weights_only=True).
        self.total_steps = int(total_steps)
        self.warmup = float(warmup)
        self.schedule = schedule
        self.power = float(power)
        self.decay = float(decay)
        self.decay_shape = str(decay_shape)
        self.min_lr_ratio = float(min_lr_ratio)
        self.counting = str(counting)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """Learning rates for the next optimizer step, one per parameter group."""
        step = self.last_epoch + 1
        if self.counting == "transformers":
            return [trainer_lr(float(base), step, self.total_steps, self.warmup, self.schedule,
                               self.power) for base in self.base_lrs]
        return [schedule_lr(float(base), step, self.total_steps, self.warmup, self.schedule,
                            self.power, self.decay, self.decay_shape, self.min_lr_ratio)
                for base in self.base_lrs]

    # ``step(epoch)`` (deprecated in torch) uses this; the schedule is closed-form anyway.
    _get_closed_form_lr = get_lr


def _validate(schedule: str, total_steps: int, warmup: float, power: float) -> None:
    """The checks behind :func:`build_scheduler` (``ValueError`` naming the argument); the values
    are not checked again per step."""
    check_choice(schedule, "schedule", SCHEDULES)
    if isinstance(total_steps, bool) or int(total_steps) != total_steps or total_steps < 1:
        raise ValueError(f"total_steps must be an integer >= 1, got {total_steps}")
    limits.WARMUP.check(warmup, "warmup")
    limits.POWER.check(power, "power")


def _validate_wsd(schedule: str, warmup: float, decay: float, decay_shape: str,
                  min_lr_ratio: float) -> None:
    """The checks of the "wsd" settings, as the config makes them: ranges whatever the
    schedule, and for "wsd" itself, warm-up and decay that do not overlap."""
    limits.DECAY.check(decay, "decay")
    check_choice(decay_shape, "decay_shape", DECAY_SHAPES)
    limits.MIN_LR_RATIO.check(min_lr_ratio, "min_lr_ratio")
    if schedule == "wsd":
        limits.check_phases(warmup, decay, ("warmup", "decay"))


def _validate_counting(counting: str, schedule: str) -> None:
    check_choice(counting, "counting", COUNTINGS)
    if counting == "transformers" and schedule not in TRAINER_SCHEDULES:
        raise ValueError(f"counting='transformers' supports the {', '.join(TRAINER_SCHEDULES)} "
                         f"schedules, got {schedule!r}")


def build_scheduler(optimizer: torch.optim.Optimizer, name: str, total_steps: int,
                    warmup: float, power: float = 0.5, *, decay: float = 0.1,
                    decay_shape: str = "1-sqrt", min_lr_ratio: float = 0.0,
                    counting: str = "nvidia") -> WarmupDecayLR:
    """The schedule named by ``optim.schedule`` ("poly", "linear", "constant" or "wsd") over
    ``total_steps`` optimizer steps, warming up for the fraction ``warmup`` of them. "wsd" then
    holds ``base_lr`` and decays over the last fraction ``decay`` of the steps, with
    ``decay_shape`` ("linear" or "1-sqrt"), to ``min_lr_ratio * base_lr``; the other schedules
    ignore those three. ``counting``: "nvidia" (pretraining's, the module docstring's formulas)
    or "transformers" (the Trainer's whole warm-up steps and step origin, :func:`trainer_lr`;
    linear, poly and constant only).

    Building it sets every group's ``lr`` to the first step's value. When resuming, build it
    first, then load the optimizer's and this scheduler's state dicts.
    """
    return WarmupDecayLR(optimizer, total_steps, warmup, name, power, decay=decay,
                         decay_shape=decay_shape, min_lr_ratio=min_lr_ratio, counting=counting)
