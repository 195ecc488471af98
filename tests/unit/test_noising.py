"""BART noising: each corruption's semantics and statistics, determinism, purity and errors."""

from __future__ import annotations

import math
import multiprocessing
import pickle
from dataclasses import replace

import numpy as np
import pytest

from bertforge.data.masking import _random_ordinary_ids, sample_rng
from bertforge.data.noise_statistics import noise_statistics
from bertforge.data.noising import (
    DEFAULT_NOISE,
    NoiseSpec,
    NoiseVocab,
    add_insertion_noise,
    add_rolling_buffer,
    add_whole_word_mask,
    check_noise_spec,
    delete_tokens,
    noise,
    permute_sentences,
    poisson_span_lengths,
)

BOS, PAD, EOS, UNK, MASK = 0, 1, 2, 3, 4
SPECIALS = np.array([BOS, PAD, EOS, UNK, MASK])
V = 1000
WORD_START = np.arange(V) < 500  # ids 5..499 begin a word, 500..999 continue one
TOKEN_VOCAB = NoiseVocab(MASK, BOS, EOS, V, SPECIALS, None)
WORD_VOCAB = NoiseVocab(MASK, BOS, EOS, V, SPECIALS, WORD_START)
NO_NOISE = NoiseSpec(mask=0.0, permute_sentences=0.0)


