"""From start/end logits over windows back to answer texts, n-best lists and no-answer odds.

Per example, every window proposes spans from its ``n_best_size`` highest start and end logits:
both ends on context tokens, end not before start, at most ``max_answer_length`` tokens, and the
start in the window that gives that token the most context (the "max context" rule, see
``max_context_masks``), so a span is scored once, from the window that saw it best. A span's
score is start_logit + end_logit; its text is the context between the character offsets of its
two end tokens, so it keeps the original spacing and casing.

SQuAD 2.0: the no-answer score is the lowest [CLS] score (start_logit[0] + end_logit[0]) over the
example's windows; ``null_odds = no-answer score - best span score`` (infinite when no window has
a valid span) and the prediction is "" exactly when ``null_odds > null_score_diff_threshold``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.core.io import write_json_atomic

from bertforge.data.finetuning.examples import QAExample

__all__ = ["QAFeatures", "QAPredictions", "WindowOffsets", "max_context_masks", "postprocess_qa",
           "write_qa_outputs"]

# null_odds.json stands for "no valid span at all" (infinite odds) with this finite value,
# because JSON has no infinity.
NO_SPAN_ODDS = 1e30


class WindowOffsets:
    """The character span in the context of every token of every window, in one array.

    ``spans`` is (N, S, 2) int32 with -1 on question, [CLS], [SEP] and padding tokens, and
    ``lengths`` (N,) the tokens of each window. One small array instead of a Python tuple per
    token keeps the features of a long context a few bytes per token (a list of tuples costs
    about 100). ``offsets[n]`` is window n as a list of (start, end) or None per real token.
    """

    def __init__(self, spans: np.ndarray, lengths: np.ndarray) -> None:
        self.spans = spans        # (N, S, 2) int32
        self.lengths = lengths    # (N,) int64

    def __len__(self) -> int:
        return len(self.spans)

    def row(self, n: int) -> np.ndarray:
        """(L, 2) spans of window n's L real tokens; -1 where a token is not context."""
        return self.spans[n, :int(self.lengths[n])]

    def __getitem__(self, n: int) -> list[tuple[int, int] | None]:
        return [(s, e) if s >= 0 else None for s, e in self.row(n).tolist()]

    def __iter__(self) -> Iterator[list[tuple[int, int] | None]]:
        return (self[n] for n in range(len(self)))

    @classmethod
    def concat(cls, parts: Sequence[WindowOffsets]) -> WindowOffsets:
        return cls(np.concatenate([p.spans for p in parts]),
                   np.concatenate([p.lengths for p in parts]))


@dataclass
class QAFeatures:
    """Model inputs for every window of every example, with what post-processing needs.

    N windows, S = max_seq_length. ``offsets[n][t]`` is the character span of token t in the
    example's context, or None for question, [CLS], [SEP] tokens (see ``WindowOffsets``).
    ``token_is_max_context[n, t]`` is True where window n gives context token t the most
    surrounding context of all windows holding it (see ``max_context_masks``).
    """

    input_ids: np.ndarray             # (N, S) int64, padded with [PAD]
    token_type_ids: np.ndarray        # (N, S) int64
    attention_mask: np.ndarray        # (N, S) int64, 1 on real tokens
    example_index: np.ndarray         # (N,) int64, index into the examples list
    offsets: WindowOffsets
    token_is_max_context: np.ndarray  # (N, S) bool
    start_positions: np.ndarray | None = None  # (N,) int64, training only; 0 = [CLS]
    end_positions: np.ndarray | None = None    # (N,) int64

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class QAPredictions:
    """Answers by question id: the best text, the n-best list and (SQuAD 2.0) the no-answer odds."""

    predictions: dict[str, str] = field(default_factory=dict)
    nbest: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    null_odds: dict[str, float] = field(default_factory=dict)


def max_context_masks(starts: Sequence[int], sizes: Sequence[int]) -> list[np.ndarray]:
    """Per window, a (size,) bool mask of the context tokens whose best window it is.

    A token seen by several windows is scored in each by min(tokens left of it, tokens right of
    it) + 0.01 * window size; the best-scoring window (the first on a tie) owns it. Post-processing
    only lets an answer start at a token in its owning window, so a span near a window edge, where
    the model saw little context, does not compete with the same span seen from the middle.
    """
    total = starts[-1] + sizes[-1]
    best = np.full(total, -1.0)                 # (T,) best score so far per context token
    owner = np.zeros(total, dtype=np.int64)     # (T,) window index owning each token
    for k, (start, size) in enumerate(zip(starts, sizes)):
        j = np.arange(size)
        score = np.minimum(j, size - 1 - j) + 0.01 * size
        better = score > best[start:start + size]
        best[start:start + size][better] = score[better]
        owner[start:start + size][better] = k
    return [owner[s:s + n] == k for k, (s, n) in enumerate(zip(starts, sizes))]


