"""Reading tables (CSV, TSV, JSON Lines) of fine-tuning data, and classification data from them.

Fine-tuning sets are small (at most a few hundred MB), so a file is read whole: that lets every
row keep its line number and lets the whole file be checked before anything is built from it.
The format comes from the extension, after an optional ``.gz``:

* ``.csv``: comma-separated with standard double-quote quoting (fields may span lines);
* ``.tsv`` and ``.txt``: tab-separated with no quoting at all, because GLUE's TSVs (and the
  Microsoft paraphrase ``.txt`` files MRPC comes from) hold unbalanced quotes inside unquoted
  text. A field cannot contain a tab or a newline;
* ``.jsonl``, ``.ndjson`` and ``.json``: JSON Lines, one object per line (a ``.json`` file is
  JSON Lines too, as Hugging Face datasets' ``to_json`` writes it).

CSV and TSV files start with a header line unless the caller gives the column names. A UTF-8
byte order mark is dropped. Blank lines are skipped. Errors name ``FILE:LINE`` (invalid JSON:
``FILE:LINE:COLUMN``, the column counted in characters from 1).
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import math
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.core.jsonfile import parse_json
from bertforge.data.finetuning.examples import TextExample, unique_ids
from bertforge.errors import DataError, os_error_text

FORMATS = {".csv": "csv", ".tsv": "tsv", ".txt": "tsv",
           ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
SUPPORTED = "CSV (.csv), TSV (.tsv .txt) or JSON Lines (.jsonl .ndjson .json), optionally .gz"
MAX_FIELD_CHARS = 1 << 26  # csv's default limit (128 KiB) is below some long passages


@dataclass(frozen=True)
class Row:
    """One record: its 1-based line number (where the record starts) and its fields by column."""

    line: int
    fields: dict[str, Any]


@dataclass(frozen=True)
class Table:
    """A whole file's records; ``columns`` in file order (JSON Lines: order of first use)."""

    path: Path
    format: str
    columns: list[str]
    rows: list[Row]

    def where(self, row: Row) -> str:
        """``FILE:LINE`` of a row, for messages and ``source`` fields."""
        return f"{self.path}:{row.line}"


def table_format(path: str | Path) -> str:
    """"csv", "tsv" or "jsonl", from the extension (a trailing .gz is looked through)."""
    p = Path(path)
    suffix = Path(p.stem).suffix if p.suffix.lower() == ".gz" else p.suffix
    fmt = FORMATS.get(suffix.lower())
    if fmt is None:
        raise DataError(f"{p}: cannot tell the format from the extension {suffix or '(none)'!r}; "
                        f"give a file in {SUPPORTED}")
    return fmt


def _line_of(data: bytes, offset: int) -> int:
    """1-based line number of byte ``offset`` (LF, CRLF and lone CR end lines)."""
    before = data[:offset]
    lines = len(before.splitlines())
    return lines + 1 if not before or before.endswith((b"\n", b"\r")) else lines


def read_text(path: str | Path) -> str:
    """A whole UTF-8 file (optionally gzip-compressed) as text, without a byte order mark."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file; check the path")
    if p.is_dir():
        raise DataError(f"{p}: is a directory; give a data file in {SUPPORTED}")
    try:
        data = p.read_bytes()
        if p.suffix.lower() == ".gz":
            data = gzip.decompress(data)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(f"{p}: not a complete gzip file ({exc}); "
                        "compress it again or give it uncompressed") from None
    except OSError as exc:
        raise DataError(f"{p}: cannot read: {os_error_text(exc)}") from None
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = _line_of(data, exc.start)
        raise DataError(f"{p}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                        "save the file as UTF-8") from None


def _no_rows(path: Path, header: bool) -> DataError:
    what = "has a header line but no rows" if header else "is empty"
    return DataError(f"{path}: the file {what}; give a file with at least one example")


def delimited_records(path: Path, lines: Iterable[str], fmt: str,
                      columns: Sequence[str] | None = None) -> Iterator[tuple[int, dict]]:
    """(start line, {column: field}) of each CSV or TSV record of ``lines`` (a file's text,
    read as a stream); the first record is the header unless ``columns`` names them, and every
    record must have its width. Blank lines are skipped."""
    csv.field_size_limit(max(csv.field_size_limit(), MAX_FIELD_CHARS))
    options: dict[str, Any] = (
        {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if fmt == "tsv" else {"strict": True})
    reader = csv.reader(lines, **options)
    names: list[str] | None = list(columns) if columns is not None else None
    header_line = 0
    while True:
        start = reader.line_num + 1
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DataError(f"{path}:{start}: not valid CSV ({exc}); check the quoting of the "
                            "fields on this line") from None
        if not record or (len(record) == 1 and not record[0].strip()):
            continue  # a blank line
        if names is None:
            names, header_line = _header(path, start, record), start
            continue
        if len(record) != len(names):
            origin = f"the header (line {header_line})" if header_line else "this file's layout"
            sep = "tab" if fmt == "tsv" else "comma"
            count = f"{len(record)} field{'' if len(record) == 1 else 's'}"
            raise DataError(f"{path}:{start}: {count} where {origin} has "
                            f"{len(names)} columns; check for a missing or extra {sep} "
                            "on this line")
        yield start, dict(zip(names, record))


def _header(path: Path, line: int, record: list[str]) -> list[str]:
    names = [name.strip() for name in record]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DataError(f"{path}:{line}: the header names column(s) "
                        f"{', '.join(map(repr, repeated))} more than once; give each column its "
                        "own name")
    return names


def _delimited(path: Path, text: str, fmt: str, columns: Sequence[str] | None) -> Table:
    """CSV or TSV records with their start lines; every record must have the header's width."""
    rows = [Row(line, fields) for line, fields in
            delimited_records(path, io.StringIO(text, newline=""), fmt, columns)]
    if not rows:  # a header alone, or nothing
        raise _no_rows(path, header=bool(text.strip()) and columns is None)
    names = list(columns) if columns is not None else list(rows[0].fields)
    return Table(path, fmt, names, rows)


