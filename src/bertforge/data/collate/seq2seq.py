"""Batches of encoder-decoder pairs: summarization (article, summary) and BART denoising (noised
document, document). Both collate with ``bertforge.data.seq2seq.collate_seq2seq``: sources and
targets padded to their longest (rounded up), decoder inputs the targets shifted right after the
decoder start id, and the source's token layout for an unpadded encoder."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from bertforge.data.batch import Batch
from bertforge.data.masking import sample_rng
from bertforge.data.noising import NoiseSpec, NoiseVocab, noise
from bertforge.data.seq2seq import collate_seq2seq, truncate_framed


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


__all__ = ["DenoisingBatchMaker", "PairFeatures"]
