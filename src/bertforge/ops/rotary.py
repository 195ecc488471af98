"""Rotary position embeddings (RoPE, Su et al. 2021) in the "rotate half" convention.

Dimension ``i < d/2`` of a head is paired with dimension ``i + d/2`` and the pair is rotated by
``position * theta ** (-2i / d)``; queries and keys are rotated, values are not, so attention
scores depend on the distance between two tokens only. This is the convention of transformers'
Llama/ModernBERT code (and of checkpoints trained with it), not GPT-J's interleaved pairs.

Tables are computed from the position ids of the batch (any layout: (B, S) padded rows or the
(T,) real tokens of an unpadded pass) in float32 and not stored: a module buffer would be cast
to bf16 with the model and lose the frequencies' precision.
"""

from __future__ import annotations

import torch


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (*positions.shape, head_dim) in ``dtype``, for integer ``positions``."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device,
                             dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponents)                           # (head_dim / 2,)
    angles = positions[..., None].float() * inv_freq                # (..., head_dim / 2)
    angles = torch.cat((angles, angles), dim=-1)                    # (..., head_dim)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the halves of the last axis."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (..., heads, head_dim) by tables (..., head_dim) of the same leading shape
    (broadcast over the heads); computed in float32, returned in ``x``'s dtype."""
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)


__all__ = ["apply_rotary", "rotary_tables", "rotate_half"]
