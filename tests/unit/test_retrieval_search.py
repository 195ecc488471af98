"""Exact search in blocks equals a brute-force full sort for any block size (ties included: equal
scores in corpus order), and hard-negative mining follows its rules: positives and the anchor
skipped, the rank range, the margin, rows dropped and counted."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.errors import RunError
from bertforge.retrieval.evaluate import evaluate_sts, rerank, retrieve
from bertforge.retrieval.mining import check_range, mine
from bertforge.retrieval.search import rankings, search


def _brute(queries: np.ndarray, corpus: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every document scored, sorted by (score descending, corpus position ascending)."""
    scores = queries.astype(np.float64) @ corpus.astype(np.float64).T  # (Q, N), exact here
    order = np.lexsort((np.broadcast_to(np.arange(len(corpus)), scores.shape), -scores))[:, :k]
    return np.take_along_axis(scores, order, 1), order


def _blocks(ids: list[str], corpus: np.ndarray, size: int):
    return ((ids[i:i + size], corpus[i:i + size]) for i in range(0, len(corpus), size))


@pytest.mark.parametrize("seed", range(6))
def test_block_search_equals_a_full_sort_for_any_block_size(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 90)), int(rng.integers(1, 40))
    # Small integer vectors: exact float32 dot products with many ties, and duplicate rows.
    corpus = rng.integers(-2, 3, (n, 6)).astype(np.float32)
    corpus[n // 2:n // 2 + 3] = corpus[0]
    queries = rng.integers(-2, 3, (int(rng.integers(1, 12)), 6)).astype(np.float32)
    ids = [f"doc{i}" for i in range(n)]
    want_scores, want = _brute(queries, corpus, k)
    for size in (1, 2, 5, k, k + 1, 64, 1000):
        scores, got = search(queries, _blocks(ids, corpus, size), k, device="cpu")
        assert got == [[ids[j] for j in row] for row in want.tolist()], size
        assert np.array_equal(scores, want_scores.astype(np.float32)), size
    # Random real vectors too (no ties): the same documents in the same order.
    corpus = rng.standard_normal((n, 16)).astype(np.float32)
    queries = rng.standard_normal((3, 16)).astype(np.float32)
    _, want = _brute(queries, corpus, k)
    _, got = search(queries, _blocks(ids, corpus, 7), k, device="cpu")
    assert got == [[ids[j] for j in row] for row in want.tolist()]


def test_search_checks_its_inputs() -> None:
    queries = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="3 dimensions.*embed both with one model|queries 3"):
        search(queries, [(["a"], np.ones((1, 4), dtype=np.float32))], 5)
    with pytest.raises(ValueError, match="a block of 2 ids has 1 vectors"):
        search(queries, [(["a", "b"], np.ones((1, 3), dtype=np.float32))], 5)
    with pytest.raises(RunError, match="not finite"):
        search(queries, [(["a"], np.full((1, 3), np.nan, dtype=np.float32))], 5)
    scores, ids = search(queries, [(["a"], np.ones((1, 3), dtype=np.float32))], 5)
    assert scores.shape == (2, 1) and ids == [["a"], ["a"]]
    run = rankings(["q1", "q2"], scores, ids)
    assert run == {"q1": {"a": 3.0}, "q2": {"a": 3.0}}


def _table_embed(table: dict[str, list[float]]):
    return lambda texts: np.array([table[t] for t in texts], dtype=np.float32)


def test_retrieve_rerank_and_sts_with_given_callables() -> None:
    table = {"q": [1, 0], "a": [0.9, 0.1], "b": [0.1, 0.9], "c": [-1, 0]}
    embed = _table_embed(table)
    run = retrieve(embed, embed, {"q1": "q"}, {"da": "a", "db": "b", "dc": "c"}, block_size=2,
                   top_k=2)
    assert list(run["q1"]) == ["da", "db"]  # cosine: a, then b; c is cut by top_k
    from bertforge.data.beir import BeirData

    data = BeirData(corpus={"da": "a", "db": "b", "dc": "c"}, queries={"q1": "q"},
                    qrels={"q1": {"db": 1}})
    reranked = rerank(lambda pairs: np.array([len(p) * (p == "b") for _, p in pairs]), data,
                      run, top=2)
    assert reranked == {"q1": {"da": 0.0, "db": 1.0}}
    sts = evaluate_sts(embed, [("q", "a"), ("q", "b"), ("q", "c")], [5.0, 2.0, 0.0])
    assert sts["spearman"] == pytest.approx(1.0) and sts["pearson"] > 0.9


