"""Retrieval metrics equal trec_eval's (pytrec_eval, the C code BEIR and MTEB report through) to
1e-9 on random runs with tied scores and graded, partly negative qrels; Spearman equals scipy's;
a few small cases are checked by hand; BEIR files are read, and refused with one-line errors."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from bertforge.data.beir import read_beir
from bertforge.errors import DataError
from bertforge.metrics.retrieval import (
    RETRIEVAL_KEYS,
    per_query_metrics,
    retrieval_metrics,
    spearman,
    trec_order,
)

pytrec_eval = pytest.importorskip("pytrec_eval")
stats = pytest.importorskip("scipy.stats")

TREC = {"ndcg@10": "ndcg_cut_10", "recall@10": "recall_10", "recall@100": "recall_100",
        "map@100": "map_cut_100"}


def _random_case(rng: random.Random) -> tuple[dict, dict]:
    docs = [f"d{i}" for i in range(rng.randint(3, 160))]
    qrels, run = {}, {}
    for q in range(rng.randint(1, 6)):
        judged = rng.sample(docs, rng.randint(1, min(len(docs), 25)))
        qrels[f"q{q}"] = {d: rng.choice([-1, 0, 1, 1, 2, 3]) for d in judged}
        if rng.random() < 0.85:  # some queries have no run at all: they count 0
            # Few distinct scores: many ties, which trec_eval breaks by document id descending.
            run[f"q{q}"] = {d: rng.randint(0, 6) / 4 for d in rng.sample(docs, rng.randint(
                0, len(docs)))}
    run["not-judged"] = {"d0": 1.0}  # ignored: not in the qrels
    return qrels, run


def _trec_mrr10(qrels: dict, run: dict, query: str) -> float:
    """pytrec_eval's recip_rank of the query's run cut to its top 10 in trec_eval's order."""
    ranking = run.get(query, {})
    top = {doc: ranking[doc] for doc in trec_order(ranking)[:10]}
    result = pytrec_eval.RelevanceEvaluator({query: qrels[query]}, {"recip_rank"}).evaluate(
        {query: top})
    return result.get(query, {}).get("recip_rank", 0.0)


def test_metrics_equal_pytrec_eval_on_random_runs_with_ties() -> None:
    rng = random.Random(0)
    checked = 0
    for _ in range(120):
        qrels, run = _random_case(rng)
        reference = pytrec_eval.RelevanceEvaluator(qrels, set(TREC.values())).evaluate(run)
        ours = per_query_metrics(run, qrels)
        judged = [q for q, j in qrels.items() if any(g > 0 for g in j.values())]
        assert sorted(ours) == sorted(judged)
        for query, metrics in ours.items():
            for key, trec in TREC.items():
                want = reference.get(query, {}).get(trec, 0.0)
                assert abs(metrics[key] - want) < 1e-9, (query, key, metrics[key], want)
            assert abs(metrics["mrr@10"] - _trec_mrr10(qrels, run, query)) < 1e-9
            checked += 1
        mean = retrieval_metrics(run, qrels)
        for key in RETRIEVAL_KEYS:
            assert abs(mean[key] - np.mean([m[key] for m in ours.values()])) < 1e-12
    assert checked > 300


