"""The device a model is placed on, from a name a person typed: ``auto`` (the GPU when there is
one), ``cpu``, ``cuda`` or ``cuda:N``. A GPU asked for on a machine without one is a
``ConfigError`` here, before any weight is read, rather than a CUDA error later."""

from __future__ import annotations

import torch

from bertforge.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """``name`` as a ``torch.device``: ``auto`` -> ``cuda`` when a CUDA GPU is available, else
    ``cpu``. ``ConfigError`` for a name that is not a device or a GPU that is not there."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"device {name!r} is not a device; use auto, cpu, cuda or "
                          "cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name} was asked for but no CUDA GPU is available; use cpu")
    return device


__all__ = ["resolve_device"]
