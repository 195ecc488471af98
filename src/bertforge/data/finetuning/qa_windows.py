"""The windowed features extractive QA trains and predicts on, with memory bounded by the input.

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
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from bertforge.data.finetuning.examples import QAExample
from bertforge.data.finetuning.qa_postprocess import QAFeatures, WindowOffsets, max_context_masks
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import BertTokenizer

log = logging.getLogger(__name__)
_SHOWN_IDS = 5  # ids named in a warning

# About 1,000 pages of text, a whole book or the longest Wikipedia article; 250 times the
# longest SQuAD paragraph (about 4,000 characters). At BERT's ~4.5 characters a token it is some
# 220,000 tokens, ~1,700 windows of 384 with stride 128: ~20 MB of features and minutes of
# BERT-base on a CPU per question. Longer documents should be split (or retrieved from) first.
MAX_CONTEXT_CHARS = 1_000_000
PIECE_CHARS = 1 << 16  # longer contexts are tokenized in pieces of about this many characters
_BATCH_CHARS = 1 << 20  # characters of context tokenized per call to the Rust tokenizer


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
