"""ROUGE scores of generated summaries, as summarization papers report them.

Scoring goes through Google's ``rouge-score`` package, the maintained re-implementation of the
original ROUGE-1.5.5 Perl script that the BART, PEGASUS and Hugging Face numbers come from:
lower-cased alphanumeric tokens, optionally Porter-stemmed (words longer than three letters),
and F-measures averaged over examples (no bootstrap), shown as percentages.

ROUGE-Lsum (summary-level LCS) compares sentence by sentence and takes sentences to be the
lines of a text; ``rouge-score`` itself does not split them. Reported CNN/DailyMail ROUGE-Lsum
numbers assume one sentence per line, so by default (``lsum_split``) every prediction and
reference is split into sentences first (each line on its own, with
``bertforge.data.segment.split_sentences``) and the sentences joined with newlines. Without it,
a text on one line is one sentence and ROUGE-Lsum equals ROUGE-L. ROUGE-1, -2 and -L ignore
line breaks either way.

With several references for an example, each ROUGE type takes the best-scoring reference
(by F-measure) for that example, as ``rouge-score``'s ``score_multi`` does.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from rouge_score import rouge_scorer

from bertforge.data.finetuning.summarization import (
    STORY_SUFFIX, SUMMARY_COLUMNS, read_summarization, require_column, row_references,
)
from bertforge.data.finetuning.tables import (
    FORMATS, Table, cell_text, id_column, read_table, read_text,
)
from bertforge.data.segment import split_sentences
from bertforge.errors import ConfigError, DataError

log = logging.getLogger(__name__)

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
PREDICTION_COLUMNS = ("prediction", "summary")
_SHOWN_IDS = 5  # missing ids named in an error message


def lsum_text(text: str) -> str:
    """``text`` with one sentence per line: each line split into sentences (blank lines go)."""
    return "\n".join(s for line in text.splitlines() for s in split_sentences(line))


def _reference_lists(references: Sequence[str] | Sequence[Sequence[str]],
                     count: int) -> list[list[str]]:
    """Every example's references as a non-empty list of strings."""
    if isinstance(references, str):
        raise ValueError("references is one string; give one reference (or a list of "
                         "references) per prediction")
    if len(references) != count:
        raise ValueError(f"{count} predictions for {len(references)} references; they must "
                         "pair up")
    lists: list[list[str]] = []
    for i, item in enumerate(references):
        texts = [item] if isinstance(item, str) else item
        if (not isinstance(texts, Sequence) or not texts
                or not all(isinstance(t, str) for t in texts)):
            raise ValueError(f"references[{i}] is {type(item).__name__}, not a string or a "
                             "non-empty sequence of strings")
        lists.append(list(texts))
    return lists


def rouge_scores(predictions: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]],
                 *, use_stemmer: bool = True, lsum_split: bool = True) -> dict[str, float]:
    """Mean ROUGE-1, -2, -L and -Lsum of ``predictions`` against ``references``, x100.

    ``references[i]`` is the reference text of ``predictions[i]``, or a sequence of several.
    Returns the F-measures under ``rouge1``, ``rouge2``, ``rougeL`` and ``rougeLsum``, and the
    precision and recall of the same (best) reference as ``rouge1_precision``,
    ``rouge1_recall`` and so on. ``use_stemmer`` is Porter stemming (on in the published
    CNN/DailyMail and XSum numbers); ``lsum_split`` is explained in the module notes.
    """
    if isinstance(predictions, str):
        raise ValueError("predictions is one string; give a sequence of prediction strings")
    if not predictions:
        raise ValueError("no predictions to score")
    for i, text in enumerate(predictions):
        if not isinstance(text, str):
            raise ValueError(f"predictions[{i}] is {type(text).__name__}, not a string")
    targets = _reference_lists(references, len(predictions))
    whole = rouge_scorer.RougeScorer(list(ROUGE_TYPES[:3]), use_stemmer=use_stemmer)
    summary_level = rouge_scorer.RougeScorer([ROUGE_TYPES[3]], use_stemmer=use_stemmer)
    split: Callable[[str], str] = lsum_text if lsum_split else str
    # (examples, ROUGE types, [precision, recall, F-measure])
    values = np.empty((len(predictions), len(ROUGE_TYPES), 3))
    for i, (prediction, refs) in enumerate(zip(predictions, targets)):
        scores = whole.score_multi(refs, prediction)
        scores.update(summary_level.score_multi([split(r) for r in refs], split(prediction)))
        values[i] = [tuple(scores[name]) for name in ROUGE_TYPES]
    means = values.mean(axis=0) * 100.0
    out = {name: float(means[t, 2]) for t, name in enumerate(ROUGE_TYPES)}
    for t, name in enumerate(ROUGE_TYPES):
        out[f"{name}_precision"] = float(means[t, 0])
        out[f"{name}_recall"] = float(means[t, 1])
    return out


# --------------------------------------------------------------------------- files


def _one_per_line(path: Path) -> bool:
    """Plain text with one summary per line: any file that is not a table or a story (a
    ``.txt`` file is plain text here, not TSV)."""
    suffix = Path(path.stem).suffix if path.suffix.lower() == ".gz" else path.suffix
    return (not path.is_dir() and path.suffix != STORY_SUFFIX
            and (suffix.lower() == ".txt" or suffix.lower() not in FORMATS))


