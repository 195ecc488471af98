"""Checks of tensors that every loader and saver shares: NaN or inf in weights or optimizer state
(refused when loading a model, never written to a checkpoint)."""

from __future__ import annotations

from typing import Iterable

import torch

_LISTED = 3


def count_nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[int, list[str]]:
    """(number of NaN/inf values, names of the tensors holding them) over floating tensors.

    Counts are stacked per device and read back together: one host sync per device, not one per
    tensor, so a BERT-large check costs milliseconds.
    """
    per_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in named:
        if torch.is_tensor(tensor) and tensor.is_floating_point():
            count = torch.isfinite(tensor).logical_not().sum()
            per_device.setdefault(tensor.device, []).append((name, count))
    total, bad = 0, []
    for items in per_device.values():
        for (name, _), n in zip(items, torch.stack([c for _, c in items]).tolist()):
            total += n
            if n:
                bad.append(name)
    return total, bad


def nonfinite_summary(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """A line such as "12 non-finite values in 2 tensor(s) (a, b)"; None if all are finite."""
    count, bad = count_nonfinite(named)
    if not count:
        return None
    shown = ", ".join(bad[:_LISTED]) + (", ..." if len(bad) > _LISTED else "")
    return f"{count:,} non-finite values in {len(bad)} tensor(s) ({shown})"


__all__ = ["count_nonfinite", "nonfinite_summary"]
