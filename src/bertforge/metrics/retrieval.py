"""Retrieval metrics as trec_eval defines them: nDCG@10, MRR@10, recall@10/100, MAP@100.

BEIR, MTEB and the sentence-transformers leaderboards report these through ``pytrec_eval`` (the
trec_eval C code), so the definitions here are trec_eval's to the letter and the tests compare
against it to 1e-9:

* a query's ranking is its run sorted by score, descending, ties broken by document id
  *descending* (as strings), exactly as trec_eval sorts; the order a run dict was built in does
  not matter;
* a document is relevant when its grade in the qrels is > 0; documents missing from the qrels
  have grade 0;
* ``ndcg@10`` (trec_eval's ``ndcg_cut_10``): sum over the top 10 of grade / log2(rank + 1),
  divided by the same sum over the ideal ranking of the query's judged grades;
* ``mrr@10``: 1 / rank of the first relevant document within the top 10, else 0;
* ``recall@k``: relevant documents in the top k / all relevant documents of the query;
* ``map@100`` (``map_cut_100``): the sum over relevant documents in the top 100 of the precision
  at their rank, divided by all relevant documents of the query.

Scores are fractions in [0, 1] (BEIR prints them x100). ``spearman`` is the classification
module's (average ranks for ties, then Pearson; no scipy at run time), exported here for the
STS evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from bertforge.metrics.classification import pearson, spearman

RETRIEVAL_KEYS = ("ndcg@10", "mrr@10", "recall@10", "recall@100", "map@100")
"""The keys :func:`retrieval_metrics` returns, in the order they are printed."""
_DEPTH = 100  # the deepest cut-off any metric reads


def trec_order(ranking: Mapping[str, float]) -> list[str]:
    """The document ids of one query's run in trec_eval's order: score descending, then id
    descending (two stable sorts: the id order survives among equal scores)."""
    ids = sorted(ranking, reverse=True)
    return sorted(ids, key=lambda doc: -float(ranking[doc]))


def _query_metrics(order: list[str], judged: Mapping[str, int]) -> dict[str, float]:
    """The five metrics of one query: ``order`` its ranked document ids (trec_eval's order),
    ``judged`` its qrels (at least one grade > 0)."""
    relevant = sum(1 for grade in judged.values() if grade > 0)
    grades = [max(judged.get(doc, 0), 0) for doc in order[:_DEPTH]]  # (<= 100,) by rank
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:10]
    dcg = sum(g / math.log2(rank + 2) for rank, g in enumerate(grades[:10]) if g > 0)
    idcg = sum(g / math.log2(rank + 2) for rank, g in enumerate(ideal))
    first = next((rank for rank, g in enumerate(grades[:10]) if g > 0), None)
    hits, precision_sum = 0, 0.0
    for rank, grade in enumerate(grades):
        if grade > 0:
            hits += 1
            precision_sum += hits / (rank + 1)
    return {"ndcg@10": dcg / idcg,
            "mrr@10": 0.0 if first is None else 1.0 / (first + 1),
            "recall@10": sum(1 for g in grades[:10] if g > 0) / relevant,
            "recall@100": hits / relevant,
            "map@100": precision_sum / relevant}


def per_query_metrics(run: Mapping[str, Mapping[str, float]],
                      qrels: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, float]]:
    """The metrics of each query of ``qrels`` that has a relevant document (see
    :func:`retrieval_metrics`), by query id."""
    out: dict[str, dict[str, float]] = {}
    for query, judged in qrels.items():
        if not any(grade > 0 for grade in judged.values()):
            continue
        out[query] = _query_metrics(trec_order(run.get(query, {})), judged)
    return out


def retrieval_metrics(run: Mapping[str, Mapping[str, float]],
                      qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """nDCG@10, MRR@10, recall@10, recall@100 and MAP@100 of ``run`` (query id -> document id
    -> score, higher is better) against ``qrels`` (query id -> document id -> grade), by
    trec_eval's definitions (see the module notes).

    The average is over the queries of ``qrels`` that have at least one relevant document
    (grade > 0); such a query missing from ``run``, or with an empty ranking, counts 0 for every
    metric. Queries of ``run`` that are not in ``qrels`` are ignored. With no query to average
    over, every metric is ``nan``."""
    per_query = per_query_metrics(run, qrels)
    if not per_query:
        return {key: math.nan for key in RETRIEVAL_KEYS}
    return {key: math.fsum(m[key] for m in per_query.values()) / len(per_query)
            for key in RETRIEVAL_KEYS}


__all__ = ["RETRIEVAL_KEYS", "pearson", "per_query_metrics", "retrieval_metrics", "spearman",
           "trec_order"]