def _lines(path: Path) -> list[str]:
    """The lines of a text file, without their line ends; a final line end adds no line."""
    lines = [line.rstrip("\r\n") for line in io.StringIO(read_text(path), newline="")]
    if not lines:
        raise DataError(f"{path}: the file is empty; write one summary per line")
    return lines


def _unique_ids(table: Table, column: str) -> list[str]:
    """The id of every row; an id given twice is an error naming both lines."""
    seen: dict[str, int] = {}
    ids: list[str] = []
    for row in table.rows:
        value = cell_text(table, row, column)
        if value is None:
            raise DataError(f"{table.where(row)}: no id in column {column!r}; give every row "
                            "an id, or none")
        if value in seen:
            raise DataError(f"{table.where(row)}: id {value!r} was already given on line "
                            f"{seen[value]}; ids must be unique")
        seen[value] = row.line
        ids.append(value)
    return ids


def _no_field(option: str, path: Path, layout: str) -> ConfigError:
    return ConfigError(f"{path}: {option} does not apply to {layout}; leave {option} unset or "
                       "give a CSV, TSV or JSON Lines file")


def _predictions(path: Path, field: str | None) -> tuple[list[str] | None, list[str]]:
    """(ids or None, texts) of a predictions file."""
    if _one_per_line(path):
        if field is not None:
            raise _no_field("prediction_field", path, "a plain-text file (one summary per line)")
        return None, _lines(path)
    table = read_table(path)
    column = require_column(table, field, PREDICTION_COLUMNS, "prediction_field")
    ids = id_column(table, [column])
    texts: list[str] = []
    for row in table.rows:
        text = cell_text(table, row, column)
        if text is None:
            raise DataError(f"{table.where(row)}: no prediction in column {column!r}; write "
                            "one for every example (\"\" for an empty summary)")
        texts.append(text)
    return (_unique_ids(table, ids) if ids is not None else None), texts


def _references(path: Path, field: str | None) -> tuple[list[str] | None, list[tuple[str, ...]]]:
    """(ids or None, reference texts of each example) of a references file or directory."""
    if _one_per_line(path):
        if field is not None:
            raise _no_field("reference_field", path, "a plain-text file (one summary per line)")
        lines = _lines(path)
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                raise DataError(f"{path}:{number}: a blank reference summary; write one "
                                "summary per line, with no blank lines")
        return None, [(line,) for line in lines]
    if path.is_dir() or path.suffix == STORY_SUFFIX:
        if field is not None:
            raise _no_field("reference_field", path, "CNN/DailyMail story files")
        examples = read_summarization(path)
        return [e.id for e in examples], [e.references for e in examples]
    table = read_table(path)
    column = require_column(table, field, SUMMARY_COLUMNS, "reference_field")
    ids = id_column(table, [column])
    references: list[tuple[str, ...]] = []
    for row in table.rows:
        texts = row_references(table, row, column)
        if not texts:
            raise DataError(f"{table.where(row)}: no reference summary in column {column!r}; "
                            "every example needs one")
        references.append(texts)
    return (_unique_ids(table, ids) if ids is not None else None), references


def evaluate_summarization_files(predictions: Path, references: Path, *,
                                 prediction_field: str | None = None,
                                 reference_field: str | None = None) -> dict[str, float | int]:
    """ROUGE (see :func:`rouge_scores`, with its defaults) of a predictions file against a
    references file, plus ``count``, the number of examples scored.

    ``predictions``: JSON Lines, CSV or TSV with the summary in ``prediction_field`` (else a
    ``prediction`` or ``summary`` column) and optionally an ``id`` column; or plain text
    (``.txt`` or any other extension), one summary per line, where an empty line is an empty
    summary. A summary that spans lines (one sentence per line) needs JSON Lines.

    ``references``: anything :func:`read_summarization` reads (a story directory or file, or
    a table whose summary column is ``reference_field``, else one of ``SUMMARY_COLUMNS``; an
    article column is not needed here, and a list in a cell is several references), or plain
    text, one reference per line.

    When both files have ids, predictions are matched to references by id (every reference
    needs a prediction; predictions for other ids are ignored with a warning); otherwise by
    order, and the counts must agree.
    """
    predictions, references = Path(predictions), Path(references)
    pred_ids, texts = _predictions(predictions, prediction_field)
    ref_ids, targets = _references(references, reference_field)
    if pred_ids is not None and ref_ids is not None:
        by_id = dict(zip(pred_ids, texts))
        missing = [i for i in ref_ids if i not in by_id]
        if missing:
            shown = ", ".join(map(repr, missing[:_SHOWN_IDS]))
            more = f" and {len(missing) - _SHOWN_IDS} more" if len(missing) > _SHOWN_IDS else ""
            raise DataError(f"{predictions}: no prediction for {len(missing)} of the "
                            f"{len(ref_ids)} examples of {references}: id {shown}{more}; "
                            "predict every example of the references file")
        unknown = len(pred_ids) - len(ref_ids)  # ids are unique and cover every reference
        if unknown:
            log.warning("%s: %d predictions are for ids not in %s and are ignored",
                        predictions, unknown, references)
        texts = [by_id[i] for i in ref_ids]
    elif len(texts) != len(targets):
        raise DataError(f"{predictions} holds {len(texts)} predictions but {references} holds "
                        f"{len(targets)} references; without ids in both files they pair up by "
                        "order, so the counts must match")
    return {**rouge_scores(texts, targets), "count": len(targets)}


__all__ = ["PREDICTION_COLUMNS", "ROUGE_TYPES", "evaluate_summarization_files", "lsum_text",
           "rouge_scores"]
