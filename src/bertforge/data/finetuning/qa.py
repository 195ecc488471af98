"""Extractive QA features: the windows a question and its context become (``qa_features``),
and the way back from the windows' start/end logits to answer texts (``postprocess_qa``),
with memory bounded by the input.

Every example becomes windows of ``[CLS] question [SEP] context part [SEP]``, the context parts
starting ``doc_stride`` tokens apart (the classic SQuAD meaning: a step, not an overlap), each
holding as many context tokens as fit next to that example's question, until one reaches the end
of the context. These are the windows the ``tokenizers`` library cuts with ``overflow`` and
``stride = room - doc_stride``; they are built here from one tokenization of each distinct
context instead, so that a long context costs its tokens (12 bytes each: an int32 id and an
int32 character span) plus the output arrays, and never a Python object per token or per
window. Windows are made one at a time (``window_starts``) and written straight into the
preallocated (N, S) arrays.

A context (or question) over ``MAX_CONTEXT_CHARS`` characters is refused: its windows would
take minutes of model time per question and memory in proportion. A context longer than
``PIECE_CHARS`` is tokenized in pieces cut after a space, which gives the same tokens as one
pass (BERT's normalizer works per character and its pre-tokenizer splits at every space).

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

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.core.io import write_json_atomic
from bertforge.data.finetuning.examples import QAExample
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import BertTokenizer

__all__ = ["MAX_CONTEXT_CHARS", "QAFeatures", "QAPredictions", "WindowOffsets", "check_lengths",
           "max_context_masks", "postprocess_qa", "qa_features", "too_long", "window_starts",
           "write_qa_outputs"]

log = logging.getLogger(__name__)
_SHOWN_IDS = 5  # ids named in a warning

# About 1,000 pages of text, a whole book or the longest Wikipedia article; 250 times the
# longest SQuAD paragraph (about 4,000 characters). At BERT's ~4.5 characters a token it is some
# 220,000 tokens, ~1,700 windows of 384 with stride 128: ~20 MB of features and minutes of
# BERT-base on a CPU per question. Longer documents should be split (or retrieved from) first.
MAX_CONTEXT_CHARS = 1_000_000
PIECE_CHARS = 1 << 16  # longer contexts are tokenized in pieces of about this many characters
_BATCH_CHARS = 1 << 20  # characters of context tokenized per call to the Rust tokenizer
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

# ----------------------------------------------------------------------------------------- windows

def too_long(text: str, what: str) -> str | None:
    """Why ``text`` (the question or the context, named by ``what``) is over the size limit,
    or None when it is not; the callers add where it is and raise their own error."""
    if len(text) <= MAX_CONTEXT_CHARS:
        return None
    return (f"the {what} is {len(text):,} characters, over the limit of {MAX_CONTEXT_CHARS:,} "
            f"(MAX_CONTEXT_CHARS); split the document into parts of at most that size and ask "
            "each part")


@dataclass
class _Tokens:
    """One context's tokens: ids (T,) int32 and character spans (T, 2) int32."""

    ids: np.ndarray
    spans: np.ndarray


def _pieces(text: str) -> list[tuple[int, str]]:
    """(start, piece) cuts of ``text``, each cut just before a space (or at the end): the next
    piece starts with its space, as the word after it does in the whole text, which byte-level
    BPE spells differently ("Ġword") from a word at the start of a text."""
    pieces, lo = [], 0
    while len(text) - lo > PIECE_CHARS:
        cut = text.rfind(" ", lo + 1, lo + PIECE_CHARS)
        if cut <= lo:  # no space in reach: go on to the next one, wherever it is
            cut = text.find(" ", lo + PIECE_CHARS)
            if cut < 0:
                break
        pieces.append((lo, text[lo:cut]))
        lo = cut
    pieces.append((lo, text[lo:]))
    return pieces


