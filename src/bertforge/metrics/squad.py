"""SQuAD v1.1 and v2.0 scores, with the semantics of the official evaluation scripts.

Reported SQuAD numbers are only comparable when every detail of the scoring agrees: how answers
are normalized, how F1 treats empty answers, what counts as "no answer", and how the best
no-answer threshold is searched. This module reproduces those details; where the official
scripts would crash (a missing prediction in v2.0) we score the question 0 instead, as v1.1 does.

Scores are percentages (0-100), as the official scripts print them. Inputs come either as the
official dev JSON's ``data`` list (:func:`squad_v1_scores`, :func:`squad_v2_scores`), as files
(:func:`evaluate_squad_files`), or as in-memory :class:`SquadQuestion` lists built by the
fine-tuning code (:func:`score_v1`, :func:`score_v2`).
"""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.core.jsonfile import read_json
from bertforge.errors import DataError

log = logging.getLogger(__name__)

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_V2_VERSIONS = ("v2.0", "2.0")


def normalize_answer(text: str) -> str:
    """Lower case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace.

    The order matters ("the." loses its dot first, then is an article), so it is the official one.
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> int:
    """1 when both texts normalize to the same string, else 0."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, *, version_2: bool = False) -> float:
    """Bag-of-tokens F1 between two normalized texts.

    v1.1 scores 0 whenever the texts share no token, even two empty texts; v2.0 needs "no answer"
    to match "no answer", so there an empty side scores 1 exactly when the other is empty too.
    """
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if version_2 and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class SquadQuestion:
    """One scored question: its id and gold answer texts (none for an unanswerable question)."""

    qid: str
    answers: tuple[str, ...]

    @property
    def has_answer(self) -> bool:
        """The official v2.0 rule: answerable means a non-empty ``answers`` list."""
        return bool(self.answers)


def questions_from_dataset(dataset: Any, source: str = "dataset", *,
                           require_answers: bool = False) -> list[SquadQuestion]:
    """Walk the official ``data`` list (articles > paragraphs > qas), checking its shape.

    A malformed entry raises :class:`DataError` naming ``source`` and the entry's position, so the
    user can find it in a file of thousands of questions. ``require_answers`` is v1.1's rule:
    every question has at least one gold answer (the official script would crash otherwise).
    """
    if not isinstance(dataset, list):
        raise DataError(f"{source}: 'data' must be a list of articles, got "
                        f"{type(dataset).__name__}; give a SQuAD dev JSON file")
    questions: list[SquadQuestion] = []
    seen: dict[str, str] = {}  # id -> where it was first used
    for i, article in enumerate(dataset):
        where = f"data[{i}]"
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise DataError(f"{source}: {where}: an article must be an object with a "
                            "'paragraphs' list; fix or remove this article")
        for j, paragraph in enumerate(paragraphs):
            pwhere = f"{where}.paragraphs[{j}]"
            qas = paragraph.get("qas") if isinstance(paragraph, dict) else None
            if not isinstance(qas, list):
                raise DataError(f"{source}: {pwhere}: a paragraph must be an object with a "
                                "'qas' list; fix or remove this paragraph")
            for k, qa in enumerate(qas):
                questions.append(_question(qa, f"{pwhere}.qas[{k}]", source, require_answers))
                if questions[-1].qid in seen:
                    raise DataError(f"{source}: {pwhere}.qas[{k}]: question id "
                                    f"{questions[-1].qid!r} was already used at "
                                    f"{seen[questions[-1].qid]}; ids must be unique")
                seen[questions[-1].qid] = f"{pwhere}.qas[{k}]"
    if not questions:
        raise DataError(f"{source}: the dataset has no questions; give a SQuAD dev JSON file")
    return questions


def _question(qa: Any, where: str, source: str, require_answers: bool) -> SquadQuestion:
    """One ``qas`` entry as a :class:`SquadQuestion`, or a :class:`DataError` saying what is off."""
    if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
        raise DataError(f"{source}: {where}: a question must be an object with a string 'id'; "
                        "fix or remove this question")
    answers = qa.get("answers")
    if not isinstance(answers, list) or not all(
            isinstance(a, dict) and isinstance(a.get("text"), str) for a in answers):
        raise DataError(f"{source}: {where} (id {qa['id']!r}): 'answers' must be a list of "
                        "objects with a string 'text'; fix or remove this question")
    if require_answers and not answers:
        raise DataError(f"{source}: {where} (id {qa['id']!r}): no gold answers, which SQuAD "
                        "v1.1 requires; for unanswerable questions set \"version\": \"v2.0\"")
    return SquadQuestion(qa["id"], tuple(a["text"] for a in answers))


