"""SWAG: pick the most plausible continuation of a video caption out of four.

SWAG's original CSVs (train.csv, val.csv, test.csv) have the columns video-id, fold-ind,
startphrase, sent1, sent2, gold-source, ending0..ending3 and label (not in test.csv), after an
unnamed index column written by pandas. ``sent1`` is the context and ``sent2`` the first words
of the continuation, which each ending completes. The same columns in a JSON Lines or TSV export
(Hugging Face's "swag" dataset) read the same way.
"""

from __future__ import annotations

from pathlib import Path

from bertforge.core.numbers import ascii_int
from bertforge.data.finetuning.examples import ChoiceExample, unique_ids
from bertforge.data.finetuning.tables import (
    Row, Table, cell_text, columns_found, find_column, label_cell, read_table, required_text,
)
from bertforge.errors import DataError

ID_COLUMNS = ("id", "idx", "")  # "" is the unnamed index column pandas writes first
MIN_ENDINGS = 2


def _endings(table: Table) -> list[str]:
    """ending0, ending1, ... as far as they go without a gap."""
    columns: list[str] = []
    while (column := find_column(table.columns, f"ending{len(columns)}")) is not None:
        columns.append(column)
    return columns


def _choice(table: Table, row: Row, column: str, count: int) -> int | None:
    """The label as an ending index; None where the row has none."""
    text = label_cell(row, column)
    if text is None:
        return None
    number = ascii_int(text, negative=True) if isinstance(text, str) else None
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif number is not None:
        value = number
    else:
        value = count  # not a number: reported below like an index out of range
    if value == -1:
        return None  # Hugging Face's mark of an unlabeled test example
    if not 0 <= value < count:
        raise DataError(f"{table.where(row)}: label {text!r} is not an ending number 0-{count - 1}; "
                        "give the index of the right ending")
    return value


def read_swag(path: str | Path, require_labels: bool = True) -> list[ChoiceExample]:
    """The multiple-choice examples of a SWAG file.

    With ``require_labels`` every row must say which ending is right (column ``label``); without
    it (test.csv, prediction) rows without one get ``label=None``. A blank ending, or a blank
    sent1 together with a blank sent2, is an error naming the line.
    """
    table = read_table(path)
    context, start = find_column(table.columns, "sent1"), find_column(table.columns, "sent2")
    endings = _endings(table)
    missing = [name for name, col in (("sent1", context), ("sent2", start)) if col is None]
    if len(endings) < MIN_ENDINGS:
        missing += [f"ending{i}" for i in range(len(endings), MIN_ENDINGS)]
    if missing or context is None or start is None:
        raise DataError(f"{table.path}: not a SWAG file: no column(s) {', '.join(missing)} "
                        f"(found: {columns_found(table)}); SWAG files need sent1, sent2, "
                        "ending0, ending1, ... and label")
    label = find_column(table.columns, "label")
    if label is None and require_labels:
        raise DataError(f"{table.path}: no column 'label' (found: {columns_found(table)}); "
                        "a test file without labels serves only for prediction")
    ids = next((c for c in (find_column(table.columns, n) for n in ID_COLUMNS) if c is not None),
               None)
    examples: list[ChoiceExample] = []
    for number, row in enumerate(table.rows):
        value = _choice(table, row, label, len(endings)) if label is not None else None
        if value is None and require_labels:
            raise DataError(f"{table.where(row)}: no label; training and evaluation need the "
                            "index of the right ending")
        example_id = cell_text(table, row, ids) if ids is not None else None
        examples.append(ChoiceExample(
            id=example_id if example_id else str(number),
            context=required_text(table, row, context),
            start=required_text(table, row, start),
            endings=[_ending(table, row, column) for column in endings],
            label=value, source=table.where(row)))
        if not (examples[-1].context.strip() or examples[-1].start.strip()):
            raise DataError(f"{table.where(row)}: sent1 and sent2 are both blank; an example "
                            "needs the text its endings continue")
    return list(unique_ids(examples))


def _ending(table: Table, row: Row, column: str) -> str:
    text = required_text(table, row, column)
    if not text.strip():
        raise DataError(f"{table.where(row)}: {column} is blank; every ending needs text "
                        "(is a column shifted?)")
    return text
