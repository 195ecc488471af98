"""Masked-language-model masking of one token sequence, and the seeded RNG that drives it.

Masks are drawn at load time (dynamic masking) from a generator that depends only on
``(seed, epoch, sample index)``. The same sample therefore gets the same mask in every process
layout (one GPU with gradient accumulation, or many GPUs), in every worker and after a resume,
and a fresh mask in every epoch.

The recipe is BERT's: about ``masked_lm_prob`` of the maskable tokens (never special tokens)
are chosen, capped at ``max_predictions``; each chosen token becomes [MASK] 80% of the time, a
random ordinary token 10% and stays unchanged 10%. With whole-word masking a word (a start
token and the "##" pieces after it) is chosen or skipped as a unit.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

# Domains of the counter-based generator, so the mask stream of a sample and the shuffle
# stream of an epoch can never coincide.
_MASK_DOMAIN = 0
ORDER_DOMAIN = 1
_ARRANGE_DOMAIN = 2

_U64 = (1 << 64) - 1


def _philox(seed: int, domain: int, epoch: int, index: int) -> np.random.Generator:
    """A Philox generator keyed by ``seed`` whose counter starts at (0, domain, index, epoch).

    Philox is counter-based: each distinct starting counter is an independent stream, and draws
    advance only the lowest counter word, so streams never overlap in practice (2**64 blocks).
    Creating one costs about 10 microseconds, cheap enough to do per sample.
    """
    for name, value in (("seed", seed), ("epoch", epoch), ("index", index)):
        if not 0 <= int(value) <= _U64:
            raise ValueError(f"{name}={value} must be an integer in [0, 2**64)")
    key = [int(seed) & _U64, 0]
    counter = [0, int(domain), int(index), int(epoch)]
    return np.random.Generator(np.random.Philox(counter=counter, key=key))


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator that masks sample ``index`` in ``epoch``; depends on nothing else."""
    return _philox(seed, _MASK_DOMAIN, epoch, index)


def order_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator that orders the samples of ``epoch`` (independent of every mask stream)."""
    return _philox(seed, ORDER_DOMAIN, epoch, 0)


def arrange_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator a dataset's ``arrange_batches`` draws from in ``epoch`` (independent of
    the order and mask streams, so arranging never shifts either)."""
    return _philox(seed, _ARRANGE_DOMAIN, epoch, 0)


def normalize_special_ids(special_ids: Iterable[int] | np.ndarray) -> np.ndarray:
    """Sorted, unique int64 array of special token ids (accepts a set, list or array)."""
    if isinstance(special_ids, np.ndarray):
        return np.unique(special_ids.astype(np.int64, copy=False))
    return np.unique(np.fromiter((int(i) for i in special_ids), dtype=np.int64))


def _random_ordinary_ids(
    rng: np.random.Generator, n: int, vocab_size: int, special_sorted: np.ndarray
) -> np.ndarray:
    """``n`` ids drawn uniformly from [0, vocab_size) minus the special ids.

    Draws r from a range shortened by the number of specials, then shifts r past every special
    id at or below it; no vocabulary-sized array is built. (n,) int64.
    """
    specials = special_sorted[(special_sorted >= 0) & (special_sorted < vocab_size)]
    n_allowed = vocab_size - len(specials)
    if n_allowed <= 0:
        raise ValueError(f"vocab_size={vocab_size} leaves no ordinary tokens to draw from")
    r = rng.integers(0, n_allowed, size=n, dtype=np.int64)
    # specials[k] - k = how many ordinary ids precede the k-th special; every special whose
    # count is <= r lies at or below the r-th ordinary id and shifts it up by one.
    return r + np.searchsorted(specials - np.arange(len(specials)), r, side="right")


