"""Hard-negative mining: for each (anchor, positive) pair, passages the embedding model ranks
high for the anchor that are not its positives, as training negatives for an embedding model.

For each anchor the whole corpus is searched exactly (``retrieval.search``, block by block).
Its ranking leaves out the anchor's own positives (every positive any line gives it, compared
by text) and any passage identical to the anchor itself; ranks then count from 0 over what is
left. The negatives of a pair are taken in rank order from ranks ``[range_min, range_max)``:
``range_min`` skips the very top, where unlabelled true positives (false negatives) gather.
With ``margin`` set, a candidate scoring above (the pair's positive score - ``margin``) is
skipped too, the absolute margin of sentence-transformers' ``mine_hard_negatives``. A pair
with fewer than ``count`` candidates left is dropped and counted in the report, by reason.

Rows are sentence-transformers' n-tuple columns: ``anchor``, ``positive``, ``negative_1`` ...
``negative_<count>``, one per (anchor, positive), which the sentence-similarity task reads.
The corpus is de-duplicated by text, so a row never holds one passage twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bertforge.retrieval.evaluate import check_similarity, document_blocks, embedded

Embed = Callable[[list[str]], np.ndarray]


@dataclass
class MiningReport:
    """What mining did: pairs in, rows out, and the pairs dropped by reason (``range``: fewer
    than ``count`` candidates within the rank range, the corpus being too small; ``margin``:
    the margin left fewer than ``count``). ``anchors_dropped``: anchors left without any row."""

    anchors: int = 0
    pairs: int = 0
    corpus: int = 0
    rows: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {"range": 0, "margin": 0})
    anchors_dropped: int = 0

    def lines(self) -> list[str]:
        """The one-screen summary a command prints."""
        out = [(f"{self.rows} rows written from {self.pairs} (anchor, positive) pairs of "
                f"{self.anchors} anchors; corpus: {self.corpus} distinct passages")]
        if self.dropped["range"]:
            out.append(f"  {self.dropped['range']} pairs dropped: fewer candidates in the rank "
                       "range than negatives asked for (a larger corpus, a wider range or "
                       "fewer --negatives)")
        if self.dropped["margin"]:
            out.append(f"  {self.dropped['margin']} pairs dropped: the margin left too few "
                       "candidates (a smaller --margin or a wider range)")
        if self.anchors_dropped:
            out.append(f"  {self.anchors_dropped} anchors have no row left")
        return out


def check_range(range_min: int, range_max: int, count: int) -> None:
    """``ValueError`` unless 0 <= range_min < range_max and the range holds ``count``."""
    if range_min < 0 or range_max <= range_min:
        raise ValueError(f"the rank range [{range_min}, {range_max}) is empty; range_max must "
                         "be above range_min >= 0")
    if not 1 <= count <= range_max - range_min:
        raise ValueError(f"{count} negatives cannot come from the {range_max - range_min} ranks "
                         f"[{range_min}, {range_max}); widen the range or ask for fewer")


@dataclass(frozen=True)
class _Pairs:
    """The (anchor, positive) pairs as corpus positions: ``anchor`` (P,) anchor index,
    ``doc`` (P,) the positive's row in the de-duplicated corpus."""

    anchor: np.ndarray
    doc: np.ndarray


def _pair_scores(pairs: _Pairs, anchors: np.ndarray,
                 blocks: Iterator[tuple[list[str], np.ndarray]],
                 out: np.ndarray) -> Iterator[np.ndarray]:
    """The blocks' vectors, passed on to the search; on the way, ``out`` (P,) receives each
    pair's positive score from the block holding its positive (no second embedding pass)."""
    seen = 0
    for _, vectors in blocks:
        inside = (pairs.doc >= seen) & (pairs.doc < seen + len(vectors))  # (P,)
        a, d = pairs.anchor[inside], pairs.doc[inside] - seen
        out[inside] = np.einsum("pd,pd->p", anchors[a], vectors[d])
        seen += len(vectors)
        yield vectors


def group_pairs(anchors: Sequence[str],
                positives: Sequence[Sequence[str]]) -> tuple[list[str], list[list[str]]]:
    """Distinct anchors (first-seen order), each with all the positives its lines give (in
    order, each once): a positive of one line is never a negative of another for one anchor."""
    if len(anchors) != len(positives):
        raise ValueError(f"{len(anchors)} anchors for {len(positives)} lists of positives")
    grouped: dict[str, dict[str, None]] = {}
    for anchor, own in zip(anchors, positives):
        grouped.setdefault(anchor, {}).update(dict.fromkeys(own))
    return list(grouped), [list(own) for own in grouped.values()]