_LINES_HINT = "each line must hold one JSON object (JSON Lines)"


def _json_lines(path: Path, text: str) -> Table:
    """One JSON object per non-blank line."""
    columns: dict[str, None] = {}
    rows: list[Row] = []
    for number, line in enumerate(io.StringIO(text, newline=""), start=1):
        # Without its line break: json would report an error at the end of the line (an
        # unclosed object) at column 1 of the next line.
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        try:
            record = parse_json(line, str(path), line=number, hint=_LINES_HINT)
        except DataError as exc:
            if rows or not _is_one_document(text):
                raise
            raise DataError(str(exc).replace(_LINES_HINT, "the file is one JSON document; "
                                             "write one object per line (JSON Lines) "
                                             "instead")) from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number}: a JSON {type(record).__name__}, not an object; "
                            "each line must hold one JSON object with named fields")
        columns.update(dict.fromkeys(record))
        rows.append(Row(number, record))
    if not rows:
        raise _no_rows(path, header=False)
    return Table(path, "jsonl", list(columns), rows)


def _is_one_document(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def read_table(path: str | Path, *, columns: Sequence[str] | None = None) -> Table:
    """All records of a CSV, TSV or JSON Lines file (see the module notes for formats).

    ``columns`` names the fields of a CSV/TSV file that has no header line.
    """
    p = Path(path)
    return parse_table(p, read_text(p), columns=columns)


def parse_table(path: Path, text: str, *, columns: Sequence[str] | None = None) -> Table:
    """``read_table`` on text already read, for callers that look at the text first."""
    fmt = table_format(path)
    return _json_lines(path, text) if fmt == "jsonl" else _delimited(path, text, fmt, columns)


def find_column(columns: Sequence[str], name: str) -> str | None:
    """The column called ``name``: exactly, else ignoring case."""
    if name in columns:
        return name
    folded = [c for c in columns if c.lower() == name.lower()]
    return folded[0] if folded else None


def columns_found(table: Table) -> str:
    """The table's columns for an error message."""
    return ", ".join(repr(c) for c in table.columns) or "none"


def cell_text(table: Table, row: Row, column: str) -> str | None:
    """A field as text; None when the row has no value there (absent, JSON null)."""
    value = row.fields.get(column)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise DataError(f"{table.where(row)}: column {column!r} holds a JSON "
                    f"{type(value).__name__}, not text; give it a string")


def required_text(table: Table, row: Row, column: str) -> str:
    """A text field that must be present (it may be the empty string)."""
    text = cell_text(table, row, column)
    if text is None:
        raise DataError(f"{table.where(row)}: no value in column {column!r}; every row needs one")
    return text


def class_label(value: Any) -> str | None:
    """A classification label as its name: JSON 1 and 1.0 and CSV "1" all read as "1"."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    return text or None


def label_cell(row: Row, column: str) -> Any:
    """A label cell as an int (JSON 1.0 -> 1), stripped text, or None when it is empty."""
    raw: Any = row.fields.get(column)
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    text = raw.strip() if isinstance(raw, str) else raw
    return None if text is None or text == "" else text


def text_example(table: Table, row: Row, number: int, ids: str | None, texts: Sequence[str],
                 label: str | float | None) -> TextExample:
    """One row as a ``TextExample``: its id column's value (else its row number), its one or
    two text columns, and ``label``. One of a pair may be blank, not both."""
    example_id = cell_text(table, row, ids) if ids is not None else None
    text_a = required_text(table, row, texts[0])
    text_b = required_text(table, row, texts[1]) if len(texts) > 1 else None
    if not text_a.strip() and not (text_b or "").strip():
        raise DataError(f"{table.where(row)}: no text in column(s) "
                        f"{', '.join(map(repr, texts))}; every example needs some text (is a "
                        "column shifted, or the row empty?)")
    return TextExample(id=example_id if example_id is not None else str(number),
                       text_a=text_a, text_b=text_b, label=label, source=table.where(row))


def score_label(table: Table, row: Row, column: str) -> float | None:
    """A regression target: a finite number, or None when the row has none."""
    value = row.fields.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        score = float(value)
    except (TypeError, ValueError):
        score = math.nan
    if isinstance(value, bool) or not math.isfinite(score):
        raise DataError(f"{table.where(row)}: label {value!r} in column {column!r} is not a "
                        "finite number, as a regression target must be")
    return score


# Text columns tried when none are given, best first. Pairs come before single columns so that
# a question+sentence file is not read as its sentence alone.
TEXT_COLUMN_CHOICES: tuple[tuple[str, ...], ...] = (
    ("sentence1", "sentence2"), ("premise", "hypothesis"), ("question", "sentence"),
    ("question1", "question2"), ("question", "passage"), ("text_a", "text_b"),
    ("sentence",), ("text",), ("text_a",),
)
LABEL_COLUMN_CHOICES = ("label", "labels", "score", "target", "class")
ID_COLUMN_CHOICES = ("id", "idx", "index", "guid")


def _text_columns(table: Table, given: Sequence[str] | None) -> list[str]:
    if given is not None:
        if not 1 <= len(given) <= 2:
            raise DataError(f"data.text_columns names {len(given)} columns; give one (single "
                            "texts) or two (text pairs)")
        found = [find_column(table.columns, name) for name in given]
        missing = [name for name, col in zip(given, found) if col is None]
        if missing:
            raise DataError(f"{table.path}: no column {', '.join(map(repr, missing))} "
                            f"(found: {columns_found(table)}); fix data.text_columns")
        return [col for col in found if col is not None]
    for choice in TEXT_COLUMN_CHOICES:
        found = [find_column(table.columns, name) for name in choice]
        if all(found):
            return [col for col in found if col is not None]
    raise DataError(f"{table.path}: cannot tell which columns hold the text (found: "
                    f"{columns_found(table)}); set data.text_columns to the one or two text "
                    "columns, and data.label_column to the label column")


def _label_column(table: Table, given: str | None, require: bool, taken: list[str]) -> str | None:
    if given is not None:
        column = find_column(table.columns, given)
        if column is None and require:
            raise DataError(f"{table.path}: no column {given!r} (found: {columns_found(table)}); "
                            "fix data.label_column")
        return column
    for name in LABEL_COLUMN_CHOICES:
        column = find_column(table.columns, name)
        if column is not None and column not in taken:
            return column
    if require:
        raise DataError(f"{table.path}: no label column (looked for "
                        f"{', '.join(LABEL_COLUMN_CHOICES)}; found: {columns_found(table)}); "
                        "set data.label_column to the column that holds the labels")
    return None


def id_column(table: Table, taken: Sequence[str | None]) -> str | None:
    """A column of example ids (id, idx, index, guid) that is not used for anything else."""
    for name in ID_COLUMN_CHOICES:
        column = find_column(table.columns, name)
        if column is not None and column not in taken:
            return column
    return None


def read_classification(path: str | Path, text_columns: Sequence[str] | None = None,
                        label_column: str | None = None, regression: bool = False,
                        require_labels: bool = True) -> list[TextExample]:
    """The user's own sentence (pair) classification or regression data.

    Without ``text_columns`` the first of ``TEXT_COLUMN_CHOICES`` present is used, and without
    ``label_column`` the first of ``LABEL_COLUMN_CHOICES``. Labels are names (str) or, with
    ``regression``, floats. With ``require_labels=False`` (prediction) a missing label column or
    value gives ``label=None``. An example's id is its id/idx/index/guid field if the table has
    one, else its 0-based row number.
    """
    table = read_table(path)
    texts = _text_columns(table, text_columns)
    label = _label_column(table, label_column, require_labels, texts)
    ids = id_column(table, [*texts, label])
    examples: list[TextExample] = []
    for number, row in enumerate(table.rows):
        value: str | float | None = None
        if label is not None:
            value = (score_label(table, row, label) if regression
                     else class_label(row.fields.get(label)))
            if value is None and require_labels:
                raise DataError(f"{table.where(row)}: no label in column {label!r}; every "
                                "training and evaluation example needs one")
        examples.append(text_example(table, row, number, ids, texts, value))
    return list(unique_ids(examples))
