"""Fault injection: corpus files whose lines end with CR (classic Mac OS), CRLF, or a mix.

A lone CR used to be no line break at all: a CR-only text file read as one huge line (one
document, cut into chunks at spaces) and a CR-separated JSON Lines file as one bad JSON line.
Each test reads a text whose line breaks were rewritten and expects exactly what the LF version
of the same text gives: lines, line numbers, documents, sentences, warnings and vocabulary.
"""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc
from pathlib import Path

import pytest

from bertforge.data import lines
from bertforge.data.corpus import Document, ReadStats, document_sentences, iter_documents
from bertforge.data.lines import Notes, iter_lines
from bertforge.tokenization.training import train_wordpiece

CORPUS = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"
TEXT = (
    "The cat sat. It purred loudly.\nA second line here.\n\n\nDoc two starts. Then ends.\n"
    "It has a sentence that wraps\nonto the next line.\n\nThird doc.\n"
)
CR = ("\r",)
CRLF = ("\r\n",)
# Round robin over the lines. A lone CR is always followed by CRLF, never LF: "\r" + "\n"
# would be one CRLF break where two were meant; "\r\r\n" (CR, then CRLF) is two breaks.
MIXED = ("\r", "\r\n", "\n")


def with_breaks(text: str, breaks: tuple[str, ...]) -> bytes:
    """``text`` (LF line breaks) with its n-th LF replaced by ``breaks[n % len(breaks)]``."""
    parts = text.split("\n")
    ends = [breaks[n % len(breaks)] for n in range(len(parts) - 1)] + [""]
    return "".join(part + end for part, end in zip(parts, ends)).encode()


def read_as(path: Path, data: bytes, **kwargs) -> tuple[list[Document], list[str], ReadStats]:
    """Write ``data`` to ``path`` and read it back: (documents, warnings, stats).

    Reading two versions of a text through the same path makes sources and warnings comparable.
    """
    path.write_bytes(data)
    warnings: list[str] = []
    stats = ReadStats()
    docs = list(iter_documents(path, warn=warnings.append, stats=stats, **kwargs))
    return docs, warnings, stats


def note_into(notes: list[str]) -> Notes:
    """A ``notes`` callback for ``iter_lines`` that appends each message to ``notes``."""
    return lambda message, *, kind="other": notes.append(message)


def raw_lines(
    data: bytes, max_chars: int, split: bool
) -> tuple[list[tuple[int, str]], list[str], int]:
    """``iter_lines`` over ``data`` directly: (lines, notes, bytes counted)."""
    notes: list[str] = []
    stats = ReadStats()
    found = list(
        iter_lines(io.BytesIO(data), Path("c.txt"), note_into(notes), stats, max_chars, split=split)
    )
    return found, notes, stats.text_bytes


# -- text -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("input_format", ["auto", "sentences", "paragraphs"])
@pytest.mark.parametrize("breaks", [CR, MIXED], ids=["cr", "mixed"])
def test_text_reads_like_its_lf_version(
    tmp_path: Path, input_format: str, breaks: tuple[str, ...]
) -> None:
    path = tmp_path / "a.txt"
    lf_docs, _, _ = read_as(path, TEXT.encode(), input_format=input_format)
    data = with_breaks(TEXT, breaks)
    docs, warnings, stats = read_as(path, data, input_format=input_format)
    assert len(lf_docs) == 3 and docs == lf_docs and warnings == []
    assert [document_sentences(d) for d in docs] == [document_sentences(d) for d in lf_docs]
    assert stats.text_bytes == len(data)


