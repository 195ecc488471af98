"""Streaming corpus reader: files, directories, globs and datasets in, ``Document`` objects out.

Inputs are text, JSON Lines and Wikipedia XML files (each optionally compressed: .gz .bz2 .xz
.zst), Parquet files, Hugging Face ``save_to_disk`` folders and Hub names (``hf://...``,
streamed; :mod:`bertforge.data.columns`). A JSON Lines record or a table row is one document,
its ``text_field`` holding the text.

Reading is cheap (I/O and line splitting only) so a single process can feed many workers;
``document_sentences`` does the costly part (markup removal, sentence segmentation) and is meant
to run in those workers. Nothing here holds more than one document in memory.

Bad input never stops a run: each problem is reported through ``warn(msg)`` naming the file (and
line), counted in ``ReadStats``, and reading goes on with the next line or file. Only a path that
does not exist at all is an error (``DataError``), because that is almost always a typo.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterator, Sequence
from xml.etree import ElementTree

from bertforge.data.columns import (HUB_PREFIX, MISSING, DatasetInput, SkipInput, dataset_rows,
                                    hub_input, parquet_rows, saved_dataset)
from bertforge.data.compression import COMPRESSORS, DECOMPRESS_ERRORS
from bertforge.data.lines import iter_lines
from bertforge.data.segment import split_sentences, wiki_to_paragraphs
from bertforge.core.jsonfile import parse_json
from bertforge.core.limits import INPUT_FORMATS as FORMATS
from bertforge.errors import ConfigError, DataError

__all__ = [
    "Document", "Input", "ReadStats", "FORMATS", "expand_inputs", "input_key", "input_size",
    "known_size", "iter_documents", "iter_corpus", "document_sentences",
]

TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", "")
JSON_SUFFIXES = (".jsonl", ".json")
XML_SUFFIXES = (".xml",)
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED = (
    "text (.txt .text .md .rst or no extension), JSON Lines (.jsonl .json), Wikipedia XML dump "
    "(.xml), each optionally compressed (.gz .bz2 .xz .zst), Parquet (.parquet), a Hugging Face "
    "save_to_disk folder or hf://ORG/NAME"
)
Input = Path | DatasetInput
"""One input: a file, or a Hugging Face dataset (a save_to_disk folder or a Hub name)."""
MAX_LINE_CHARS = 1_000_000  # longer text lines are cut into chunks of at most this many chars
MAX_JSON_LINE_CHARS = 16_000_000  # a JSON record cannot be cut, so it gets a larger allowance
MAX_DOC_CHARS = 20_000_000  # bounds memory when a file has no blank lines between documents
MAX_WARNINGS_PER_FILE = 10  # per kind; then one summary line, so a bad file cannot flood the log


@dataclass
class Document:
    """One document, as cheap to produce as possible.

    ``kind`` says how ``document_sentences`` turns ``lines`` into sentences: "sentences" (each
    line is one sentence), "paragraphs" (each line is text to segment) or "wikitext" (one page of
    MediaWiki markup in ``lines[0]``). ``source`` is "path:line" (for wiki pages, the title).
    """

    source: str
    kind: str
    lines: list[str]


@dataclass
class ReadStats:
    """Counters filled while reading, for progress bars and end-of-run summaries."""

    files_read: int = 0
    documents: int = 0
    empty_documents: int = 0
    text_bytes: int = 0  # UTF-8 bytes of text read, after decompression
    input_bytes: int = 0  # on-disk bytes consumed so far (drives byte progress bars)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    warnings: int = 0

    def summary(self) -> str:
        """A few human-readable lines."""
        lines = [
            f"read {self.files_read} file(s), {self.documents} document(s), "
            f"{self.text_bytes / 1e6:.1f} MB of text"
        ]
        if self.empty_documents:
            lines.append(f"skipped {self.empty_documents} empty document(s)")
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} input(s):")
            lines += [f"  {path}: {reason}" for path, reason in self.skipped[:20]]
            if len(self.skipped) > 20:
                lines.append(f"  ... and {len(self.skipped) - 20} more")
        if self.warnings:
            lines.append(f"{self.warnings} warning(s) while reading")
        return "\n".join(lines)


def expand_inputs(patterns: Sequence[str | Path]) -> list[Input]:
    """Files, directories (recursive, hidden entries skipped), globs and datasets -> inputs.

    A Hugging Face ``save_to_disk`` folder (``DIR`` or ``DIR@SPLIT``, also met inside a
    directory) and a Hub name (``hf://ORG/NAME[:CONFIG][@SPLIT]``) are one input each. Order
    follows ``patterns``; each pattern's matches are sorted so a run is reproducible, and
    repeats are dropped. A path or glob that matches nothing raises ``DataError`` naming it.
    """
    if not patterns:
        raise DataError("no input given: pass at least one file, directory or glob (--input)")
    found: list[Input] = []
    for pattern in patterns:
        text = str(pattern)
        path = Path(text)
        dataset = hub_input(text) if text.startswith(HUB_PREFIX) else saved_dataset(text)
        if dataset is not None:
            matches: list[Input] = [dataset]
        elif path.is_dir():
            matches = _directory_inputs(path)
            if not matches:
                raise DataError(f"input directory {text} contains no files")
        elif path.is_file():
            matches = [path]
        elif any(ch in text for ch in "*?["):
            matches = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
            if not matches:
                raise DataError(f"input pattern {text!r} matches no files; check path and quotes")
        else:
            raise DataError(f"input {text} does not exist; check the path")
        found += matches
    return list(dict.fromkeys(found))


def _directory_inputs(root: Path) -> list[Input]:
    """The files below ``root`` in path order, a save_to_disk folder among them as one input."""
    found: list[Input] = []
    folders: list[Path] = []
    for path in sorted(root.rglob("*")):  # a folder sorts before its contents
        if not _visible(path, root) or any(f in path.parents for f in folders):
            continue
        if path.is_file():
            found.append(path)
        elif (dataset := saved_dataset(str(path))) is not None:
            folders.append(path)
            found.append(dataset)
    return found


def input_size(source: Input) -> int:
    """Bytes on disk of an input (0 for a Hub name: not known)."""
    return source.size() if isinstance(source, DatasetInput) else source.stat().st_size


def known_size(sources: Sequence[Input]) -> int | None:
    """Bytes on disk of all ``sources``, or None when one is a Hub name (not known ahead)."""
    if any(isinstance(s, DatasetInput) and s.hub for s in sources):
        return None
    return sum(input_size(s) for s in sources)


def input_key(source: Input) -> str:
    """An input as a run's settings record it: a resolved path, or a Hub name."""
    if isinstance(source, DatasetInput):
        return str(source) if source.hub else str(
            DatasetInput(str(Path(source.location).resolve()), False, split=source.split))
    return str(source.resolve())


def _visible(path: Path, root: Path) -> bool:
    """False inside hidden directories and for hidden files (.git, .DS_Store) below ``root``."""
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


def _layout(path: Path, input_format: str) -> tuple[str | None, str, str]:
    """(layout, compression suffix, inner suffix); layout None means an unknown extension."""
    suffix = path.suffix.lower()
    compression = suffix if suffix in COMPRESSORS else ""
    inner = Path(path.stem).suffix.lower() if compression else suffix
    if inner in PARQUET_SUFFIXES:  # a binary format: whatever --input-format says
        return ("parquet" if not compression else None), compression, inner
    if input_format in ("jsonl", "wiki"):
        return input_format, compression, inner
    if inner in JSON_SUFFIXES:
        return "jsonl", compression, inner
    if inner in XML_SUFFIXES:
        return "wiki", compression, inner
    if inner in TEXT_SUFFIXES:
        return input_format, compression, inner  # "auto", "sentences" or "paragraphs"
    return None, compression, inner


def iter_documents(
    path: Input,
    *,
    input_format: str = "auto",
    text_field: str = "text",
    warn: Callable[[str], None],
    stats: ReadStats | None = None,
) -> Iterator[Document]:
    """Stream the documents of one input; problems go to ``warn`` and ``stats``.

    Raises only for an unknown ``input_format`` (``ConfigError``), a missing path or a dataset
    that cannot be opened (``DataError``). ``stats.input_bytes`` advances by the input's size,
    even when it is skipped.
    """
    if input_format not in FORMATS:
        known = ", ".join(FORMATS)
        raise ConfigError(f"input format {input_format!r} is not known; use one of {known}")
    stats = stats if stats is not None else ReadStats()
    path = path if isinstance(path, DatasetInput) else Path(path)
    if isinstance(path, Path) and not path.is_file():
        raise DataError(f"input {path} does not exist; check the path")
    start, size = stats.input_bytes, input_size(path)
    try:
        if isinstance(path, DatasetInput):
            yield from _table_documents(path, lambda _: dataset_rows(path, text_field),
                                        text_field, warn, stats, start, size)
        else:
            yield from _file_documents(path, input_format, text_field, warn, stats, start)
    finally:
        stats.input_bytes = start + size


def _file_documents(
    path: Path,
    input_format: str,
    text_field: str,
    warn: Callable[[str], None],
    stats: ReadStats,
    start: int,
) -> Iterator[Document]:
    layout, compression, inner = _layout(path, input_format)
    if layout is None:
        _skip(stats, warn, path, f"unknown extension {inner!r}; supported: {SUPPORTED}")
        return
    if layout == "parquet":
        yield from _table_documents(path, lambda notes: parquet_rows(path, text_field, notes),
                                    text_field, warn, stats, start, path.stat().st_size)
        return
    notes = _FileWarnings(path, warn, stats)
    with open(path, "rb") as raw:
        stream = _open_stream(raw, compression, path)
        try:
            head, reason = stream.read(8192), ""
            raw.seek(0)  # from the start again (a zstd stream cannot seek back)
            stream = _open_stream(raw, compression, path)
        except DECOMPRESS_ERRORS as exc:
            head, reason = b"", f"cannot decompress ({exc}); corrupt, or not really {compression}"
        if not reason and not head:
            reason = "empty file"
        elif b"\x00" in head:
            reason = "binary file (NUL bytes in the first 8 KiB); is it really text?"
        if reason:
            _skip(stats, warn, path, reason)
            return
        stats.files_read += 1
        if layout == "wiki":
            docs = _wiki_documents(stream, path, notes, stats)
        elif layout == "jsonl":
            docs = _jsonl_documents(stream, path, text_field, notes, stats)
        else:
            docs = _text_documents(stream, path, layout, notes, stats)
        for doc in docs:
            stats.documents += 1
            stats.input_bytes = start + raw.tell()
            yield doc
        notes.finish()


def _open_stream(raw: IO[bytes], compression: str, path: Path) -> IO[bytes]:
    """The decompressed stream of ``raw`` (itself when not compressed)."""
    if not compression:
        return raw
    try:
        return COMPRESSORS[compression](raw)
    except ModuleNotFoundError as exc:  # .zst without the zstandard package
        raise DataError(f"{path}: {exc}") from None


def _table_documents(
    source: Input,
    rows: Callable[[_FileWarnings], Iterator[tuple[str, object, float | None]]],
    text_field: str,
    warn: Callable[[str], None],
    stats: ReadStats,
    start: int,
    size: int,
) -> Iterator[Document]:
    """One document per row of a table (``columns``' readers); ``stats.input_bytes`` follows
    the rows read (a size not known stays at ``start``)."""
    notes = _FileWarnings(source, warn, stats)
    try:
        for place, value, done in rows(notes):
            if done is not None:
                stats.input_bytes = start + int(size * done)
            doc = _record_document(value, place, text_field, notes, stats, "row")
            if doc is not None:
                stats.documents += 1
                yield doc
    except SkipInput as exc:
        _skip(stats, warn, source, str(exc))
        return
    stats.files_read += 1
    notes.finish()


def _record_document(value: object, place: str, text_field: str, notes: _FileWarnings,
                     stats: ReadStats, unit: str) -> Document | None:
    """The document of one record's text field (``unit``: a JSON Lines "line", a table "row",
    whose text bytes are counted here), or None with a note when the field is missing or not
    text, or is nothing but whitespace."""
    if not isinstance(value, str):
        what = ("is missing" if value is MISSING else "is null" if value is None
                else "is not a string")
        notes(f"{place}: field {text_field!r} {what}; {unit} skipped (choose the field with "
              "--text-field)", kind="missing field")
        return None
    if unit == "row":
        stats.text_bytes += len(value) if value.isascii() else len(value.encode("utf-8"))
    lines = [s for s in (part.strip() for part in value.splitlines()) if s]
    if not lines:
        stats.empty_documents += 1
        return None
    return Document(place, "paragraphs", lines)


def iter_corpus(
    patterns: Sequence[str | Path],
    *,
    input_format: str = "auto",
    text_field: str = "text",
    warn: Callable[[str], None],
    stats: ReadStats | None = None,
) -> Iterator[Document]:
    """``iter_documents`` over every file that ``expand_inputs(patterns)`` finds."""
    for path in expand_inputs(patterns):
        yield from iter_documents(
            path, input_format=input_format, text_field=text_field, warn=warn, stats=stats
        )


def document_sentences(doc: Document) -> list[str]:
    """The sentences of one document (markup removed, segmented, stripped, non-empty)."""
    if doc.kind == "sentences":
        return [s for s in (line.strip() for line in doc.lines) if s]
    if doc.kind == "paragraphs":
        return [s for line in doc.lines for s in split_sentences(line)]
    if doc.kind == "wikitext":
        paragraphs = wiki_to_paragraphs("\n".join(doc.lines))
        return [s for para in paragraphs for s in split_sentences(para)]
    raise ValueError(f"unknown document kind {doc.kind!r} from {doc.source}")


def _skip(stats: ReadStats, warn: Callable[[str], None], path: Input, reason: str) -> None:
    stats.skipped.append((str(path), reason))
    stats.warnings += 1
    warn(f"skipping {path}: {reason}")


class _FileWarnings:
    """Per-file warning sink that caps repeated line-level warnings of one kind."""

    def __init__(self, path: Input, warn: Callable[[str], None], stats: ReadStats) -> None:
        self.path, self.warn, self.stats = path, warn, stats
        self.counts: dict[str, int] = {}

    def __call__(self, message: str, *, kind: str = "other") -> None:
        n = self.counts[kind] = self.counts.get(kind, 0) + 1
        if n <= MAX_WARNINGS_PER_FILE:
            self.stats.warnings += 1
            self.warn(message)

    def finish(self) -> None:
        for kind, n in self.counts.items():
            if n > MAX_WARNINGS_PER_FILE:
                self.stats.warnings += 1
                hidden = n - MAX_WARNINGS_PER_FILE
                self.warn(f"{self.path}: {hidden} more {kind} warning(s) not shown")


def _text_documents(
    stream: IO[bytes], path: Path, layout: str, notes: _FileWarnings, stats: ReadStats
) -> Iterator[Document]:
    """Blank lines separate documents; ``layout`` decides what a non-blank line is."""
    kind = "sentences" if layout == "sentences" else "paragraphs"
    block: list[str] = []
    start, chars = 0, 0

    def flush() -> Document:
        lines = [" ".join(block)] if layout == "paragraphs" else list(block)
        return Document(f"{path}:{start}", kind, lines)

    for lineno, line in iter_lines(stream, path, notes, stats, MAX_LINE_CHARS, split=True):
        text = line.strip()
        if not text:
            if block:
                yield flush()
                block, chars = [], 0
            continue
        if not block:
            start = lineno
        block.append(text)
        chars += len(text)
        if chars > MAX_DOC_CHARS:
            notes(
                f"{path}:{lineno}: document starting at line {start} exceeds {MAX_DOC_CHARS:,} "
                "characters; cutting it here (separate documents with a blank line)",
                kind="long document",
            )
            yield flush()
            block, chars = [], 0
    if block:
        yield flush()


def _jsonl_documents(
    stream: IO[bytes], path: Path, text_field: str, notes: _FileWarnings, stats: ReadStats
) -> Iterator[Document]:
    """One JSON object per line; its ``text_field`` string is one document."""
    for lineno, line in iter_lines(stream, path, notes, stats, MAX_JSON_LINE_CHARS, split=False):
        if not line.strip():
            continue
        try:  # invalid JSON, or a key given twice (which text was meant?)
            record = parse_json(line, str(path), line=lineno)
        except DataError as exc:
            notes(f"{exc}; line skipped", kind="bad JSON")
            continue
        value = record.get(text_field, MISSING) if isinstance(record, dict) else MISSING
        # iter_lines counted the line's bytes
        doc = _record_document(value, f"{path}:{lineno}", text_field, notes, stats, "line")
        if doc is not None:
            yield doc


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]  # "{http://www.mediawiki.org/xml/export-0.10/}page" -> "page"


