"""What BART's noising did to a set of documents: length change, masked and missing shares, span
lengths and order changes, measured from ``(original, noised)`` pairs (``bertforge inspect``
prints them for denoising data; the noising tests check the recipe against them)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from bertforge.data.noising import NoiseVocab, _document

# noise_statistics codes token trigrams as base-vocab_size numbers in an int64.
_MAX_STATISTICS_VOCAB = 1 << 21


def _missing_count(original: np.ndarray, source: np.ndarray) -> int:
    """How many tokens of ``original`` have no counterpart in ``source`` (multiset difference)."""
    values, inverse = np.unique(np.concatenate((original, source)), return_inverse=True)
    have = np.bincount(inverse[: len(original)], minlength=len(values))
    kept = np.bincount(inverse[len(original):], minlength=len(values))
    return int(np.maximum(have - kept, 0).sum())


def _order_changed(original: np.ndarray, source: np.ndarray, mask_id: int, base: int) -> bool:
    """Whether trigrams that occur once in ``original`` appear out of order in ``source``.

    Trigrams holding a ``<mask>`` are ignored. Masking, deletion and insertion keep the order
    of what survives; permuted sentences and rotation break it as soon as one unique trigram
    survives on each side of a moved boundary.
    """
    if len(original) < 3 or len(source) < 3:
        return False

    def codes(x: np.ndarray) -> np.ndarray:
        return (x[:-2] * base + x[1:-1]) * base + x[2:]

    table, first, counts = np.unique(codes(original), return_index=True, return_counts=True)
    is_mask = source == mask_id
    seen = codes(source)[~(is_mask[:-2] | is_mask[1:-1] | is_mask[2:])]
    at = np.minimum(np.searchsorted(table, seen), len(table) - 1)
    unique_hit = (table[at] == seen) & (counts[at] == 1)
    return bool(np.any(np.diff(first[at[unique_hit]]) < 0))


def noise_statistics(
    pairs: Iterable[tuple[np.ndarray, np.ndarray]], vocab: NoiseVocab
) -> dict[str, float]:
    """What noising did to a set of ``(original, noised)`` documents.

    Content means the tokens between ``<s>`` and ``</s>``. Keys:

    * ``samples``: number of pairs;
    * ``length_ratio``: mean over pairs of ``len(noised) / len(original)``;
    * ``mask_fraction``: ``<mask>`` tokens / content tokens, over all noised documents;
    * ``missing_fraction``: original content tokens with no counterpart in the noised content
      (multiset difference: masked, deleted or randomly replaced), over all originals;
    * ``mean_span_length``: missing tokens per run of consecutive ``<mask>`` tokens, an
      estimate of the mean span length in tokens (zero-length spans count as spans) for
      ``replace_length`` 1 or -1. It reads high when spans are randomized (their tokens are
      missing but show no ``<mask>``: about ``lambda / (1 - mask_random)``), when spans touch
      (their masks form one run) and with deletion. 0.0 when there is no ``<mask>``;
    * ``order_changed``: fraction of pairs whose surviving text is out of the original order
      (sentence permutation or rotation), judged by trigrams that occur once in the original.
      A change no unique trigram witnesses is not seen.
    """
    if vocab.vocab_size > _MAX_STATISTICS_VOCAB:
        raise ValueError(f"noise_statistics supports vocab_size up to {_MAX_STATISTICS_VOCAB}, "
                         f"got {vocab.vocab_size}")
    n_pairs = 0
    ratio_sum = 0.0
    original_content = source_content = masks = runs = missing = changed = 0
    for original, noised in pairs:
        orig = _document(original, vocab)
        src = _document(noised, vocab)
        n_pairs += 1
        ratio_sum += len(src) / len(orig)
        orig_body, src_body = orig[1:-1], src[1:-1]
        original_content += len(orig_body)
        source_content += len(src_body)
        is_mask = src_body == vocab.mask_id
        masks += int(is_mask.sum())
        runs += int(is_mask.sum()) - int(np.count_nonzero(is_mask[1:] & is_mask[:-1]))
        missing += _missing_count(orig_body, src_body)
        changed += _order_changed(orig, src, vocab.mask_id, vocab.vocab_size)
    if n_pairs == 0:
        raise ValueError("pairs is empty; give at least one (original, noised) pair")
    return {
        "samples": float(n_pairs),
        "length_ratio": ratio_sum / n_pairs,
        "mask_fraction": masks / source_content if source_content else 0.0,
        "missing_fraction": missing / original_content if original_content else 0.0,
        "mean_span_length": missing / runs if runs else 0.0,
        "order_changed": changed / n_pairs,
    }
