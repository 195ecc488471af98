"""Exact nearest-neighbour search over a corpus that never sits in memory whole.

The corpus arrives as blocks of (ids, vectors), typically embedded on the fly; each block is
scored against every query (dot product: callers normalize the vectors for cosine similarity)
and merged into a running top-k per query, then dropped. Memory is therefore the queries, one
block of corpus vectors, and a (query chunk, k + block) score matrix, whatever the corpus size:
MS MARCO's 8.8M passages are searched with the same footprint as a thousand.

The result is exact and deterministic: each query's documents in score order, equal scores in
corpus order (the earlier document first), including at the k-th place, so the block size
never changes the answer. Scores are computed in float32 with full-precision matmuls (TF32 is
switched off for the search, whatever the process set).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from bertforge.errors import RunError

QUERY_CHUNK = 1024  # queries scored against a block at once: bounds the (chunk, k + B) scores


@contextmanager
def _full_precision() -> Iterator[None]:
    """float32 matmuls at full precision for the body (a training run may have allowed TF32,
    whose 10-bit mantissa reorders close documents)."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


def _as_tensor(vectors: np.ndarray, device: torch.device, what: str) -> torch.Tensor:
    array = np.ascontiguousarray(vectors, dtype=np.float32)
    if array.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array (rows, dimensions), got shape "
                         f"{array.shape}")
    # One float64 sum finds any NaN or infinity (they propagate) at a fraction of a full check.
    if not np.isfinite(array.sum(dtype=np.float64)):
        raise RunError(f"the model gave vectors that are not finite numbers for {what}; "
                       "check the model (a diverged checkpoint gives NaN)")
    return torch.from_numpy(array).to(device)


def _exact_rows(scores: torch.Tensor, positions: torch.Tensor, k: int) -> tuple[torch.Tensor,
                                                                                 torch.Tensor]:
    """Top ``k`` of one row by (score descending, position ascending): the slow, exact path
    for a row whose k-th score is tied with a candidate ``topk`` left out."""
    order = np.lexsort((positions.cpu().numpy(), -scores.cpu().double().numpy()))[:k]
    index = torch.from_numpy(order).to(scores.device)
    return scores[index], positions[index]


def _tied_rows(block: torch.Tensor, small: torch.Tensor, block_top: torch.Tensor,
               kth: torch.Tensor, k: int) -> torch.Tensor:
    """Rows whose k-th place ``topk`` may have filled arbitrarily: more than k candidates score
    >= the k-th score ``kth`` (C, 1). Counted on the (C, k + k_b) ``small`` candidates, plus,
    where the block's own k-th best equals ``kth``, the block's equal scores ``topk`` left out
    (a full pass over those rows only: all rows for the first block, then rarely)."""
    tied = (small >= kth).sum(1) > k
    if block_top.shape[1] == k:  # the block had more than k rows: some were left out
        edge = torch.nonzero(block_top[:, -1] == kth[:, 0]).flatten()
        if len(edge):
            hidden = ((block[edge] == kth[edge]).sum(1)
                      > (block_top[edge] == kth[edge]).sum(1))
            tied[edge] |= hidden
    return tied


def _merge(best: torch.Tensor, where: torch.Tensor, block: torch.Tensor, offset: int) -> None:
    """Merge one block's scores (C, B) into a chunk's running top-k, in place: ``best`` (C, k)
    scores, ``where`` (C, k) corpus positions (-1 for an empty slot, score -inf)."""
    k = best.shape[1]
    block_top, block_index = torch.topk(block, min(k, block.shape[1]), dim=1)  # (C, k_b)
    small = torch.cat([best, block_top], dim=1)  # (C, k + k_b)
    top, index = torch.topk(small, k, dim=1)  # (C, k)
    chosen = torch.gather(torch.cat([where, offset + block_index], dim=1), 1, index)
    # topk breaks ties at the k-th score arbitrarily: rows with more candidates at that score
    # than places left are redone exactly (rare: duplicate documents, or integer vectors).
    kth = top[:, -1:]  # (C, 1)
    for row in torch.nonzero(_tied_rows(block, small, block_top, kth, k)).flatten().tolist():
        scores = torch.cat([best[row], block[row]])
        positions = torch.cat([where[row], torch.arange(offset, offset + block.shape[1],
                                                        device=where.device)])
        top[row], chosen[row] = _exact_rows(scores, positions, k)
    best.copy_(top)
    where.copy_(chosen)


