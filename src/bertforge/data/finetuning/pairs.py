"""Training and validation files of embedding models (sentence-similarity) and rerankers
(text-ranking), read into one rectangle of texts per file.

Two conventions are understood, in any format ``records`` reads (CSV, TSV, JSON Lines, Parquet):

* **sentence-transformers'**: the text columns, in file order, are the anchor, the positive and
  then the negatives, whatever their names (anchor/positive/negative, query/answer,
  sentence1/sentence2, negative_1..negative_n). A column named ``label`` or ``score`` holds a
  number: with two text columns it is the pair's similarity (CoSENT), with more it is the
  teacher's margin score(positive) - score(negative) (MarginMSE; a list gives one margin per
  negative). Columns named ``id``, ``idx``, ``index`` or ``guid`` are ignored.
* **FlagEmbedding's** JSON objects ``{"query", "pos": [...], "neg": [...], "pos_scores",
  "neg_scores", "prompt"}``, recognised by the ``query`` and ``pos`` fields: one row per
  (query, positive) with all of the object's negatives. A batch is a rectangle, so every row
  keeps the first h negatives, h the fewest any object has (a warning says how many were
  dropped); an object without negatives while others have some is an error, since dropping all
  negatives everywhere would silently change the training objective. ``prompt`` is put in
  front of the query as it is (FlagEmbedding's default "{}{}" instruction format).
  ``pos_scores``/``neg_scores`` give the margins ``pos_scores[j] - neg_scores[k]``.

Every text must be a non-empty string. Errors name ``FILE:LINE`` (Parquet: ``FILE row N``),
the field and what to do. Only the rows are kept; ``max_rows`` stops reading once that many
rows are read (after FlagEmbedding's positives are expanded into rows).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.core.kinds import json_kind
from bertforge.data.finetuning.records import Record, iter_records, place
from bertforge.data.finetuning.tables import ID_COLUMN_CHOICES, find_column
from bertforge.errors import DataError

log = logging.getLogger(__name__)

SCORE_COLUMNS = ("label", "score")


@dataclass(frozen=True)
class TextRows:
    """A file's rows as texts by role; every row has one text per column."""

    columns: tuple[str, ...]
    """Roles in order: ("anchor", "positive", "negative_1", ...), ("sentence1", "sentence2"),
    ("query", "passage") or ("query", "positive", "negative_1", ...)."""
    texts: list[tuple[str, ...]]
    """One tuple per row, one text per column."""
    kind: str
    """"pairs", "triplets" (anchor, positive, >= 1 negatives), "scored" (two texts + a score),
    "pointwise" (query, passage, label) or "listwise" (query, positive, negatives)."""
    scores: np.ndarray | None = None
    """(N,) float32: a scored pair's score, or a pointwise label."""
    margins: np.ndarray | None = None
    """(N, h) float32 teacher margins score(positive) - score(negative_j), for MarginMSE."""
    source: str = ""
    """The file, for messages."""
    lines: list[int] | None = None
    """The line (Parquet: row) each row was read from, for messages."""

    def __len__(self) -> int:
        return len(self.texts)

    def where(self, i: int) -> str:
        """``FILE:LINE`` of row ``i``, for messages."""
        return place(Path(self.source), self.lines[i]) if self.lines else self.source


def read_pairs(path: str | Path, *, max_rows: int | None = None) -> TextRows:
    """Sentence-similarity data: kind "pairs", "triplets" (with ``margins`` when the file has
    a label/score column or FlagEmbedding scores) or "scored" (see the module notes)."""
    return _read(Path(path), max_rows, ranking=False)


def read_ranking(path: str | Path, *, max_rows: int | None = None) -> TextRows:
    """Text-ranking data. Pointwise: two texts and a label in [0, 1] (the columns named
    query/passage or sentence1/sentence2, else the two text columns in file order) -> kind
    "pointwise" with ``scores``. Listwise: query, positive, then negatives (or FlagEmbedding's
    objects) -> kind "listwise", the positive first; with no negative column the batch's other
    passages are the negatives."""
    return _read(Path(path), max_rows, ranking=True)


