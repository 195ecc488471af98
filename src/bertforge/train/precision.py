"""Mixed precision applied from outside the model: autocast dtype and the fp16 loss scaler."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import ContextManager

import torch


@dataclass
class Precision:
    name: str                       # "fp32" | "bf16" | "fp16"
    device: torch.device
    scaler: torch.amp.GradScaler | None

    @property
    def dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)

    def autocast(self) -> ContextManager:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)


def resolve(name: str, device: torch.device) -> str:
    """``auto`` -> bf16 on GPUs that support it, else fp32 (CPU bf16 autocast is slower than fp32)."""
    if name != "auto":
        return name
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def build_precision(name: str, device: torch.device, init_scale: float = 2.0**16) -> Precision:
    """fp16 gets dynamic loss scaling (halve on overflow and skip the step, grow every 2000 steps)."""
    name = resolve(name, device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True   # "fp32" on Ampere+ means TF32 matmuls
        torch.backends.cudnn.allow_tf32 = True
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale) if name == "fp16" else None
    return Precision(name=name, device=device, scaler=scaler)
