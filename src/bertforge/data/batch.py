"""What flows from a data loader through a task's loss: the batch and the loss's report.

One definition for every task, so the train loop, the benchmark and evaluation never guess at
keys. A batch is a dict of tensors (a torch DataLoader moves and pins dicts natively); the keys a
task may use are listed here with their shapes. ``IGNORE_INDEX`` marks a label position that no
loss reads (cross-entropy's default ``ignore_index``, as in transformers).

Fine-tuning tasks encode every example once into fixed-width numpy arrays (one row per feature):
``SequenceFeatures`` holds them and, indexed by ``(epoch, indices)`` as the loader's
``make_batch``, returns the rows as a batch with the sequence axis cut to the batch's longest
real length rounded up to 8 (padding is compute, and fine-tuning data varies a lot in length).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
import torch

IGNORE_INDEX = -100


class Batch(TypedDict, total=False):
    """A collated micro-batch. B: sequences (examples), S: tokens, C: choices."""

    input_ids: torch.Tensor        # (B, S) int64, or (B, C, S) for multiple choice
    attention_mask: torch.Tensor   # same shape as input_ids: 1 = real token, 0 = padding
    token_type_ids: torch.Tensor   # same shape as input_ids: 0 first segment, 1 second
    mlm_labels: torch.Tensor       # (B, S) target id at masked positions, IGNORE_INDEX elsewhere
    nsp_labels: torch.Tensor       # (B,) next-sentence / sentence-order label or IGNORE_INDEX
                                   # (one per sequence: more than B for packed rows)
    labels: torch.Tensor           # (B,) class id or float target; (B, S) per token (tagging);
                                   # (B, T) target ids of a seq2seq batch, IGNORE_INDEX at padding
    decoder_input_ids: torch.Tensor  # (B, T) seq2seq: the labels shifted right after the start id
    start_positions: torch.Tensor  # (B,) QA answer start token (0 = [CLS]: no answer here)
    end_positions: torch.Tensor    # (B,) QA answer end token (inclusive)
    index: torch.Tensor            # (B,) row of the feature set (evaluation keeps the order)
    position_ids: torch.Tensor     # (B, S) packed rows only: positions restart at each sequence
    mlm_positions: torch.Tensor    # (N,) flat positions row * S + column of the predicted tokens
    token_indices: torch.Tensor    # (T,) flat positions of the real tokens   } the batch's
    cu_seqlens: torch.Tensor       # (N + 1,) int32 sequence offsets in them  } TokenLayout
    max_seqlen: torch.Tensor       # 0-d, the longest sequence; stays on the host (HOST_KEYS)
    min_seqlen: torch.Tensor       # 0-d, the shortest sequence; stays on the host (HOST_KEYS)


@dataclass
class LossOutput:
    """A task's loss on one micro-batch and what the loop should count and log.

    ``sequences`` and ``tokens`` are what the micro-batch trained on, as the task defines them
    (a multiple-choice example of C choices is one sequence of C x S tokens; padding is not a
    token), so throughput means the same for every task. ``tokens`` may stay a device tensor:
    the loop reads it only at log intervals.
    """

    loss: torch.Tensor
    stats: dict[str, torch.Tensor] = field(default_factory=dict)  # detached scalars to average
    sequences: int = 0
    tokens: torch.Tensor | int = 0


def real_tokens(batch: Batch) -> torch.Tensor:
    """Non-padding tokens of a batch (a 0-d tensor on the batch's device; no host sync)."""
    return batch["attention_mask"].sum()


HOST_KEYS = frozenset({"max_seqlen", "min_seqlen"})
"""Batch entries that stay on the host: sizes a kernel launch needs as a Python int, which read
from a GPU tensor would cost a device->host sync."""


def to_device(batch: dict, device: torch.device) -> dict:
    """Tensors moved (asynchronously from pinned memory) to ``device``, except ``HOST_KEYS``;
    other values kept."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) and k not in HOST_KEYS
            else v for k, v in batch.items()}


# ---------------------------------------------------------------------------- fine-tuning features
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