def _excluded(anchors: Sequence[str], positives: Sequence[Sequence[str]],
              row: dict[str, int]) -> list[set[int]]:
    """Per anchor, the corpus rows its ranking leaves out: its positives and itself."""
    out: list[set[int]] = []
    for anchor, own in zip(anchors, positives):
        skip = {row[p] for p in own}
        if anchor in row:
            skip.add(row[anchor])
        out.append(skip)
    return out


def _select(candidates: list[tuple[int, float]], limit: float | None,
            count: int) -> list[int] | None:
    """The first ``count`` candidates (rank order) scoring at most ``limit``; None when fewer
    are left."""
    chosen = [doc for doc, score in candidates if limit is None or score <= limit][:count]
    return chosen if len(chosen) == count else None


def _rows(anchors: Sequence[str], positives: Sequence[Sequence[str]], texts: list[str],
          ranked: tuple[np.ndarray, np.ndarray], skip: list[set[int]], pos_scores: np.ndarray,
          settings: dict[str, Any], report: MiningReport) -> list[dict[str, str]]:
    """The output rows, pair by pair, from each anchor's ranking (scores, corpus rows)."""
    lo, hi, count, margin = (settings[k] for k in ("range_min", "range_max", "count", "margin"))
    rows: list[dict[str, str]] = []
    pair = 0
    for a, (anchor, own) in enumerate(zip(anchors, positives)):
        scores, docs = ranked[0][a].tolist(), ranked[1][a].tolist()
        ranking = [(d, s) for d, s in zip(docs, scores) if d not in skip[a]][lo:hi]
        kept = 0
        for positive in own:
            limit = None if margin is None else pos_scores[pair] - margin
            pair += 1
            chosen = _select(ranking, limit, count)
            if chosen is None:
                report.dropped["range" if len(ranking) < count else "margin"] += 1
                continue
            kept += 1
            rows.append({"anchor": anchor, "positive": positive,
                         **{f"negative_{i + 1}": texts[d] for i, d in enumerate(chosen)}})
        report.anchors_dropped += kept == 0
    report.rows = len(rows)
    return rows


def mine(embed_queries: Embed, embed_documents: Embed, anchors: list[str],
         positives: list[list[str]], corpus: list[str], *, range_min: int = 10,
         range_max: int = 100, count: int = 5, margin: float | None = None,
         block_size: int = 16384, similarity: str = "cosine",
         device: Any = None) -> tuple[list[dict[str, str]], MiningReport]:
    """(rows, report) of hard negatives for each (anchor, positive) (see the module notes).

    ``anchors``: anchor texts; ``positives[i]``: anchor i's positives, one output row each
    (lines repeating an anchor are grouped: :func:`group_pairs`). ``corpus``: the passages to mine from (the positives are added when missing, so an
    empty list mines among the positives of the other anchors). Ranks are 0-based, the range
    ``[range_min, range_max)`` (start included, end excluded). ``margin``: None for no margin
    filter. Anchors are embedded with ``embed_queries``, passages with ``embed_documents``,
    ``block_size`` at a time; ``similarity``: "cosine" (unit vectors) or "dot"."""
    check_range(range_min, range_max, count)
    check_similarity(similarity)
    anchors, positives = group_pairs(anchors, positives)
    from bertforge.core.progress import progress_bar
    from bertforge.retrieval.search import search_positions

    texts = list(dict.fromkeys([*corpus, *(p for own in positives for p in own)]))
    row = {text: i for i, text in enumerate(texts)}
    skip = _excluded(anchors, positives, row)
    pairs = _Pairs(np.array([a for a, own in enumerate(positives) for _ in own], dtype=np.int64),
                   np.array([row[p] for own in positives for p in own], dtype=np.int64))
    report = MiningReport(anchors=len(anchors), pairs=len(pairs.doc), corpus=len(texts))
    vectors = embedded(embed_queries, anchors, similarity, "anchor")  # (A, D)
    pos_scores = np.zeros(len(pairs.doc), dtype=np.float32)  # (P,)
    k = min(len(texts), range_max + max((len(s) for s in skip), default=0))
    with progress_bar(total=len(texts), desc="embedding passages", unit="doc") as bar:
        blocks = document_blocks(embed_documents, [""] * len(texts), texts, block_size,
                                 similarity, bar)
        ranked = search_positions(vectors, _pair_scores(pairs, vectors, blocks, pos_scores), k,
                                  device=device)
    settings = {"range_min": range_min, "range_max": range_max, "count": count,
                "margin": margin}
    return _rows(anchors, positives, texts, ranked, skip, pos_scores, settings, report), report


__all__ = ["MiningReport", "check_range", "group_pairs", "mine"]