def test_cr_breaks_count_in_line_numbers_and_warnings(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    text = b"first line\nsecond\n\nthird \xff bad\nfourth\n"
    lf_docs, lf_warnings, _ = read_as(path, text)
    docs, warnings, _ = read_as(path, text.replace(b"\n", b"\r"))
    assert [d.source for d in docs] == [f"{path}:1", f"{path}:4"]
    assert [d.lines for d in docs] == [["first line", "second"], ["third \ufffd bad", "fourth"]]
    assert len(warnings) == 1 and warnings[0].startswith(f"{path}:4: invalid UTF-8")
    assert docs == lf_docs and warnings == lf_warnings


SAMPLES = [
    TEXT,
    "no break at the end\n\nlast",
    "\n\n\nonly breaks before\n",
    "short\nalpha beta gamma delta epsilon zeta eta\n" + "x" + "é" * 13 + "\nend\n",
    "a\nbb\n\nccc\n" * 5,
]


@pytest.mark.parametrize("breaks", [CR, CRLF, MIXED], ids=["cr", "crlf", "mixed"])
def test_breaks_cut_between_reads_read_like_lf(
    monkeypatch: pytest.MonkeyPatch, breaks: tuple[str, ...]
) -> None:
    # Tiny reads put a read boundary at every position, so some CRLF has its CR at the end of
    # one read and its LF at the start of the next: that must stay one break, not add a blank
    # line. A small max_chars also cuts the long lines (with a multi-byte "é") into pieces.
    # Every result is compared with the LF version read with the usual read size.
    for text in SAMPLES:
        data = with_breaks(text, breaks)
        for max_chars, split in [(6, True), (6, False), (1000, True)]:
            expected, expected_notes, _ = raw_lines(text.encode(), max_chars, split)
            for size in [1, 2, 3, 4, 5, 7, 64]:
                monkeypatch.setattr(lines, "BLOCK", size)
                found, notes, counted = raw_lines(data, max_chars, split)
                assert found == expected, (text, max_chars, split, size)
                assert notes == expected_notes and counted == len(data)
                monkeypatch.undo()


def test_cr_only_stream_far_over_the_line_limit_is_read_line_by_line() -> None:
    # Taken as one line, this stream would be 3000 times the byte limit: it must come out as
    # its 20,000 lines, without ever holding much more than one read of it.
    texts = [f"Sentence {i} of a file saved with classic Mac line endings." for i in range(20_000)]
    data = "\r".join(texts).encode()
    notes: list[str] = []
    stream = io.BytesIO(data)
    tracemalloc.start()
    try:
        found = iter_lines(stream, Path("mac.txt"), note_into(notes), ReadStats(), 100, split=True)
        matches = sum(line == (n, texts[n - 1]) for n, line in enumerate(found, 1))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert matches == len(texts) and notes == []
    assert peak < len(data) // 4


# -- compressed text ------------------------------------------------------------------------------


def test_gzip_cr_only_reads_like_lf(tmp_path: Path) -> None:
    path = tmp_path / "a.txt.gz"
    lf_docs, _, _ = read_as(path, gzip.compress(TEXT.encode()))
    data = with_breaks(TEXT, CR)
    docs, warnings, stats = read_as(path, gzip.compress(data))
    assert len(docs) == 3 and docs == lf_docs and warnings == []
    assert stats.text_bytes == len(data)


def test_truncated_gzip_cr_only_keeps_the_lines_read(tmp_path: Path) -> None:
    path = tmp_path / "cut.txt.gz"
    texts = [f"Sentence number {i} has a few words in it." for i in range(3000)]
    data = gzip.compress("\r".join(texts).encode())
    docs, warnings, _ = read_as(path, data[: len(data) // 2])
    assert len(docs) == 1
    kept = len(docs[0].lines)
    assert 100 < kept < 3000 and docs[0].lines == texts[:kept]
    assert len(warnings) == 1 and warnings[0].startswith(f"{path}:{kept + 1}: reading stopped")
    assert warnings[0].endswith(f"Keeping the {kept} line(s) read before it.")


# -- JSON Lines -----------------------------------------------------------------------------------


@pytest.mark.parametrize("breaks", [CR, MIXED], ids=["cr", "mixed"])
def test_jsonl_with_cr_separators_reads_like_lf(tmp_path: Path, breaks: tuple[str, ...]) -> None:
    records = [
        json.dumps({"text": "One doc.\r\nIts second line.\rIts third."}),
        "",
        json.dumps({"text": "Second doc."}),
        "not json",
        json.dumps({"text": "Last doc."}),
    ]
    text = "\n".join(records) + "\n"
    path = tmp_path / "d.jsonl"
    lf_docs, lf_warnings, _ = read_as(path, text.encode())
    docs, warnings, _ = read_as(path, with_breaks(text, breaks))
    assert [d.lines for d in docs] == [
        ["One doc.", "Its second line.", "Its third."], ["Second doc."], ["Last doc."]
    ]
    assert [d.source.rsplit(":", 1)[1] for d in docs] == ["1", "3", "5"]
    assert warnings == [f"{path}:4:1: not valid JSON (Expecting value); line skipped"]
    assert docs == lf_docs and warnings == lf_warnings


# -- vocab ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_vocab_from_cr_only_corpus_matches_lf(tmp_path: Path, suffix: str) -> None:
    # BERT's normalizer turns a CR into a space, so a text file read as one line can still give
    # the same words; its document count shows whether the lines were found.
    text = CORPUS.read_text(encoding="utf-8")
    if suffix == ".jsonl":
        text = "".join(json.dumps({"text": doc}) + "\n" for doc in text.split("\n\n"))
    reports, vocabs = [], []
    for name, data in [("lf", text.encode()), ("cr", with_breaks(text, CR))]:
        (tmp_path / name).mkdir()
        (tmp_path / name / f"corpus{suffix}").write_bytes(data)
        reports.append(
            train_wordpiece(
                [str(tmp_path / name / f"corpus{suffix}")],
                vocab_size=300,
                output=tmp_path / name / "vocab.txt",
                min_frequency=1,
                progress=False,
            )
        )
        vocabs.append((tmp_path / name / "vocab.txt").read_bytes())
    assert vocabs[1] == vocabs[0]
    assert reports[1].documents == reports[0].documents > 1
    assert reports[1].bytes == reports[0].bytes
