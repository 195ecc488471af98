"""Batches in which no text appears twice, for losses that use the rest of a batch as negatives.

With in-batch negatives (MultipleNegativesRankingLoss and its kin) every other positive in the
batch is taken as a wrong answer for an anchor. If a batch holds two rows with the same positive
(or an anchor equal to another row's negative) the loss pushes a text away from itself. So the
samples of an epoch are rearranged, as sentence-transformers' NoDuplicatesBatchSampler promises,
such that no batch holds the same text id twice where that is possible at all.

How: every sample is filed under its most frequent text (over the epoch), the files are put in
random order, and the samples dealt round-robin to the batches (in a random batch order). The
samples of one file are then consecutive in the deal, so up to n of them (n = batches) land in n
different batches, and a text shared by c > n samples is spread evenly, ceil(c / n) at most per
batch, the least bad place for the copies that cannot be kept apart. Collisions of the samples'
other texts are then repaired by swapping samples between batches, accepting a swap only when it
lowers the two batches' excess of repeated texts. Everything is numpy except the repair, a
Python loop over the few samples still in conflict. The input order only fixes the multiset of
samples: the result depends on (the multiset, ``rng``) alone.
"""

from __future__ import annotations

import logging
from collections import Counter, deque

import numpy as np

log = logging.getLogger(__name__)

_TRIES = 32  # swap partners tried per conflicting sample before it stays where it is


def text_ids(texts: list[tuple[str, ...]]) -> np.ndarray:
    """(N, m) int64 ids, one per text of each row; equal texts (in any column) share an id."""
    m = len(texts[0]) if texts else 0
    if any(len(row) != m for row in texts):
        raise ValueError("text_ids needs rows of equal length (one text per column)")
    interned: dict[str, int] = {}
    flat = np.fromiter((interned.setdefault(t, len(interned)) for row in texts for t in row),
                       dtype=np.int64, count=len(texts) * m)
    return flat.reshape(len(texts), m)


def _own_ids(text_ids: np.ndarray) -> np.ndarray:
    """(N, m) ids with a text a sample holds twice (anchor == positive) made unique: such a
    repeat is the sample's own and no arrangement can remove it, so it must not count."""
    ids = np.sort(np.asarray(text_ids, dtype=np.int64), axis=1)
    repeat = np.zeros(ids.shape, dtype=bool)
    repeat[:, 1:] = ids[:, 1:] == ids[:, :-1]
    ids[repeat] = -1 - np.flatnonzero(repeat)  # negative ids no real text has
    return ids


def duplicate_batches(batches: np.ndarray, text_ids: np.ndarray) -> int:
    """How many of the (n, G) batches hold one text id in two different samples."""
    return int(_has_duplicate(np.asarray(batches), _own_ids(text_ids)).sum())


def _has_duplicate(batches: np.ndarray, own_ids: np.ndarray) -> np.ndarray:
    """(n,) bool: batch holds a repeated id. Sorting each batch's (G * m) ids puts repeats side
    by side."""
    per_batch = np.sort(own_ids[batches].reshape(len(batches), -1), axis=1)  # (n, G * m)
    return (per_batch[:, 1:] == per_batch[:, :-1]).any(axis=1)


