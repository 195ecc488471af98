"""Optimizers and learning-rate schedules.

``build_optimizer(model, name, ...)`` groups parameters into decay / no-decay sets and returns
:class:`Lamb` ("lamb", clips internally), ``torch.optim.AdamW`` ("adamw"), :class:`DecoupledAdamW`
("decoupled_adamw") or :class:`StableAdamW` ("stableadamw", "decoupled_stableadamw"); the loop
clips with :func:`clip_grad_norm_` for all but LAMB. ``build_scheduler(optimizer, "poly" |
"linear" | "constant" | "wsd", ...)`` returns NVIDIA's warm-up schedules, or warm-up-stable-decay,
as a PyTorch scheduler. See docs/optim.md for the equations.
"""

from bertforge.optim.build import (
    OPTIMIZERS,
    SCHEDULES,
    WarmupDecayLR,
    build_optimizer,
    build_scheduler,
    needs_external_clipping,
    param_groups,
    schedule_lr,
    split_decay,
)
from bertforge.optim.lamb import Lamb, clip_grad_norm_, global_grad_norm
from bertforge.optim.stable_adamw import AdamWVariant, DecoupledAdamW, StableAdamW

__all__ = [
    "AdamWVariant",
    "DecoupledAdamW",
    "Lamb",
    "OPTIMIZERS",
    "SCHEDULES",
    "StableAdamW",
    "WarmupDecayLR",
    "build_optimizer",
    "build_scheduler",
    "clip_grad_norm_",
    "global_grad_norm",
    "needs_external_clipping",
    "param_groups",
    "schedule_lr",
    "split_decay",
]
