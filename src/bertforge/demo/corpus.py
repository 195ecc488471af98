"""A small real English corpus built offline from the docstrings of Python's standard library.

Every Python installation carries a few megabytes of carefully written English in its modules'
docstrings (PSF license), so demos and tests can train a vocabulary and a tiny model on real
prose without downloading anything. Modules are parsed with ``ast`` and never imported.

Output is the sentences format: one sentence per line, a blank line between documents, one
document per module. The file is the same for the same Python version.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import sysconfig
from pathlib import Path
from typing import Iterator

from bertforge.data.segment import split_sentences
from bertforge.errors import ConfigError
from bertforge.core.io import write_text_atomic

__all__ = ["build_sample_corpus", "is_prose", "module_sentences", "prose_paragraphs",
           "stdlib_modules"]

# Directories with tests, vendored packages, tools or generated tables rather than prose.
_SKIP_DIRS = frozenset(
    {
        "test", "tests", "idle_test", "idlelib", "site-packages", "dist-packages", "__pycache__",
        "lib2to3", "ensurepip", "turtledemo", "pydoc_data", "encodings", "config-3", "venv",
        "__phello__", "msilib", "tkinter",
    }
)
# Field lists (":param x:", "@return", numpy's "x : int") and section underlines ("-----").
_FIELD = re.compile(r"^\s*(:\w[^:]*:|@\w+|[\w*]+ : |[-=~^*]{3,}\s*$)")
_WORD = re.compile(r"[A-Za-z]+")
_MIN_SENTENCE_WORDS = 3


def stdlib_modules() -> list[Path]:
    """Sorted .py files of the standard library, without tests, tools and vendored code."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruning in place keeps os.walk from descending; sorting makes the walk reproducible.
        dirnames[:] = sorted(
            d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(("config-", "test"))
        )
        found += [
            Path(dirpath) / f for f in filenames if f.endswith(".py") and not f.startswith("test")
        ]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _docstrings(tree: ast.Module) -> Iterator[str]:
    """Module, class and function docstrings in source order."""
    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    inner = sorted(
        (n for n in ast.walk(tree) if isinstance(n, kinds)), key=lambda n: (n.lineno, n.col_offset)
    )
    for node in [tree, *inner]:
        doc = ast.get_docstring(node, clean=False)
        if doc:
            yield inspect.cleandoc(doc)


def is_prose(sentence: str) -> bool:
    """Mostly letters, a few words, no code-like symbols: a sentence worth learning from."""
    words = _WORD.findall(sentence)
    visible = [c for c in sentence if not c.isspace()]
    letters = sum(c.isalpha() for c in visible)
    return (
        len(words) >= _MIN_SENTENCE_WORDS
        and letters >= 0.8 * len(visible)
        and not any(tok in sentence for tok in ("()", "==", "->", "{", "}", "__", "\\", "`", ">>>"))
    )


def prose_paragraphs(doc: str) -> Iterator[str]:
    """Prose paragraphs of one docstring: doctests, indented code and field lists dropped."""
    block: list[str] = []
    in_doctest = False
    for line in doc.splitlines() + [""]:
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_doctest = True  # the example and its output run to the next blank line
        if not stripped or in_doctest or line[:1].isspace() or _FIELD.match(line):
            if block:
                yield " ".join(block)
                block = []
            in_doctest = in_doctest and bool(stripped)
            continue
        block.append(stripped)


def module_sentences(path: Path) -> list[str]:
    """Cleaned docstring sentences of one module (empty if it does not parse)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return []
    paragraphs = (para for doc in _docstrings(tree) for para in prose_paragraphs(doc))
    return [s for para in paragraphs for s in split_sentences(para) if is_prose(s)]


def build_sample_corpus(output: Path, max_bytes: int = 3_000_000) -> Path:
    """Write the sample corpus to ``output`` (atomically) and return its path.

    Modules are added in sorted order, sentence by sentence, until the next sentence would
    make the file larger than ``max_bytes``; modules with fewer than two usable sentences
    are left out (a document needs a next sentence for next-sentence prediction).
    """
    if max_bytes < 1000:
        raise ConfigError(f"max_bytes={max_bytes} is too small for a corpus; use at least 1000")
    parts: list[str] = []
    size = 0
    for path in stdlib_modules():
        sentences = module_sentences(path)
        if len(sentences) < 2:
            continue
        budget = max_bytes - size - (1 if size else 0)  # a blank line goes between documents
        kept: list[str] = []
        for sentence in sentences:
            budget -= len(sentence.encode("utf-8")) + 1
            if budget < 0:
                break
            kept.append(sentence)
        if len(kept) >= 2:
            text = ("\n" if size else "") + "".join(s + "\n" for s in kept)
            parts.append(text)
            size += len(text.encode("utf-8"))
        if len(kept) < len(sentences):
            break  # the budget ran out inside this module
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(output, "".join(parts))
