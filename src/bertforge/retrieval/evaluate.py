"""Evaluating embedding models and rerankers: BEIR-style retrieval and STS correlation.

The functions take callables so that a command can pass a model directory's
(``bertforge.inference.embedding``) and a training task its in-memory model's:

* ``embed_queries`` / ``embed_documents`` / ``embed``: texts -> float32 (N, D) vectors;
* ``score_pairs``: (query, passage) pairs -> float32 (N,) scores (a cross-encoder's logits).

Retrieval is exact (``retrieval.search``): every document is embedded once, block by block, and
only the top ``top_k`` of each query is kept. With ``similarity="cosine"`` both sides are scaled
to unit length first (sentence-transformers' default); ``"dot"`` keeps them as the model gives
them (models trained for dot product, e.g. TAS-B).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from bertforge.data.beir import BeirData
from bertforge.metrics.classification import pearson
from bertforge.metrics.retrieval import retrieval_metrics, spearman, trec_order

Embed = Callable[[list[str]], np.ndarray]
ScorePairs = Callable[[list[tuple[str, str]]], np.ndarray]
SIMILARITIES = ("cosine", "dot")
_PAIR_CHUNK = 4096  # pairs handed to score_pairs at once (its own batching is finer)


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero), float32."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def check_similarity(similarity: str) -> None:
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be {' or '.join(SIMILARITIES)}, got {similarity!r}")


def embedded(embed: Embed, texts: Sequence[str], similarity: str, what: str) -> np.ndarray:
    """``embed(texts)`` checked to be (len(texts), D), unit rows for cosine similarity."""
    vectors = np.asarray(embed(list(texts)), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise ValueError(f"the {what} embedding function returned shape {vectors.shape} for "
                         f"{len(texts)} texts; it must return (texts, dimensions)")
    return unit_rows(vectors) if similarity == "cosine" else vectors


def document_blocks(embed_documents: Embed, ids: Sequence[str], texts: Sequence[str],
                    block_size: int, similarity: str,
                    progress: Any = None) -> Iterator[tuple[list[str], np.ndarray]]:
    """(ids, vectors (B, D)) of ``block_size`` documents at a time, embedded as they are
    read; ``progress`` (a tqdm bar, or None) advances by each block's documents."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    for lo in range(0, len(texts), block_size):
        block_ids, block = list(ids[lo:lo + block_size]), texts[lo:lo + block_size]
        vectors = embedded(embed_documents, block, similarity, "document")
        if progress is not None:
            progress.update(len(block))
        yield block_ids, vectors


def retrieve(embed_queries: Embed, embed_documents: Embed, queries: dict[str, str],
             corpus: dict[str, str], *, block_size: int = 16384, top_k: int = 100,
             similarity: str = "cosine", device: Any = None) -> dict[str, dict[str, float]]:
    """The run (query id -> document id -> score) of an exact search of ``corpus`` for each
    query: its ``top_k`` documents by the model's similarity."""
    from bertforge.core.progress import progress_bar
    from bertforge.retrieval.search import rankings, search

    check_similarity(similarity)
    query_ids = list(queries)
    vectors = embedded(embed_queries, [queries[q] for q in query_ids], similarity, "query")
    with progress_bar(total=len(corpus), desc="embedding documents", unit="doc") as bar:
        blocks = document_blocks(embed_documents, list(corpus), list(corpus.values()),
                                 block_size, similarity, bar)
        scores, ids = search(vectors, blocks, top_k, device=device)
    return rankings(query_ids, scores, ids)


def evaluate_retrieval(embed_queries: Embed, embed_documents: Embed, data: BeirData, *,
                       block_size: int = 16384, top_k: int = 100, similarity: str = "cosine",
                       device: Any = None) -> tuple[dict[str, float],
                                                     dict[str, dict[str, float]]]:
    """(metrics, run) of an embedding model on a BEIR split: each query of ``data`` searched
    exactly over the whole corpus (``block_size`` documents embedded at a time, the ``top_k``
    best kept), scored by ``metrics.retrieval.retrieval_metrics`` (nDCG@10, MRR@10,
    recall@10/100, MAP@100). ``top_k`` below 100 caps what recall@100 and MAP@100 can see."""
    run = retrieve(embed_queries, embed_documents, data.queries, data.corpus,
                   block_size=block_size, top_k=top_k, similarity=similarity, device=device)
    return retrieval_metrics(run, data.qrels), run


def rerank(score_pairs: ScorePairs, data: BeirData, run: dict[str, dict[str, float]],
           top: int = 100) -> dict[str, dict[str, float]]:
    """A new run in which each query's ``top`` best documents of ``run`` (in trec_eval's order)
    carry ``score_pairs``' score of (query text, document text); documents below ``top`` are
    left out, so the metrics measure the reranked list alone."""
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    pairs: list[tuple[str, str]] = []
    keys: list[tuple[str, str]] = []
    for query, ranking in run.items():
        for doc in trec_order(ranking)[:top]:
            pairs.append((data.queries[query], data.corpus[doc]))
            keys.append((query, doc))
    scores = np.empty(len(pairs), dtype=np.float64)
    for lo in range(0, len(pairs), _PAIR_CHUNK):
        chunk = np.asarray(score_pairs(pairs[lo:lo + _PAIR_CHUNK]), dtype=np.float64).reshape(-1)
        if chunk.shape[0] != len(pairs[lo:lo + _PAIR_CHUNK]):
            raise ValueError(f"score_pairs returned {chunk.shape[0]} scores for "
                             f"{len(pairs[lo:lo + _PAIR_CHUNK])} pairs")
        scores[lo:lo + len(chunk)] = chunk
    reranked: dict[str, dict[str, float]] = {query: {} for query in run}
    for (query, doc), score in zip(keys, scores.tolist()):
        reranked[query][doc] = score
    return reranked


def evaluate_sts(embed: Embed, pairs: Sequence[tuple[str, str]],
                 scores: Sequence[float]) -> dict[str, float]:
    """Spearman (the primary number, as sentence-transformers' EmbeddingSimilarityEvaluator
    reports it) and Pearson correlation between the gold ``scores`` and the cosine similarity
    of each pair's two vectors. Each distinct text is embedded once."""
    if len(pairs) != len(scores):
        raise ValueError(f"{len(pairs)} pairs for {len(scores)} scores")
    if not pairs:
        raise ValueError("no pairs to evaluate")
    texts = list(dict.fromkeys(t for pair in pairs for t in pair))
    row = {text: i for i, text in enumerate(texts)}
    vectors = embedded(embed, texts, "cosine", "sentence")  # (T, D), unit rows
    a = vectors[[row[p[0]] for p in pairs]]
    b = vectors[[row[p[1]] for p in pairs]]
    cosine = np.einsum("nd,nd->n", a.astype(np.float64), b.astype(np.float64))  # (N,)
    gold = np.asarray(scores, dtype=np.float64)
    return {"spearman": spearman(cosine, gold), "pearson": pearson(cosine, gold)}


__all__ = ["SIMILARITIES", "check_similarity", "document_blocks", "embedded",
           "evaluate_retrieval", "evaluate_sts", "rerank", "retrieve", "unit_rows"]