def _whole_word_positions(
    tokens: np.ndarray,
    candidate: np.ndarray,
    is_continuation: np.ndarray,
    num_to_predict: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Positions of whole words chosen in random order until ``num_to_predict`` tokens.

    A word starts at a candidate token that is not a "##" piece or whose predecessor is not a
    candidate; following "##" candidates belong to it. As in BERT's reference, a word that would
    overshoot the budget is skipped and later (shorter) words may still fill it, so the total
    never exceeds ``num_to_predict`` and a word is never split.
    """
    cont = is_continuation[tokens] & candidate  # (L,) bool
    prev_candidate = np.concatenate(([False], candidate[:-1]))
    is_start = candidate & ~(cont & prev_candidate)  # (L,) bool
    # A word runs from its start up to the next start or the next non-candidate token.
    cand_pos = np.flatnonzero(candidate)  # (C,)
    word_of = np.cumsum(is_start[cand_pos]) - 1  # (C,) word id of each candidate
    n_words = int(is_start.sum())
    lengths = np.bincount(word_of, minlength=n_words)  # (W,)

    order = rng.permutation(n_words)
    shuffled_len = lengths[order]
    fits = np.cumsum(shuffled_len) <= num_to_predict
    n_prefix = int(np.argmin(fits)) if not fits.all() else len(order)
    chosen = [order[:n_prefix]]
    budget = num_to_predict - int(shuffled_len[:n_prefix].sum())
    # Greedy fill after the first word that did not fit: in shuffled order, take each word that
    # still fits. The budget only shrinks, so a word longer than it now is never taken later;
    # dropping those first leaves the next taken word at the front. One pass per word taken
    # (at most the budget), not per word visited.
    rest = order[n_prefix + 1 :]
    while budget > 0:
        rest = rest[lengths[rest] <= budget]
        if not len(rest):
            break
        chosen.append(rest[:1])
        budget -= int(lengths[rest[0]])
        rest = rest[1:]
    chosen_words = np.zeros(n_words, dtype=bool)
    chosen_words[np.concatenate(chosen)] = True
    return cand_pos[chosen_words[word_of]]


def mask_tokens(
    tokens: np.ndarray,
    rng: np.random.Generator,
    *,
    masked_lm_prob: float = 0.15,
    max_predictions: int = 20,
    mask_id: int,
    vocab_size: int,
    special_ids: Iterable[int] | np.ndarray,
    is_continuation: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Choose and corrupt the tokens the model must predict.

    Args:
        tokens: (L,) token ids of one sample, including [CLS]/[SEP], no padding.
        rng: source of randomness, normally ``sample_rng(seed, epoch, index)``.
        masked_lm_prob: fraction of the maskable (non-special) tokens to predict.
        max_predictions: hard cap on the number of predicted tokens.
        mask_id: id of [MASK].
        vocab_size: size of the tokenizer's vocabulary; random replacements are drawn from
            [0, vocab_size) minus ``special_ids``, never from an embedding's padding rows.
        special_ids: ids that are never predicted nor drawn as replacements.
        is_continuation: (vocab_size,) bool, True for "##" pieces; enables whole-word masking.

    Returns:
        ``(input_ids, positions, labels)``: (L,) int64 corrupted copy of ``tokens``; (P,) int64
        predicted positions in increasing order; (P,) int64 original ids at those positions.
        P = min(max_predictions, max(1, round(C * masked_lm_prob))) for C maskable tokens
        (P <= C; with whole words P can fall short when no remaining word fits the budget).
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    special_sorted = normalize_special_ids(special_ids)
    # A handful of specials: one broadcast compare beats np.isin's sorting. (L, n_special)
    candidate = ~(tokens[:, None] == special_sorted[None, :]).any(axis=1)  # (L,) bool
    n_candidates = int(candidate.sum())
    input_ids = tokens.copy()
    if n_candidates == 0 or max_predictions <= 0:
        empty = np.empty(0, dtype=np.int64)
        return input_ids, empty, empty
    # Python's round (half to even), as BERT's reference data generator uses.
    num_to_predict = min(max_predictions, max(1, int(round(n_candidates * masked_lm_prob))))

    if is_continuation is None:
        cand_pos = np.flatnonzero(candidate)
        picked = rng.permutation(n_candidates)[: min(num_to_predict, n_candidates)]
        positions = np.sort(cand_pos[picked])
    else:
        positions = _whole_word_positions(tokens, candidate, is_continuation, num_to_predict, rng)

    labels = tokens[positions]
    # One uniform per predicted token: [0, .8) -> [MASK], [.8, .9) -> random id, [.9, 1) -> keep.
    u = rng.random(len(positions))
    input_ids[positions[u < 0.8]] = mask_id
    random_pos = positions[(u >= 0.8) & (u < 0.9)]
    if len(random_pos):
        input_ids[random_pos] = _random_ordinary_ids(rng, len(random_pos), vocab_size,
                                                     special_sorted)
    return input_ids, positions, labels
