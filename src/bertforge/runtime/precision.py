"""Mixed precision applied from outside the model: autocast dtype, TF32 matmuls, the fp16 loss
scaler.

Nothing here changes process-wide numerics for longer than a ``with`` block: TF32 matmuls (what
"fp32" means on a GPU since Ampere) are switched on by :meth:`Precision.scope` and
:meth:`Precision.autocast` and switched back on exit, so loading a model, building a pipeline or
running a benchmark's fp32 reference check leaves ``torch.get_float32_matmul_precision()`` as it
found it.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import ContextManager, Iterator

import torch

from bertforge.core.limits import INFERENCE_PRECISIONS


@contextmanager
def float32_matmul(mode: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(mode)`` for the body, the previous mode after it
    ("high" = TF32 tensor cores on CUDA, "highest" = full fp32)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(mode)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@dataclass
class Precision:
    name: str                       # "fp32" | "bf16" | "fp16" | "int8" (inference: fp32 autocast)
    device: torch.device
    scaler: torch.amp.GradScaler | None

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype; None for fp32."""
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)

    @property
    def tf32(self) -> bool:
        """fp32 matmuls run as TF32 inside this precision's scopes (CUDA only)."""
        return self.device.type == "cuda"

    def scope(self) -> ContextManager:
        """The run's numerics for the body (forward, backward and optimizer alike): TF32
        matmuls on CUDA. Restored on exit."""
        return float32_matmul("high") if self.tf32 else nullcontext()

    def autocast(self) -> ContextManager:
        """Forward passes: :meth:`scope` plus autocast to bf16/fp16."""
        stack = ExitStack()
        stack.enter_context(self.scope())
        if self.dtype is not None:
            stack.enter_context(torch.autocast(device_type=self.device.type, dtype=self.dtype))
        return stack


def resolve(name: str, device: torch.device) -> str:
    """``auto`` -> bf16 on GPUs that support it, else fp32 (CPU bf16 autocast is slower than fp32)."""
    if name != "auto":
        return name
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def build_precision(name: str, device: torch.device, init_scale: float = 2.0**16) -> Precision:
    """fp16 gets dynamic loss scaling (halve on overflow and skip the step, grow every 2000 steps).
    Changes no global state: the returned object's scopes do, for their body only."""
    if name not in INFERENCE_PRECISIONS:
        raise ValueError(f"precision {name!r} is not one of {', '.join(INFERENCE_PRECISIONS)}")
    name = resolve(name, device)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale) if name == "fp16" else None
    return Precision(name=name, device=device, scaler=scaler)