def _check_predictions(questions: Sequence[SquadQuestion],
                       predictions: Mapping[str, str]) -> None:
    """Warn (with counts) about predictions that will score 0 or be ignored."""
    ids = {q.qid for q in questions}
    for qid, text in predictions.items():
        if not isinstance(text, str):
            raise TypeError(f"prediction for {qid!r} is {type(text).__name__}, not str")
    missing = [q.qid for q in questions if q.qid not in predictions]
    if missing:
        log.warning("%d of %d questions have no prediction and score 0 (first: %s)",
                    len(missing), len(questions), missing[0])
    unknown = [qid for qid in predictions if qid not in ids]
    if unknown:
        log.warning("%d predictions are for ids not in the dataset and are ignored (first: %s)",
                    len(unknown), unknown[0])


def score_v1(questions: Sequence[SquadQuestion],
             predictions: Mapping[str, str]) -> dict[str, float]:
    """v1.1 exact match and F1 in percent over all questions, each the max over its golds."""
    _check_predictions(questions, predictions)
    em = f1 = 0.0
    for q in questions:
        if not q.answers:
            raise ValueError(f"question {q.qid!r} has no gold answers; v1.1 needs at least one")
        pred = predictions.get(q.qid)
        if pred is None:
            continue
        em += max(exact_match(pred, gold) for gold in q.answers)
        f1 += max(token_f1(pred, gold) for gold in q.answers)
    return {"exact_match": 100.0 * em / len(questions), "f1": 100.0 * f1 / len(questions)}


def score_v2(questions: Sequence[SquadQuestion], predictions: Mapping[str, str],
             na_probs: Mapping[str, float] | None = None,
             na_prob_thresh: float = 1.0) -> dict[str, float | int]:
    """v2.0 scores in the official key order; the best-threshold keys only with ``na_probs``.

    Without ``na_probs`` every no-answer probability is 0.0, as in the official script, so the
    threshold changes nothing. A missing prediction scores 0 whatever the threshold.
    """
    _check_predictions(questions, predictions)
    if na_probs is not None:
        lacking = [q.qid for q in questions if q.qid in predictions and q.qid not in na_probs]
        if lacking:
            raise ValueError(f"{len(lacking)} predicted questions have no no-answer probability "
                             f"(first: {lacking[0]})")
    probs: Mapping[str, float] = na_probs if na_probs is not None else {}
    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    for q in questions:
        pred = predictions.get(q.qid)
        if pred is None:
            continue
        # Golds that normalize to nothing are dropped; a question left with none has gold "".
        golds = [a for a in q.answers if normalize_answer(a)] or [""]
        exact_raw[q.qid] = float(max(exact_match(pred, g) for g in golds))
        f1_raw[q.qid] = max(token_f1(pred, g, version_2=True) for g in golds)

    def thresholded(raw: dict[str, float]) -> dict[str, float]:
        # Above the threshold the answer becomes "", which is right exactly for no-answer golds.
        return {q.qid: float(not q.has_answer) if probs.get(q.qid, 0.0) > na_prob_thresh
                else raw[q.qid] for q in questions if q.qid in raw}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
    out: dict[str, float | int] = {}
    groups = [("", list(questions)),
              ("HasAns_", [q for q in questions if q.has_answer]),
              ("NoAns_", [q for q in questions if not q.has_answer])]
    for prefix, group in groups:
        if group:
            out[f"{prefix}exact"] = _percent(exact, group)
            out[f"{prefix}f1"] = _percent(f1, group)
            out[f"{prefix}total"] = len(group)
    if na_probs is not None:
        for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
            out[f"best_{name}"], out[f"best_{name}_thresh"] = _best_threshold(
                questions, predictions, raw, na_probs)
    return out


def _percent(scores: Mapping[str, float], group: Sequence[SquadQuestion]) -> float:
    """Mean score of ``group`` in percent; an unscored (unpredicted) question counts 0."""
    return 100.0 * sum(scores.get(q.qid, 0.0) for q in group) / len(group)


def _best_threshold(questions: Sequence[SquadQuestion], predictions: Mapping[str, str],
                    raw: Mapping[str, float], na_probs: Mapping[str, float]) -> tuple[float, float]:
    """The best score over all no-answer thresholds, and the threshold reaching it.

    At a threshold below every probability all answers become "" and exactly the (predicted)
    no-answer questions score 1. Raising the threshold past a question's probability restores
    its answer: an answerable question gains its raw score, an unanswerable one loses its point
    if the restored answer is non-empty. The walk is in ascending probability (stable in
    ``na_probs`` order, as officially); ties are not merged, as officially.
    """
    answerable = {q.qid: q.has_answer for q in questions}
    score = float(sum(1 for q in questions if not q.has_answer and q.qid in raw))
    best, best_thresh = score, 0.0
    for qid in sorted((k for k in na_probs if k in raw), key=lambda k: na_probs[k]):
        if answerable[qid]:
            score += raw[qid]
        elif predictions[qid]:
            score -= 1.0
        if score > best:
            best, best_thresh = score, float(na_probs[qid])
    return 100.0 * best / len(questions), best_thresh


