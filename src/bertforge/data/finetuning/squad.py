"""SQuAD v1.1 / v2.0 reading (the windowed features and answers are in ``qa``, re-exported here).

Files are UTF-8 (a byte order mark is allowed): the official JSON (``{"version", "data": [article{title, paragraphs[{context,
qas[{id, question, answers[{text, answer_start}], is_impossible}]}]}]}``) or JSON Lines with one
question per line (``id, question, context, answers`` as ``{"text": [...], "answer_start":
[...]}`` or as a list of ``{"text", "answer_start"}``; optional ``title``, ``is_impossible``).

Answer recovery: some exported files have an ``answer_start`` that does not point at the answer
text (a shifted offset after re-encoding the context). Such an answer is moved to the occurrence
of its text nearest to the given start (the earlier one on a tie) and a warning counts them. An
answer whose text does not occur in the context at all keeps ``start = -1``: evaluation still uses
the question (the metric compares gold texts), training skips it.

Refused with the file, the question's place and its id: a missing, blank or repeated id, a
blank question, a context or question over ``MAX_CONTEXT_CHARS`` characters, malformed answers,
and (for training and evaluation) a question without answers that is not marked impossible.
Invalid JSON is reported at ``FILE:LINE:COLUMN``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.core.jsonfile import parse_json
from bertforge.data.finetuning.examples import Answer, QAExample
from bertforge.data.finetuning.qa import (
    MAX_CONTEXT_CHARS,
    QAFeatures,
    QAPredictions,
    postprocess_qa,
    qa_features,
    too_long,
    write_qa_outputs,
)
from bertforge.errors import DataError

__all__ = ["MAX_CONTEXT_CHARS", "Answer", "QAExample", "QAFeatures", "QAPredictions", "SquadData",
           "postprocess_qa", "qa_features", "read_squad", "write_qa_outputs"]

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
            obj = parse_json(line.rstrip("\r"), str(self.path), line=lineno,
                             hint="JSON Lines hold one question object per line")
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
        if not isinstance(qid, str) or not qid.strip():
            raise self.fail(where, 'no "id"; every question needs a unique string id')
        if qid in self.seen:
            raise self.fail(where, f"id {qid!r} was already used at {self.seen[qid]}; ids must "
                            "be unique")
        self.seen[qid] = f"line {where}" if where.isdigit() else where
        for key, value in (("question", raw.get("question")), ("context", context)):
            if not isinstance(value, str):
                raise self.fail(where, f'question {qid!r} has no "{key}" text')
            why = too_long(value, key)
            if why:
                raise self.fail(where, f"question {qid!r}: {why}")
        if not raw["question"].strip():
            raise self.fail(where, f'question {qid!r} is blank; give its "question" text or '
                            "remove it")
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
        text = path.read_text(encoding="utf-8-sig")  # -sig: a byte order mark is dropped
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
    doc = parse_json(text, str(path), hint='expected SQuAD JSON ({"data": [...]}) or JSON '
                     "Lines (one question a line)")
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
