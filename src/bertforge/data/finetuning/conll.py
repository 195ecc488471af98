"""Token classification data (named entities, chunks, parts of speech).

Two layouts, chosen by the extension:

* JSON Lines (``.jsonl``, ``.ndjson``, ``.json``, optionally ``.gz``): one sentence per line,
  ``{"tokens": [...], "tags": [...]}``. The tags may be called ``ner_tags`` instead (as in
  Hugging Face's conll2003) and may be class ids, which need ``label_names`` (the tag names in
  id order) to become names. A file without tags is unlabeled (prediction).
* Anything else: CoNLL-2003 style text, one token per line with whitespace-separated columns,
  the token first and its tag last, and a blank line between sentences. ``-DOCSTART-`` lines
  are skipped. Every token line of a file has the same number of columns; a file with one column
  holds tokens only (prediction).

Tags are kept as written: whether they are IOB1, IOB2 or BIOES is the task's business. A token
with no visible character (e.g. only a no-break or zero-width space) is an error naming its
line: the tokenizer would drop it and misalign the tags after it.
"""

from __future__ import annotations

import io
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertforge.data.finetuning.examples import TaggedExample, unique_ids
from bertforge.data.finetuning.tables import Row, Table, cell_text, read_table, read_text
from bertforge.errors import DataError

JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
TAG_FIELDS = ("tags", "ner_tags")
DOCSTART = "-DOCSTART-"
# Columns are split at spaces and tabs only: a token may hold other whitespace (a no-break space).
COLUMN_BREAK = re.compile(r"[ \t]+")


def unreadable(token: str) -> bool:
    """True when BERT's tokenizer keeps nothing of ``token``: it drops whitespace, control and
    format characters (a zero-width space) and U+FFFD. Such a word gets no sub-token, so every
    tag after it would land on the word before its own."""
    return not any(not (ch.isspace() or ch == "\ufffd" or unicodedata.category(ch)[0] == "C")
                   for ch in token)


def _blank_token(where: str, token: str, index: int | None = None) -> DataError:
    which = f"token {index} " if index is not None else "the token "
    return DataError(f"{where}: {which}{token!r} has no visible character (only whitespace, "
                     "control or format characters), so the tokenizer drops it and the tags "
                     "after it would shift; remove it and its tag")


def _is_json(path: Path) -> bool:
    suffix = Path(path.stem).suffix if path.suffix.lower() == ".gz" else path.suffix
    return suffix.lower() in JSON_SUFFIXES


def _conll(path: Path) -> list[TaggedExample]:
    """Sentences of a CoNLL-style file; their source is the line of their first token."""
    examples: list[TaggedExample] = []
    tokens: list[str] = []
    tags: list[str] = []
    width, width_line, start = 0, 0, 0

    def flush() -> None:
        if tokens:
            examples.append(TaggedExample(str(len(examples)), list(tokens),
                                          list(tags) if width > 1 else None, f"{path}:{start}"))
            tokens.clear()
            tags.clear()

    for number, line in enumerate(io.StringIO(read_text(path), newline=""), start=1):
        text = line.rstrip("\r\n").strip(" \t")
        fields = COLUMN_BREAK.split(text) if text else []
        if not fields:
            flush()
            continue
        if fields[0] == DOCSTART:
            flush()
            continue
        if not width:
            width, width_line = len(fields), number
        elif len(fields) != width:
            raise DataError(f"{path}:{number}: {len(fields)} column(s) where line {width_line} "
                            f"has {width}; every token line needs the same columns (token "
                            "first, tag last), and sentences are separated by a blank line")
        if unreadable(fields[0]):
            raise _blank_token(f"{path}:{number}", fields[0])
        if not tokens:
            start = number
        tokens.append(fields[0])
        if width > 1:
            tags.append(fields[-1])
    flush()
    if not examples:
        raise DataError(f"{path}: no tokens in the file; give one token per line with its tag "
                        "last, and a blank line between sentences")
    return examples


def _json_tags(table: Table, row: Row, column: str,
               label_names: Sequence[str] | None) -> list[str]:
    where = table.where(row)
    value: Any = row.fields.get(column)
    if not isinstance(value, list):
        raise DataError(f"{where}: {column!r} is not a list; give one tag per token")
    tags: list[str] = []
    for tag in value:
        if isinstance(tag, str):
            tags.append(tag)
        elif isinstance(tag, int) and not isinstance(tag, bool):
            if label_names is None:
                raise DataError(f"{where}: the tags in {column!r} are class ids; give the tag "
                                "names in id order (label_names) to read them")
            if not 0 <= tag < len(label_names):
                raise DataError(f"{where}: tag id {tag} is outside the {len(label_names)} tag "
                                "names given (label_names); correct the tag or the names")
            tags.append(label_names[tag])
        else:
            raise DataError(f"{where}: tag {tag!r} in {column!r} is neither a name nor an id")
    return tags


def _json_lines(path: Path, label_names: Sequence[str] | None) -> list[TaggedExample]:
    table = read_table(path)
    tag_column = next((name for name in TAG_FIELDS if name in table.columns), None)
    id_column = next((name for name in ("id", "idx") if name in table.columns), None)
    examples: list[TaggedExample] = []
    for number, row in enumerate(table.rows):
        where = table.where(row)
        tokens = row.fields.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise DataError(f"{where}: no list of strings in 'tokens' (found fields: "
                            f"{', '.join(map(repr, row.fields)) or 'none'}); give each "
                            "sentence as {\"tokens\": [...], \"tags\": [...]}")
        if not tokens:
            raise DataError(f"{where}: 'tokens' is empty; drop the line or give its tokens")
        blank = next((i for i, token in enumerate(tokens) if unreadable(token)), None)
        if blank is not None:
            raise _blank_token(where, tokens[blank], blank)
        tags: list[str] | None = None
        if tag_column is not None:
            if tag_column not in row.fields:
                raise DataError(f"{where}: no {tag_column!r} field, though other lines have "
                                "one; give every sentence its tags")
            tags = _json_tags(table, row, tag_column, label_names)
            if len(tags) != len(tokens):
                raise DataError(f"{where}: {len(tokens)} tokens but {len(tags)} tags; give "
                                "one tag per token")
        example_id = cell_text(table, row, id_column) if id_column is not None else None
        examples.append(TaggedExample(example_id if example_id is not None else str(number),
                                      tokens, tags, where))
    return list(unique_ids(examples))


def read_token_tags(path: str | Path,
                    label_names: Sequence[str] | None = None) -> list[TaggedExample]:
    """The sentences of a token classification file (see the module notes for layouts).

    ``label_names`` turns JSON tag ids into names; it is needed only when the tags are ids.
    Ids are the file's id/idx field (JSON Lines), else 0-based sentence numbers.
    """
    p = Path(path)
    return _json_lines(p, label_names) if _is_json(p) else _conll(p)