def _read(path: Path, max_rows: int | None, *, ranking: bool) -> TextRows:
    if max_rows is not None and max_rows < 1:
        raise DataError(f"max_rows={max_rows} must be at least 1 (or unset to read every row)")
    records = iter_records(path)
    with contextlib.closing(records):
        first = next(records, None)
        if first is None:
            raise DataError(f"{path}: no rows; give a file with a header (CSV/TSV) and at "
                            "least one row")
        columns = list(first[1])
        rest = _chain(first, records)
        if find_column(columns, "query") and find_column(columns, "pos"):
            return _flag_rows(path, columns, rest, max_rows, ranking)
        return _column_rows(path, columns, rest, max_rows, ranking)


def _chain(first: Record, rest: Iterator[Record]) -> Iterator[Record]:
    yield first
    yield from rest


# --- sentence-transformers' columns ---------------------------------------------------------

def _score_column(path: Path, columns: list[str]) -> str | None:
    found = [c for c in (find_column(columns, n) for n in SCORE_COLUMNS) if c is not None]
    if len(found) > 1:
        raise DataError(f"{path}: both {found[0]!r} and {found[1]!r} columns; keep one of them "
                        "as the score column (the other would be read as a text)")
    return found[0] if found else None


def _text_columns(path: Path, columns: list[str], score: str | None, ranking: bool) -> list[str]:
    ids = {c for c in (find_column(columns, n) for n in ID_COLUMN_CHOICES) if c is not None}
    texts = [c for c in columns if c != score and c not in ids]
    if len(texts) < 2:
        what = ("a query and a passage (and a label), or a query, a positive and negatives"
                if ranking else "an anchor and a positive, then optional negatives")
        found = ", ".join(map(repr, columns))
        raise DataError(f"{path}: {len(texts)} text column(s) (found: {found}); the columns "
                        f"must hold {what}")
    if ranking and score is not None:
        return _pointwise_columns(path, texts)
    return texts


def _pointwise_columns(path: Path, texts: list[str]) -> list[str]:
    for pair in (("query", "passage"), ("sentence1", "sentence2")):
        named = [find_column(texts, name) for name in pair]
        if named[0] is not None and named[1] is not None:
            texts = [named[0], named[1], *[c for c in texts if c not in named]]
            break
    if len(texts) > 2:
        raise DataError(f"{path}: a label column and {len(texts)} text columns "
                        f"({', '.join(map(repr, texts))}); pointwise ranking data has two "
                        "texts (query, passage) and a label: remove the extra columns, or drop "
                        "the label for listwise data (query, positive, negatives)")
    return texts


def _column_rows(path: Path, columns: list[str], records: Iterator[Record],
                 max_rows: int | None, ranking: bool) -> TextRows:
    score = _score_column(path, columns)
    texts_of = _text_columns(path, columns, score, ranking)
    negatives = len(texts_of) - 2
    texts: list[tuple[str, ...]] = []
    lines: list[int] = []
    values: list[Any] = []
    for number, fields in records:
        where = place(path, number)
        texts.append(tuple(_text(where, fields, c) for c in texts_of))
        lines.append(number)
        if score is not None:
            raw = fields.get(score)
            if ranking:
                values.append(_label(where, raw, score))
            elif negatives == 0:
                values.append(_number(where, raw, score))
            else:
                values.append(_margins(where, raw, score, negatives))
        if max_rows is not None and len(texts) >= max_rows:
            break
    kind, roles = _kind(texts_of, score is not None, ranking)
    array = np.asarray(values, dtype=np.float32) if values else None
    return TextRows(roles, texts, kind, source=str(path), lines=lines,
                    scores=array if array is not None and array.ndim == 1 else None,
                    margins=array if array is not None and array.ndim == 2 else None)


