"""Reading a retrieval benchmark in the BEIR layout (the layout of BEIR, MTEB's retrieval sets
and most IR datasets on the Hugging Face Hub).

A BEIR directory holds::

    corpus.jsonl        one document per line: {"_id": "...", "title": "...", "text": "..."}
    queries.jsonl       one query per line: {"_id": "...", "text": "..."}
    qrels/<split>.tsv   query-id <TAB> corpus-id <TAB> score, after a header line

A document's text is its title and text joined with one space when the title is non-empty, as
BEIR's sentence-transformers models read it. Only the queries the split judges are kept. A
corpus is read line by line (never whole: MS MARCO's is 3 GB), but its texts are kept in
memory: the evaluation embeds them block by block. Errors name ``FILE:LINE`` and the field.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.core.jsonfile import parse_json
from bertforge.core.kinds import json_kind
from bertforge.core.numbers import ascii_int
from bertforge.errors import DataError, os_error_text

LAYOUT = "corpus.jsonl, queries.jsonl and qrels/<split>.tsv"
_QRELS_HEADER = ("query-id", "corpus-id", "score")


@dataclass(frozen=True)
class BeirData:
    """One split of a BEIR dataset: ``corpus`` (document id -> text), ``queries`` (query id ->
    text, only the queries of the split's qrels) and ``qrels`` (query id -> document id ->
    relevance grade)."""

    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its break) of a UTF-8 text file, streamed; a byte
    order mark is dropped; bytes that are not UTF-8 are a ``DataError`` naming the line."""
    number = 0
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            for number, line in enumerate(handle, start=1):
                yield number, line.rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}:{number + 1}: not UTF-8 text ({exc.reason}); save the file as "
                        "UTF-8") from None
    except OSError as exc:
        raise DataError(f"cannot read {path}: {os_error_text(exc)}") from None


def _field(record: Any, name: str, where: str, required: bool = True) -> str:
    """A string field of one JSON record (a whole-number id is taken as its digits); an absent
    or null optional field is ""."""
    value = record.get(name)
    if value is None and not required:
        return ""
    if name == "_id" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        what = "missing" if value is None else f"{json_kind(value)}, not a string"
        raise DataError(f"{where}: field {name!r} is {what}; each line needs {name!r} as a "
                        "string")
    if name == "_id" and not value.strip():
        raise DataError(f"{where}: field '_id' is empty; give every record an id")
    return value


def _records(path: Path, what: str) -> Iterator[tuple[str, Any]]:
    """(``FILE:LINE``, JSON object) for each non-blank line of a JSON Lines file."""
    for number, line in text_lines(path):
        if not line.strip():
            continue
        record = parse_json(line, str(path), line=number,
                            hint=f"{path.name} holds one JSON object per line ({what})")
        where = f"{path}:{number}"
        if not isinstance(record, dict):
            raise DataError(f"{where}: {json_kind(record)}, not a JSON object; each line of "
                            f"{path.name} is one object ({what})")
        yield where, record


def _add(table: dict[str, str], key: str, value: str, where: str, first: dict[str, str]) -> None:
    if key in table:
        raise DataError(f"{where}: id {key!r} was already given at {first[key]}; give each "
                        "record its own id")
    table[key] = value
    first[key] = where


def read_corpus(path: str | os.PathLike[str]) -> dict[str, str]:
    """A BEIR ``corpus.jsonl``: document id -> title and text joined by one space (the text
    alone when the title is empty or absent)."""
    path = Path(path)
    corpus: dict[str, str] = {}
    first: dict[str, str] = {}
    for where, record in _records(path, '{"_id", "title", "text"}'):
        title = _field(record, "title", where, required=False)
        text = _field(record, "text", where)
        _add(corpus, _field(record, "_id", where), f"{title} {text}" if title else text, where,
             first)
    if not corpus:
        raise DataError(f"{path} holds no documents; a BEIR corpus has one JSON object per line")
    return corpus


