"""Reading the lines of a (possibly compressed) text stream with bounded memory.

``iter_lines`` never holds more than a few times ``max_chars`` of one line: an enormous line
(a binary blob, a whole book without newlines) is cut into chunks or dropped, invalid UTF-8 is
replaced and reported once, and a truncated or corrupt compressed file ends the stream with a
note instead of an exception. Problems go to a ``notes`` callback, so the caller decides how
warnings are counted and capped.
"""

from __future__ import annotations

import lzma
import zlib
from pathlib import Path
from typing import IO, Iterator, Protocol

# What reading a damaged .gz/.bz2/.xz stream can raise part-way through.
DECOMPRESS_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)


class Notes(Protocol):
    """Receives one warning; ``kind`` groups repeated warnings so a sink can cap them."""

    def __call__(self, message: str, *, kind: str = "other") -> None: ...


class ByteCounter(Protocol):
    """Anything with a ``text_bytes`` counter (e.g. ``corpus.ReadStats``)."""

    text_bytes: int


def _utf8_tail(data: bytes) -> int:
    """Bytes at the end of ``data`` that start a character not yet complete (0..3)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # ASCII or a lead byte: how long is its character?
            need = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if need > back else 0
    return 0


def iter_lines(
    stream: IO[bytes],
    path: Path,
    notes: Notes,
    stats: ByteCounter,
    max_chars: int,
    *,
    split: bool,
) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without its newline) for each line of ``stream``.

    Lines are read with a byte limit so one enormous line (a binary blob, a whole book without
    newlines) never has to fit in memory: it is cut into chunks of at most ``max_chars`` at
    spaces (``split=True``, each chunk yielded with the same line number) or dropped.
    Invalid UTF-8 is replaced with U+FFFD and reported once per file. Every byte read is
    added to ``stats.text_bytes``.
    """
    limit = 4 * max_chars  # a UTF-8 character is at most 4 bytes, so a legal line always fits
    lineno, bad_utf8 = 0, False

    def decode(data: bytes) -> str:
        nonlocal bad_utf8
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            if not bad_utf8:
                bad_utf8 = True
                notes(
                    f"{path}:{lineno}: invalid UTF-8 (first bad line in this file); undecodable "
                    "bytes replaced with U+FFFD. Convert the file to UTF-8 (e.g. with iconv)."
                )
            return data.decode("utf-8", "replace")

    def pieces(data: bytes) -> Iterator[str]:
        # Decoded pieces of one line longer than ``limit`` bytes, cut at character boundaries.
        while not (data.endswith(b"\n") or len(data) < limit):
            cut = len(data) - _utf8_tail(data)
            yield decode(data[:cut])
            more = stream.readline(limit)
            stats.text_bytes += len(more)
            data = data[cut:] + more
        yield decode(data)

    try:
        while data := stream.readline(limit):
            lineno += 1
            stats.text_bytes += len(data)
            if len(data) < limit or data.endswith(b"\n"):
                text = decode(data)
                if len(text) <= max_chars:
                    yield lineno, text.rstrip("\r\n")
                    continue
            action = "cut into chunks" if split else "skipped"
            notes(
                f"{path}:{lineno}: line longer than {max_chars:,} characters; {action}",
                kind="long line",
            )
            pending = ""
            for piece in pieces(data):
                if not split:
                    continue  # read to the end of the line, keeping nothing
                pending += piece
                while len(pending) > max_chars:
                    cut = pending.rfind(" ", 0, max_chars)
                    cut = cut if cut > 0 else max_chars
                    yield lineno, pending[:cut]
                    pending = pending[cut:]
            if pending.strip():
                yield lineno, pending.rstrip("\r\n")
    except DECOMPRESS_ERRORS as exc:
        notes(
            f"{path}:{lineno + 1}: reading stopped early ({exc}); the file is truncated or "
            f"corrupt. Keeping the {lineno} line(s) read before it."
        )
