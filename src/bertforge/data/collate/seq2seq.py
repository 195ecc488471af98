"""Batches of encoder-decoder pairs: summarization (article, summary) and BART denoising (noised
document, document).

A pair is a source token sequence (the encoder input: a noised document, an article) and a
target (what the decoder must produce: the document, the summary), each framed ``<s> ... </s>``.
Teacher forcing feeds the decoder the target shifted right behind the decoder start token, as
BART and transformers do: ``decoder_input_ids = [start] + target[:-1]``. ``collate_seq2seq`` pads
sources and targets to their longest (rounded up) and adds the source's token layout for an
unpadded encoder."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bertforge.data.batch import IGNORE_INDEX, Batch
from bertforge.data.masking import sample_rng
from bertforge.data.noising import NoiseSpec, NoiseVocab, noise
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


class PairFeatures(torch.utils.data.Dataset):
    """Encoded (article, summary) pairs; as the loader's ``make_batch`` it collates
    ``(epoch, indices)`` into a seq2seq micro-batch padded to its longest source and target."""

    def __init__(self, sources: list[np.ndarray], targets: list[np.ndarray], *, pad_id: int,
                 decoder_start_id: int) -> None:
        self.sources, self.targets = sources, targets
        self.pad_id, self.decoder_start_id = pad_id, decoder_start_id
        self.lengths = np.array([len(s) for s in sources], dtype=np.int64)
        digest = hashlib.sha256()
        for row in (*sources, *targets):
            digest.update(row.tobytes())
        self.fingerprint = f"{len(sources)} pairs, sha256 {digest.hexdigest()[:16]}"

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, key: tuple[int, np.ndarray]) -> Batch:
        rows = [int(i) for i in key[1]]
        return collate_seq2seq([self.sources[i] for i in rows], [self.targets[i] for i in rows],
                               pad_id=self.pad_id, decoder_start_id=self.decoder_start_id)


class DenoisingBatchMaker(torch.utils.data.Dataset):
    """(epoch, sample indices) -> a noised seq2seq micro-batch; runs in loader workers.

    The noise of a sample depends only on (seed, epoch, sample index), like BERT's masks.
    Sources longer than ``max_source_length`` (insertion noise can lengthen a document) are cut,
    keeping their final ``</s>``.
    """

    def __init__(self, dataset: Any, *, seed: int, spec: NoiseSpec, vocab: NoiseVocab,
                 pad_id: int, max_source_length: int, pad_to_multiple_of: int = 8) -> None:
        self.dataset, self.seed, self.spec, self.vocab = dataset, seed, spec, vocab
        self.pad_id, self.max_source_length = pad_id, max_source_length
        self.pad_to_multiple_of = pad_to_multiple_of

    def pair(self, index: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(noised source, original target) of sample ``index`` in ``epoch``, int64."""
        tokens, ends = self.dataset.get_sentences(index)
        target = np.asarray(tokens, dtype=np.int64)
        source = noise(target, ends, sample_rng(self.seed, epoch, index), self.spec, self.vocab)
        return truncate_framed(source, self.max_source_length), target

    def __getitem__(self, key: tuple[int, np.ndarray]) -> dict[str, torch.Tensor]:
        epoch, indices = key
        pairs = [self.pair(int(i), epoch) for i in indices]
        return collate_seq2seq([p[0] for p in pairs], [p[1] for p in pairs], pad_id=self.pad_id,
                               decoder_start_id=self.vocab.eos_id,
                               pad_to_multiple_of=self.pad_to_multiple_of)


__all__ = ["DenoisingBatchMaker", "PairFeatures", "collate_seq2seq", "pad_rows",
           "truncate_framed"]
