"""Batches of rows of several texts each, encoded one text at a time: embedding training.

A row of a sentence-similarity file holds m texts (anchor, positive, negatives...) that the model
embeds separately. Each distinct text is tokenized once (a positive shared by many anchors, a
passage mined as a negative for many queries) into ``tokens`` (U, S); ``rows`` (N, m) names the
texts of each row. A micro-batch of B rows is laid out column by column, (m * B, s): texts
``c * B .. c * B + B - 1`` are column c of rows 0..B-1, so the model runs once over all of them
and its (m * B, D) vectors reshape to (m, B, D). ``s`` is the batch's longest text, rounded up
to 8. Row values (a score, teacher margins) travel as (B, ...) arrays.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from bertforge.data.batch import Batch

TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids")


class TextGroups(torch.utils.data.Dataset):
    """``tokens``: ``TOKEN_KEYS`` arrays (U, S) of the distinct texts; ``rows`` (N, m) int64
    indices into them; ``values``: per-row arrays (N, ...) (``scores``, ``margins``).
    ``no_duplicates``: ``arrange_batches`` (the loader's hook) keeps a global batch free of
    repeated texts."""

    def __init__(self, tokens: dict[str, np.ndarray], rows: np.ndarray,
                 values: dict[str, np.ndarray] | None = None, no_duplicates: bool = False) -> None:
        self.tokens = {k: v for k, v in tokens.items() if k in TOKEN_KEYS}
        self.rows = np.asarray(rows, dtype=np.int64)
        self.values = dict(values or {})
        self.no_duplicates = no_duplicates
        self.text_lengths = self.tokens["attention_mask"].sum(-1)  # (U,)
        self.lengths = self.text_lengths[self.rows].max(-1)        # (N,) a row's longest text
        digest = hashlib.sha256()
        for name, array in sorted({**self.tokens, "rows": self.rows, **self.values}.items()):
            digest.update(name.encode() + np.ascontiguousarray(array).tobytes())
        self.fingerprint = f"{len(self.rows)} rows, sha256 {digest.hexdigest()[:16]}"

    @property
    def columns(self) -> int:
        return int(self.rows.shape[1])

    def __len__(self) -> int:
        return len(self.rows)

    def collate(self, indices: np.ndarray) -> Batch:
        texts = self.rows[indices].T.reshape(-1)  # (m * B,) column by column
        longest = int(self.text_lengths[texts].max())
        s = min(self.tokens["attention_mask"].shape[-1], -(-longest // 8) * 8)
        batch: dict[str, Any] = {k: torch.from_numpy(np.ascontiguousarray(v[texts, :s]))
                                 for k, v in self.tokens.items()}
        batch.update({k: torch.from_numpy(np.ascontiguousarray(v[indices]))
                      for k, v in self.values.items()})
        return batch

    def __getitem__(self, key: tuple[int, np.ndarray]) -> Batch:
        return self.collate(np.asarray(key[1]))

    def arrange_batches(self, batches: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The loader's epoch order (n, G), rearranged so that no global batch holds a text
        twice (a repeated positive would be scored as its own in-batch negative)."""
        if not self.no_duplicates:
            return batches
        from bertforge.data.distinct import distinct_batches

        return distinct_batches(batches, self.rows, rng)


__all__ = ["TOKEN_KEYS", "TextGroups"]