def squad_v1_scores(dataset: list[dict[str, Any]],
                    predictions: Mapping[str, str]) -> dict[str, float]:
    """SQuAD v1.1 ``{"exact_match", "f1"}`` (percent) of ``predictions`` (id -> text)."""
    return score_v1(questions_from_dataset(dataset, require_answers=True), predictions)


def squad_v2_scores(dataset: list[dict[str, Any]], predictions: Mapping[str, str],
                    na_probs: Mapping[str, float] | None = None,
                    na_prob_thresh: float = 1.0) -> dict[str, float | int]:
    """SQuAD v2.0 scores (percent; see :func:`score_v2`) of ``predictions`` (id -> text)."""
    return score_v2(questions_from_dataset(dataset), predictions, na_probs, na_prob_thresh)


def _load_json(path: Path, what: str) -> Any:
    """Parse a JSON file (``bertforge.core.jsonfile``: a byte-order mark dropped, errors at
    ``FILE:LINE:COLUMN``, a key given twice refused with both places: two predictions for one
    question id are one too many) as a one-line :class:`DataError`."""
    if not Path(path).exists():
        raise DataError(f"{path}: no such file; give the {what}")
    return read_json(path, hint=f"give the {what} as a JSON file")


def _is_v2(doc: dict[str, Any], path: Path) -> bool:
    """v2.0 when the file says so or when any question carries ``is_impossible``."""
    version = doc.get("version")
    if version in _V2_VERSIONS:
        return True
    if version not in (None, "1.1", "v1.1"):
        log.warning("%s: unknown SQuAD version %r; telling v1.1 from v2.0 by 'is_impossible'",
                    path, version)
    # The shape is checked later, with positions in the messages; here anything odd is skipped.
    def items(obj: Any, key: str) -> list[Any]:
        value = obj.get(key) if isinstance(obj, dict) else None
        return value if isinstance(value, list) else []

    return any(isinstance(qa, dict) and "is_impossible" in qa
               for article in items(doc, "data")
               for paragraph in items(article, "paragraphs")
               for qa in items(paragraph, "qas"))


def evaluate_squad_files(data: Path, predictions: Path,
                         na_probs: Path | None = None) -> dict[str, float | int]:
    """Score a predictions file (id -> text) against an official SQuAD dev file.

    The version comes from the dev file; v1.1 returns ``{"exact_match", "f1"}``, v2.0 the
    official v2.0 keys (with the best-threshold search when a null-odds file is given). A
    no-answer probability file for v1.1 data is ignored with a warning, since v1.1 has no
    unanswerable questions.
    """
    doc = _load_json(data, "SQuAD dev file")
    if not isinstance(doc, dict) or "data" not in doc:
        raise DataError(f"{data}: expected a JSON object with a 'data' list (the official SQuAD "
                        "dev format)")
    v2 = _is_v2(doc, data)
    questions = questions_from_dataset(doc["data"], str(data), require_answers=not v2)

    preds = _load_json(predictions, "predictions file")
    if not isinstance(preds, dict):
        raise DataError(f"{predictions}: expected a JSON object mapping question id to answer "
                        f"text, got {type(preds).__name__}")
    for qid, text in preds.items():
        if not isinstance(text, str):
            raise DataError(f"{predictions}: the prediction for id {qid!r} is "
                            f"{type(text).__name__}, not a string; write answers as text (\"\" "
                            "for no answer)")
    if not v2:
        if na_probs is not None:
            log.warning("%s: SQuAD v1.1 data has no unanswerable questions; ignoring %s",
                        data, na_probs)
        return score_v1(questions, preds)

    probs = None
    if na_probs is not None:
        probs = _load_json(na_probs, "no-answer probability file")
        if not isinstance(probs, dict):
            raise DataError(f"{na_probs}: expected a JSON object mapping question id to a "
                            f"no-answer probability, got {type(probs).__name__}")
        for qid, p in probs.items():
            if isinstance(p, bool) or not isinstance(p, (int, float)):
                raise DataError(f"{na_probs}: the value for id {qid!r} is {p!r}, not a number")
        lacking = [q.qid for q in questions if q.qid in preds and q.qid not in probs]
        if lacking:
            raise DataError(f"{na_probs}: {len(lacking)} predicted questions have no no-answer "
                            f"probability (first: id {lacking[0]!r}); write one for each "
                            "prediction")
    return score_v2(questions, preds, probs)