def _kind(texts_of: list[str], scored: bool, ranking: bool) -> tuple[str, tuple[str, ...]]:
    negatives = tuple(f"negative_{j}" for j in range(1, len(texts_of) - 1))
    if ranking:
        if scored:
            return "pointwise", ("query", "passage")
        return "listwise", ("query", "positive", *negatives)
    if len(texts_of) == 2:
        return ("scored", ("sentence1", "sentence2")) if scored else ("pairs",
                                                                      ("anchor", "positive"))
    return "triplets", ("anchor", "positive", *negatives)


def _text(where: str, fields: dict[str, Any], column: str) -> str:
    value = fields.get(column)
    if value is None:
        raise DataError(f"{where}: no value in field {column!r}; every row needs a text there")
    return _checked_text(where, value, column)


def _checked_text(where: str, value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where}: field {field!r} holds {json_kind(value)}, not text; give "
                        "it a string")
    if not value.strip():
        raise DataError(f"{where}: field {field!r} is empty; every text must be a non-empty "
                        "string (fill it in or remove the row)")
    return value


def _number(where: str, value: Any, field: str) -> float:
    """A finite number from JSON or from CSV text."""
    number = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    if not math.isfinite(number):
        shown = "nothing" if value is None or value == "" else repr(value)
        raise DataError(f"{where}: field {field!r} holds {shown}, not a finite number; give "
                        "every row its score")
    return number


def _label(where: str, value: Any, field: str) -> float:
    """A pointwise relevance label: 0/1 or a float in [0, 1] (JSON true/false as 1/0)."""
    label = float(value) if isinstance(value, bool) else _number(where, value, field)
    if not 0.0 <= label <= 1.0:
        raise DataError(f"{where}: label {label:g} in field {field!r} is outside [0, 1]; give "
                        "1 (relevant), 0 (not relevant) or a probability in between")
    return label


