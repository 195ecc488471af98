"""A small extractive-QA sample in SQuAD v1.1 format, built offline from the standard library.

Python functions document what they return in a first sentence of the form "Return the ...".
Each such function gives one question, "What does NAME return?", whose context is the first
sentences of its docstring (up to four) and whose answer is the rest of the first one: real prose, real spans,
written by Python's authors (PSF license), and nothing to download. It is an easy task (the
answer follows "Return"), meant to show the fine-tuning pipeline working end to end on a CPU;
its scores say nothing about SQuAD. Modules are split between train and dev by a hash of their
path, and a docstring repeated in several modules is kept once, so no context is in both.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

from bertforge.data.segment import split_sentences
from bertforge.core.io import write_text_atomic
from bertforge.demo.corpus import is_prose, prose_paragraphs, stdlib_modules

_RETURN = re.compile(r"^Returns? ")
_MAX_ANSWER_WORDS = 20


def _question(name: str, doc: str) -> tuple[str, str, int] | None:
    """(context, answer, answer_start) for one docstring, or None when it does not fit."""
    sentences = [s for para in prose_paragraphs(doc) for s in split_sentences(para)][:4]
    if not sentences or not _RETURN.match(sentences[0]) or not all(map(is_prose, sentences)):
        return None
    first = sentences[0]
    answer = first[_RETURN.match(first).end():].rstrip(".")
    if not 2 <= len(answer.split()) <= _MAX_ANSWER_WORDS:
        return None
    context = " ".join(sentences)
    return context, answer, context.index(answer)


def _articles(modules: list[Path], seen: set[str]) -> list[dict]:
    """Questions of ``modules``, skipping contexts in ``seen`` (which it extends): some
    docstrings are copied between modules and must not be in both train and dev."""
    articles = []
    for path in modules:
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        paragraphs = []
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            found = _question(node.name, doc) if doc and not node.name.startswith("_") else None
            if found is None:
                continue
            context, answer, start = found
            if context in seen:
                continue
            seen.add(context)
            qid = f"{path.stem}.{node.name}.{node.lineno}"
            paragraphs.append({"context": context, "qas": [{
                "id": qid, "question": f"What does {node.name} return?",
                "answers": [{"text": answer, "answer_start": start}]}]})
        if paragraphs:
            articles.append({"title": path.stem, "paragraphs": paragraphs})
    return articles


def build_sample_qa(directory: Path, dev_fraction: float = 0.15) -> tuple[Path, Path, int, int]:
    """Write ``train.json`` and ``dev.json`` (SQuAD v1.1) to ``directory``; returns both paths
    and their question counts. The same Python version always gives the same files."""
    train, dev = [], []
    for path in stdlib_modules():
        digest = hashlib.sha256(path.name.encode()).digest()
        (dev if digest[0] < 256 * dev_fraction else train).append(path)
    counts, paths, seen = [], [], set()
    for name, modules in (("train.json", train), ("dev.json", dev)):
        articles = _articles(modules, seen)
        counts.append(sum(len(a["paragraphs"]) for a in articles))
        out = Path(directory) / name
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, json.dumps({"version": "1.1", "data": articles}, indent=1))
        paths.append(out)
    return paths[0], paths[1], counts[0], counts[1]
