"""Corpus reading: formats, compression, input expansion, every bad-input warning, segmentation,
wiki markup, and the stdlib sample corpus."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import textwrap
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

from bertforge.data import corpus
from bertforge.data.corpus import (
    Document,
    ReadStats,
    document_sentences,
    expand_inputs,
    iter_corpus,
    iter_documents,
)
from bertforge.data.segment import split_sentences, wiki_to_paragraphs
from bertforge.errors import ConfigError, DataError
from bertforge.demo.corpus import build_sample_corpus, module_sentences

OPENERS = [(".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)]
TEXT = "The cat sat. It purred loudly.\nA second line here.\n\n\nDoc two starts. Then ends.\n"


def read(path: Path, **kwargs) -> tuple[list[Document], list[str], ReadStats]:
    warnings: list[str] = []
    stats = ReadStats()
    docs = list(iter_documents(path, warn=warnings.append, stats=stats, **kwargs))
    return docs, warnings, stats


# -- formats ----------------------------------------------------------------------------------


def test_auto_text_segments_each_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(TEXT)
    docs, warnings, stats = read(tmp_path / "a.txt")
    assert warnings == [] and stats.documents == 2 and stats.text_bytes == len(TEXT)
    assert [d.source for d in docs] == [f"{tmp_path / 'a.txt'}:1", f"{tmp_path / 'a.txt'}:5"]
    first = ["The cat sat.", "It purred loudly.", "A second line here."]
    assert document_sentences(docs[0]) == first
    assert document_sentences(docs[1]) == ["Doc two starts.", "Then ends."]


def test_sentences_format_keeps_lines(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(TEXT)
    docs, _, _ = read(tmp_path / "a.txt", input_format="sentences")
    assert docs[0].kind == "sentences"
    assert document_sentences(docs[0]) == ["The cat sat. It purred loudly.", "A second line here."]


def test_paragraphs_format_joins_block_lines(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("First part of a\nsentence that wraps. Next one.\n\nBlock 2.\n")
    docs, _, stats = read(tmp_path / "a.md", input_format="paragraphs")
    joined = "First part of a sentence that wraps. Next one."
    assert [d.lines for d in docs] == [[joined], ["Block 2."]]
    assert document_sentences(docs[0]) == ["First part of a sentence that wraps.", "Next one."]
    assert stats.documents == 2


def test_jsonl_documents_and_bad_lines(tmp_path: Path) -> None:
    lines = [
        json.dumps({"text": "One doc. Two sentences.\n\nSecond paragraph."}),
        "not json at all",
        json.dumps({"body": "wrong field"}),
        json.dumps({"text": 42}),
        json.dumps({"text": "  \n "}),
        "",
        json.dumps({"text": "Last doc."}),
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    docs, warnings, stats = read(tmp_path / "d.jsonl")
    assert [document_sentences(d) for d in docs] == [
        ["One doc.", "Two sentences.", "Second paragraph."], ["Last doc."]
    ]
    assert [d.source.rsplit(":", 1)[1] for d in docs] == ["1", "7"]
    hint = "line skipped (choose the field with --text-field)"
    assert warnings == [
        f"{tmp_path / 'd.jsonl'}:2:1: not valid JSON (Expecting value); line skipped",
        f"{tmp_path / 'd.jsonl'}:3: field 'text' is missing; {hint}",
        f"{tmp_path / 'd.jsonl'}:4: field 'text' is not a string; {hint}",
    ]
    assert stats.documents == 2 and stats.empty_documents == 1
    docs, warnings, _ = read(tmp_path / "d.jsonl", text_field="body")
    assert [d.lines for d in docs] == [["wrong field"]] and len(warnings) == 5


PARIS = """'''Paris''' is the [[capital city|capital]] of [[France]].<ref>{{cite web|url=x}}</ref>
{{Infobox city|name=Paris}}
== History ==
[[File:Paris.jpg|thumb|A [[city]] picture]]
The city grew &amp; grew.<!-- note --> It is old.
{| class="wikitable"
|-
| cell one || cell two
|}
* A listed fact about the [http://example.org river Seine].
[[Category:Capitals]]"""
# Dumps escape the wikitext inside <text>, so "<ref>" arrives as "&lt;ref&gt;".
WIKI = f"""<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">
  <siteinfo><sitename>Wikipedia</sitename></siteinfo>
  <page><title>Paris</title><ns>0</ns><id>1</id>
    <revision><text xml:space="preserve">{escape(PARIS)}</text></revision></page>
  <page><title>Talk:Paris</title><ns>1</ns><revision><text>Talk page text.</text></revision></page>
  <page><title>Lutetia</title><ns>0</ns><redirect title="Paris"/>
    <revision><text>#REDIRECT [[Paris]]</text></revision></page>
  <page><title>Empty</title><ns>0</ns><revision><text></text></revision></page>
</mediawiki>
"""


def test_wiki_xml_pages(tmp_path: Path) -> None:
    (tmp_path / "dump.xml").write_text(WIKI)
    docs, warnings, stats = read(tmp_path / "dump.xml")
    assert warnings == [] and len(docs) == 1 and docs[0].kind == "wikitext"
    assert docs[0].source == f"{tmp_path / 'dump.xml'}: page 'Paris'"
    assert document_sentences(docs[0]) == [
        "Paris is the capital of France.",
        "The city grew & grew.",
        "It is old.",
        "A listed fact about the river Seine.",
    ]
    assert stats.empty_documents == 1 and stats.documents == 1


def test_truncated_wiki_xml_keeps_pages_read(tmp_path: Path) -> None:
    cut = WIKI.index("<page><title>Talk")
    (tmp_path / "dump.xml.bz2").write_bytes(bz2.compress(WIKI[: cut + 30].encode()))
    docs, warnings, _ = read(tmp_path / "dump.xml.bz2")
    assert len(docs) == 1
    assert len(warnings) == 1 and "XML ends early or is malformed" in warnings[0]
    assert "keeping the 1 page(s) read before it" in warnings[0]


def test_wiki_markup_leftovers() -> None:
    text = (
        "Foo {{broken template\n{{nested {{inner}} }} bar.\n__NOTOC__\n"
        ": Indented ''quote'' text.\n! header\n<br/>"
    )
    assert wiki_to_paragraphs(text) == ["Foo {{broken template", "bar.", "Indented quote text."]
    assert wiki_to_paragraphs("Paris (; French: Paris) is.") == ["Paris (French: Paris) is."]


# -- compression and inputs ---------------------------------------------------------------------


@pytest.mark.parametrize("suffix, opener", OPENERS)
def test_compressed_inputs(tmp_path: Path, suffix: str, opener) -> None:
    path = tmp_path / f"a.txt{suffix}"
    with opener(path, "wt") as fh:
        fh.write(TEXT)
    docs, warnings, stats = read(path)
    plain = [d.lines for d in read(_plain(tmp_path))[0]]
    assert warnings == [] and [d.lines for d in docs] == plain
    assert stats.text_bytes == len(TEXT) and stats.input_bytes == path.stat().st_size


def _plain(tmp_path: Path) -> Path:
    (tmp_path / "plain.txt").write_text(TEXT)
    return tmp_path / "plain.txt"


def test_truncated_gzip_keeps_lines_read(tmp_path: Path) -> None:
    body = "".join(f"Sentence number {i} has a few words in it.\n" for i in range(3000))
    data = gzip.compress(body.encode())
    (tmp_path / "cut.txt.gz").write_bytes(data[: len(data) // 2])
    docs, warnings, stats = read(tmp_path / "cut.txt.gz")
    assert len(docs) == 1 and 100 < len(docs[0].lines) < 3000
    assert docs[0].lines[-1].startswith("Sentence number")
    assert len(warnings) == 1 and "reading stopped early" in warnings[0]
    assert "the file is truncated or corrupt" in warnings[0]
    assert f"Keeping the {len(docs[0].lines)} line(s) read before it." in warnings[0]
    assert stats.files_read == 1 and stats.skipped == []


def test_not_really_gzip_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "fake.txt.gz").write_text("plain text pretending\n")
    docs, warnings, stats = read(tmp_path / "fake.txt.gz")
    assert docs == [] and stats.skipped[0][0] == str(tmp_path / "fake.txt.gz")
    assert warnings[0].startswith(f"skipping {tmp_path / 'fake.txt.gz'}: cannot decompress")


def test_expand_inputs_dirs_globs_and_order(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("z\n")
    (tmp_path / "b" / "a.txt").write_text("a\n")
    (tmp_path / "b" / ".hidden.txt").write_text("h\n")
    (tmp_path / "c.jsonl").write_text("{}\n")
    patterns = [str(tmp_path / "c.jsonl"), str(tmp_path / "b"), str(tmp_path / "**" / "*.txt")]
    found = expand_inputs(patterns)
    assert found == [tmp_path / "c.jsonl", tmp_path / "b" / "a.txt", tmp_path / "b" / "z.txt"]
    with pytest.raises(DataError, match=r"input .*nothing.txt does not exist; check the path"):
        expand_inputs([str(tmp_path / "nothing.txt")])
    with pytest.raises(DataError, match=r"input pattern '.*\*.xml' matches no files"):
        expand_inputs([str(tmp_path / "*.xml")])
    (tmp_path / "void").mkdir()
    with pytest.raises(DataError, match=r"input directory .*void contains no files"):
        expand_inputs([str(tmp_path / "void")])
    with pytest.raises(DataError, match=r"no input given"):
        expand_inputs([])


def test_iter_corpus_over_many_files(tmp_path: Path) -> None:
    (tmp_path / "1.txt").write_text(TEXT)
    (tmp_path / "2").write_text("No extension means text.\n")
    stats = ReadStats()
    docs = list(iter_corpus([str(tmp_path)], warn=print, stats=stats))
    assert len(docs) == 3 and stats.files_read == 2
    assert docs[2].lines == ["No extension means text."]
    assert stats.input_bytes == len(TEXT) + 25
    assert "read 2 file(s), 3 document(s)" in stats.summary()


# -- bad input ----------------------------------------------------------------------------------


def test_binary_empty_and_unknown_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "bin.txt").write_bytes(b"abc\x00def" * 10)
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "doc.pdf").write_bytes(b"%PDF-1.4")
    stats = ReadStats()
    warnings: list[str] = []
    for name in ("bin.txt", "empty.txt", "doc.pdf"):
        assert list(iter_documents(tmp_path / name, warn=warnings.append, stats=stats)) == []
    assert warnings[0] == (
        f"skipping {tmp_path / 'bin.txt'}: binary file (NUL bytes in the first 8 KiB); "
        "is it really text?"
    )
    assert warnings[1] == f"skipping {tmp_path / 'empty.txt'}: empty file"
    assert warnings[2].startswith(
        f"skipping {tmp_path / 'doc.pdf'}: unknown extension '.pdf'; supported: text (.txt"
    )
    assert ".jsonl" in warnings[2] and ".xml" in warnings[2] and ".gz .bz2 .xz" in warnings[2]
    assert [reason.split(" ")[0] for _, reason in stats.skipped] == ["binary", "empty", "unknown"]
    assert stats.files_read == 0 and "skipped 3 input(s):" in stats.summary()


def test_invalid_utf8_warns_once_with_first_line(tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_bytes(b"fine line\nbad \xff byte\nok\nagain \xfe\n")
    docs, warnings, _ = read(tmp_path / "bad.txt")
    assert docs[0].lines == ["fine line", "bad \ufffd byte", "ok", "again \ufffd"]
    assert warnings == [
        f"{tmp_path / 'bad.txt'}:2: invalid UTF-8 (first bad line in this file); undecodable bytes "
        "replaced with U+FFFD. Convert the file to UTF-8 (e.g. with iconv)."
    ]


def test_enormous_lines_are_cut_at_spaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "MAX_LINE_CHARS", 20)
    # Line 2 is 59 chars and line 3 has 45 chars with no space at all; multi-byte "é" straddles
    # the 80-byte read limit so the UTF-8 boundary handling is exercised too.
    long_line = "alpha beta gamma delta epsilon zeta eta theta iota kappa."
    nospace = "x" + "é" * 45
    (tmp_path / "long.txt").write_text(f"short\n{long_line}\n{nospace}\nend\n")
    docs, warnings, _ = read(tmp_path / "long.txt")
    lines = docs[0].lines
    assert all(len(x) <= 20 for x in lines) and lines[0] == "short" and lines[-1] == "end"
    assert " ".join(lines[1:-4]) == long_line and "".join(lines[-4:-1]) == nospace
    assert warnings == [
        f"{tmp_path / 'long.txt'}:2: line longer than 20 characters; cut into chunks",
        f"{tmp_path / 'long.txt'}:3: line longer than 20 characters; cut into chunks",
    ]


def test_enormous_jsonl_line_is_skipped_and_warnings_are_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpus, "MAX_JSON_LINE_CHARS", 50)
    rows = [json.dumps({"text": "x" * 100})] + ["oops"] * 15 + [json.dumps({"text": "kept"})]
    (tmp_path / "d.json").write_text("\n".join(rows) + "\n")
    docs, warnings, stats = read(tmp_path / "d.json")
    assert [d.lines for d in docs] == [["kept"]]
    assert warnings[0] == f"{tmp_path / 'd.json'}:1: line longer than 50 characters; skipped"
    bad_json = [w for w in warnings if "not valid JSON" in w]
    assert len(bad_json) == corpus.MAX_WARNINGS_PER_FILE
    assert bad_json[-1].startswith(f"{tmp_path / 'd.json'}:11:")
    assert warnings[-1] == f"{tmp_path / 'd.json'}: 5 more bad JSON warning(s) not shown"
    assert stats.warnings == len(warnings)


def test_unbroken_document_is_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "MAX_DOC_CHARS", 30)
    (tmp_path / "a.txt").write_text("".join(f"Line {i} of text.\n" for i in range(10)))
    docs, warnings, _ = read(tmp_path / "a.txt", input_format="sentences")
    assert [len(d.lines) for d in docs] == [3, 3, 3, 1]
    expected = f"{tmp_path / 'a.txt'}:3: document starting at line 1 exceeds 30 characters"
    assert warnings[0].startswith(expected)


def test_bad_format_and_missing_path(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(TEXT)
    with pytest.raises(ConfigError, match=r"input format 'csv' is not known; use one of auto, sen"):
        read(tmp_path / "a.txt", input_format="csv")
    with pytest.raises(DataError, match=r"input .*gone.txt does not exist"):
        read(tmp_path / "gone.txt")


def test_forced_formats_ignore_extension(tmp_path: Path) -> None:
    (tmp_path / "records.txt").write_text(json.dumps({"text": "Forced JSON."}) + "\n")
    docs, _, _ = read(tmp_path / "records.txt", input_format="jsonl")
    assert docs[0].lines == ["Forced JSON."]


# -- segmentation and the sample corpus ---------------------------------------------------------


def test_split_sentences() -> None:
    text = "Mr. Smith went to Washington. He arrived at 5 p.m. on Monday! Why?"
    assert split_sentences(text) == [
        "Mr. Smith went to Washington.", "He arrived at 5 p.m. on Monday!", "Why?"
    ]
    assert split_sentences("") == [] and split_sentences("   ") == []


def test_sample_corpus_is_deterministic_and_bounded(tmp_path: Path) -> None:
    a = build_sample_corpus(tmp_path / "a.txt", max_bytes=20_000)
    b = build_sample_corpus(tmp_path / "sub" / "b.txt", max_bytes=20_000)
    data = a.read_bytes()
    assert data == b.read_bytes() and 15_000 < len(data) <= 20_000
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary file was renamed, not left behind
    docs, warnings, _ = read(a, input_format="sentences")
    assert warnings == [] and len(docs) >= 3 and all(len(d.lines) >= 2 for d in docs)
    sentences = [s for d in docs for s in d.lines]
    assert not any(">>>" in s or "()" in s for s in sentences)
    assert sum(s[0].isupper() and s[-1] in ".!?:" for s in sentences) > 0.6 * len(sentences)
    with pytest.raises(ConfigError, match=r"max_bytes=10 is too small"):
        build_sample_corpus(tmp_path / "c.txt", max_bytes=10)


def test_module_sentences_cleans_docstrings(tmp_path: Path) -> None:
    source = textwrap.dedent('''
        """Tools for counting sheep quickly.

        This module counts sheep in a field. It never sleeps.

        >>> count(3)
        3

        Parameters
        ----------
        n : int
            How many sheep there are.
        """

        def count(n):
            """Return the number of sheep.

            :param n: the sheep
            x = {a: b for a, b in pairs()}
            """
    ''')
    (tmp_path / "sheep.py").write_text(source)
    assert module_sentences(tmp_path / "sheep.py") == [
        "Tools for counting sheep quickly.",
        "This module counts sheep in a field.",
        "It never sleeps.",
        "Return the number of sheep.",
    ]
    (tmp_path / "broken.py").write_text("def (:\n")
    assert module_sentences(tmp_path / "broken.py") == []
