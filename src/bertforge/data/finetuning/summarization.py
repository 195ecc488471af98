"""Summarization data: articles with their reference summaries, from every layout they ship in.

The layout comes from the path:

* a directory: CNN/DailyMail as distributed, one ``*.story`` file per article, read in sorted
  name order (a single ``.story`` file reads as one example). A story holds the article's
  paragraphs, then ``@highlight`` blocks, each followed by one highlight sentence. The id is the
  file name without ``.story``;
* anything else: a CSV, TSV or JSON Lines table (see ``tables``), such as the Hugging Face
  exports of CNN/DailyMail (article, highlights, id) and XSum (document, summary, id), or the
  SummEval subset of CNN/DailyMail (article, highlights_tokenized, extra_refs_summeval).

Story files are cleaned the way the standard CNN/DailyMail preprocessing (See et al. 2017, and
the Hugging Face ``cnn_dailymail`` loader after it) cleans them, so that a story reads to the
same text as its distributed table row: a paragraph or highlight that does not end in
sentence-final punctuation gets " ." appended (image captions otherwise run into the next
sentence), paragraphs are joined with single spaces and highlights with newlines (one summary
sentence per line, which is what ROUGE-Lsum expects).

A summary cell may also hold a JSON list of texts: several human references for one article.
The example then carries them all in ``references``, and ``summary`` is the first.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bertforge.data.finetuning.tables import (
    Row, Table, cell_text, columns_found, find_column, id_column, read_table, read_text,
)
from bertforge.errors import ConfigError, DataError

# Columns tried when none is given, best first.
ARTICLE_COLUMNS = ("article", "document", "text", "source", "input")
SUMMARY_COLUMNS = ("summary", "highlights", "target", "abstract", "highlights_tokenized")

STORY_SUFFIX = ".story"
HIGHLIGHT_MARK = "@highlight"
# A line ending in one of these already ends its sentence (the curly quotes are DailyMail's).
SENTENCE_ENDS = (".", "!", "?", "'", "`", '"', "\u2019", "\u201d", ")")


@dataclass(frozen=True)
class SummaryExample:
    """One article and its reference summary (None for unlabeled data, e.g. prediction).

    ``references`` holds every reference summary of the article, ``summary`` first; it is
    ``(summary,)`` unless given, and empty when there is no summary. ``source`` is the story
    file or ``FILE:LINE`` of the table row.
    """

    id: str
    article: str
    summary: str | None
    source: str
    references: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.references and self.summary is not None:
            object.__setattr__(self, "references", (self.summary,))
        elif self.references and self.references[0] != self.summary:
            raise ValueError(f"references[0] of example {self.id!r} differs from its summary; "
                             "the summary must be the first reference")


def _end_sentence(line: str) -> str:
    """``line`` with " ." appended unless it already ends a sentence."""
    return line if line.endswith(SENTENCE_ENDS) else f"{line} ."


def read_story(path: Path) -> tuple[str, list[str]]:
    """The article (paragraphs joined with spaces) and the highlights of one ``.story`` file.

    Every non-blank line after the first ``@highlight`` mark that is not a mark itself is a
    highlight. Raises ``DataError`` naming the file when the article is empty.
    """
    # Universal newlines, as text files are read: str.splitlines would also break the text at
    # the form feeds and Unicode line separators some articles contain.
    lines = [line.strip() for line in io.StringIO(read_text(path), newline=None)]
    marks = [i for i, line in enumerate(lines) if line.startswith(HIGHLIGHT_MARK)]
    split = marks[0] if marks else len(lines)
    paragraphs = [_end_sentence(line) for line in lines[:split] if line]
    highlights = [_end_sentence(line) for line in lines[split:]
                  if line and not line.startswith(HIGHLIGHT_MARK)]
    if not paragraphs:
        raise DataError(f"{path}: the story has no article text (nothing before its first "
                        f"{HIGHLIGHT_MARK}); remove this file from the directory")
    return " ".join(paragraphs), highlights


def _story_files(path: Path, max_examples: int | None) -> list[Path]:
    """The story files a directory (or one story file) stands for, in sorted name order."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.suffix == STORY_SUFFIX and p.is_file())
    if not files:
        raise DataError(f"{path}: no {STORY_SUFFIX} files in this directory; give the "
                        "directory that holds the CNN/DailyMail story files (e.g. cnn/stories), "
                        "or a CSV, TSV or JSON Lines file")
    return files[:max_examples]


def _read_stories(path: Path, require_summaries: bool,
                  max_examples: int | None) -> list[SummaryExample]:
    examples: list[SummaryExample] = []
    for story in _story_files(path, max_examples):
        article, highlights = read_story(story)
        if not highlights and require_summaries:
            raise DataError(f"{story}: the story has no highlights (no line after an "
                            f"{HIGHLIGHT_MARK} mark), so no reference summary; remove this file "
                            "or read the data as unlabeled")
        summary = "\n".join(highlights) if highlights else None
        examples.append(SummaryExample(id=story.stem, article=article, summary=summary,
                                       source=str(story)))
    return examples