# --- mining --------------------------------------------------------------------------------------

def _mine(anchor_vectors: dict, passages: dict, positives: dict, corpus: list[str], **kw):
    table = {**anchor_vectors, **passages}
    embed = _table_embed(table)
    anchors = list(positives)
    return mine(embed, embed, anchors, [positives[a] for a in anchors], corpus,
                similarity="dot", block_size=kw.pop("block_size", 3), **kw)


# One anchor "A" along axis x; passage p<i> scores 10 - i against it. Its positive is p3.
PASSAGES = {f"p{i}": [10.0 - i, 0.0] for i in range(10)}
ANCHORS = {"A": [1.0, 0.0], "B": [0.0, 1.0]}


def test_mining_skips_positives_and_takes_the_rank_range_in_order() -> None:
    rows, report = _mine(ANCHORS, PASSAGES, {"A": ["p3"]}, list(PASSAGES), range_min=1,
                         range_max=5, count=3)
    # Ranking without p3: p0 p1 p2 p4 p5 ...; ranks [1, 5) start at p1.
    assert rows == [{"anchor": "A", "positive": "p3", "negative_1": "p1",
                     "negative_2": "p2", "negative_3": "p4"}]
    assert (report.rows, report.pairs, report.dropped) == (1, 1, {"range": 0, "margin": 0})


def test_mining_margin_skips_near_positives_and_drops_pairs_left_short() -> None:
    # Positive p3 scores 7; margin 1.5 keeps only scores <= 5.5: p5 (5), p6 (4), ...
    rows, _ = _mine(ANCHORS, PASSAGES, {"A": ["p3"]}, list(PASSAGES), range_min=0,
                    range_max=9, count=2, margin=1.5)
    assert [rows[0]["negative_1"], rows[0]["negative_2"]] == ["p5", "p6"]
    # Within ranks [0, 4) only p0 p1 p2 p4 (all > 5.5): the margin leaves nothing.
    rows, report = _mine(ANCHORS, PASSAGES, {"A": ["p3"]}, list(PASSAGES), range_min=0,
                         range_max=4, count=2, margin=1.5)
    assert rows == [] and report.dropped == {"range": 0, "margin": 1}
    assert report.anchors_dropped == 1 and "margin left too few" in "\n".join(report.lines())


def test_mining_groups_an_anchors_positives_and_drops_short_ranges() -> None:
    passages = {**PASSAGES, "other": [0.0, 5.0]}
    rows, report = _mine(ANCHORS, passages, {"A": ["p0", "p1"], "B": ["other"]}, [],
                         range_min=0, range_max=3, count=1, block_size=1)
    # The corpus is only the positives: A's ranking without p0, p1 is just "other"; B's is
    # p0, p1 by score (ties at 0: corpus order).
    assert [(r["anchor"], r["positive"], r["negative_1"]) for r in rows] == [
        ("A", "p0", "other"), ("A", "p1", "other"), ("B", "other", "p0")]
    rows, report = _mine(ANCHORS, passages, {"A": ["p0", "p1"], "B": ["other"]}, [],
                         range_min=1, range_max=3, count=1)
    assert [r["anchor"] for r in rows] == ["B"] and report.dropped["range"] == 2
    # Lines repeating an anchor are grouped: neither positive is the other's negative.
    embed = _table_embed({**ANCHORS, **PASSAGES})
    rows, _ = mine(embed, embed, ["A", "A"], [["p0"], ["p1"]], list(PASSAGES), range_min=0,
                   range_max=3, count=1, similarity="dot")
    assert [(r["positive"], r["negative_1"]) for r in rows] == [("p0", "p2"), ("p1", "p2")]


def test_mining_checks_its_range() -> None:
    with pytest.raises(ValueError, match="range .5, 5. is empty"):
        check_range(5, 5, 1)
    with pytest.raises(ValueError, match="4 negatives cannot come from the 3 ranks"):
        check_range(2, 5, 4)
