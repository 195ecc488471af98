"""distinct_batches: no batch holds a text twice where that can be done, the same samples come
out, the result is a function of the rng, the impossible case is spread evenly and reported;
and the loader's ``arrange_batches`` hook, resumed from a state_dict, replays the same stream."""

from __future__ import annotations

import itertools
import logging
from collections import Counter

import numpy as np
import pytest
import torch

from bertforge.data.distinct import distinct_batches, duplicate_batches, text_ids
from bertforge.data.loader import PretrainingLoader


def naive_duplicates(batches: np.ndarray, ids: np.ndarray) -> int:
    """Reference: batches in which two different samples share a text (sets, no numpy)."""
    bad = 0
    for batch in batches.tolist():
        seen: set[int] = set()
        clash = False
        for s in batch:
            own = set(ids[s].tolist())
            clash |= bool(seen & own)
            seen |= own
        bad += clash
    return bad


def triplet_ids(n: int, seed: int, queries: int, negatives: int) -> np.ndarray:
    """(n, 3) ids of (query, positive, negative) rows: queries repeat with their positive,
    negatives are drawn from a small pool, so random batches collide often."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, queries, n)
    return np.stack([q, q + queries, 2 * queries + rng.integers(0, negatives, n)], axis=1)


def test_text_ids_intern_across_columns() -> None:
    ids = text_ids([("a", "b", "c"), ("b", "a", "d"), ("c", "c", "e")])
    assert ids.dtype == np.int64 and ids.shape == (3, 3)
    assert ids[0, 0] == ids[1, 1] and ids[0, 1] == ids[1, 0] and ids[0, 2] == ids[2, 0]
    assert len(np.unique(ids)) == 5
    with pytest.raises(ValueError, match="rows of equal length"):
        text_ids([("a", "b"), ("c",)])


def test_no_duplicates_and_same_samples() -> None:
    ids = triplet_ids(4096, seed=0, queries=1500, negatives=300)
    batches = np.random.default_rng(1).permutation(4096).reshape(128, 32)
    assert naive_duplicates(batches, ids) > 100  # the input is far from distinct
    out = distinct_batches(batches, ids, np.random.default_rng(2))
    assert out.shape == batches.shape and out.dtype == np.int64
    assert naive_duplicates(out, ids) == 0 == duplicate_batches(out, ids)
    assert np.array_equal(np.sort(out, axis=None), np.sort(batches, axis=None))


def test_repeated_samples_are_kept_and_spread() -> None:
    """drop_last=False repeats a few samples in an epoch: they stay, in different batches."""
    ids = triplet_ids(300, seed=3, queries=250, negatives=10_000)
    batches = np.resize(np.arange(300), 320).reshape(10, 32)
    out = distinct_batches(batches, ids, np.random.default_rng(0))
    assert Counter(out.ravel().tolist()) == Counter(batches.ravel().tolist())
    assert naive_duplicates(out, ids) == 0


def test_own_repeats_do_not_count() -> None:
    """A sample whose anchor equals its positive cannot be helped; it is no duplicate."""
    ids = np.array([[0, 0], [1, 2], [3, 3], [4, 5]])
    assert duplicate_batches(np.array([[0, 1, 2, 3]]), ids) == 0
    assert duplicate_batches(np.array([[0, 2], [2, 3]]), np.array([[0, 0], [1, 1], [0, 7],
                                                                   [8, 9]])) == 1


def test_deterministic_given_the_generator() -> None:
    ids = triplet_ids(2048, seed=5, queries=800, negatives=200)
    batches = np.arange(2048).reshape(64, 32)
    a = distinct_batches(batches, ids, np.random.default_rng(7))
    b = distinct_batches(batches, ids, np.random.default_rng(7))
    c = distinct_batches(batches, ids, np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # The input order fixes only the multiset.
    shuffled = np.random.default_rng(0).permutation(batches.ravel()).reshape(64, 32)
    assert np.array_equal(distinct_batches(shuffled, ids, np.random.default_rng(7)), a)


def test_impossible_case_is_spread_evenly_and_reported(caplog: pytest.LogCaptureFixture) -> None:
    """40 rows share one positive, 64 rows in batches of 32: 20 copies per batch at best."""
    ids = np.stack([np.arange(64), np.where(np.arange(64) < 40, 1000, 2000 + np.arange(64))], 1)
    batches = np.arange(64).reshape(2, 32)
    with caplog.at_level(logging.WARNING, logger="bertforge.data.distinct"):
        out = distinct_batches(batches, ids, np.random.default_rng(0))
    shared = [(ids[row][:, 1] == 1000).sum() for row in out]
    assert shared == [20, 20]
    assert [r.getMessage().split(" batches")[0] for r in caplog.records] == ["2 of 2"]

    # One batch fewer than the shared text's rows: all but one batch can be kept clean.
    ids = np.stack([np.arange(96), np.where(np.arange(96) < 4, 1000, 2000 + np.arange(96))], 1)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertforge.data.distinct"):
        out = distinct_batches(np.arange(96).reshape(3, 32), ids, np.random.default_rng(1))
    assert sorted((ids[row][:, 1] == 1000).sum() for row in out) == [1, 1, 2]
    assert caplog.records[0].getMessage().startswith("1 of 3 batches hold a text twice")


def test_agrees_with_sentence_transformers_sampler() -> None:
    """sentence-transformers' NoDuplicatesBatchSampler batches have no duplicate by our count
    either, and our arrangement of the same data passes its test (sets of texts)."""
    datasets = pytest.importorskip("datasets")
    try:
        from sentence_transformers.base.sampler import NoDuplicatesBatchSampler
    except ImportError:
        from sentence_transformers.sampler import NoDuplicatesBatchSampler
    ids = triplet_ids(512, seed=9, queries=200, negatives=60)
    texts = [tuple(f"text {i}" for i in row) for row in ids.tolist()]
    data = datasets.Dataset.from_dict({"anchor": [t[0] for t in texts],
                                       "positive": [t[1] for t in texts],
                                       "negative": [t[2] for t in texts]})
    sampler = NoDuplicatesBatchSampler(data, batch_size=16, drop_last=True, seed=0)
    theirs = np.array([b for b in sampler if len(b) == 16])
    interned = text_ids(texts)
    assert duplicate_batches(theirs, interned) == 0
    ours = distinct_batches(np.arange(512).reshape(32, 16), interned, np.random.default_rng(0))
    for batch in ours.tolist():
        values = [t for s in batch for t in set(texts[s])]
        assert len(values) == len(set(values))


def test_a_hundred_thousand_samples() -> None:
    """Sanity at size (no timing asserted; benchmarks time things): heavy-tailed negatives."""
    rng = np.random.default_rng(0)
    n = 100_000
    q = rng.integers(0, n // 8, n)
    neg = np.minimum(rng.zipf(2.0, n), 1000) * 100 + rng.integers(0, 100, n) + 2 * n
    ids = np.stack([q, q + n, neg], axis=1)
    batches = rng.permutation(n)[: n // 64 * 64].reshape(-1, 64)
    assert duplicate_batches(batches, ids) > 100
    out = distinct_batches(batches, ids, np.random.default_rng(1))
    assert duplicate_batches(out, ids) == 0
    assert np.array_equal(np.sort(out, axis=None), np.sort(batches, axis=None))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="must both be 2-D"):
        distinct_batches(np.arange(4), np.zeros((4, 2)), np.random.default_rng(0))
    with pytest.raises(ValueError, match="must index rows of text_ids"):
        distinct_batches(np.array([[0, 9]]), np.zeros((4, 2)), np.random.default_rng(0))


# --- the loader hook ------------------------------------------------------------------------

class TextPairs:
    """A tiny text dataset that arranges its batches with distinct_batches."""

    def __init__(self, n: int, *, arrange: bool = True) -> None:
        self.ids = triplet_ids(n, seed=11, queries=n // 2, negatives=n)
        self.lengths = np.full(n, 8)
        self.calls: list[int] = []
        if not arrange:
            self.arrange_batches = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self.ids)

    def arrange_batches(self, batches: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        self.calls.append(len(batches))
        return distinct_batches(batches, self.ids, rng)


class Indices:
    """make_batch: a micro-batch is just its sample indices."""

    def __getitem__(self, key: tuple[int, np.ndarray]) -> dict[str, torch.Tensor]:
        return {"index": torch.from_numpy(np.asarray(key[1]).copy())}


def loader(ds: TextPairs, **kw) -> PretrainingLoader:
    base = {"global_batch_size": 16, "micro_batch_size": 4, "seed": 5, "make_batch": Indices()}
    return PretrainingLoader(ds, **{**base, **kw})


def stream(it, n: int) -> list[list[int]]:
    return [b["index"].tolist() for b in itertools.islice(it, n)]


def test_loader_hook_arranges_every_epoch_and_resumes_exactly() -> None:
    ds = TextPairs(160)
    plain = loader(TextPairs(160, arrange=False))
    first = loader(ds)
    assert np.bincount(ds.ids[:, 0]).max() <= first.batches_per_epoch  # can be kept apart
    assert naive_duplicates(plain.epoch_batches(0), ds.ids) > 0
    for epoch in (0, 1, 2):
        arranged = first.epoch_batches(epoch)
        assert naive_duplicates(arranged, ds.ids) == 0
        assert np.array_equal(np.sort(arranged, axis=None),
                              np.sort(plain.epoch_batches(epoch), axis=None))
    assert not np.array_equal(first.epoch_batches(0), first.epoch_batches(1))

    whole = stream(iter(loader(TextPairs(160))), 4 * 10 * 3)  # 10 global batches an epoch
    it = iter(first := loader(TextPairs(160)))
    head = stream(it, 4 * 13)
    state = first.state_dict()
    resumed = loader(TextPairs(160), seed=99)
    resumed.load_state_dict(state)
    assert head + stream(iter(resumed), 4 * 17) == whole
    # Another rank layout sees the same global batches.
    two = [loader(TextPairs(160), micro_batch_size=2, rank=r, world_size=2) for r in (0, 1)]
    assert np.array_equal(two[0].epoch_batches(1), two[1].epoch_batches(1))
    assert np.array_equal(two[0].epoch_batches(1), first.epoch_batches(1))


def test_loader_refuses_an_arrangement_that_changes_the_samples() -> None:
    ds = TextPairs(64)
    ds.arrange_batches = lambda b, rng: np.zeros_like(b)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="not a rearrangement"):
        loader(ds).epoch_batches(0)
