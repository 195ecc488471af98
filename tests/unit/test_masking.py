"""Dynamic MLM masking: statistics, caps, whole words, special tokens and determinism."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.data.masking import mask_tokens, order_rng, sample_rng

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = {PAD, UNK, CLS, SEP, MASK}
VOCAB = 1000


def _pair(rng: np.random.Generator, n_a: int, n_b: int) -> np.ndarray:
    """[CLS] A [SEP] B [SEP] with ordinary ids in [5, VOCAB)."""
    a, b = rng.integers(5, VOCAB, n_a), rng.integers(5, VOCAB, n_b)
    return np.concatenate(([CLS], a, [SEP], b, [SEP]))


def _mask(tokens: np.ndarray, rng: np.random.Generator, **kw):
    kw.setdefault("max_predictions", 20)
    return mask_tokens(tokens, rng, mask_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS, **kw)


def test_counts_split_and_specials_over_many_samples() -> None:
    gen = np.random.default_rng(0)
    n_mask = n_random = n_keep = total = 0
    for i in range(2500):
        tokens = _pair(gen, int(gen.integers(5, 60)), int(gen.integers(5, 60)))
        ids, pos, lab = _mask(tokens, sample_rng(7, 0, i), max_predictions=100)
        n_cand = len(tokens) - 3
        assert len(pos) == max(1, int(round(n_cand * 0.15)))
        assert np.all(np.diff(pos) > 0)  # sorted, unique
        assert not np.isin(tokens[pos], list(SPECIALS)).any()
        np.testing.assert_array_equal(lab, tokens[pos])
        untouched = np.setdiff1d(np.arange(len(tokens)), pos)
        np.testing.assert_array_equal(ids[untouched], tokens[untouched])
        out = ids[pos]
        n_mask += int((out == MASK).sum())
        n_keep += int((out == lab).sum())
        n_random += int(((out != MASK) & (out != lab)).sum())
        assert not np.isin(out[out != MASK], list(SPECIALS)).any()
        total += len(pos)
    assert total > 20000
    # 3 standard deviations of a binomial over ~23k draws is about 0.008 / 0.006.
    assert abs(n_mask / total - 0.8) < 0.01
    # a random draw equals the original with probability 1/995, so "keep" is 10% + 0.01%.
    assert abs(n_keep / total - 0.1) < 0.008
    assert abs(n_random / total - 0.1) < 0.008


def test_max_predictions_cap_and_minimum_of_one() -> None:
    gen = np.random.default_rng(1)
    long = _pair(gen, 250, 250)
    _, pos, _ = _mask(long, sample_rng(0, 0, 0), max_predictions=20)
    assert len(pos) == 20
    short = np.array([CLS, 10, 11, SEP])
    _, pos, _ = _mask(short, sample_rng(0, 0, 0))
    assert len(pos) == 1 and pos[0] in (1, 2)
    only_specials = np.array([CLS, SEP, SEP])
    ids, pos, lab = _mask(only_specials, sample_rng(0, 0, 0))
    assert len(pos) == 0 and len(lab) == 0
    np.testing.assert_array_equal(ids, only_specials)


def test_random_replacements_cover_exactly_the_ordinary_ids() -> None:
    # A tiny vocabulary so every id is drawn many times; specials sit at the edges and inside.
    specials = {0, 2, 5, 19}
    tokens = np.array([2] + [7] * 40 + [5])
    drawn = []
    for i in range(3000):
        ids, pos, _ = mask_tokens(tokens, sample_rng(3, 1, i), masked_lm_prob=1.0,
                                  max_predictions=40, mask_id=5, vocab_size=20,
                                  special_ids=specials)
        out = ids[pos]
        drawn.append(out[out != 5])
    drawn = np.concatenate(drawn)
    allowed = sorted(set(range(20)) - specials)
    counts = np.bincount(drawn, minlength=20)
    assert sorted(np.flatnonzero(counts)) == allowed
    # Every token is 7, so "keep" inflates the count of 7; the others must look uniform
    # (~800 draws each: a relative spread of about 0.035).
    others = np.array([counts[a] for a in allowed if a != 7], dtype=float)
    assert others.std() / others.mean() < 0.1


def _words(gen: np.random.Generator, n_words: int, is_cont: np.ndarray) -> np.ndarray:
    """Words of 1-4 pieces: a start id in [5, 500) then '##' ids in [500, VOCAB)."""
    out = []
    for _ in range(n_words):
        out.append(int(gen.integers(5, 500)))
        out.extend(gen.integers(500, VOCAB, int(gen.integers(0, 4))).tolist())
    return np.array(out)


def test_whole_word_masking_never_splits_a_word() -> None:
    is_cont = np.zeros(VOCAB, dtype=bool)
    is_cont[500:] = True
    gen = np.random.default_rng(2)
    predicted = candidates = 0
    for i in range(400):
        body = _words(gen, int(gen.integers(3, 40)), is_cont)
        tokens = np.concatenate(([CLS], body, [SEP]))
        ids, pos, lab = _mask(tokens, sample_rng(11, 2, i), is_continuation=is_cont)
        n_cand = len(body)
        budget = min(20, max(1, int(round(n_cand * 0.15))))
        assert len(pos) <= budget
        chosen = np.zeros(len(tokens), dtype=bool)
        chosen[pos] = True
        starts = np.flatnonzero(~is_cont[tokens])
        for s, e in zip(starts[:-1], starts[1:]):  # a word spans [s, e); [SEP] ends the last
            word = chosen[s:e]
            assert word.all() or not word.any(), (tokens[s:e], word)
        np.testing.assert_array_equal(lab, tokens[pos])
        predicted += len(pos)
        candidates += n_cand
    # Skipping words that overshoot loses little: close to 15% of candidates overall.
    assert 0.12 < predicted / candidates <= 0.155


def test_whole_word_budget_is_filled_by_smaller_words() -> None:
    # One 5-piece word and ten 1-piece words; budget round(15 * 0.4) = 6. Whatever the order,
    # the greedy fill reaches exactly 6 (5 + 1 or six singles).
    is_cont = np.zeros(VOCAB, dtype=bool)
    is_cont[500:] = True
    body = np.array([10, 501, 502, 503, 504] + list(range(20, 30)))
    tokens = np.concatenate(([CLS], body, [SEP]))
    for i in range(50):
        _, pos, _ = _mask(tokens, sample_rng(0, 0, i), masked_lm_prob=0.4, is_continuation=is_cont)
        assert len(pos) == 6
        big = np.isin(pos, [1, 2, 3, 4, 5])
        assert big.sum() in (0, 5)



def _reference_whole_word_positions(tokens, candidate, is_continuation, num_to_predict, rng):
    """The greedy fill as first written: a Python loop over every word after the first miss."""
    cont = is_continuation[tokens] & candidate
    is_start = candidate & ~(cont & np.concatenate(([False], candidate[:-1])))
    cand_pos = np.flatnonzero(candidate)
    word_of = np.cumsum(is_start[cand_pos]) - 1
    n_words = int(is_start.sum())
    lengths = np.bincount(word_of, minlength=n_words)
    order = rng.permutation(n_words)
    fits = np.cumsum(lengths[order]) <= num_to_predict
    n_prefix = int(np.argmin(fits)) if not fits.all() else len(order)
    chosen = list(order[:n_prefix])
    budget = num_to_predict - int(lengths[order[:n_prefix]].sum())
    for w in order[n_prefix + 1:]:
        if budget == 0:
            break
        if lengths[w] <= budget:
            chosen.append(w)
            budget -= int(lengths[w])
    chosen_words = np.zeros(n_words, dtype=bool)
    chosen_words[np.asarray(chosen, dtype=np.int64)] = True
    return cand_pos[chosen_words[word_of]]


def test_whole_word_fill_equals_the_per_word_loop() -> None:
    # The vectorised fill must choose exactly what the per-word loop chose (bit-identical masks).
    # Mixes of 1..4-piece words, specials inside the body and small odd budgets make the fill
    # run often, including the case where no remaining word fits and every word is visited.
    from bertforge.data.masking import _whole_word_positions

    is_cont = np.zeros(VOCAB, dtype=bool)
    is_cont[500:] = True
    gen = np.random.default_rng(7)
    specials = np.array(sorted(SPECIALS))
    filled = 0
    for i in range(600):
        n_words = int(gen.integers(1, 120))
        pieces = gen.choice([1, 2, 3, 4], size=n_words, p=[0.3, 0.4, 0.2, 0.1] if i % 2 else
                            [0.0, 0.7, 0.3, 0.0])
        body = np.concatenate([np.concatenate(([gen.integers(5, 500)],
                                               gen.integers(500, VOCAB, k - 1)))
                               for k in pieces])
        if i % 5 == 0:  # a special token inside splits a word's pieces from their start
            body[gen.integers(0, len(body))] = SEP
        tokens = np.concatenate(([CLS], body, [SEP]))
        candidate = ~np.isin(tokens, specials)
        budget = int(gen.integers(1, 2 * candidate.sum() + 2))
        got = _whole_word_positions(tokens, candidate, is_cont, budget, sample_rng(9, 1, i))
        want = _reference_whole_word_positions(tokens, candidate, is_cont, budget,
                                               sample_rng(9, 1, i))
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
        filled += len(got) < budget
    assert filled > 50  # the budget-not-reached path was exercised

def test_masks_depend_only_on_seed_epoch_index() -> None:
    gen = np.random.default_rng(3)
    samples = [_pair(gen, 30, 30) for _ in range(20)]
    forward = [_mask(t, sample_rng(5, 3, i)) for i, t in enumerate(samples)]
    backward = [_mask(samples[i], sample_rng(5, 3, i)) for i in reversed(range(20))][::-1]
    for (a_ids, a_pos, _), (b_ids, b_pos, _) in zip(forward, backward):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_pos, b_pos)
    # Another epoch, index or seed gives another mask (20 of 60 tokens: collisions ~ never).
    base = forward[0][1]
    for other in (sample_rng(5, 4, 0), sample_rng(6, 3, 0), sample_rng(5, 3, 1)):
        assert not np.array_equal(_mask(samples[0], other)[1], base)


def test_streams_are_separated_and_seeds_validated() -> None:
    a = sample_rng(1, 2, 0).integers(0, 2**62, 4)
    b = order_rng(1, 2).integers(0, 2**62, 4)
    c = sample_rng(1, 0, 2).integers(0, 2**62, 4)  # swapped epoch and index
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    with pytest.raises(ValueError, match="seed=-1"):
        sample_rng(-1, 0, 0)
