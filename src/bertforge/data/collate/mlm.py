"""Masked-LM pretraining batches: a sample's mask drawn from ``sample_rng(seed, epoch, index)``
(``bertforge.data.masking``), rows padded to the longest (rounded up) or packed into rows of a
fixed width (``bertforge.data.packing``), and the batch's token layout and MLM positions computed
here on the CPU so the model's step needs no host-device sync (contracts.md, "micro-batch")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bertforge.core import limits
from bertforge.data.batch import IGNORE_INDEX
from bertforge.data.masking import mask_tokens, normalize_special_ids, sample_rng
from bertforge.data.packing import first_fit_decreasing
from bertforge.ops.unpad import layout_batch_entries


@dataclass(frozen=True)
class MaskingSpec:
    """What dynamic masking needs besides the sample and its generator."""

    masked_lm_prob: float
    max_predictions: int
    mask_id: int
    vocab_size: int
    special_ids: np.ndarray  # sorted unique int64
    is_continuation: np.ndarray | None  # (vocab_size,) bool for whole-word masking, else None


Row = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # input_ids, token_type_ids, mlm_labels, nsp


def masking_spec(*, masked_lm_prob: float, max_predictions: int, whole_word_masking: bool,
                 is_continuation: np.ndarray | None, mask_id: int | None, vocab_size: int | None,
                 special_ids: Sequence[int] | np.ndarray, pad_id: int) -> MaskingSpec:
    """Checked dynamic-masking settings; ``ValueError`` naming the keyword when one is wrong."""
    limits.MASKED_LM_PROB.check(masked_lm_prob, "masked_lm_prob")
    if max_predictions < 1:
        raise ValueError(f"max_predictions={max_predictions} must be at least 1")
    if mask_id is None or vocab_size is None:
        raise ValueError("dynamic masking needs mask_id and vocab_size (the tokenizer's "
                         "mask_id and vocab_size, or a native shard directory's manifest)")
    if whole_word_masking and is_continuation is None:
        raise ValueError("whole_word_masking=True needs is_continuation (pass "
                         "is_continuation=tokenizer.is_continuation)")
    # [MASK] and [PAD] are never targets nor random replacements, listed or not.
    specials = np.union1d(normalize_special_ids(special_ids), [mask_id, pad_id])
    wwm = np.asarray(is_continuation, dtype=bool) if whole_word_masking else None
    return MaskingSpec(masked_lm_prob, max_predictions, int(mask_id), int(vocab_size),
                       specials, wwm)


def collate_rows(rows: Sequence[Row], *, pad_id: int, pad_to_multiple_of: int,
                 pack_width: int | None = None) -> dict[str, torch.Tensor | int]:
    """Pad rows to the longest one rounded up to ``pad_to_multiple_of`` (contracts.md batch),
    or with ``pack_width`` pack them into as few rows of that width as first fit decreasing
    finds (``bertforge.data.packing``).

    Returns int64 tensors input_ids, attention_mask, token_type_ids, mlm_labels (R, S), with
    -100 where nothing is predicted, and nsp_labels (one per sequence); ``position_ids`` (R, S)
    when packed; ``mlm_positions`` (flat positions of the predicted tokens) and the batch's
    ``TokenLayout`` entries (``bertforge.ops.unpad.LAYOUT_KEYS``), so the model needs no
    host-device sync to find tokens, sequences and predictions.
    """
    if pack_width is None:
        longest = max(len(r[0]) for r in rows)
        s = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
        placement = [[i] for i in range(len(rows))]
    else:
        s = pack_width
        placement = first_fit_decreasing([len(r[0]) for r in rows], pack_width)
    b = len(placement)
    input_ids = np.full((b, s), pad_id, dtype=np.int64)
    attention = np.zeros((b, s), dtype=np.int64)
    types = np.zeros((b, s), dtype=np.int64)
    labels = np.full((b, s), IGNORE_INDEX, dtype=np.int64)
    positions = np.zeros((b, s), dtype=np.int64) if pack_width is not None else None
    nsp = []  # one per sequence, in the order of their first tokens
    for r, members in enumerate(placement):  # loops over samples, not tokens
        start = 0
        for i in members:
            ids, tt, lab, ns = rows[i]
            end = start + len(ids)
            input_ids[r, start:end] = ids
            attention[r, start:end] = 1
            types[r, start:end] = tt
            labels[r, start:end] = lab
            if positions is not None:
                positions[r, start:end] = np.arange(len(ids))
            nsp.append(IGNORE_INDEX if ns < 0 else ns)
            start = end
    arrays = {"input_ids": input_ids, "attention_mask": attention, "token_type_ids": types,
              "mlm_labels": labels, "nsp_labels": np.array(nsp, dtype=np.int64),
              "mlm_positions": np.flatnonzero(labels.reshape(-1) != IGNORE_INDEX)}
    if positions is not None:
        arrays["position_ids"] = positions
    out: dict[str, torch.Tensor | int] = {k: torch.from_numpy(v) for k, v in arrays.items()}
    out.update(layout_batch_entries(out["attention_mask"], out.get("position_ids")))
    return out


class MicroBatchMaker(torch.utils.data.Dataset):
    """Turns (epoch, sample indices) into a collated micro-batch; runs in loader workers.

    A map-style dataset whose keys are ``(epoch, indices)`` so a torch DataLoader can run the
    masking in worker processes while the main process decides the order.
    """

    def __init__(self, dataset: Any, *, seed: int, masking: MaskingSpec | None, pad_id: int,
                 pad_to_multiple_of: int, pack_width: int | None = None) -> None:
        self.dataset, self.seed, self.masking = dataset, seed, masking
        self.pad_id, self.pad_to_multiple_of = pad_id, pad_to_multiple_of
        self.pack_width = pack_width

    def dynamic_row(self, index: int, epoch: int) -> Row:
        """Sample ``index`` with the mask it gets in ``epoch``: (ids, types, labels, nsp), (L,)."""
        m = self.masking
        assert m is not None
        tokens, a_length, nsp = self.dataset.get(index)
        ids, positions, targets = mask_tokens(
            np.asarray(tokens), sample_rng(self.seed, epoch, index),
            masked_lm_prob=m.masked_lm_prob, max_predictions=m.max_predictions, mask_id=m.mask_id,
            vocab_size=m.vocab_size, special_ids=m.special_ids, is_continuation=m.is_continuation)
        labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
        labels[positions] = targets
        types = (np.arange(len(ids)) >= a_length).astype(np.int64)  # 0 for "[CLS] A [SEP]"
        return ids, types, labels, int(nsp)

    def __getitem__(self, key: tuple[int, np.ndarray]) -> dict[str, torch.Tensor]:
        epoch, indices = key
        if self.masking is None:
            rows = [self.dataset.get_static(int(i)) for i in indices]
        else:
            rows = [self.dynamic_row(int(i), epoch) for i in indices]
        return collate_rows(rows, pad_id=self.pad_id, pad_to_multiple_of=self.pad_to_multiple_of,
                            pack_width=self.pack_width)


__all__ = ["MaskingSpec", "MicroBatchMaker", "Row", "collate_rows", "masking_spec"]