def _final_order(best: torch.Tensor, where: torch.Tensor,
                 count: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, positions), each (Q, count), every row by score descending then position
    ascending; the empty slots (corpus smaller than k) cut off."""
    scores, positions = best.cpu().numpy(), where.cpu().numpy()
    order = np.lexsort((positions, -scores.astype(np.float64)), axis=-1)[:, :count]
    return (np.take_along_axis(scores, order, 1),
            np.take_along_axis(positions, order, 1))


def search_positions(queries: np.ndarray, corpus_blocks: Iterable[np.ndarray], k: int, *,
                     device: str | torch.device | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`search` over blocks of vectors alone: (scores (Q, k'), positions (Q, k')), a
    position counting the corpus rows from 0 across blocks, k' = min(k, corpus rows)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    device = torch.device(device if device is not None else
                          "cuda" if torch.cuda.is_available() else "cpu")
    with _full_precision(), torch.inference_mode():
        q = _as_tensor(queries, device, "the queries")  # (Q, D)
        best = torch.full((q.shape[0], k), -torch.inf, device=device)  # (Q, k)
        where = torch.full((q.shape[0], k), -1, dtype=torch.int64, device=device)  # (Q, k)
        seen = 0
        for vectors in corpus_blocks:
            block = _as_tensor(vectors, device, "the documents")  # (B, D)
            if block.shape[1] != q.shape[1]:
                raise ValueError(f"documents have {block.shape[1]} dimensions, queries "
                                 f"{q.shape[1]}; embed both with one model")
            for lo in range(0, q.shape[0], QUERY_CHUNK):
                hi = lo + QUERY_CHUNK
                _merge(best[lo:hi], where[lo:hi], q[lo:hi] @ block.T, seen)
            seen += block.shape[0]
        return _final_order(best, where, min(k, seen))


def search(queries: np.ndarray, corpus_blocks: Iterable[tuple[Sequence[str], np.ndarray]],
           k: int, *, device: str | torch.device | None = None
           ) -> tuple[np.ndarray, list[list[str]]]:
    """The ``k`` best documents of each query by dot product, exactly.

    ``queries``: (Q, D) float32. ``corpus_blocks``: (ids, vectors (B, D)) pairs, read once and
    in order; one block's vectors are held at a time. Returns (scores (Q, k'), ids: Q lists of
    k' document ids), k' = min(k, documents), each row best first (equal scores in corpus
    order). ``device``: where the scoring runs (None: the GPU when there is one, much faster for
    large corpora; the CPU otherwise)."""
    ids: list[str] = []

    def vectors() -> Iterator[np.ndarray]:
        for block_ids, block in corpus_blocks:
            if len(block_ids) != len(block):
                raise ValueError(f"a block of {len(block_ids)} ids has {len(block)} vectors")
            ids.extend(block_ids)
            yield block

    scores, positions = search_positions(queries, vectors(), k, device=device)
    return scores, [[ids[p] for p in row] for row in positions.tolist()]


def rankings(query_ids: Sequence[str], scores: np.ndarray,
             ids: Sequence[Sequence[str]]) -> dict[str, dict[str, float]]:
    """The run of a :func:`search` (query id -> document id -> score) that
    ``bertforge.metrics.retrieval.retrieval_metrics`` takes; ``query_ids`` in the order of the
    searched query vectors."""
    if not len(query_ids) == len(scores) == len(ids):
        raise ValueError(f"{len(query_ids)} query ids for {len(scores)} rows of scores and "
                         f"{len(ids)} of ids")
    return {query: {doc: float(s) for doc, s in zip(row_ids, row)}
            for query, row, row_ids in zip(query_ids, scores.tolist(), ids)}


__all__ = ["QUERY_CHUNK", "rankings", "search", "search_positions"]