def _tokenize(contexts: Sequence[str], tokenizer: BertTokenizer) -> list[_Tokens]:
    """Tokens of each context (no special tokens), about ``_BATCH_CHARS`` characters of pieces
    per call to the Rust tokenizer, so its per-token objects never cover more than that."""
    ids: list[list[np.ndarray]] = [[] for _ in contexts]
    spans: list[list[np.ndarray]] = [[] for _ in contexts]

    def flush(batch: list[tuple[int, int, str]]) -> None:
        encodings = tokenizer.backend.encode_batch([p for _, _, p in batch],
                                                   add_special_tokens=False)
        for (c, start, _), enc in zip(batch, encodings):
            ids[c].append(np.asarray(enc.ids, dtype=np.int32))
            spans[c].append(np.asarray(enc.offsets, dtype=np.int32).reshape(-1, 2) + start)

    batch: list[tuple[int, int, str]] = []
    size = 0
    for c, text in enumerate(contexts):
        for start, piece in _pieces(text):
            batch.append((c, start, piece))
            size += len(piece)
            if size >= _BATCH_CHARS:
                flush(batch)
                batch, size = [], 0
    if batch:
        flush(batch)
    return [_Tokens(np.concatenate(i), np.concatenate(s)) for i, s in zip(ids, spans)]


def window_starts(total: int, room: int, step: int) -> Iterator[int]:
    """Token index, in the context, where each window's context part starts: every ``step``
    tokens until a window of ``room`` tokens reaches the end (one window for a short or empty
    context)."""
    start = 0
    while True:
        yield start
        if start + room >= total:
            return
        start += step


