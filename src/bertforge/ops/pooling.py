"""One vector per text from an encoder's last hidden states: the pooling modes bertforge trains
and serves, the same in training (``tasks/embedding.py``), inference (the feature-extraction
pipeline) and the sentence-transformers directories it writes (``1_Pooling/config.json``).

Inputs are padded rows: ``hidden`` (B, S, H) and the ``attention_mask`` (B, S) of real tokens
(1) and right padding (0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bertforge.core.limits import POOLINGS


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, H) text vectors of ``hidden`` (B, S, H) by ``mode`` (one of ``POOLINGS``), in fp32
    for mean pooling's sum (bf16 sums of hundreds of tokens lose digits)."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "last":
        last = attention_mask.sum(1).clamp(min=1) - 1  # (B,) index of the last real token
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    if mode != "mean":
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {mode!r}")
    mask = attention_mask.unsqueeze(-1).to(torch.float32)  # (B, S, 1)
    summed = (hidden.to(torch.float32) * mask).sum(1)
    return (summed / mask.sum(1).clamp(min=1e-9)).to(hidden.dtype)


def finish(vectors: torch.Tensor, normalize: bool, dims: int | None = None) -> torch.Tensor:
    """``vectors`` (B, H) cut to their first ``dims`` values (a Matryoshka size; None: all)
    and, with ``normalize``, scaled to unit length: what a client is given."""
    if dims is not None:
        vectors = vectors[:, :dims]
    return F.normalize(vectors, dim=-1, eps=1e-12) if normalize else vectors


__all__ = ["POOLINGS", "finish", "pool"]
