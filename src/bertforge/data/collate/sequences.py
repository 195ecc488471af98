"""Batches of encoded single texts and text pairs: classification, question answering, tagging.

A fine-tuning task encodes every example once into fixed-width numpy arrays (one row per
feature). ``SequenceFeatures`` holds them and, indexed by ``(epoch, indices)`` as the loader's
``make_batch``, returns the rows as tensors with the sequence axis cut to the batch's longest
real length rounded up to 8: padding is compute, and fine-tuning data varies a lot in length.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from bertforge.data.batch import Batch

SEQUENCE_KEYS = ("input_ids", "attention_mask", "token_type_ids")
"""The model inputs every encoder feature set holds."""


class SequenceFeatures(torch.utils.data.Dataset):
    """Encoded examples: ``SEQUENCE_KEYS`` arrays (N, S), targets (N,) or per token (N, S)
    (``labels`` of the inputs' shape has a sequence axis too), other arrays (N,)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        mask = arrays["attention_mask"]
        self.width = mask.shape[-1]
        self.lengths = mask.reshape(len(mask), -1, self.width).sum(-1).max(-1)  # (N,) longest
        digest = hashlib.sha256()
        for key in sorted(arrays):
            digest.update(key.encode() + np.ascontiguousarray(arrays[key]).tobytes())
        self.fingerprint = f"{len(mask)} features, sha256 {digest.hexdigest()[:16]}"

    def __len__(self) -> int:
        return len(self.arrays["attention_mask"])

    def is_sequence(self, key: str) -> bool:
        return key in SEQUENCE_KEYS or (
            key == "labels" and self.arrays[key].shape == self.arrays["input_ids"].shape)

    def collate(self, indices: np.ndarray) -> Batch:
        longest = int(self.lengths[indices].max())
        s = min(self.width, -(-longest // 8) * 8)
        return {key: torch.from_numpy(np.ascontiguousarray(
                    value[indices, ..., :s] if self.is_sequence(key) else value[indices]))
                for key, value in self.arrays.items()}

    def __getitem__(self, key: tuple[int, np.ndarray]) -> Batch:
        return self.collate(np.asarray(key[1]))


__all__ = ["SEQUENCE_KEYS", "SequenceFeatures"]
