"""The nine GLUE tasks: what each file holds, its labels and its metrics.

``read_glue`` takes either GLUE's original TSV files or the same data exported with named
columns (CSV, TSV or JSON Lines, as Hugging Face datasets or SuperGLUE write it), so a user can
fine-tune on whichever copy they have. Labels always come out as the task's canonical names
(GLUE's own label strings, in GLUE's order) or a float in [0, 5] for STS-B (another score is an
error naming its line), whatever the file used:

* GLUE's TSVs: CoLA train/dev have no header (source, label, original mark, sentence); CoLA's
  test file has one (index, sentence). MRPC starts with a byte order mark and calls its columns
  "#1 String", "#2 String" and "Quality"; QQP says "is_duplicate", MNLI "gold_label", STS-B
  "score". Quotes in GLUE's TSVs are text, never quoting (see ``tables``).
* Exports: integer labels are Hugging Face class ids, read in the Hugging Face order of the task
  (for MNLI: entailment, neutral, contradiction, unlike GLUE's order); Hugging Face's label
  names (e.g. "acceptable", "not_duplicate") are accepted too. A label of -1 marks a test
  example without a label, as in Hugging Face's test splits.

Task names ignore case, "-" and "_" ("SST-2", "sts_b"). "mnli-m"/"mnli-mm" (and
"mnli_matched"/"mnli_mismatched") name MNLI too: matched or mismatched is the file's choice.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path

from bertforge.core.numbers import ascii_int
from bertforge.data.finetuning.examples import TextExample, unique_ids
from bertforge.data.finetuning.labels import LabelMap
from bertforge.data.finetuning.tables import (
    Row, Table, columns_found, find_column, id_column, label_cell, parse_table, read_text,
    score_label, table_format, text_example,
)
from bertforge.errors import DataError

_PAIR = ("sentence1", "sentence2")
_NLI = ("premise", "hypothesis")
COLA_RAW_COLUMNS = ("source", "label", "original_label", "sentence")


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task.

    ``text_columns`` lists the column choices (one or two text columns each) that files of the
    task use, and ``label_columns`` the names of the label column. ``labels`` are the canonical
    label names in GLUE's order (None for regression); ``hf_labels`` are Hugging Face's label
    names in class-id order. ``positive_label`` is the class that F1 is measured on.
    ``score_range`` is the [low, high] a regression task's labels must lie in.
    """

    name: str
    text_columns: tuple[tuple[str, ...], ...]
    label_columns: tuple[str, ...]
    labels: tuple[str, ...] | None
    hf_labels: tuple[str, ...]
    metrics: tuple[str, ...]
    positive_label: str | None = None
    score_range: tuple[float, float] | None = None

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    def label_map(self) -> LabelMap:
        """The task's class ids, in GLUE's label order."""
        if self.labels is None:
            raise ValueError(f"{self.name} is a regression task: it has no classes")
        return LabelMap(list(self.labels), fixed=True)

    def label_aliases(self) -> dict[str, str]:
        """Every accepted label spelling -> canonical name (Hugging Face names included)."""
        labels = self.labels or ()
        if set(self.hf_labels) == set(labels):
            return {name: name for name in labels}
        # Binary tasks with labels "0"/"1": Hugging Face's class ids follow the same order.
        return {**{name: name for name in labels}, **dict(zip(self.hf_labels, labels))}


_BINARY = ("0", "1")
_ENTAIL = ("entailment", "not_entailment")
GLUE_TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("cola", (("sentence",),), ("label",), _BINARY, ("unacceptable", "acceptable"),
             ("matthews_correlation",)),
    GlueTask("sst2", (("sentence",),), ("label",), _BINARY, ("negative", "positive"),
             ("accuracy",)),
    GlueTask("mrpc", (("#1 String", "#2 String"), _PAIR), ("Quality", "label"), _BINARY,
             ("not_equivalent", "equivalent"), ("accuracy", "f1"), positive_label="1"),
    GlueTask("stsb", (_PAIR,), ("score", "label"), None, (), ("pearson", "spearmanr"),
             score_range=(0.0, 5.0)),
    GlueTask("qqp", (("question1", "question2"),), ("is_duplicate", "label"), _BINARY,
             ("not_duplicate", "duplicate"), ("accuracy", "f1"), positive_label="1"),
    GlueTask("mnli", (_PAIR, _NLI), ("gold_label", "label"),
             ("contradiction", "entailment", "neutral"),
             ("entailment", "neutral", "contradiction"), ("accuracy",)),
    GlueTask("qnli", (("question", "sentence"),), ("label",), _ENTAIL, _ENTAIL, ("accuracy",)),
    GlueTask("rte", (_PAIR, _NLI), ("label",), _ENTAIL, _ENTAIL, ("accuracy",)),
    GlueTask("wnli", (_PAIR, _NLI), ("label",), _BINARY, ("not_entailment", "entailment"),
             ("accuracy",)),
)}
TASK_ALIASES = {"mnlim": "mnli", "mnlimm": "mnli", "mnlimatched": "mnli",
                "mnlimismatched": "mnli"}


