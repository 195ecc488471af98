"""Collating source/target pairs for encoder-decoder models (BART denoising and summarization).

A pair is a source token sequence (the encoder input: a noised document, an article) and a
target (what the decoder must produce: the document, the summary), each framed ``<s> ... </s>``.
Teacher forcing feeds the decoder the target shifted right behind the decoder start token, as
BART and transformers do: ``decoder_input_ids = [start] + target[:-1]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bertforge.data.batch import IGNORE_INDEX
from bertforge.ops.unpad import layout_batch_entries


def pad_rows(rows: Sequence[Sequence[int] | np.ndarray], pad_id: int,
             width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Token rows padded with ``pad_id`` to ``width`` (default: the longest row): int64 ids and
    attention mask (1 = real token), (N, width) each."""
    width = max(len(r) for r in rows) if width is None else width
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):  # a loop over sequences, not tokens
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    return ids, mask


def collate_seq2seq(sources: Sequence[np.ndarray], targets: Sequence[np.ndarray], *, pad_id: int,
                    decoder_start_id: int, pad_to_multiple_of: int = 8) -> dict[str, torch.Tensor]:
    """Pad pairs into a batch: ``input_ids``/``attention_mask`` (B, S), ``decoder_input_ids`` and
    ``labels`` (B, T, IGNORE_INDEX at padding); both widths rounded up to the multiple. Also the
    source's ``TokenLayout`` entries (``bertforge.ops.unpad.LAYOUT_KEYS``) for an unpadded
    encoder."""
    if len(sources) != len(targets) or not sources:
        raise ValueError(f"need as many sources as targets (at least one), got {len(sources)} "
                         f"and {len(targets)}")

    def width(rows: Sequence[np.ndarray]) -> int:
        longest = max(len(r) for r in rows)
        return -(-longest // pad_to_multiple_of) * pad_to_multiple_of

    b, t = len(sources), width(targets)
    input_ids, attention = pad_rows(sources, pad_id, width(sources))
    labels = np.full((b, t), IGNORE_INDEX, dtype=np.int64)
    decoder = np.full((b, t), pad_id, dtype=np.int64)
    decoder[:, 0] = decoder_start_id
    for i, tgt in enumerate(targets):  # a loop over pairs, not tokens
        labels[i, : len(tgt)] = tgt
        decoder[i, 1 : len(tgt)] = tgt[:-1]
    arrays = {"input_ids": input_ids, "attention_mask": attention,
              "decoder_input_ids": decoder, "labels": labels}
    out: dict[str, torch.Tensor | int] = {k: torch.from_numpy(v) for k, v in arrays.items()}
    out.update(layout_batch_entries(out["attention_mask"]))  # the source's, for the encoder
    return out


def truncate_framed(tokens: np.ndarray, max_length: int) -> np.ndarray:
    """``<s> ... </s>`` cut to at most ``max_length`` tokens, keeping the final ``</s>``."""
    if len(tokens) <= max_length:
        return tokens
    return np.concatenate([tokens[: max_length - 1], tokens[-1:]])


__all__ = ["collate_seq2seq", "pad_rows", "truncate_framed"]