def _window_count(total: int, room: int, step: int) -> int:
    return 1 if total <= room else 1 + -(-(total - room) // step)


def check_lengths(max_seq_length: int, doc_stride: int, max_query_length: int) -> None:
    if max_query_length < 1:
        raise ConfigError(f"max_query_length must be >= 1, got {max_query_length}")
    if doc_stride < 1:
        raise ConfigError(f"doc_stride must be >= 1 (the token step between context windows), "
                          f"got {doc_stride}")
    if max_seq_length - 3 - max_query_length < 1:
        raise ConfigError(
            f"max_seq_length {max_seq_length} leaves no room for the context after a question of "
            f"max_query_length {max_query_length} tokens and 3 special tokens; raise "
            "max_seq_length or lower max_query_length"
        )


def _trainable(examples: Sequence[QAExample]) -> list[int]:
    """Indices of examples a training window can be labelled from; warns about the others."""
    keep: list[int] = []
    skipped: list[str] = []
    for i, ex in enumerate(examples):
        if ex.is_impossible or (ex.answers and ex.answers[0].start >= 0):
            keep.append(i)
        else:
            skipped.append(ex.id)
    if skipped:
        log.warning("skipped %d of %d questions for training: their first answer is missing or its "
                    "text does not occur in the context (first ids: %s)", len(skipped),
                    len(examples), ", ".join(skipped[:_SHOWN_IDS]))
    return keep


def _questions(examples: Sequence[QAExample], tokenizer: BertTokenizer,
               max_query_length: int) -> list[np.ndarray]:
    """Token ids of each question, stripped of surrounding whitespace (some SQuAD 2.0 questions
    start with many spaces) and cut to ``max_query_length`` tokens at a character offset, so
    that the cut text is what gets encoded."""
    questions = [ex.question.strip() for ex in examples]
    ids = tokenizer.encode_batch(questions)
    long = [i for i, q in enumerate(ids) if len(q) > max_query_length]
    for i in long:
        questions[i] = tokenizer.truncate_text(questions[i], max_query_length)
    if long:
        for i, q in zip(long, tokenizer.encode_batch([questions[i] for i in long])):
            ids[i] = q
    return [np.asarray(q, dtype=np.int64) for q in ids]


def _answer_chars(ex: QAExample) -> tuple[int, int]:
    """[start, end) of the first answer, trimmed of whitespace so both ends fall inside tokens."""
    answer = ex.answers[0]
    start, end = answer.start, answer.start + len(answer.text)
    while start < end and ex.context[start].isspace():
        start += 1
    while end > start and ex.context[end - 1].isspace():
        end -= 1
    return start, end


def _positions(span: np.ndarray, first: int, chars: tuple[int, int]) -> tuple[int, int]:
    """Token positions of the answer chars in a window whose context tokens have the (C, 2)
    character spans ``span`` and begin at position ``first``; (0, 0) when the answer is not
    wholly inside."""
    char_start, char_end = chars
    if not len(span) or span[0, 0] > char_start or span[-1, 1] < char_end:
        return 0, 0
    s = int(np.searchsorted(span[:, 1], char_start, side="right"))  # first token ending after it
    e = int(np.searchsorted(span[:, 0], char_end, side="left")) - 1  # last token starting before
    if e < s:
        return 0, 0
    return first + s, first + e


class _Rows:
    """The preallocated output arrays, filled one window at a time."""

    def __init__(self, n: int, width: int, pad_id: int) -> None:
        self.ids = np.full((n, width), pad_id, dtype=np.int64)
        self.types = np.zeros((n, width), dtype=np.int64)
        self.mask = np.zeros((n, width), dtype=np.int64)
        self.spans = np.full((n, width, 2), -1, dtype=np.int32)
        self.lengths = np.zeros(n, dtype=np.int64)
        self.is_max = np.zeros((n, width), dtype=bool)
        self.index = np.zeros(n, dtype=np.int64)
        self.positions = np.zeros((n, 2), dtype=np.int64)  # start, end
        self.next = 0

    def add(self, ex_i: int, question: np.ndarray, ctx: _Tokens, lo: int, hi: int,
            max_ctx: np.ndarray, cls_sep: tuple[int, int]) -> int:
        """Write ``[CLS] question [SEP] ctx[lo:hi] [SEP]``; returns its row."""
        r, q, n = self.next, len(question), hi - lo
        first, end = q + 2, q + 3 + n  # first context position, length of the window
        self.ids[r, 0], self.ids[r, 1:q + 1], self.ids[r, q + 1] = cls_sep[0], question, cls_sep[1]
        self.ids[r, first:first + n], self.ids[r, end - 1] = ctx.ids[lo:hi], cls_sep[1]
        self.types[r, first:end] = 1
        self.mask[r, :end] = 1
        self.spans[r, first:first + n] = ctx.spans[lo:hi]
        self.lengths[r] = end
        self.is_max[r, first:first + n] = max_ctx
        self.index[r] = ex_i
        self.next += 1
        return r


def qa_features(examples: Sequence[QAExample], tokenizer: BertTokenizer, *,
                max_seq_length: int = 384, doc_stride: int = 128, max_query_length: int = 64,
                training: bool) -> QAFeatures:
    """Cut every example into windows of ``max_seq_length`` tokens: ``[CLS] question [SEP]
    context part [SEP]``, window starts ``doc_stride`` context tokens apart.

    With ``training`` each window is labelled with the token span of the first answer when it
    lies wholly inside the window's context, else (and for unanswerable questions) with 0, the
    [CLS] position; examples without a usable answer are skipped with one warning. A question
    or context over ``MAX_CONTEXT_CHARS`` characters is a ``DataError`` naming the question id.
    """
    check_lengths(max_seq_length, doc_stride, max_query_length)
    chosen = _trainable(examples) if training else list(range(len(examples)))
    picked = [examples[i] for i in chosen]
    for ex in picked:
        why = too_long(ex.context, "context") or too_long(ex.question, "question")
        if why:
            raise DataError(f"question {ex.id!r}: {why}")
    questions = _questions(picked, tokenizer, max_query_length)
    distinct: dict[str, int] = {}  # context text -> its index in ``contexts``
    where = [distinct.setdefault(ex.context, len(distinct)) for ex in picked]
    contexts = _tokenize(list(distinct), tokenizer)
    rooms = [max_seq_length - 3 - len(q) for q in questions]
    steps = [min(doc_stride, room) for room in rooms]
    total = sum(_window_count(len(contexts[c].ids), room, step)
                for c, room, step in zip(where, rooms, steps))
    rows = _Rows(total, max_seq_length, tokenizer.pad_id)
    for ex_i, ex, q, c, room, step in zip(chosen, picked, questions, where, rooms, steps):
        ctx = contexts[c]
        starts = list(window_starts(len(ctx.ids), room, step))
        sizes = [min(room, len(ctx.ids) - s) for s in starts]
        chars = None if not training or ex.is_impossible else _answer_chars(ex)
        for lo, size, mask in zip(starts, sizes, max_context_masks(starts, sizes)):
            r = rows.add(ex_i, q, ctx, lo, lo + size, mask, (tokenizer.cls_id, tokenizer.sep_id))
            if chars is not None:
                rows.positions[r] = _positions(ctx.spans[lo:lo + size], len(q) + 2, chars)
    features = QAFeatures(input_ids=rows.ids, token_type_ids=rows.types,
                          attention_mask=rows.mask, example_index=rows.index,
                          offsets=WindowOffsets(rows.spans, rows.lengths),
                          token_is_max_context=rows.is_max)
    if training:
        features.start_positions = rows.positions[:, 0].copy()
        features.end_positions = rows.positions[:, 1].copy()
    return features

# ----------------------------------------------------------------------------------------- answers

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
