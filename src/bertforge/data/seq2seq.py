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

from bertforge.batch import IGNORE_INDEX


def collate_seq2seq(sources: Sequence[np.ndarray], targets: Sequence[np.ndarray], *, pad_id: int,
                    decoder_start_id: int, pad_to_multiple_of: int = 8) -> dict[str, torch.Tensor]:
    """Pad pairs into a batch: ``input_ids``/``attention_mask`` (B, S), ``decoder_input_ids`` and
    ``labels`` (B, T, IGNORE_INDEX at padding); both widths rounded up to the multiple."""
    if len(sources) != len(targets) or not sources:
        raise ValueError(f"need as many sources as targets (at least one), got {len(sources)} "
                         f"and {len(targets)}")

    def width(rows: Sequence[np.ndarray]) -> int:
        longest = max(len(r) for r in rows)
        return -(-longest // pad_to_multiple_of) * pad_to_multiple_of

    b, s, t = len(sources), width(sources), width(targets)
    input_ids = np.full((b, s), pad_id, dtype=np.int64)
    attention = np.zeros((b, s), dtype=np.int64)
    labels = np.full((b, t), IGNORE_INDEX, dtype=np.int64)
    decoder = np.full((b, t), pad_id, dtype=np.int64)
    decoder[:, 0] = decoder_start_id
    for i, (src, tgt) in enumerate(zip(sources, targets)):  # a loop over pairs, not tokens
        input_ids[i, : len(src)] = src
        attention[i, : len(src)] = 1
        labels[i, : len(tgt)] = tgt
        decoder[i, 1 : len(tgt)] = tgt[:-1]
    out = {"input_ids": input_ids, "attention_mask": attention, "decoder_input_ids": decoder,
           "labels": labels}
    return {k: torch.from_numpy(v) for k, v in out.items()}


def truncate_framed(tokens: np.ndarray, max_length: int) -> np.ndarray:
    """``<s> ... </s>`` cut to at most ``max_length`` tokens, keeping the final ``</s>``."""
    if len(tokens) <= max_length:
        return tokens
    return np.concatenate([tokens[: max_length - 1], tokens[-1:]])


__all__ = ["collate_seq2seq", "truncate_framed"]
