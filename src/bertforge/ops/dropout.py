"""Dropout whose mask is cheap on a CPU: :func:`dropout` and the module :class:`Dropout`.

``torch.nn.functional.dropout`` on a CPU draws one Bernoulli variable per element from the
generator (``bernoulli_``): about 13 ns an element on one core of the Xeon the benchmarks ran
on, 9% of BERT-mini's train step and 11% of a MiniLM fine-tuning step (docs/performance.md).
Here the mask comes from random 64-bit words instead (``random_`` over the whole int64 range),
each cut into four 16-bit slices; an element is dropped when its slice falls below
``round(p * 65536)`` (as a signed number: below ``round(p * 65536) - 32768``), so one word
decides four elements, and the mask is applied as bytes (torch's elementwise kernels on bool
tensors are not vectorised): forward and backward together take well under half of
``F.dropout``'s time. The rate is ``p`` rounded to a multiple of 1/65536 (0.1 becomes 0.100006),
and the kept elements are scaled by the inverse of the realised keep rate, so the expectation is
unchanged exactly. Only the mask is kept for backward (one byte an element, as ``F.dropout``).

The words come from torch's default CPU generator, like every other draw of a run, so a run is
as reproducible as before and resume stays exact. On other devices (a GPU's fused, counter-based
dropout is already fast), inside ``torch.compile`` (which generates its own fused dropout) and
outside training this is ``F.dropout``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 1 << 16  # one 16-bit slice of a random word per element
_INT64 = (-(1 << 63), (1 << 63) - 1)  # random_'s bounds for (nearly) all 64 bits of a word


def _quantised(p: float) -> tuple[int, float]:
    """(threshold for a signed 16-bit slice below which an element is dropped, scale of the
    kept elements) for drop rate ``p``."""
    dropped = round(p * _LEVELS)
    return dropped - _LEVELS // 2, _LEVELS / (_LEVELS - dropped)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> torch.Tensor:
    """A bool CPU tensor of ``shape``: True (keep) with probability ``1 - p`` rounded to 1/65536,
    from torch's default generator."""
    n = math.prod(shape)
    words = torch.empty(-(-n // 4), dtype=torch.int64).random_(*_INT64)
    threshold, _ = _quantised(p)
    return (words.view(torch.int16)[:n] >= threshold).view(shape)


class _MaskedScale(torch.autograd.Function):
    """x * keep * scale, keeping only the mask for backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float):  # type: ignore[override]
        keep = keep.view(torch.uint8)  # 0/1 bytes: a vectorised multiply, unlike bool's
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return (x * keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)``, with the cheap mask above for CPU tensors in training."""
    if not training or p == 0.0:
        return x
    if (x.device.type != "cpu" or p >= 1.0 or round(p * _LEVELS) == 0
            or torch.compiler.is_compiling()):  # compiled code fuses its own dropout
        return F.dropout(x, p, training)
    _, scale = _quantised(p)
    return _MaskedScale.apply(x, keep_mask(x.shape, p), scale)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same arguments and state dict: none) computed by :func:`dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)


__all__ = ["Dropout", "dropout", "keep_mask"]