def choose_column(table: Table, given: str | None, choices: Sequence[str],
                  option: str) -> str | None:
    """The column named by ``given`` (the value of the ``option`` parameter), else the first of
    ``choices`` the table has, else None. A named column that is missing is an error listing
    the table's columns."""
    if given is not None:
        column = find_column(table.columns, given)
        if column is None:
            raise DataError(f"{table.path}: no column {given!r} (found: {columns_found(table)}); "
                            f"fix {option}")
        return column
    return next((c for c in (find_column(table.columns, n) for n in choices) if c is not None),
                None)


def require_column(table: Table, given: str | None, choices: Sequence[str], option: str) -> str:
    """``choose_column``, where finding none of ``choices`` is an error listing the table's
    columns."""
    column = choose_column(table, given, choices, option)
    if column is None:
        raise DataError(f"{table.path}: no column named {', '.join(choices)} (found: "
                        f"{columns_found(table)}); set {option} to the column to use")
    return column


def row_references(table: Table, row: Row, column: str) -> tuple[str, ...]:
    """The reference texts in a row's cell: one text, a JSON list of texts, or none (absent,
    null, blank or an empty list)."""
    value = row.fields.get(column)
    if not isinstance(value, list):
        text = cell_text(table, row, column)
        return (text,) if text is not None and text.strip() else ()
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            what = "a blank text" if isinstance(item, str) else f"a JSON {type(item).__name__}"
            raise DataError(f"{table.where(row)}: item {i} of the list in column {column!r} is "
                            f"{what}; every reference summary must be non-empty text")
    return tuple(value)


def _read_table(path: Path, article_field: str | None, summary_field: str | None,
                require_summaries: bool, max_examples: int | None) -> list[SummaryExample]:
    table = read_table(path)
    article = require_column(table, article_field, ARTICLE_COLUMNS, "article_field")
    summary = (require_column if require_summaries else choose_column)(
        table, summary_field, SUMMARY_COLUMNS, "summary_field")
    ids = id_column(table, [article, summary])
    seen: dict[str, int] = {}  # id -> line of its first use
    examples: list[SummaryExample] = []
    for number, row in enumerate(table.rows[:max_examples]):
        text = cell_text(table, row, article)
        if text is None or not text.strip():
            raise DataError(f"{table.where(row)}: no article text in column {article!r}; every "
                            "example needs one")
        references = row_references(table, row, summary) if summary is not None else ()
        if not references and require_summaries:
            raise DataError(f"{table.where(row)}: no summary in column {summary!r}; every "
                            "training and evaluation example needs one")
        example_id = cell_text(table, row, ids) if ids is not None else None
        if example_id is not None:
            if example_id in seen:
                raise DataError(f"{table.where(row)}: id {example_id!r} was already used at "
                                f"{table.path}:{seen[example_id]}; ids must be unique, since "
                                "predictions are matched to references by id")
            seen[example_id] = row.line
        examples.append(SummaryExample(
            id=example_id if example_id is not None else str(number), article=text,
            summary=references[0] if references else None, source=table.where(row),
            references=references))
    return examples


def read_summarization(path: str | Path, *, article_field: str | None = None,
                       summary_field: str | None = None, require_summaries: bool = True,
                       max_examples: int | None = None) -> list[SummaryExample]:
    """The summarization examples of a story directory, a ``.story`` file or a table.

    Tables: the article column is ``article_field``, else the first of ``ARTICLE_COLUMNS``
    present; the summary column is ``summary_field``, else the first of ``SUMMARY_COLUMNS``
    (names match ignoring case). An example's id is its id/idx/index/guid field, else its
    0-based row number. A row with a blank article is an error, and so is an id used twice
    (naming both lines): predictions and references are matched by id.

    Stories: a story with no article text is an error naming the file (CNN/DailyMail has about
    a hundred such files; remove them first), and so is a story with no highlights when
    ``require_summaries``. With ``require_summaries=False`` (prediction) a missing summary
    column, cell or highlights gives ``summary=None`` instead of an error. The field options
    apply to tables only; giving one for stories is a ``ConfigError``.

    ``max_examples`` keeps the first that many examples (stories: the first files in name
    order, so the rest are not read).
    """
    if max_examples is not None and (isinstance(max_examples, bool) or
                                     not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"max_examples={max_examples!r} must be a positive integer or None")
    p = Path(path)
    if p.is_dir() or p.suffix == STORY_SUFFIX:
        for option, value in (("article_field", article_field), ("summary_field", summary_field)):
            if value is not None:
                raise ConfigError(f"{p}: {option} applies to tables only; CNN/DailyMail story "
                                  f"files have a fixed layout, so leave {option} unset")
        return _read_stories(p, require_summaries, max_examples)
    return _read_table(p, article_field, summary_field, require_summaries, max_examples)


__all__ = ["ARTICLE_COLUMNS", "STORY_SUFFIX", "SUMMARY_COLUMNS", "SummaryExample", "choose_column",
           "read_story", "read_summarization", "require_column", "row_references"]
