"""Packing: several sequences per row of a fixed width, attention confined to each sequence.

A micro-batch keeps its samples (the loader's order and determinism contract are unchanged);
packing only lays them out differently: first fit decreasing puts the longest sequence first
into the first row with room, so R rows of ``width`` tokens hold the B sequences with little
padding, and every batch has the same row width (static shapes for compiled kernels).

A packed batch (contracts.md) has ``position_ids`` restarting at 0 where each sequence begins
(so a packed sequence gets the position embeddings it would get alone) and one ``nsp_labels``
entry per sequence, in the row-major order of the sequences' first tokens; the model keeps
attention inside each sequence (block-diagonal) and pools each sequence's first token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def first_fit_decreasing(lengths: Sequence[int] | np.ndarray, width: int) -> list[list[int]]:
    """Rows of item indices: each item in the first row with room, longest items first (ties
    by index, so the result is deterministic). ValueError when an item exceeds ``width``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and int(lengths.max()) > width:
        raise ValueError(f"a sequence of {int(lengths.max())} tokens does not fit in rows of "
                         f"{width}; pack to at least the data's max_seq_length")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in np.argsort(-lengths, kind="stable"):  # a loop over sequences, not tokens
        n = int(lengths[i])
        for r, free in enumerate(room):
            if free >= n:
                rows[r].append(int(i))
                room[r] -= n
                break
        else:
            rows.append([int(i)])
            room.append(width - n)
    return rows


def packing_efficiency(lengths: Sequence[int] | np.ndarray, width: int) -> float:
    """Real tokens / row slots when ``lengths`` are packed into rows of ``width``."""
    rows = first_fit_decreasing(lengths, width)
    return float(np.sum(lengths)) / (len(rows) * width) if rows else 1.0


__all__ = ["first_fit_decreasing", "packing_efficiency"]