def _top(values: np.ndarray, allowed: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest allowed values, largest first, lower index first on a tie."""
    idx = np.flatnonzero(allowed)
    order = np.lexsort((idx, -values[idx]))  # last key sorts first: by value, then by index
    return idx[order[:k]]


def _spans(offsets: np.ndarray, start: np.ndarray, end: np.ndarray,
           max_ctx: np.ndarray, n_best_size: int, max_answer_length: int
           ) -> list[tuple[float, int, int, float, float]]:
    """(score, char start, char end, start logit, end logit) of one window's valid spans;
    ``offsets`` (L, 2) as ``WindowOffsets.row`` gives them."""
    is_ctx = offsets[:, 0] >= 0  # (L,)
    found = []
    for s in _top(start, is_ctx & max_ctx, n_best_size).tolist():
        for e in _top(end, is_ctx, n_best_size).tolist():
            if e < s or e - s + 1 > max_answer_length:
                continue
            sl, el = float(start[s]), float(end[e])
            found.append((sl + el, int(offsets[s, 0]), int(offsets[e, 1]), sl, el))
    return found


def _entry(text: str, start_logit: float, end_logit: float, start: int | None = None,
           end: int | None = None) -> dict[str, Any]:
    """An n-best candidate; ``start``/``end``: its characters [start, end) in the context (None
    for the no-answer entry)."""
    return {"text": text, "probability": 0.0, "start_logit": start_logit, "end_logit": end_logit,
            "start": start, "end": end}


def _with_probabilities(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Softmax over the entries' scores, so the listed candidates' probabilities sum to 1."""
    scores = np.array([e["start_logit"] + e["end_logit"] for e in entries], dtype=np.float64)
    weights = np.exp(scores - scores.max())
    for entry, p in zip(entries, weights / weights.sum()):
        entry["probability"] = float(p)
    return entries


def postprocess_qa(examples: Sequence[QAExample], features: QAFeatures, start_logits: np.ndarray,
                   end_logits: np.ndarray, *, n_best_size: int = 20, max_answer_length: int = 30,
                   version_2: bool, null_score_diff_threshold: float = 0.0) -> QAPredictions:
    """Answer every example from its windows' logits (``(N, S)`` each, rows as in ``features``).

    Never fails on odd logits: an example without any valid span (or without windows) gets the
    prediction "" and an n-best list holding only "". Candidates with equal scores are ordered by
    their position in the context.
    """
    start_logits = np.asarray(start_logits, dtype=np.float64)  # (N, S)
    end_logits = np.asarray(end_logits, dtype=np.float64)      # (N, S)
    n = len(features)
    if start_logits.shape != end_logits.shape or start_logits.ndim != 2 or len(start_logits) != n:
        raise ValueError(f"start and end logits must both be ({n}, seq_len); got "
                         f"{start_logits.shape} and {end_logits.shape}")
    if n_best_size < 1 or max_answer_length < 1:
        raise ValueError("n_best_size and max_answer_length must be >= 1")
    windows: dict[int, list[int]] = {}
    for row, ex_i in enumerate(features.example_index.tolist()):
        windows.setdefault(ex_i, []).append(row)

    out = QAPredictions()
    for ex_i, ex in enumerate(examples):
        best: dict[tuple[int, int], tuple[float, int, int, float, float]] = {}
        null: tuple[float, float, float] | None = None  # (score, start logit, end logit)
        for row in windows.get(ex_i, []):
            offsets = features.offsets.row(row)  # (L, 2)
            size = len(offsets)
            start, end = start_logits[row, :size], end_logits[row, :size]  # (L,) each
            cls = float(start[0] + end[0])
            if null is None or cls < null[0]:
                null = (cls, float(start[0]), float(end[0]))
            for span in _spans(offsets, start, end, features.token_is_max_context[row, :size],
                               n_best_size, max_answer_length):
                key = (span[1], span[2])
                if key not in best or span[0] > best[key][0]:
                    best[key] = span
        ranked = sorted(best.values(), key=lambda c: (-c[0], c[1], c[2]))[:n_best_size]
        entries = [_entry(ex.context[c1:c2], sl, el, c1, c2) for _, c1, c2, sl, el in ranked]
        null_entry = _entry("", *(null[1:] if null else (0.0, 0.0)))
        text = entries[0]["text"] if entries else ""
        if version_2:
            null_score = null[0] if null else 0.0
            odds = null_score - ranked[0][0] if ranked else math.inf
            out.null_odds[ex.id] = odds
            if odds > null_score_diff_threshold:
                text = ""
            # The null entry ranks among the spans by score; on a tie it goes first ([CLS] is 0).
            place = sum(1 for c in ranked if c[0] > null_score)
            entries.insert(place, null_entry)
        elif not entries:
            entries = [null_entry]
        out.predictions[ex.id] = text
        out.nbest[ex.id] = _with_probabilities(entries)
    return out


def write_qa_outputs(out_dir: str | Path, preds: QAPredictions, version_2: bool) -> list[Path]:
    """Write predictions.json (id -> text, the official format), nbest_predictions.json and, for
    SQuAD 2.0, null_odds.json (the official script's na-prob file), each atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"predictions.json": preds.predictions, "nbest_predictions.json": preds.nbest}
    if version_2:
        files["null_odds.json"] = {k: v if math.isfinite(v) else math.copysign(NO_SPAN_ODDS, v)
                                   for k, v in preds.null_odds.items()}
    return [write_json_atomic(out_dir / name, obj, sort_keys=False, ensure_ascii=False)
            for name, obj in files.items()]