def _margins(where: str, value: Any, field: str, negatives: int) -> list[float]:
    """h teacher margins: a number when there is one negative, else a list of h numbers (in CSV
    written as JSON, e.g. "[0.5, 1.2]")."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(value)
    if not isinstance(value, list):
        if negatives != 1:
            raise DataError(f"{where}: field {field!r} holds one number but the row has "
                            f"{negatives} negatives; give a list of {negatives} margins "
                            "score(positive) - score(negative_j)")
        value = [value]
    if len(value) != negatives:
        raise DataError(f"{where}: field {field!r} holds {len(value)} margin(s) for "
                        f"{negatives} negative(s); give one margin per negative")
    return [_number(where, v, field) for v in value]


# --- FlagEmbedding's objects ----------------------------------------------------------------

@dataclass
class _FlagState:
    """What the rows so far say about negatives and scores, for the checks at the end."""

    scored: bool
    fewest: int = -1        # negatives of the object with the fewest
    most: int = 0
    empty_at: str = ""      # where an object without negatives was seen
    full_at: str = ""       # where an object with negatives was seen


def _flag_rows(path: Path, columns: list[str], records: Iterator[Record],
               max_rows: int | None, ranking: bool) -> TextRows:
    names = {n: find_column(columns, n) or n
             for n in ("query", "pos", "neg", "pos_scores", "neg_scores", "prompt")}
    state = _FlagState(scored=find_column(columns, "pos_scores") is not None)
    texts: list[tuple[str, ...]] = []
    lines: list[int] = []
    margins: list[list[float]] = []
    for number, fields in records:
        where = place(path, number)
        query, positives, negatives, pos_scores, neg_scores = _flag_object(where, fields, names,
                                                                           state)
        for j, positive in enumerate(positives):
            texts.append((query, positive, *negatives))
            lines.append(number)
            if state.scored:
                margins.append([pos_scores[j] - s for s in neg_scores])
            if max_rows is not None and len(texts) >= max_rows:
                break
        if max_rows is not None and len(texts) >= max_rows:
            break
    h = _negatives_kept(state)
    dropped = sum(len(row) - 2 - h for row in texts)
    if dropped:
        log.warning("%s: objects have between %d and %d negatives; every row keeps its first "
                    "%d so that batches are rectangles, dropping %d negatives in all (give "
                    "every object the same number to use them all)", path, h, state.most, h,
                    dropped)
    texts = [row[:2 + h] for row in texts]
    kept = (np.asarray([m[:h] for m in margins], dtype=np.float32).reshape(len(texts), h)
            if state.scored and h else None)
    roles = ("query" if ranking else "anchor", "positive",
             *(f"negative_{j}" for j in range(1, h + 1)))
    kind = "listwise" if ranking else ("triplets" if h else "pairs")
    return TextRows(roles, texts, kind, margins=kept, source=str(path), lines=lines)


def _flag_object(where: str, fields: dict[str, Any], names: dict[str, str],
                 state: _FlagState) -> tuple[str, list[str], list[str], list[float], list[float]]:
    """(query with its prompt, positives, negatives, pos_scores, neg_scores) of one object."""
    query = _text(where, fields, names["query"])
    prompt = fields.get(names["prompt"])
    if prompt is not None:
        if not isinstance(prompt, str):
            raise DataError(f"{where}: field {names['prompt']!r} holds {json_kind(prompt)}; "
                            "give the instruction as a string")
        query = prompt + query
    positives = _text_list(where, fields.get(names["pos"]), names["pos"], required=True)
    negatives = _text_list(where, fields.get(names["neg"]), names["neg"], required=False)
    pos_scores: list[float] = []
    neg_scores: list[float] = []
    if state.scored:
        pos_scores = _score_list(where, fields, names["pos_scores"], len(positives))
        neg_scores = _score_list(where, fields, names["neg_scores"], len(negatives))
    elif fields.get(names["pos_scores"]) is not None:
        raise DataError(f"{where}: field {names['pos_scores']!r} is given but the first row "
                        "has none; give scores on every row or on none")
    n = len(negatives)
    state.fewest = n if state.fewest < 0 else min(state.fewest, n)
    state.most = max(state.most, n)
    if n == 0 and not state.empty_at:
        state.empty_at = where
    if n and not state.full_at:
        state.full_at = where
    return query, positives, negatives, pos_scores, neg_scores


def _text_list(where: str, value: Any, field: str, *, required: bool) -> list[str]:
    if value is None:
        if required:
            raise DataError(f"{where}: no field {field!r}; every object needs at least one "
                            "positive text")
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise DataError(f"{where}: field {field!r} holds {json_kind(value)}; give a list of "
                        "strings")
    if required and not value:
        raise DataError(f"{where}: field {field!r} is an empty list; give at least one "
                        "positive text")
    return [_checked_text(where, text, f"{field}[{j}]") for j, text in enumerate(value)]


def _score_list(where: str, fields: dict[str, Any], field: str, count: int) -> list[float]:
    value = fields.get(field)
    if value is None and count == 0:
        return []
    if not isinstance(value, list) or len(value) != count:
        got = "nothing" if value is None else json_kind(value)
        raise DataError(f"{where}: field {field!r} holds {got} where the row's texts need a "
                        f"list of {count} score(s), one per text (scores are given on the "
                        "first row, so every row needs them)")
    return [_number(where, v, f"{field}[{j}]") for j, v in enumerate(value)]


def _negatives_kept(state: _FlagState) -> int:
    """h: the fewest negatives of any object; none at all only if no object has any."""
    if state.empty_at and state.full_at:
        raise DataError(f"{state.empty_at}: no negatives, but other objects have some (e.g. "
                        f"{state.full_at}); give every object at least one negative, or none "
                        "to train on pairs with in-batch negatives")
    return max(state.fewest, 0)


__all__ = ["TextRows", "read_pairs", "read_ranking"]
