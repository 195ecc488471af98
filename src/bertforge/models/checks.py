"""Checks that every loader and saver shares: NaN or inf in weights or optimizer state (refused
when loading a model, never written to a checkpoint), and a model's memory estimated from its
config before anything is built (a config.json with a wrong size fails with one line naming the
key, not with an allocator error or the OOM killer)."""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any, Iterable

import torch

from bertforge.errors import ConfigError

_LISTED = 3
GIB = 2**30
WEIGHT_BYTES = 4
"""Bytes per parameter of a model as it is built (fp32, before any cast)."""
POSITION_ID_BYTES = 8
"""Bytes per position of the int64 position-id tables a model keeps beside its weights."""


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


def model_bytes(config: Any, bytes_per_parameter: int = WEIGHT_BYTES) -> int:
    """Memory a model of ``config`` takes: its parameters at ``bytes_per_parameter`` and its
    position tables (from ``num_parameters()`` and ``max_position_embeddings``, no allocation).

    Read from the config's own interface, not the family record's ``ModelShape`` (whose
    ``parameters`` and ``positions`` are these very numbers; tests/unit/test_family_records.py
    holds them equal): every model class imports this module through ``models.hub``, and the
    record names those classes, so reading the record here would be an import cycle."""
    positions = getattr(config, "max_position_embeddings", 0) or 0
    return config.num_parameters() * bytes_per_parameter + positions * POSITION_ID_BYTES


def available_memory(device: torch.device | str) -> int | None:
    """Memory free for a new model on ``device`` now: a GPU's free memory, or the machine's
    available RAM (Linux's MemAvailable, else the free pages); None when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError, ValueError):
            return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None


def costliest_key(config: Any, bytes_per_parameter: int = WEIGHT_BYTES) -> tuple[str, Any] | None:
    """(field, value) of the size setting of ``config`` that costs the most memory: the one
    that, put back to its default, lowers the estimate most (no config is validated or built)."""
    if not dataclasses.is_dataclass(config):
        return None
    full, best = model_bytes(config, bytes_per_parameter), None
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if type(value) is not int or type(f.default) is not int or value <= f.default:
            continue
        trial = copy.copy(config)
        object.__setattr__(trial, f.name, f.default)
        saved = full - model_bytes(trial, bytes_per_parameter)
        if best is None or saved > best[0]:
            best = (saved, f.name, value)
    return None if best is None else (best[1], best[2])


def check_memory(config: Any, device: torch.device | str, source: str, *,
                 bytes_per_parameter: int = WEIGHT_BYTES, purpose: str = "its weights") -> None:
    """``ConfigError`` before anything is built when a model of ``config`` cannot fit in the
    memory available to it: the CPU's RAM (every model is built there first) and, for a GPU,
    the GPU's. ``source`` names the config (a config.json, a preset); the message names the
    setting that costs the most, the estimate and what is available."""
    need = model_bytes(config, bytes_per_parameter)
    devices = [torch.device("cpu")] + ([torch.device(device)]
                                       if torch.device(device).type != "cpu" else [])
    for target in devices:
        have = available_memory(target)
        if have is None or need <= have:
            continue
        key = costliest_key(config, bytes_per_parameter)
        blame = f"{key[0]}={key[1]:,}" if key else config.shape_summary()
        where = "RAM" if target.type == "cpu" else f"memory on {target}"
        raise ConfigError(
            f"{source}: {blame} gives a model of {config.num_parameters():,} parameters that "
            f"needs at least {need / GIB:,.1f} GiB for {purpose}, but only {have / GIB:,.1f} "
            f"GiB of {where} is available; check {key[0] if key else 'the sizes'} in {source} "
            "(or use a machine with more memory)")


__all__ = ["GIB", "available_memory", "check_memory", "costliest_key", "count_nonfinite",
           "model_bytes", "nonfinite_summary"]
