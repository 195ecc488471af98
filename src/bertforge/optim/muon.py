"""Muon for the matrices of the transformer blocks, AdamW for everything else.

Muon (Jordan et al. 2024; "Muon is Scalable for LLM Training", Liu et al. 2025) replaces Adam's
per-element scaling of a weight matrix's update by an approximate orthogonalization of its
momentum (five Newton-Schulz iterations), which makes every direction of the update equally
large. It is meant for the hidden matrices only: embedding tables, the tied vocabulary
projection, task heads, biases and norms keep AdamW. Which matrices are "hidden" is decided by
owner, not name: the weights of the ``nn.Linear`` layers inside the model's repeated blocks
(every ``nn.ModuleList``: BERT's, BART's and ModernBERT's layer stacks alike), unless a weight is
tied to an embedding.

The Muon half is ``torch.optim.Muon`` with Moonshot's learning-rate adjustment
(``adjust_lr_fn="match_rms_adamw"``: the update of an A x B matrix is scaled by
0.2 * sqrt(max(A, B)), which gives it AdamW's typical update size), so one ``optim.lr`` and one
``optim.weight_decay`` serve both halves and an AdamW recipe's values carry over. The AdamW half is
``torch.optim.AdamW`` (fused where torch has the kernel). :class:`MuonAdamW` is one torch
optimizer over both: its ``param_groups`` are the two halves' group dicts (a scheduler that sets
``group["lr"]`` drives both), its ``state`` is one dict both halves write to, and
``state_dict()`` / ``load_state_dict()`` are torch's, so checkpoints, resume and the train loop
treat it as any other optimizer. It does not clip: the loop clips the global gradient norm first,
as for AdamW.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

MUON_MOMENTUM = 0.95  # Muon's (Nesterov) momentum; the value of both papers


def split_muon(model: nn.Module) -> set[int]:
    """``id``s of the parameters Muon updates: the 2-D weights of the ``nn.Linear`` layers inside
    any ``nn.ModuleList`` of ``model``, except weights shared with an ``nn.Embedding``."""
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    out: set[int] = set()
    for stack in model.modules():
        if not isinstance(stack, nn.ModuleList):
            continue
        for module in stack.modules():
            if (isinstance(module, nn.Linear) and module.weight.requires_grad
                    and id(module.weight) not in embedded):
                out.add(id(module.weight))
    return out


class MuonAdamW(torch.optim.Optimizer):
    """Muon over the groups whose ``params`` :func:`split_muon` chose, AdamW over the rest.

    Args:
        muon_groups: parameter-group dicts of 2-D hidden matrices (each with ``weight_decay``).
        adamw_groups: parameter-group dicts of everything else.
        lr, weight_decay: shared by both halves (Muon's update is scaled to AdamW's size).
        betas, eps: AdamW's.
        fused: use torch's one-kernel AdamW (see :func:`bertforge.optim.build_optimizer`).
        momentum: Muon's Nesterov momentum.
    """

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], lr: float,
                 weight_decay: float, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-6,
                 fused: bool = False, momentum: float = MUON_MOMENTUM) -> None:
        if not muon_groups:
            raise ValueError("optim.name=muon found no hidden matrices to update (no nn.Linear "
                             "inside an nn.ModuleList of the model); use adamw for this model")
        self._muon = torch.optim.Muon(muon_groups, lr=lr, weight_decay=weight_decay,
                                      momentum=momentum, adjust_lr_fn="match_rms_adamw")
        self._adamw = (torch.optim.AdamW(adamw_groups, lr=lr, betas=tuple(betas), eps=eps,
                                         weight_decay=weight_decay, fused=fused or None)
                       if adamw_groups else None)
        self._n_muon = len(self._muon.param_groups)
        groups = self._muon.param_groups + (self._adamw.param_groups if self._adamw else [])
        # The base class keeps these very dicts (it only fills in missing defaults), so a
        # scheduler's writes to group["lr"] reach the half that owns the group.
        super().__init__(groups, {"lr": lr})
        self._share()

    def _share(self) -> None:
        """Point both halves at this optimizer's groups and state (after construction and after
        ``load_state_dict``, which replaces both)."""
        self._muon.param_groups = self.param_groups[:self._n_muon]
        self._muon.state = self.state
        if self._adamw is not None:
            self._adamw.param_groups = self.param_groups[self._n_muon:]
            self._adamw.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._share()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._muon.step()
        if self._adamw is not None:
            self._adamw.step()
        return loss


def build_muon_adamw(model: nn.Module, groups: list[dict], lr: float, weight_decay: float,
                     betas: Sequence[float], eps: float, fused: bool) -> MuonAdamW:
    """:class:`MuonAdamW` over ``groups`` (:func:`bertforge.optim.build.param_groups`'s decay and
    no-decay groups): the hidden matrices leave the decay group for a Muon group of their own."""
    chosen = split_muon(model)
    muon = [p for g in groups for p in g["params"] if id(p) in chosen]
    rest = [{**g, "params": [p for p in g["params"] if id(p) not in chosen]} for g in groups]
    muon_groups = [{"params": muon, "weight_decay": float(weight_decay)}] if muon else []
    return MuonAdamW(muon_groups, [g for g in rest if g["params"]], lr=lr,
                     weight_decay=weight_decay, betas=betas, eps=eps, fused=fused)
