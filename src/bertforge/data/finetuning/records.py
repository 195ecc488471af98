"""Records of a training file read one at a time: CSV, TSV, JSON Lines or Parquet.

``tables.read_table`` reads a file whole, which suits evaluation sets; embedding and reranker
training sets run to millions of rows, so this reader streams and keeps nothing but the record
it hands out. Formats and their rules are ``tables``' (see its module notes): ``.csv`` with
double-quote quoting (a quoted field may span lines), ``.tsv``/``.txt`` with no quoting at all
(GLUE's convention: a field holds no tab or newline, and quotes are ordinary characters),
``.jsonl``/``.ndjson``/``.json`` one object per line, each optionally ``.gz``; plus ``.parquet``
(needs pyarrow, the ``parquet`` extra). Text is UTF-8 with or without a byte order mark; blank
lines are skipped; CSV/TSV files start with a header line.

Each record is ``(number, fields)``: the 1-based line it starts on (Parquet: its 1-based row),
and its fields by column name in the file's column order. ``place(path, number)`` words it for
messages: ``FILE:LINE``, or ``FILE row N`` for Parquet.
"""

from __future__ import annotations

import codecs
import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertforge.core.jsonfile import parse_json
from bertforge.data.columns import PARQUET_HINT
from bertforge.data.finetuning.tables import SUPPORTED, delimited_records, table_format
from bertforge.errors import DataError, os_error_text

Record = tuple[int, dict[str, Any]]
STREAM_SUPPORTED = f"{SUPPORTED}, or Parquet (.parquet)"


def record_format(path: Path) -> str:
    """"csv", "tsv", "jsonl" or "parquet" from the extension."""
    if path.suffix.lower() == ".parquet":
        return "parquet"
    try:
        return table_format(path)
    except DataError:
        suffix = path.suffix or "(none)"
        raise DataError(f"{path}: cannot tell the format from the extension {suffix!r}; give a "
                        f"file in {STREAM_SUPPORTED}") from None


def place(path: Path, number: int) -> str:
    """Where record ``number`` is, for messages: ``FILE:LINE`` (Parquet: ``FILE row N``)."""
    return f"{path} row {number}" if path.suffix.lower() == ".parquet" else f"{path}:{number}"


def iter_records(path: str | Path) -> Iterator[Record]:
    """The file's records, streamed (see the module notes); ``DataError`` naming ``FILE:LINE``
    for anything malformed. A header line with no rows, or no records at all, yields nothing:
    the caller says what it needed."""
    p = Path(path)
    fmt = record_format(p)
    if not p.exists():
        raise DataError(f"{p}: no such file; check the path")
    if p.is_dir():
        raise DataError(f"{p}: is a directory; give a data file in {STREAM_SUPPORTED}")
    if fmt == "parquet":
        return _parquet_records(p)
    if fmt == "jsonl":
        return _json_records(p)
    return delimited_records(p, _text_lines(p), fmt)


def _text_lines(path: Path) -> Iterator[str]:
    """Decoded lines, each with its line break (csv needs it to join a quoted field's lines)."""
    opener: Any = gzip.open if path.suffix.lower() == ".gz" else open
    number = 0
    try:
        with opener(path, "rb") as raw:
            for number, data in enumerate(raw, start=1):
                if number == 1:
                    data = data.removeprefix(codecs.BOM_UTF8)
                try:
                    yield data.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(f"{path}:{number}: not UTF-8 text (byte "
                                    f"0x{data[exc.start]:02x}); save the file as UTF-8") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(f"{path}: not a complete gzip file (after line {number}: {exc}); "
                        "compress it again or give it uncompressed") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {os_error_text(exc)}") from None


_LINES_HINT = "each line must hold one JSON object (JSON Lines)"


def _json_records(path: Path) -> Iterator[Record]:
    for number, line in enumerate(_text_lines(path), start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        record = parse_json(line, str(path), line=number, hint=_LINES_HINT)
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number}: a JSON {type(record).__name__}, not an object; "
                            "each line must hold one JSON object with named fields")
        yield number, record


def _parquet_records(path: Path) -> Iterator[Record]:
    """Rows of a Parquet file, a record batch at a time (list columns come as Python lists)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow; {PARQUET_HINT}") from None
    import pyarrow as pa

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
        number = 0
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield number, row
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc}); write it again, e.g. "
                        "with pandas' to_parquet or datasets' to_parquet") from None


__all__ = ["PARQUET_HINT", "STREAM_SUPPORTED", "Record", "iter_records", "place",
           "record_format"]