def _read_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    first: dict[str, str] = {}
    for where, record in _records(path, '{"_id", "text"}'):
        _add(queries, _field(record, "_id", where), _field(record, "text", where), where, first)
    return queries


def _qrels_row(cells: list[str], where: str) -> tuple[str, str, int]:
    if len(cells) != 3:
        raise DataError(f"{where}: {len(cells)} tab-separated fields; a qrels line is "
                        "query-id <TAB> corpus-id <TAB> score")
    query, doc, text = (c.strip() for c in cells)
    score = ascii_int(text, negative=True)
    if score is None:
        raise DataError(f"{where}: field 'score' is {text!r}, not a whole number; give the "
                        "relevance grade as an integer (0 = not relevant)")
    if not query or not doc:
        raise DataError(f"{where}: field '{'query-id' if not query else 'corpus-id'}' is empty")
    return query, doc, score


def read_qrels(path: str | os.PathLike[str]) -> dict[str, dict[str, int]]:
    """A BEIR qrels TSV: query id -> document id -> grade. The header line
    (``query-id corpus-id score``) is skipped when present; a pair given twice is an error."""
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    for number, line in text_lines(path):
        if not line.strip():
            continue
        cells = line.split("\t")
        if number == 1 and tuple(c.strip().lower() for c in cells) == _QRELS_HEADER:
            continue
        query, doc, score = _qrels_row(cells, f"{path}:{number}")
        judged = qrels.setdefault(query, {})
        if doc in judged:
            raise DataError(f"{path}:{number}: query {query!r} and document {doc!r} are judged "
                            "twice; keep one line per pair")
        judged[doc] = score
    if not qrels:
        raise DataError(f"{path} holds no judgements; give query-id, corpus-id and score lines")
    return qrels


def _require(directory: Path, name: str, split: str) -> Path:
    path = directory / name
    if path.is_file():
        return path
    if name.startswith("qrels/") and (directory / "qrels").is_dir():
        splits = sorted(p.stem for p in (directory / "qrels").glob("*.tsv"))
        raise DataError(f"{directory} has no qrels for split {split!r} ({path} is missing); its "
                        f"splits: {', '.join(splits) or 'none'}; pass one with --split")
    raise DataError(f"{directory} has no {name}: a BEIR dataset directory holds {LAYOUT} "
                    "(as BEIR's zip files unpack)")


def _check_known(qrels: dict[str, dict[str, int]], corpus: dict[str, str],
                 queries: dict[str, str], path: Path) -> None:
    """``DataError`` naming the first query or document of ``qrels`` that is not in the
    queries or the corpus (a qrels file of another version of the dataset)."""
    for query, judged in qrels.items():
        if query not in queries:
            raise DataError(f"{path}: query {query!r} is not in queries.jsonl; the qrels and "
                            "queries must come from the same dataset version")
        for doc in judged:
            if doc not in corpus:
                raise DataError(f"{path}: document {doc!r} (judged for query {query!r}) is not "
                                "in corpus.jsonl; the qrels and corpus must come from the same "
                                "dataset version")


def read_beir(directory: str | os.PathLike[str], split: str = "test") -> BeirData:
    """The corpus, the queries of ``split`` and their qrels from a BEIR dataset directory (see
    the module notes). ``DataError`` for a missing file (naming the layout), a bad line
    (``FILE:LINE`` and the field) and qrels naming an unknown query or document."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory} is not a directory; give a BEIR dataset directory "
                        f"({LAYOUT})")
    if not split or "/" in split or split.startswith("."):
        raise DataError(f"split {split!r} is not a split name (test, dev, train...)")
    paths = [_require(directory, name, split)
             for name in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv")]
    qrels = read_qrels(paths[2])
    all_queries = _read_queries(paths[1])
    corpus = read_corpus(paths[0])
    _check_known(qrels, corpus, all_queries, paths[2])
    queries = {query: all_queries[query] for query in qrels}
    return BeirData(corpus=corpus, queries=queries, qrels=qrels)


__all__ = ["LAYOUT", "BeirData", "read_beir", "read_corpus", "read_qrels", "text_lines"]