def _wiki_documents(
    stream: IO[bytes], path: Path, notes: _FileWarnings, stats: ReadStats
) -> Iterator[Document]:
    """Main-namespace, non-redirect pages of a MediaWiki XML dump, one at a time."""
    root = None
    kept = 0
    try:
        for event, elem in ElementTree.iterparse(stream, events=("start", "end")):
            if root is None:
                root = elem
            if event != "end" or _local(elem.tag) != "page":
                continue
            title, ns, text, redirect = "", "0", "", False
            for child in elem.iter():
                name = _local(child.tag)
                if name == "title":
                    title = child.text or ""
                elif name == "ns":
                    ns = (child.text or "").strip()
                elif name == "redirect":
                    redirect = True
                elif name == "text":
                    text = child.text or ""
            root.clear()  # drop finished pages so memory stays flat over a multi-GB dump
            if ns != "0" or redirect or text.lstrip()[:9].upper() == "#REDIRECT":
                continue
            if not text.strip():
                stats.empty_documents += 1
                continue
            stats.text_bytes += len(text.encode("utf-8"))
            kept += 1
            yield Document(f"{path}: page {title!r}", "wikitext", [text])
    except ElementTree.ParseError as exc:
        line = exc.position[0] if exc.position else "?"
        notes(
            f"{path}:{line}: XML ends early or is malformed ({exc}); keeping the {kept} page(s) "
            "read before it"
        )
    except DECOMPRESS_ERRORS as exc:
        notes(
            f"{path}: reading stopped early ({exc}); the file is truncated or corrupt. "
            f"Keeping the {kept} page(s) read before it."
        )
