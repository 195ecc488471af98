"""Unpadded tokens to padded rows and back, for the attention kernels that need rows (the CPU's):
:class:`SlotBuilder` plans the rows, :func:`gather` and :func:`scatter` move the tokens.

A *slot* is one position of a padded row; the rows of every length group lie end to end. A
padding slot repeats a token of its own sequence (its last) instead of holding zeros, so one
gather fills the rows and no buffer is zero-filled. The kernels make that harmless: a padding
key is masked (or, in causal attention, after every real query) and a padding query's output
is never read back, so padding slots get exact zeros as gradients. Both gradients are then
gathers too: a token's gradient is read at its own slot, and the padding slots' are zeroed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


BUCKET = 32
"""Width granularity of the padded rows: sequences padded to the next multiple of 32 tokens, each
width one group (one attention call)."""


def bucket_widths(lengths: np.ndarray) -> np.ndarray:
    """Each sequence's padded width: its length rounded up to ``BUCKET``."""
    return -(-lengths // BUCKET) * BUCKET


@dataclass
class Gathering:
    """Tokens -> slots and back, along one axis."""

    index: torch.Tensor    # (slots,) the token of every slot (padding repeats a row's last)
    inverse: torch.Tensor  # (T,) the slot of every token
    real: torch.Tensor     # (slots,) 1.0 at the slots of tokens, 0.0 at padding


class SlotBuilder:
    """Host-side builder of a :class:`Gathering`: sequences (offsets ``cu``) added group by
    group, each group ``rows`` padded rows of one width."""

    def __init__(self, cu: np.ndarray) -> None:
        self.cu, self.index, self.inverse, self.real = cu, [], np.empty(int(cu[-1]), np.int64), []
        self.size = 0

    def add(self, members: np.ndarray, width: int) -> np.ndarray:
        """Rows of ``width`` slots for sequences ``members``, after the slots so far -> the
        (rows, width) bool mask of their real slots."""
        starts, lengths = self.cu[members], self.cu[members + 1] - self.cu[members]
        columns = np.arange(width)[None, :]
        real = columns < lengths[:, None]
        slots = self.size + np.arange(len(members))[:, None] * width + columns
        # A sequence with no tokens (a query set may leave one empty) repeats a neighbour's.
        tokens = np.clip(starts[:, None] + np.minimum(columns, lengths[:, None] - 1),
                         0, max(int(self.cu[-1]) - 1, 0))
        self.inverse[tokens[real]] = slots[real]
        self.index.append(tokens.reshape(-1))
        self.real.append(real.reshape(-1))
        self.size += len(members) * width
        return real

    def build(self, device: torch.device, heads: int = 1) -> Gathering | None:
        """The gathering, or None when it is the identity (no padding, tokens in order).

        ``heads`` > 1: the sequences added were ``heads`` copies of the tokens, head-major
        (copy ``j`` of token ``t`` numbered ``j * T + t``), while the tensor to gather is laid
        out token-major, (T, heads, ...) flattened to (T * heads, ...): the gathering reads and
        writes it there, so no transposing copy is needed on either side."""
        index, inverse = np.concatenate(self.index), self.inverse
        if heads > 1:
            tokens = len(inverse) // heads
            index = (index % tokens) * heads + index // tokens
            inverse = inverse.reshape(heads, tokens).T.reshape(-1)
        if len(index) == len(inverse) and (index == np.arange(len(index))).all():
            return None
        real = torch.as_tensor(np.concatenate(self.real), dtype=torch.float32, device=device)
        return Gathering(torch.as_tensor(index, device=device),
                         torch.as_tensor(inverse, device=device), real)


class _Select(torch.autograd.Function):
    """``x.index_select(dim, there)`` whose backward is a selection too: the gradient read
    through ``back``, times ``weight`` along ``dim`` when given (gather: back = inverse; scatter:
    back = index, weight = real, zeroing the padding slots)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, there: torch.Tensor,  # type: ignore[override]
                back: torch.Tensor, weight: torch.Tensor | None, dim: int):
        ctx.back, ctx.weight, ctx.dim = back, weight, dim
        return x.index_select(dim, there)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        out = grad.index_select(ctx.dim, ctx.back)
        if ctx.weight is not None:
            shape = [1] * out.dim()
            shape[ctx.dim] = -1
            out.mul_(ctx.weight.view(shape))
        return out, None, None, None, None


def gather(x: torch.Tensor, gathering: Gathering | None, dim: int = 0) -> torch.Tensor:
    """Tokens along ``dim`` -> slots: ``x.index_select(dim, index)``, whose backward reads each
    token's gradient at its own slot (no scatter-add into a zero-filled buffer)."""
    if gathering is None:
        return x
    return _Select.apply(x, gathering.index, gathering.inverse, None, dim)


def scatter(y: torch.Tensor, gathering: Gathering | None, dim: int = 0) -> torch.Tensor:
    """Slots along ``dim`` -> tokens: ``y.index_select(dim, inverse)``, whose backward reads each
    slot's token gradient and zeroes the padding slots (one pass)."""
    if gathering is None:
        return y
    return _Select.apply(y, gathering.inverse, gathering.index, gathering.real, dim)


__all__ = ["BUCKET", "Gathering", "SlotBuilder", "bucket_widths", "gather", "scatter"]