def _fold(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch not in "-_ ")


def glue_task(name: str) -> GlueTask:
    """The task called ``name`` (see the module notes for accepted spellings)."""
    key = TASK_ALIASES.get(_fold(name), _fold(name))
    if key in GLUE_TASKS:
        return GLUE_TASKS[key]
    close = difflib.get_close_matches(key, [*GLUE_TASKS, *TASK_ALIASES], n=1, cutoff=0.5)
    hint = f"did you mean {TASK_ALIASES.get(close[0], close[0])!r}? " if close else ""
    raise DataError(f"unknown GLUE task {name!r}; {hint}"
                    f"the GLUE tasks are {', '.join(GLUE_TASKS)}")


def _is_cola_raw(text: str) -> bool:
    """CoLA's train/dev TSVs have no header: their first line is already an example."""
    for line in text.splitlines():
        if line.strip():
            fields = line.split("\t")
            return len(fields) == len(COLA_RAW_COLUMNS) and fields[1].strip() in _BINARY
    return False


def _text_columns(task: GlueTask, table: Table) -> list[str]:
    for choice in task.text_columns:
        found = [find_column(table.columns, name) for name in choice]
        if all(found):
            return [col for col in found if col is not None]
    expected = " or ".join("+".join(choice) for choice in task.text_columns)
    raise DataError(f"{table.path}: not a {task.name} file: it needs the text column(s) "
                    f"{expected} (found: {columns_found(table)}); give the task's own file "
                    "or rename its columns")


def _label(task: GlueTask, table: Table, row: Row, column: str,
           aliases: dict[str, str]) -> str | float | None:
    """The canonical label of ``row``, or None where it has none (no value or -1)."""
    if task.is_regression:
        score = score_label(table, row, column)
        if score is None or score == -1.0:  # -1: a test example without a label
            return None
        low, high = task.score_range or (-math.inf, math.inf)
        if not low <= score <= high:
            raise DataError(f"{table.where(row)}: {task.name} score {score:g} in column "
                            f"{column!r} is outside [{low:g}, {high:g}]; correct the score "
                            "(-1 or an empty value marks an example without one)")
        return score
    text = label_cell(row, column)
    if text is None:
        return None
    if isinstance(text, str) and text in aliases:
        return aliases[text]
    class_id: int | None = None
    if isinstance(text, int) and not isinstance(text, bool):
        class_id = text
    elif isinstance(text, str):
        class_id = ascii_int(text, negative=True)  # "²" and "١" are names, not class ids
    if class_id == -1:
        return None
    if class_id is not None and 0 <= class_id < len(task.hf_labels):
        return aliases[task.hf_labels[class_id]]
    labels = ", ".join(task.labels or ())
    raise DataError(f"{table.where(row)}: label {text!r} is not a label of GLUE task {task.name} "
                    f"(labels: {labels}, or class ids 0-{len(task.hf_labels) - 1} in Hugging "
                    "Face's order); correct the label or check the task name")


def read_glue(path: str | Path, task_name: str, require_labels: bool = True) -> list[TextExample]:
    """The examples of one GLUE file (original TSV or a named-column export; see the module).

    With ``require_labels`` every row must have a label; without it (test files, prediction)
    rows without one get ``label=None``. Ids come from the file's idx/id/index column, else they
    are 0-based row numbers.
    """
    task = glue_task(task_name)
    p = Path(path)
    fmt = table_format(p)
    text = read_text(p)
    raw_cola = task.name == "cola" and fmt == "tsv" and _is_cola_raw(text)
    table = parse_table(p, text, columns=COLA_RAW_COLUMNS if raw_cola else None)
    texts = _text_columns(task, table)
    found = [find_column(table.columns, name) for name in task.label_columns]
    label = next((col for col in found if col is not None), None)
    if label is None and require_labels:
        raise DataError(f"{p}: no label column for {task.name} (looked for "
                        f"{', '.join(task.label_columns)}; found: {columns_found(table)}); "
                        "a test file without labels serves only for prediction")
    ids = id_column(table, [*texts, label])
    aliases = task.label_aliases()
    examples: list[TextExample] = []
    for number, row in enumerate(table.rows):
        value = _label(task, table, row, label, aliases) if label is not None else None
        if value is None and require_labels:
            raise DataError(f"{table.where(row)}: no label in column {label!r} (an empty value "
                            "or -1 marks a test example); training and evaluation need labels")
        examples.append(text_example(table, row, number, ids, texts, value))
    return list(unique_ids(examples))