def test_small_cases_by_hand() -> None:
    qrels = {"q": {"a": 2, "b": 1, "c": 0, "z": 1}}
    # b and c tie: trec_eval puts the larger id first (c, then b); x is unjudged.
    run = {"q": {"x": 3.0, "c": 2.0, "b": 2.0, "a": 1.0}}
    assert trec_order(run["q"]) == ["x", "c", "b", "a"]
    m = retrieval_metrics(run, qrels)
    dcg = 1 / math.log2(4) + 2 / math.log2(5)
    idcg = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert m["ndcg@10"] == pytest.approx(dcg / idcg, abs=1e-12)
    assert m["mrr@10"] == pytest.approx(1 / 3)
    assert m["recall@10"] == m["recall@100"] == pytest.approx(2 / 3)
    assert m["map@100"] == pytest.approx((1 / 3 + 2 / 4) / 3)
    # A relevant document at rank 11 is beyond MRR@10 and recall@10, within recall@100.
    deep = {"q": {**{f"n{i:02d}": 100.0 - i for i in range(10)}, "a": 1.0}}
    m = retrieval_metrics(deep, {"q": {"a": 1}})
    assert (m["mrr@10"], m["recall@10"], m["recall@100"]) == (0.0, 0.0, 1.0)
    assert m["map@100"] == pytest.approx(1 / 11)
    # Queries without relevant documents are not averaged; a judged query without a run is 0.
    m = retrieval_metrics({"q1": {"a": 1.0}}, {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 0}})
    assert m["ndcg@10"] == pytest.approx(0.5) and m["mrr@10"] == pytest.approx(0.5)
    assert all(math.isnan(v) for v in retrieval_metrics({}, {"q": {"a": 0}}).values())


def test_spearman_equals_scipy_with_ties() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 6, 40).astype(float)  # many ties
        y = x + rng.normal(0, 2, 40)
        assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def _beir(root: Path, corpus: list[dict], queries: list[dict], qrels: str,
          split: str = "test") -> Path:
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / f"{split}.tsv").write_text(qrels)
    return root


CORPUS = [{"_id": "d1", "title": "Paris", "text": "capital of France"},
          {"_id": "d2", "title": "", "text": "a river"}, {"_id": 3, "text": "no title"}]
QUERIES = [{"_id": "q1", "text": "capital?"}, {"_id": "q2", "text": "unjudged"}]


def test_read_beir_joins_titles_and_keeps_judged_queries(tmp_path: Path) -> None:
    root = _beir(tmp_path, CORPUS, QUERIES, "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\t3\t0\n")
    data = read_beir(root)
    assert data.corpus == {"d1": "Paris capital of France", "d2": "a river", "3": "no title"}
    assert data.queries == {"q1": "capital?"} and data.qrels == {"q1": {"d1": 2, "3": 0}}


@pytest.mark.parametrize("change, message", [
    (lambda r: (r / "queries.jsonl").unlink(), ("has no queries.jsonl: a BEIR dataset "
                                                "directory holds corpus.jsonl, queries.jsonl "
                                                "and qrels/<split>.tsv")),
    (lambda r: (r / "qrels" / "test.tsv").rename(r / "qrels" / "dev.tsv"),
     "no qrels for split 'test'.*its splits: dev; pass one with --split"),
    (lambda r: (r / "corpus.jsonl").write_text('{"_id": "d1", "text": 5}\n'),
     r"corpus.jsonl:1: field 'text' is a number, not a string"),
    (lambda r: (r / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": "d1", '
                                               '"text": "b"}\n'),
     r"corpus.jsonl:2: id 'd1' was already given at .*corpus.jsonl:1"),
    (lambda r: (r / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"\n'),
     r"corpus.jsonl:1:\d+: not valid JSON"),
    (lambda r: (r / "qrels" / "test.tsv").write_text("q1\td1\thigh\n"),
     r"test.tsv:1: field 'score' is 'high', not a whole number"),
    (lambda r: (r / "qrels" / "test.tsv").write_text("q1\td9\t1\n"),
     "document 'd9' .judged for query 'q1'. is not in corpus.jsonl"),
    (lambda r: (r / "qrels" / "test.tsv").write_text("q7\td1\t1\n"),
     "query 'q7' is not in queries.jsonl"),
])
def test_read_beir_refuses_bad_input_in_one_line(tmp_path: Path, change, message: str) -> None:
    root = _beir(tmp_path, CORPUS, QUERIES, "q1\td1\t1\n")
    change(root)
    with pytest.raises(DataError, match=message) as caught:
        read_beir(root)
    assert "\n" not in str(caught.value)
