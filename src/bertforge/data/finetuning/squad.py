"""SQuAD v1.1 / v2.0 reading and the windowed features that extractive QA trains and predicts on.

Files are the official JSON (``{"version", "data": [article{title, paragraphs[{context,
qas[{id, question, answers[{text, answer_start}], is_impossible}]}]}]}``) or JSON Lines with one
question per line (``id, question, context, answers`` as ``{"text": [...], "answer_start":
[...]}`` or as a list of ``{"text", "answer_start"}``; optional ``title``, ``is_impossible``).

Answer recovery: some exported files have an ``answer_start`` that does not point at the answer
text (a shifted offset after re-encoding the context). Such an answer is moved to the occurrence
of its text nearest to the given start (the earlier one on a tie) and a warning counts them. An
answer whose text does not occur in the context at all keeps ``start = -1``: evaluation still uses
the question (the metric compares gold texts), training skips it.

``doc_stride`` has the classic SQuAD meaning: the step, in tokens, between the starts of
consecutive context windows. The ``tokenizers`` library's ``stride`` is instead the overlap
between windows; per example we pass ``overlap = context room - doc_stride`` (0 when doc_stride
is at least the room), where the room is the context tokens one window holds next to that
example's question.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data.finetuning.examples import Answer, QAExample
from bertforge.data.finetuning.qa_postprocess import (
    QAFeatures,
    QAPredictions,
    max_context_masks,
    postprocess_qa,
    write_qa_outputs,
)
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import BertTokenizer, Window

__all__ = ["Answer", "QAExample", "QAFeatures", "QAPredictions", "SquadData", "postprocess_qa",
           "qa_features", "read_squad", "write_qa_outputs"]

log = logging.getLogger(__name__)
_SHOWN_IDS = 5  # ids named in a warning


@dataclass
class SquadData:
    """A read file: ``version`` ("1.1" or "2.0"), the examples in file order, and the articles in
    the official layout (the file's own ``data``, or built from JSON Lines) for the metric."""

    version: str
    examples: list[QAExample]
    dataset: list[dict[str, Any]]


class _Reader:
    """What reading one file accumulates: ids seen (for duplicates), answers moved or lost."""

    def __init__(self, path: Path, require_answers: bool) -> None:
        self.path, self.require_answers = path, require_answers
        self.seen: dict[str, str] = {}
        self.moved: list[str] = []
        self.lost: list[str] = []

    def fail(self, where: str, what: str) -> DataError:
        at = f"{self.path}:{where}" if where.isdigit() else f"{self.path}: {where}"  # line or path
        return DataError(f"{at}: {what}")

    def document(self, doc: Any) -> SquadData:
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
            raise DataError(f'{self.path}: no "data" list at the top level; a SQuAD file is '
                            '{"version": ..., "data": [articles]} (or JSON Lines, one question '
                            'per line)')
        v2 = str(doc.get("version", "")).lstrip("v") == "2.0"
        examples: list[QAExample] = []
        for i, article in enumerate(doc["data"]):
            if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
                raise self.fail(f"data[{i}]", 'expected an article object with a "paragraphs" list')
            title = article.get("title") if isinstance(article.get("title"), str) else ""
            for j, par in enumerate(article["paragraphs"]):
                if not isinstance(par, dict) or not isinstance(par.get("qas"), list):
                    raise self.fail(f"data[{i}].paragraphs[{j}]",
                                    'expected a paragraph object with "context" and a "qas" list')
                for k, qa in enumerate(par["qas"]):
                    where = f"data[{i}].paragraphs[{j}].qas[{k}]"
                    examples.append(self.example(qa, par.get("context"), where, title, False))
                    v2 = v2 or "is_impossible" in qa
        return self.finish("2.0" if v2 else "1.1", examples, doc["data"])

    def lines(self, text: str) -> SquadData:
        examples: list[QAExample] = []
        for lineno, line in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 is text
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise self.fail(str(lineno), f"not valid JSON ({exc.msg}); JSON Lines hold one "
                                "question object per line") from None
            if not isinstance(obj, dict):
                raise self.fail(str(lineno), "expected a JSON object with id, question, context")
            title = obj.get("title") if isinstance(obj.get("title"), str) else ""
            examples.append(self.example(obj, obj.get("context"), str(lineno), title, True))
        version = "2.0" if any(ex.is_impossible for ex in examples) else "1.1"
        return self.finish(version, examples, _articles(examples))

    def finish(self, version: str, examples: list[QAExample], dataset: list[Any]) -> SquadData:
        if not examples:
            raise DataError(f"{self.path} holds no questions; check that it is the right file")
        if self.moved:
            log.warning("%s: %d answers did not start at their answer_start and were moved to the "
                        "nearest occurrence of their text (first ids: %s)", self.path,
                        len(self.moved), ", ".join(self.moved[:_SHOWN_IDS]))
        if self.lost:
            log.info("%s: the text of %d answers does not occur in the context; evaluation keeps "
                     "their questions, training skips those whose first answer it is (first ids: "
                     "%s)", self.path, len(self.lost), ", ".join(self.lost[:_SHOWN_IDS]))
        return SquadData(version=version, examples=examples, dataset=dataset)

    def example(self, raw: Any, context: Any, where: str, title: str,
                empty_is_impossible: bool) -> QAExample:
        if not isinstance(raw, dict):
            raise self.fail(where, "expected a question object with id, question and answers")
        qid = raw.get("id")
        qid = str(qid) if isinstance(qid, int) and not isinstance(qid, bool) else qid
        if not isinstance(qid, str) or not qid:
            raise self.fail(where, 'no "id"; every question needs a unique string id')
        if qid in self.seen:
            raise self.fail(where, f"id {qid!r} was already used at {self.seen[qid]}; ids must "
                            "be unique")
        self.seen[qid] = f"line {where}" if where.isdigit() else where
        for key, value in (("question", raw.get("question")), ("context", context)):
            if not isinstance(value, str):
                raise self.fail(where, f'question {qid!r} has no "{key}" text')
        impossible = raw.get("is_impossible")
        if impossible is not None and not isinstance(impossible, bool):
            raise self.fail(where, f'"is_impossible" of {qid!r} must be true or false')
        answers = self.answers(raw.get("answers"), context, where, qid)
        if impossible is None:
            impossible = empty_is_impossible and answers == []
        if self.require_answers and not impossible and not answers:
            raise self.fail(where, f'question {qid!r} has no answers; give it at least one '
                            '{"text", "answer_start"}, or mark it "is_impossible": true '
                            '(SQuAD 2.0)')
        return QAExample(id=qid, question=raw["question"], context=context, answers=answers or [],
                         is_impossible=impossible, title=title)

    def answers(self, raw: Any, context: str, where: str, qid: str) -> list[Answer] | None:
        """The answers (None when the key is absent), each located in the context."""
        if raw is None:
            return None
        if isinstance(raw, dict):  # {"text": [...], "answer_start": [...]}, as in HF datasets
            texts, starts = raw.get("text"), raw.get("answer_start")
            if not (isinstance(texts, list) and isinstance(starts, list)
                    and len(texts) == len(starts)):
                raise self.fail(where, f'answers of {qid!r}: "text" and "answer_start" must be '
                                'lists of the same length')
            pairs = list(zip(texts, starts))
        elif isinstance(raw, list):
            pairs = [(a.get("text"), a.get("answer_start")) if isinstance(a, dict) else (None, None)
                     for a in raw]
        else:
            raise self.fail(where, f'answers of {qid!r} must be a list of {{"text", '
                            '"answer_start"}} objects')
        located = []
        for m, (text, start) in enumerate(pairs):
            if not (isinstance(text, str) and isinstance(start, int)
                    and not isinstance(start, bool) and start >= 0):
                raise self.fail(where, f'answers[{m}] of {qid!r} needs a "text" string and a '
                                'non-negative integer "answer_start"')
            found = _locate(context, text, start)
            if found != start:
                (self.moved if found >= 0 else self.lost).append(qid)
            located.append(Answer(text=text, start=found))
        return located


def _locate(context: str, text: str, start: int) -> int:
    """``start`` if the text is there, else the start of its nearest occurrence (the earlier on a
    tie), else -1; also -1 for a blank text, which no token span can represent."""
    if not text.strip():
        return -1
    if context.startswith(text, start):
        return start
    best, pos = -1, context.find(text)
    while pos >= 0:
        if best < 0 or abs(pos - start) < abs(best - start):
            best = pos
        pos = context.find(text, pos + 1)
    return best


def _articles(examples: list[QAExample]) -> list[dict[str, Any]]:
    """Official-layout articles for JSON Lines: consecutive equal titles form an article and
    consecutive equal contexts a paragraph."""
    articles: list[dict[str, Any]] = []
    for ex in examples:
        if not articles or articles[-1]["title"] != ex.title:
            articles.append({"title": ex.title, "paragraphs": []})
        paragraphs = articles[-1]["paragraphs"]
        if not paragraphs or paragraphs[-1]["context"] != ex.context:
            paragraphs.append({"context": ex.context, "qas": []})
        paragraphs[-1]["qas"].append({
            "id": ex.id, "question": ex.question, "is_impossible": ex.is_impossible,
            "answers": [{"text": a.text, "answer_start": a.start} for a in ex.answers]})
    return articles


def read_squad(path: str | Path, require_answers: bool = True) -> SquadData:
    """Read SQuAD JSON or JSON Lines (by a .jsonl suffix, or when the first line is a whole JSON
    object with more lines after it). ``require_answers=False`` is for prediction: answers may be
    absent. ``DataError`` names the file and the question's place for anything malformed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"SQuAD file {path} does not exist; check the path") from None
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text; SQuAD files are UTF-8 JSON") from None
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None
    if not text.strip():
        raise DataError(f"{path} is empty; expected SQuAD JSON or JSON Lines (one question a line)")
    reader = _Reader(path, require_answers)
    if path.suffix.lower() in (".jsonl", ".jsonlines") or _looks_like_lines(text):
        return reader.lines(text)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); expected SQuAD JSON "
                        '({"data": [...]}) or JSON Lines (one question a line)') from None
    return reader.document(doc)


def _looks_like_lines(text: str) -> bool:
    """True when the first line alone is a JSON object and other lines follow (JSON Lines)."""
    first, _, rest = text.lstrip().partition("\n")
    if not rest.strip():
        return False
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False


def _check_lengths(max_seq_length: int, doc_stride: int, max_query_length: int) -> None:
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
               max_query_length: int) -> tuple[list[str], list[int]]:
    """Questions stripped of surrounding whitespace (some SQuAD 2.0 questions start with many
    spaces) and cut to ``max_query_length`` tokens, with their token counts."""
    questions = [ex.question.strip() for ex in examples]
    lengths = [len(ids) for ids in tokenizer.encode_batch(questions)]
    long = [i for i, n in enumerate(lengths) if n > max_query_length]
    for i in long:
        questions[i] = tokenizer.truncate_text(questions[i], max_query_length)
    if long:  # count again: the cut text is what gets encoded
        for i, ids in zip(long, tokenizer.encode_batch([questions[i] for i in long])):
            lengths[i] = len(ids)
    return questions, lengths


def _answer_chars(ex: QAExample) -> tuple[int, int]:
    """[start, end) of the first answer, trimmed of whitespace so both ends fall inside tokens."""
    answer = ex.answers[0]
    start, end = answer.start, answer.start + len(answer.text)
    while start < end and ex.context[start].isspace():
        start += 1
    while end > start and ex.context[end - 1].isspace():
        end -= 1
    return start, end


def _positions(offsets: list[tuple[int, int]], first: int,
               chars: tuple[int, int]) -> tuple[int, int]:
    """Token positions of the answer chars in a window whose context tokens have ``offsets`` and
    begin at position ``first``; (0, 0) when the answer is not wholly inside."""
    char_start, char_end = chars
    if not offsets or offsets[0][0] > char_start or offsets[-1][1] < char_end:
        return 0, 0
    span = np.asarray(offsets)                   # (C, 2) char spans of the context tokens
    s = int(np.searchsorted(span[:, 1], char_start, side="right"))  # first token ending after it
    e = int(np.searchsorted(span[:, 0], char_end, side="left")) - 1  # last token starting before
    if e < s:
        return 0, 0
    return first + s, first + e


def _encode(questions: list[str], contexts: list[str], lengths: list[int], tokenizer: BertTokenizer,
            max_seq_length: int, doc_stride: int) -> tuple[list[list[Window]], list[int]]:
    """Windows of every (question, context), and each example's window step in tokens.

    One ``encode_windows`` call per distinct overlap: the overlap depends on the question length.
    """
    steps = [min(doc_stride, max_seq_length - 3 - n) for n in lengths]
    groups: dict[int, list[int]] = {}
    for i, (n, step) in enumerate(zip(lengths, steps)):
        groups.setdefault(max_seq_length - 3 - n - step, []).append(i)
    windows: list[list[Window]] = [[] for _ in questions]
    for overlap, members in sorted(groups.items()):
        for w in tokenizer.encode_windows([questions[i] for i in members],
                                          [contexts[i] for i in members],
                                          max_length=max_seq_length, stride=overlap,
                                          truncation="only_second", overflow=True):
            windows[members[w.source]].append(w)
    return windows, steps


def _check_layout(qid: str, wins: list[Window], ctx: list[list[tuple[int, int]]], q_len: int,
                  room: int, step: int) -> None:
    """Fail loudly if ``tokenizers`` did not cut ``[CLS] question [SEP] context [SEP]`` windows
    whose context parts start ``step`` tokens apart: positions and max-context rely on it."""
    for k, w in enumerate(wins):
        fine = w.sequence_ids[1:q_len + 1] == [0] * q_len and w.sequence_ids[q_len + 1] is None
        if k:
            fine = fine and len(ctx[k - 1]) == room and ctx[k][:room - step] == ctx[k - 1][step:]
        if not fine:
            raise RuntimeError(f"the windows of question {qid!r} are not laid out as [CLS] "
                               f"question [SEP] context [SEP] with starts {step} tokens apart; "
                               "the tokenizers library changed its overflow behaviour")


def qa_features(examples: Sequence[QAExample], tokenizer: BertTokenizer, *,
                max_seq_length: int = 384, doc_stride: int = 128, max_query_length: int = 64,
                training: bool) -> QAFeatures:
    """Cut every example into windows of ``max_seq_length`` tokens: ``[CLS] question [SEP]
    context part [SEP]``, window starts ``doc_stride`` context tokens apart.

    With ``training`` each window is labelled with the token span of the first answer when it
    lies wholly inside the window's context, else (and for unanswerable questions) with 0, the
    [CLS] position; examples without a usable answer are skipped with one warning.
    """
    _check_lengths(max_seq_length, doc_stride, max_query_length)
    chosen = _trainable(examples) if training else list(range(len(examples)))
    picked = [examples[i] for i in chosen]
    questions, lengths = _questions(picked, tokenizer, max_query_length)
    windows, steps = _encode(questions, [ex.context for ex in picked], lengths, tokenizer,
                             max_seq_length, doc_stride)

    rows: list[Window] = []
    index: list[int] = []
    offsets: list[list[tuple[int, int] | None]] = []
    max_ctx: list[np.ndarray] = []
    positions: list[tuple[int, int]] = []
    for ex_i, ex, wins, q_len, step in zip(chosen, picked, windows, lengths, steps):
        first = q_len + 2  # position of the first context token: [CLS] question [SEP]
        ctx = [[o for o, sid in zip(w.offsets, w.sequence_ids) if sid == 1] for w in wins]
        _check_layout(ex.id, wins, ctx, q_len, max_seq_length - 3 - q_len, step)
        starts = [k * step for k in range(len(wins))]
        max_ctx.extend(max_context_masks(starts, [len(c) for c in ctx]))
        chars = None if not training or ex.is_impossible else _answer_chars(ex)
        for w, c in zip(wins, ctx):
            rows.append(w)
            index.append(ex_i)
            offsets.append([o if sid == 1 else None for o, sid in zip(w.offsets, w.sequence_ids)])
            positions.append((0, 0) if chars is None else _positions(c, first, chars))

    n = len(rows)
    inputs = tokenizer.pad_windows(rows, max_seq_length)
    is_max = np.zeros((n, max_seq_length), dtype=bool)
    for r, (w, mask) in enumerate(zip(rows, max_ctx)):
        first = w.sequence_ids.index(1) if mask.size else 0
        is_max[r, first:first + mask.size] = mask
    features = QAFeatures(**inputs, example_index=np.asarray(index, dtype=np.int64),
                          offsets=offsets, token_is_max_context=is_max)
    if training:
        pos = np.asarray(positions, dtype=np.int64).reshape(n, 2)  # (N, 2): start, end
        features.start_positions, features.end_positions = pos[:, 0].copy(), pos[:, 1].copy()
    return features