def _doc(gen: np.random.Generator, n_sentences: int, low: int = 2, high: int = 12,
         unk: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``<s> ... </s>`` of ordinary ids (a fraction ``unk`` replaced by <unk>) and its ends."""
    lengths = gen.integers(low, high, n_sentences)
    body = gen.integers(5, V, int(lengths.sum()))
    body[gen.random(len(body)) < unk] = UNK
    return np.concatenate(([BOS], body, [EOS])), 1 + np.cumsum(lengths)


def _reference_mask(tokens: np.ndarray, rng: np.random.Generator, spec: NoiseSpec,
                    vocab: NoiseVocab) -> np.ndarray:
    """Span masking written as fairseq's step-by-step walk, with specials as span barriers.

    Draws from ``rng`` in the same order as the library: span lengths, start permutation,
    random flags, random ids, then insertions.
    """
    tokens = tokens.copy()
    n = len(tokens)
    special = np.isin(tokens, vocab.special_ids)
    if spec.mask_length == "subword" or vocab.is_word_start is None:
        start = ~special
    else:
        start = vocab.is_word_start[tokens] & ~special
    words = np.flatnonzero(start)
    budget = math.ceil(len(words) * spec.mask)
    if budget == 0:
        return tokens
    if spec.mask_length == "span-poisson":
        lengths = poisson_span_lengths(rng, budget, spec.poisson_lambda)
    else:
        lengths = np.ones(budget, dtype=np.int64)
    inserts = int((lengths == 0).sum())
    lengths = lengths[lengths > 0]
    starts = words[rng.permutation(len(words))[: len(lengths)]]
    rand = rng.random(len(lengths)) < spec.mask_random
    covered = np.zeros(n, dtype=int)
    interior = np.zeros(n, dtype=int)
    covered_random = np.zeros(n, dtype=int)
    for s, k, r in zip(starts, lengths, rand):
        left = k - 1
        pos = s
        covered[pos] += 1
        covered_random[pos] += r
        while True:
            nxt = pos + 1
            if special[nxt]:
                break
            left -= int(start[nxt])
            if left < 0:
                break
            pos = nxt
            covered[pos] += 1
            interior[pos] += 1
            covered_random[pos] += r
    if spec.replace_length == -1:
        tokens[covered > 0] = MASK
        where = np.flatnonzero((covered > 0) & (covered_random > 0))
        tokens[where] = _random_ordinary_ids(rng, len(where), V, vocab.special_ids)
        out = tokens
    elif spec.replace_length == 0:
        out = tokens[covered == 0]
    else:
        tokens[starts] = MASK
        tokens[starts[rand]] = _random_ordinary_ids(rng, int(rand.sum()), V, vocab.special_ids)
        out = tokens[interior == 0]
    if inserts:
        # add_insertion_noise inserts ceil(len * p) tokens: exactly ``inserts`` here.
        out = add_insertion_noise(out, rng, inserts / len(out), vocab, spec.mask_random)
    return out


@pytest.mark.parametrize("mask_length", ["subword", "word", "span-poisson"])
@pytest.mark.parametrize("replace_length", [-1, 0, 1])
def test_mask_matches_a_step_by_step_reference(mask_length: str, replace_length: int) -> None:
    gen = np.random.default_rng(11)
    spec = NoiseSpec(mask=0.35, mask_random=0.3, replace_length=replace_length,
                     mask_length=mask_length, poisson_lambda=2.0)
    for i in range(150):
        tokens, _ = _doc(gen, int(gen.integers(1, 6)), unk=0.05)
        got = add_whole_word_mask(tokens, sample_rng(5, 0, i), spec, WORD_VOCAB)
        want = _reference_mask(tokens, sample_rng(5, 0, i), spec, WORD_VOCAB)
        np.testing.assert_array_equal(got, want)


def test_masking_every_word_by_hand() -> None:
    # words: [10 600 601] [11] <unk> [12 602]; <unk> is special and never masked.
    tokens = np.array([BOS, 10, 600, 601, 11, UNK, 12, 602, EOS])
    rng = sample_rng(0, 0, 0)
    whole = NoiseSpec(mask=1.0, mask_random=0.0, mask_length="word")
    np.testing.assert_array_equal(
        add_whole_word_mask(tokens, rng, replace(whole, replace_length=1), WORD_VOCAB),
        [BOS, MASK, MASK, UNK, MASK, EOS])
    np.testing.assert_array_equal(
        add_whole_word_mask(tokens, rng, replace(whole, replace_length=0), WORD_VOCAB),
        [BOS, UNK, EOS])
    np.testing.assert_array_equal(
        add_whole_word_mask(tokens, rng, replace(whole, replace_length=-1), WORD_VOCAB),
        [BOS, MASK, MASK, MASK, MASK, UNK, MASK, MASK, EOS])
    # Sub-word masking treats every ordinary token as a word.
    np.testing.assert_array_equal(
        add_whole_word_mask(tokens, rng, replace(whole, mask_length="subword"), WORD_VOCAB),
        [BOS, MASK, MASK, MASK, MASK, UNK, MASK, MASK, EOS])
    # A continuation right after <s> is not a word start: nothing to mask, nothing drawn.
    lone = np.array([BOS, 600, EOS])
    np.testing.assert_array_equal(add_whole_word_mask(lone, rng, whole, WORD_VOCAB), lone)


def test_word_mask_ratio_is_ceil_of_words_times_mask() -> None:
    gen = np.random.default_rng(1)
    spec = NoiseSpec(mask=0.3, mask_random=0.0, mask_length="word", replace_length=-1)
    masked_words = total_words = 0
    for i in range(400):
        tokens, _ = _doc(gen, 20)
        starts = WORD_START[tokens] & (tokens > MASK)
        out = add_whole_word_mask(tokens, sample_rng(2, 0, i), spec, WORD_VOCAB)
        assert len(out) == len(tokens)
        hit = out == MASK
        # a masked word is masked whole: a continuation is masked exactly when its word is
        word_id = np.cumsum(starts)
        for w in np.unique(word_id[hit]):
            assert hit[(word_id == w) & (tokens > MASK)].all()
        assert int((hit & starts).sum()) == math.ceil(starts.sum() * 0.3)
        masked_words += int((hit & starts).sum())
        total_words += int(starts.sum())
    # rounding up adds less than one word per document (of ~65 words)
    assert 0 <= masked_words - 0.3 * total_words < 400
    assert abs(masked_words / total_words - 0.3) < 0.01


def test_span_mask_covers_at_most_the_word_budget() -> None:
    gen = np.random.default_rng(2)
    spec = NoiseSpec(mask=0.3, mask_random=0.0, replace_length=-1, poisson_lambda=3.5)
    covered = budget = 0
    for i in range(300):
        tokens, _ = _doc(gen, 6)
        starts = WORD_START[tokens] & (tokens > MASK)
        out = add_whole_word_mask(tokens, sample_rng(3, 0, i), spec, WORD_VOCAB)
        # inserted (zero-length) masks make the output longer; the rest stays in place
        if len(out) == len(tokens):
            hit = (out == MASK) & starts
            assert hit.sum() <= math.ceil(starts.sum() * 0.3)
            covered += int(hit.sum())
            budget += math.ceil(starts.sum() * 0.3)
    # Overlapping spans cover fewer words than the budget, but most of it.
    assert 0.75 * budget < covered <= budget


def test_poisson_span_lengths_sum_to_budget_and_average_lambda() -> None:
    for n in (1, 2, 7, 50):
        for i in range(50):
            lengths = poisson_span_lengths(sample_rng(0, n, i), n, 3.5)
            assert lengths.sum() == n and (lengths >= 0).all() and lengths[-1] >= 1
    lengths = poisson_span_lengths(sample_rng(1, 0, 0), 200_000, 3.5)
    assert lengths.sum() == 200_000
    draws = lengths[:-1]  # the last one is trimmed
    sd = math.sqrt(3.5 / len(draws))  # Poisson variance = lambda
    assert abs(draws.mean() - 3.5) < 4 * sd
    assert abs((draws == 0).mean() - math.exp(-3.5)) < 4 * math.sqrt(math.exp(-3.5) / len(draws))
    assert poisson_span_lengths(sample_rng(1, 0, 0), 0, 3.5).size == 0
    # small lambda: more than one batch of draws is needed to reach the budget
    assert poisson_span_lengths(sample_rng(1, 0, 1), 40, 0.1).sum() == 40
    with pytest.raises(ValueError, match="poisson_lambda"):
        poisson_span_lengths(sample_rng(1, 0, 0), 3, 0.0)


def test_visible_spans_average_lambda() -> None:
    # Word = token, replace_length -1: every covered token shows as <mask>. Long documents and
    # a small budget keep spans apart; noise_statistics divides covered tokens by <mask> runs.
    gen = np.random.default_rng(3)
    spec = NoiseSpec(mask=0.03, mask_random=0.0, replace_length=-1, poisson_lambda=3.5,
                     permute_sentences=0.0)
    pairs = []
    for i in range(300):
        tokens, ends = _doc(gen, 100, low=20, high=21)  # 2000 tokens, 60 masked per document
        pairs.append((tokens, noise(tokens, ends, sample_rng(4, 0, i), spec, TOKEN_VOCAB)))
    stats = noise_statistics(pairs, TOKEN_VOCAB)
    # ~5000 spans: the sampling sd of the mean is sqrt(3.5/5000) = 0.026. Trimming the last
    # span of each document (-0.1) and touching spans (+0.1) shift it by less than 0.15.
    assert abs(stats["mean_span_length"] - 3.5) < 0.25
    assert abs(stats["missing_fraction"] - 0.03) < 0.003  # overlaps only lose a little
    assert stats["order_changed"] == 0.0


@pytest.mark.parametrize("mask_length", ["subword", "word"])
def test_replace_length_modes_on_single_token_spans(mask_length: str) -> None:
    gen = np.random.default_rng(4)
    base = NoiseSpec(mask=0.4, mask_random=0.0, mask_length=mask_length)
    for i in range(100):
        tokens, _ = _doc(gen, 3)
        n_words = int((tokens > MASK).sum())
        n = math.ceil(n_words * 0.4)
        outs = {r: add_whole_word_mask(tokens, sample_rng(6, 0, i),
                                       replace(base, replace_length=r), TOKEN_VOCAB)
                for r in (-1, 0, 1)}
        covered = outs[-1] == MASK
        assert len(outs[-1]) == len(tokens) and covered.sum() == n
        np.testing.assert_array_equal(outs[-1][~covered], tokens[~covered])
        np.testing.assert_array_equal(outs[0], tokens[~covered])  # spans deleted
        np.testing.assert_array_equal(outs[1], outs[-1])  # one token per span either way


def _collapse_masks(x: np.ndarray) -> np.ndarray:
    is_mask = x == MASK
    return x[~(is_mask & np.concatenate(([False], is_mask[:-1])))]


def test_replace_length_modes_on_spans() -> None:
    gen = np.random.default_rng(5)
    # lambda 8: zero-length spans (insertions) are rare, and skipped below.
    base = NoiseSpec(mask=0.3, mask_random=0.0, poisson_lambda=8.0)
    checked = shrunk = 0
    for i in range(200):
        tokens, _ = _doc(gen, 5)
        outs = {r: add_whole_word_mask(tokens, sample_rng(7, 0, i),
                                       replace(base, replace_length=r), WORD_VOCAB)
                for r in (-1, 0, 1)}
        if len(outs[-1]) != len(tokens):
            continue
        checked += 1
        covered = outs[-1] == MASK
        np.testing.assert_array_equal(outs[-1][~covered], tokens[~covered])  # -1 keeps length
        np.testing.assert_array_equal(outs[0], tokens[~covered])  # 0 deletes the spans
        # 1: each span is one <mask>; spans that touch leave adjacent masks, so compare runs
        np.testing.assert_array_equal(_collapse_masks(outs[1]), _collapse_masks(outs[-1]))
        # the uncovered tokens plus one <mask> per span that no other span swallowed
        assert len(outs[1]) == len(tokens) - covered.sum() + (outs[1] == MASK).sum()
        shrunk += len(outs[1]) < len(tokens)
    assert checked > 180 and shrunk > 0.9 * checked


def test_mask_random_fraction_and_replacements_are_ordinary() -> None:
    gen = np.random.default_rng(6)
    spec = NoiseSpec(mask=0.3, mask_random=0.1, mask_length="word", replace_length=1)
    n_random = n_masked = 0
    for i in range(600):
        tokens, _ = _doc(gen, 5)
        out = add_whole_word_mask(tokens, sample_rng(8, 0, i), spec, TOKEN_VOCAB)
        changed = out != tokens
        n_masked += math.ceil((len(tokens) - 2) * 0.3)
        n_random += int((changed & (out != MASK)).sum())
        assert not np.isin(out[changed & (out != MASK)], SPECIALS).any()
    # binomial(n_masked ~ 6000, 0.1): 4 sd ~ 0.016; a random draw equal to the original
    # (1/995) is not counted, a negligible loss.
    sd = math.sqrt(0.1 * 0.9 / n_masked)
    assert abs(n_random / n_masked - 0.1) < 4 * sd


def test_zero_length_spans_insert_masks() -> None:
    gen = np.random.default_rng(7)
    # lambda 0.5: most spans have length 0 and each inserts one <mask>.
    spec = NoiseSpec(mask=0.3, mask_random=0.0, replace_length=-1, poisson_lambda=0.5)
    grew = 0
    for i in range(200):
        tokens, _ = _doc(gen, 4)
        out = add_whole_word_mask(tokens, sample_rng(9, 0, i), spec, TOKEN_VOCAB)
        assert len(out) >= len(tokens)
        grew += len(out) > len(tokens)
        # removing every <mask> leaves the untouched tokens in order
        kept = out[out != MASK]
        assert np.isin(kept, tokens).all() and len(kept) + (out == MASK).sum() == len(out)
        assert (out == MASK).sum() - (len(out) - len(tokens)) <= math.ceil(
            (len(tokens) - 2) * 0.3)
    assert grew > 190
    # A budget of one word: zero-length draws before the first non-zero one become extra
    # masks; the non-zero one, trimmed to a single word, masks the only token.
    tiny = np.array([BOS, 10, EOS])
    outs = [add_whole_word_mask(tiny, sample_rng(0, 0, i), spec, TOKEN_VOCAB)
            for i in range(50)]
    assert all(o[0] == BOS and o[-1] == EOS and (o[1:-1] == MASK).all() for o in outs)
    assert {len(o) for o in outs} > {3}


def _sentences(out: np.ndarray) -> list[int]:
    """Sentence ids of a document whose sentence s consists of the token 100 + s only."""
    body = out[1:-1]
    starts = np.concatenate(([True], body[1:] != body[:-1]))
    return (body[starts] - 100).tolist()


def _labelled_doc(lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    body = np.repeat(100 + np.arange(len(lengths)), lengths)
    return np.concatenate(([BOS], body, [EOS])), 1 + np.cumsum(lengths)


def test_permute_sentences_shuffles_whole_sentences() -> None:
    gen = np.random.default_rng(8)
    changed = 0
    for i in range(300):
        lengths = gen.integers(1, 6, int(gen.integers(3, 7))).tolist()
        tokens, ends = _labelled_doc(lengths)
        out = permute_sentences(tokens, ends, sample_rng(10, 0, i), 1.0)
        order = _sentences(out)
        assert sorted(order) == list(range(len(lengths)))
        np.testing.assert_array_equal(np.sort(out), np.sort(tokens))
        assert out[0] == BOS and out[-1] == EOS
        # each sentence arrives whole
        assert [int((out == 100 + s).sum()) for s in order] == [lengths[s] for s in order]
        changed += order != list(range(len(lengths)))
    # the identity order has probability 1/M! <= 1/6 for M >= 3
    assert changed > 0.75 * 300
    tokens, ends = _labelled_doc([2, 3, 1, 4])
    np.testing.assert_array_equal(permute_sentences(tokens, ends, sample_rng(0, 0, 0), 0.0),
                                  tokens)
    # p=0.5 moves ceil(4 * 0.5) = 2 sentences: at most two leave their slot
    for i in range(50):
        order = _sentences(permute_sentences(tokens, ends, sample_rng(1, 0, i), 0.5))
        assert sum(o != s for s, o in enumerate(order)) in (0, 2)
    # every order of three sentences is equally likely: binomial(3000, 1/6), 4 sd = 82
    tokens, ends = _labelled_doc([1, 2, 3])
    orders = [tuple(_sentences(permute_sentences(tokens, ends, sample_rng(2, 0, i), 1.0)))
              for i in range(3000)]
    counts = {o: orders.count(o) for o in set(orders)}
    assert len(counts) == 6 and all(abs(c - 500) < 82 for c in counts.values())
    single, single_ends = _labelled_doc([5])
    np.testing.assert_array_equal(
        permute_sentences(single, single_ends, sample_rng(0, 0, 0), 1.0), single)


def test_noise_without_permutation_keeps_sentence_order() -> None:
    gen = np.random.default_rng(9)
    for i in range(50):
        tokens, ends = _doc(gen, 5)
        np.testing.assert_array_equal(noise(tokens, ends, sample_rng(0, 0, i), NO_NOISE,
                                            TOKEN_VOCAB), tokens)
    pairs = [(t, noise(t, e, sample_rng(1, 0, i), replace(DEFAULT_NOISE, permute_sentences=0.0),
                       TOKEN_VOCAB))
             for i, (t, e) in enumerate(_doc(gen, 5, 8, 20) for _ in range(100))]
    assert noise_statistics(pairs, TOKEN_VOCAB)["order_changed"] == 0.0


def test_rotation_keeps_tokens_and_ends() -> None:
    gen = np.random.default_rng(10)
    spec = replace(NO_NOISE, rotate=1.0)
    offsets = []
    for i in range(300):
        tokens, ends = _doc(gen, 3)
        out = noise(tokens, ends, sample_rng(11, 0, i), spec, TOKEN_VOCAB)
        assert out[0] == BOS and out[-1] == EOS
        np.testing.assert_array_equal(np.sort(out), np.sort(tokens))
        body = tokens[1:-1]
        shifts = [k for k in range(len(body)) if np.array_equal(np.roll(body, -k), out[1:-1])]
        assert shifts
        offsets.append(shifts[0] / len(body))
    # the new first token is uniform over the content
    assert 0.4 < np.mean(offsets) < 0.6 and np.mean(np.array(offsets) == 0) < 0.2
    # the new first content token is uniform: binomial(4000, 1/4), 4 sd = 110
    four = np.array([BOS, 10, 11, 12, 13, EOS])
    firsts = np.array([add_rolling_buffer(four, sample_rng(1, 0, i))[1] for i in range(4000)])
    assert all(abs((firsts == t).sum() - 1000) < 110 for t in (10, 11, 12, 13))
    short = np.array([BOS, EOS])
    np.testing.assert_array_equal(add_rolling_buffer(short, sample_rng(0, 0, 0)), short)
    np.testing.assert_array_equal(noise(short, np.array([], dtype=np.int64), sample_rng(0, 0, 0),
                                        DEFAULT_NOISE, TOKEN_VOCAB), short)
    # rotate=0.5 rotates about half the documents
    tokens, ends = _doc(gen, 5, 10, 11)
    rotated = sum(not np.array_equal(noise(tokens, ends, sample_rng(12, 0, i),
                                           replace(NO_NOISE, rotate=0.5), TOKEN_VOCAB), tokens)
                  for i in range(400))
    # binomial(400, 0.5 * 49/50): 4 sd = 40
    assert abs(rotated - 400 * 0.5 * 49 / 50) < 40


def test_insertion_count_and_kinds() -> None:
    gen = np.random.default_rng(11)
    for i in range(200):
        tokens, _ = _doc(gen, 3)
        p = float(gen.choice([0.05, 0.1, 0.37]))
        out = add_insertion_noise(tokens, sample_rng(13, 0, i), p, TOKEN_VOCAB, 0.0)
        n = math.ceil(len(tokens) * p)
        assert len(out) == len(tokens) + n and (out == MASK).sum() == n
        np.testing.assert_array_equal(out[out != MASK], tokens)
        assert out[0] == BOS and out[-1] == EOS
        mixed = add_insertion_noise(tokens, sample_rng(13, 0, i), p, TOKEN_VOCAB, 0.5)
        assert len(mixed) == len(out)
        assert (mixed == MASK).sum() == n - math.ceil(n * 0.5)
        assert not np.isin(mixed[1:-1], [BOS, PAD, EOS, UNK]).any()
    np.testing.assert_array_equal(add_insertion_noise(tokens, sample_rng(0, 0, 0), 0.0,
                                                      TOKEN_VOCAB, 0.1), tokens)


def test_deletion_count_and_specials_stay() -> None:
    gen = np.random.default_rng(12)
    for i in range(200):
        tokens, _ = _doc(gen, 4, unk=0.1)
        tokens[gen.random(len(tokens)) < 0.1] = MASK
        tokens[0], tokens[-1] = BOS, EOS
        ordinary = ~np.isin(tokens, SPECIALS)
        out = delete_tokens(tokens, sample_rng(14, 0, i), 0.2, TOKEN_VOCAB)
        assert len(tokens) - len(out) == math.ceil(ordinary.sum() * 0.2)
        # specials all survive, in order, and what remains is a subsequence of the original
        np.testing.assert_array_equal(out[np.isin(out, SPECIALS)], tokens[~ordinary])
        j = 0
        for t in out:
            while tokens[j] != t:
                j += 1
            j += 1
    tokens, _ = _doc(gen, 3)
    assert len(delete_tokens(tokens, sample_rng(0, 0, 0), 1.0, TOKEN_VOCAB)) == 2


def test_specials_are_never_masked_deleted_or_drawn() -> None:
    gen = np.random.default_rng(13)
    spec = NoiseSpec(mask=0.6, mask_random=0.5, insert=0.3, rotate=0.5, delete=0.3,
                     permute_sentences=1.0, replace_length=-1)
    for i in range(200):
        tokens, ends = _doc(gen, 4, unk=0.1)
        out = noise(tokens, ends, sample_rng(15, 0, i), spec, WORD_VOCAB)
        assert out[0] == BOS and out[-1] == EOS
        assert not np.isin(out[1:-1], [BOS, EOS, PAD]).any()
        assert (out == UNK).sum() == (tokens == UNK).sum()
        assert (out == MASK).any()


def test_determinism_and_independence_across_indices() -> None:
    gen = np.random.default_rng(14)
    tokens, ends = _doc(gen, 8, 10, 20)
    spec = replace(DEFAULT_NOISE, insert=0.05, rotate=0.3, delete=0.05)
    outs = [noise(tokens, ends, sample_rng(3, 1, i), spec, WORD_VOCAB) for i in range(20)]
    again = [noise(tokens, ends, sample_rng(3, 1, i), spec, WORD_VOCAB) for i in range(20)]
    for a, b in zip(outs, again):
        np.testing.assert_array_equal(a, b)
    assert len({o.tobytes() for o in outs}) == 20
    other_epoch = noise(tokens, ends, sample_rng(3, 2, 0), spec, WORD_VOCAB)
    assert not np.array_equal(other_epoch, outs[0])


def test_inputs_are_never_modified() -> None:
    gen = np.random.default_rng(15)
    spec = NoiseSpec(mask=0.5, mask_random=0.5, insert=0.1, rotate=1.0, delete=0.1)
    for replace_length in (-1, 0, 1):
        tokens, ends = _doc(gen, 5)
        before = tokens.copy(), ends.copy()
        tokens.flags.writeable = False  # any in-place write raises
        ends.flags.writeable = False
        out = noise(tokens, ends, sample_rng(0, 0, 0), replace(spec,
                                                                  replace_length=replace_length),
                    WORD_VOCAB)
        out[:] = 0  # the result is the caller's own array
        np.testing.assert_array_equal(tokens, before[0])
        np.testing.assert_array_equal(ends, before[1])
    # nothing to do still returns a fresh array
    tokens, ends = _doc(gen, 2)
    out = noise(tokens, ends, sample_rng(0, 0, 0), NO_NOISE, TOKEN_VOCAB)
    assert out is not tokens and not np.shares_memory(out, tokens)
    # narrow integer dtypes (shards store uint16/int32) are accepted
    out16 = noise(tokens.astype(np.uint16), ends, sample_rng(0, 0, 1), DEFAULT_NOISE,
                  TOKEN_VOCAB)
    np.testing.assert_array_equal(out16, noise(tokens, ends, sample_rng(0, 0, 1),
                                               DEFAULT_NOISE, TOKEN_VOCAB))
    assert out16.dtype == np.int64


def test_same_result_after_pickling_and_in_a_spawned_process() -> None:
    gen = np.random.default_rng(16)
    tokens, ends = _doc(gen, 6, 5, 15)
    spec = replace(DEFAULT_NOISE, rotate=0.5, insert=0.05)
    here = noise(tokens, ends, sample_rng(9, 4, 77), spec, WORD_VOCAB)
    rng = pickle.loads(pickle.dumps(sample_rng(9, 4, 77)))
    np.testing.assert_array_equal(
        noise(tokens, ends, rng, pickle.loads(pickle.dumps(spec)),
              pickle.loads(pickle.dumps(WORD_VOCAB))), here)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        there = pool.apply(noise, (tokens, ends, sample_rng(9, 4, 77), spec, WORD_VOCAB))
    np.testing.assert_array_equal(there, here)


def test_default_recipe_statistics() -> None:
    gen = np.random.default_rng(17)
    pairs = []
    for i in range(300):
        tokens, ends = _doc(gen, 6, 10, 30)
        pairs.append((tokens, noise(tokens, ends, sample_rng(1, 0, i), DEFAULT_NOISE,
                                    TOKEN_VOCAB)))
    stats = noise_statistics(pairs, TOKEN_VOCAB)
    assert stats["samples"] == 300
    # 30% of tokens lie in spans, and each span of ~3.5 becomes one token: the source is about
    # 1 - 0.3 + 0.3 / 3.5 = 0.79 of the original (overlaps shorten spans a little).
    assert 0.74 < stats["length_ratio"] < 0.84
    assert 0.22 < stats["missing_fraction"] < 0.31
    assert 0.07 < stats["mask_fraction"] < 0.11
    # 3.5 / (1 - mask_random) = 3.9 as randomized spans leave no <mask>; touching spans
    # merge into one run and raise it further.
    assert 3.6 < stats["mean_span_length"] < 4.8
    assert stats["order_changed"] > 0.95  # six sentences: 1/720 stay in order


def test_noise_statistics_by_hand() -> None:
    original = np.array([BOS, 10, 11, 12, 13, 14, 15, EOS])
    masked = np.array([BOS, 10, MASK, 13, 14, 15, EOS])  # one span of 2
    rotated = np.array([BOS, 13, 14, 15, 10, 11, 12, EOS])
    stats = noise_statistics([(original, masked), (original, rotated)], TOKEN_VOCAB)
    assert stats == {
        "samples": 2.0,
        "length_ratio": pytest.approx((7 / 8 + 1) / 2),
        "mask_fraction": pytest.approx(1 / 11),
        "missing_fraction": pytest.approx(2 / 12),
        "mean_span_length": 2.0,
        "order_changed": 0.5,
    }
    assert noise_statistics([(original, original)], TOKEN_VOCAB)["mean_span_length"] == 0.0
    with pytest.raises(ValueError, match="pairs is empty"):
        noise_statistics([], TOKEN_VOCAB)
    with pytest.raises(ValueError, match="bos_id"):
        noise_statistics([(original, masked[1:])], TOKEN_VOCAB)
    big = NoiseVocab(MASK, BOS, EOS, 1 << 22, SPECIALS)
    with pytest.raises(ValueError, match="vocab_size"):
        noise_statistics([(original, masked)], big)


@pytest.mark.parametrize("change, field", [
    ({"mask": 1.5}, "mask"),
    ({"mask": -0.1}, "mask"),
    ({"mask_random": float("nan")}, "mask_random"),
    ({"insert": "0.1"}, "insert"),
    ({"rotate": 2}, "rotate"),
    ({"permute_sentences": -1.0}, "permute_sentences"),
    ({"delete": True}, "delete"),
    ({"replace_length": 2}, "replace_length"),
    ({"replace_length": True}, "replace_length"),
    ({"mask_length": "span"}, "mask_length"),
    ({"poisson_lambda": 0.0}, "poisson_lambda"),
    ({"poisson_lambda": float("inf")}, "poisson_lambda"),
])
def test_check_noise_spec_names_the_field(change: dict, field: str) -> None:
    spec = replace(DEFAULT_NOISE, **change)
    with pytest.raises(ValueError, match=f"NoiseSpec.{field}="):
        check_noise_spec(spec)
    tokens, ends = _doc(np.random.default_rng(0), 2)
    with pytest.raises(ValueError, match=field):
        noise(tokens, ends, sample_rng(0, 0, 0), spec, TOKEN_VOCAB)


def test_valid_specs_pass() -> None:
    check_noise_spec(DEFAULT_NOISE)
    check_noise_spec(NoiseSpec(mask=1.0, mask_random=0.0, insert=1.0, rotate=1.0,
                               permute_sentences=0.0, replace_length=-1, mask_length="subword",
                               delete=1.0))
    check_noise_spec(NoiseSpec(mask_length="word", poisson_lambda=0.0))  # lambda unused
    assert DEFAULT_NOISE == NoiseSpec(mask=0.3, mask_random=0.1, poisson_lambda=3.5,
                                      permute_sentences=1.0, replace_length=1)


def test_bad_documents_and_vocabularies() -> None:
    tokens, ends = _doc(np.random.default_rng(0), 3)
    rng = sample_rng(0, 0, 0)
    with pytest.raises(ValueError, match="start with bos_id"):
        noise(tokens[1:], ends - 1, rng, DEFAULT_NOISE, TOKEN_VOCAB)
    with pytest.raises(ValueError, match="outside"):
        bad = tokens.copy()
        bad[1] = V
        noise(bad, ends, rng, DEFAULT_NOISE, TOKEN_VOCAB)
    with pytest.raises(ValueError, match="1-D integer"):
        noise(tokens.astype(float), ends, rng, DEFAULT_NOISE, TOKEN_VOCAB)
    with pytest.raises(ValueError, match="at least <s> </s>"):
        noise(np.array([BOS]), np.array([], dtype=np.int64), rng, DEFAULT_NOISE, TOKEN_VOCAB)
    with pytest.raises(ValueError, match="sentence_ends must be non-decreasing"):
        noise(tokens, ends[::-1], rng, DEFAULT_NOISE, TOKEN_VOCAB)
    with pytest.raises(ValueError, match="sentence_ends must be non-decreasing"):
        noise(tokens, ends[:-1], rng, DEFAULT_NOISE, TOKEN_VOCAB)
    with pytest.raises(ValueError, match="sentence_ends is empty"):
        noise(tokens, np.array([], dtype=np.int64), rng, DEFAULT_NOISE, TOKEN_VOCAB)
    with pytest.raises(ValueError, match="sentence_ends must be a 1-D integer"):
        permute_sentences(tokens, ends.astype(float), rng, 1.0)
    with pytest.raises(ValueError, match="p=1.5"):
        delete_tokens(tokens, rng, 1.5, TOKEN_VOCAB)
    with pytest.raises(ValueError, match="mask_random"):
        add_insertion_noise(tokens, rng, 0.1, TOKEN_VOCAB, -0.5)
    with pytest.raises(ValueError, match="is_word_start has shape"):
        NoiseVocab(MASK, BOS, EOS, V, SPECIALS, np.ones(V - 1, dtype=bool))
    with pytest.raises(ValueError, match="mask_id=1000"):
        NoiseVocab(V, BOS, EOS, V, SPECIALS)
    with pytest.raises(ValueError, match="special_ids must lie"):
        NoiseVocab(MASK, BOS, EOS, V, np.array([V + 5]))
    with pytest.raises(ValueError, match="no ordinary token"):
        NoiseVocab(MASK, BOS, EOS, 5, SPECIALS)
    # bos, eos and mask are special even when the caller leaves them out
    vocab = NoiseVocab(MASK, BOS, EOS, V, np.array([UNK, PAD]))
    np.testing.assert_array_equal(vocab.special_ids, SPECIALS)
