"""Optimizers and learning-rate schedules.

``build_optimizer(model, "lamb" | "adamw", ...)`` groups parameters into decay / no-decay sets and
returns :class:`Lamb` (clips internally) or ``torch.optim.AdamW`` (the loop clips with
:func:`clip_grad_norm_`); ``build_scheduler(optimizer, "poly" | "linear" | "constant", ...)``
returns NVIDIA's warm-up schedules as a PyTorch scheduler. See docs/optim.md for the equations.
"""

from bertforge.optim.lamb import Lamb, clip_grad_norm_, global_grad_norm
from bertforge.optim.param_groups import (
    OPTIMIZERS,
    build_optimizer,
    needs_external_clipping,
    param_groups,
    split_decay,
)
from bertforge.optim.schedules import SCHEDULES, WarmupDecayLR, build_scheduler, schedule_lr

__all__ = [
    "Lamb",
    "OPTIMIZERS",
    "SCHEDULES",
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
