"""Parameter groups (decay / no decay) and the optimizer factory.

BERT's recipe decays only matrices: biases and LayerNorm weights get neither weight decay nor,
with LAMB, the trust ratio. We decide by shape and owner rather than by name, so renamed or new
modules follow the same rule: anything with fewer than two dimensions, and anything owned by a
normalization layer, goes to the no-decay group. Embedding tables are matrices and are decayed,
as in NVIDIA's and Google's code.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from bertforge.core.limits import OPTIMIZERS, check_choice
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