def distinct_batches(batches: np.ndarray, text_ids: np.ndarray,
                     rng: np.random.Generator) -> np.ndarray:
    """The samples of ``batches`` ((n, G) int64 sample indices) rearranged into n batches of G
    in which no text id of ``text_ids`` ((N, m) int64, ``text_ids(texts)``) appears in two
    samples, wherever that can be done; deterministic given ``rng``. Batches that must keep a
    duplicate (a text shared by more samples than there are batches, say) are counted in one
    logged warning per call."""
    batches = np.asarray(batches, dtype=np.int64)
    if batches.ndim != 2 or np.ndim(text_ids) != 2:
        raise ValueError(f"batches {batches.shape} and text_ids {np.shape(text_ids)} must both "
                         "be 2-D: (n, G) sample indices and (N, m) text ids")
    n, g = batches.shape
    if batches.size == 0 or np.shape(text_ids)[1] == 0:
        return batches.copy()
    if batches.min() < 0 or batches.max() >= len(text_ids) or np.min(text_ids) < 0:
        raise ValueError("batches must index rows of text_ids, and text ids must be >= 0")
    own = _own_ids(text_ids)
    samples = np.sort(batches, axis=None)  # the input order must not matter, only the samples
    # Every id of the epoch once, how often it occurs, and each sample's ids as indices into it.
    values, inverse, counts = np.unique(own[samples], return_inverse=True, return_counts=True)
    out = _deal(samples, inverse.reshape(len(samples), -1), counts, n, rng)
    bad = np.flatnonzero(_has_duplicate(out, own))
    if len(bad) and n > 1:
        over = counts > n  # ids that some batch must hold more than once
        caps = dict(zip(values[over].tolist(), (-(-counts[over] // n)).tolist()))
        _repair(out, own, bad, caps, rng)
        bad = np.flatnonzero(_has_duplicate(out, own))
    if len(bad):
        log.warning("%d of %d batches hold a text twice: some texts are shared by too many "
                    "samples to be kept apart in %d batches of %d; there, a copy of a text is "
                    "among its own in-batch negatives", len(bad), n, n, g)
    return out


def _deal(samples: np.ndarray, inverse: np.ndarray, counts: np.ndarray, n: int,
          rng: np.random.Generator) -> np.ndarray:
    """(n, G): the T = n * G samples filed under their most frequent id (``inverse``: (T, m)
    indices into ``counts``), files in random order, dealt round-robin over the batches (a
    ceiling of ceil(c / n) copies per batch for an id in c > n samples, see the module notes)."""
    heaviest = np.argmax(counts[inverse], axis=1)  # (T,) column of the sample's commonest id
    key = inverse[np.arange(len(samples)), heaviest]
    file_rank = rng.permutation(len(counts))[key]
    order = np.lexsort((rng.random(len(samples)), file_rank))  # files in random order
    slot = np.arange(len(samples))
    out = np.empty((n, len(samples) // n), dtype=np.int64)
    out[rng.permutation(n)[slot % n], slot // n] = samples[order]
    return rng.permuted(out, axis=1)  # a file's place in the deal says nothing about position


def _excess_change(counts: Counter, leaving: list[int], coming: list[int],
                   caps: dict[int, int]) -> int:
    """Change of a batch's excess sum(max(0, count - cap)) when ids ``leaving`` go and
    ``coming`` arrive."""
    change = Counter(coming)
    change.subtract(leaving)
    delta = 0
    for x, k in change.items():
        if k:
            cap, now = caps.get(x, 1), counts[x]
            delta += max(0, now + k - cap) - max(0, now - cap)
    return delta


def _repair(out: np.ndarray, own: np.ndarray, bad: np.ndarray, caps: dict[int, int],
            rng: np.random.Generator) -> None:
    """Swap the conflicting samples of the ``bad`` batches with random partners in random
    batches, in place, whenever a swap lowers the two batches' summed excess. A partner batch
    left with a conflict of its own is queued too; the excess falls with every swap, so the
    loop ends."""
    n, g = out.shape
    members: dict[int, list[int]] = {}
    counters: dict[int, Counter] = {}

    def batch(b: int) -> tuple[list[int], Counter]:
        if b not in members:
            members[b] = out[b].tolist()
            counters[b] = Counter(x for s in members[b] for x in own[s].tolist())
        return members[b], counters[b]

    queue = deque(bad.tolist())
    while queue:
        a = queue.popleft()
        samples_a, counts_a = batch(a)
        swapped = False
        for pos in range(g):
            p_ids = own[samples_a[pos]].tolist()
            if all(counts_a[x] <= caps.get(x, 1) for x in p_ids):
                continue
            for b, q_pos in zip(rng.integers(0, n, _TRIES).tolist(),
                                rng.integers(0, g, _TRIES).tolist()):
                if b == a:
                    continue
                samples_b, counts_b = batch(b)
                q_ids = own[samples_b[q_pos]].tolist()
                if (_excess_change(counts_a, p_ids, q_ids, caps)
                        + _excess_change(counts_b, q_ids, p_ids, caps)) < 0:
                    samples_a[pos], samples_b[q_pos] = samples_b[q_pos], samples_a[pos]
                    counts_a.update(q_ids)
                    counts_a.subtract(p_ids)
                    counts_b.update(p_ids)
                    counts_b.subtract(q_ids)
                    if any(counts_b[x] > caps.get(x, 1) for x in p_ids):
                        queue.append(b)
                    swapped = True
                    break
        # A partner may have brought a conflict with a sample already passed: look again.
        if swapped and any(k > caps.get(x, 1) for x, k in counts_a.items()):
            queue.append(a)
    for b, samples in members.items():
        out[b] = samples


__all__ = ["distinct_batches", "duplicate_batches", "text_ids"]
