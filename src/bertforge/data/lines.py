"""Reading the lines of a (possibly compressed) text stream with bounded memory.

``iter_lines`` never holds more than a few times ``max_chars`` of one line (or one read of
``BLOCK`` bytes): an enormous line (a binary blob, a whole book without newlines) is cut into
chunks or dropped, invalid UTF-8 is replaced and reported once, and a truncated or corrupt
compressed file ends the stream with a note instead of an exception. A line ends at LF, CRLF
or a lone CR, so files from Windows and classic Mac OS read like Unix ones. Problems go to a
``notes`` callback, so the caller decides how warnings are counted and capped.
"""

from __future__ import annotations

from itertools import chain
from pathlib import Path
from typing import IO, Iterator, Protocol

from bertforge.data.compression import DECOMPRESS_ERRORS

BLOCK = 1 << 14  # bytes per read; when a compressed file is cut short, the failed read is lost
BREAKS = (b"\n", b"\r")  # the last byte of a line break: LF, CRLF or a lone CR


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


def _blocks(stream: IO[bytes]) -> Iterator[bytes]:
    """``stream`` in reads of about ``BLOCK`` bytes, never cutting a CRLF in two."""
    head = b""
    while block := head + stream.read(BLOCK):
        head = b""
        if block.endswith(b"\r"):
            # Its LF may open the next read: split apart, they would make an extra (blank) line.
            head = stream.read(1)
            if head == b"\n":
                block, head = block + head, b""
        yield block


def _line_batches(stream: IO[bytes], limit: int) -> Iterator[list[bytes]]:
    """The raw lines of ``stream``, one list per read.

    Each line keeps its line break (LF, CRLF or CR), except the last line of the stream and the
    pieces of a line too long to hold: those come unterminated and over ``limit`` bytes each,
    and the end of the line follows them. So an unterminated line of at most ``limit`` bytes is
    the last one.
    """
    # The start of a line that goes on in the next read, kept in parts and joined once, so that
    # a long line costs linear time.
    held: list[bytes] = []
    size = 0
    for block in _blocks(stream):
        lines = block.splitlines(keepends=True)  # splits at LF, CRLF and CR, in C
        tail = b"" if lines[-1].endswith(BREAKS) else lines.pop()
        if held and lines:
            lines[0] = b"".join([*held, lines[0]])
            held, size = [], 0
        if tail:
            held.append(tail)
            size += len(tail)
        if size > limit:
            lines.append(b"".join(held))
            held, size = [], 0
        yield lines
    if held:
        yield [b"".join(held)]


def iter_lines(
    stream: IO[bytes],
    path: Path,
    notes: Notes,
    stats: ByteCounter,
    max_chars: int,
    *,
    split: bool,
) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without its line break) for each line of ``stream``.

    LF, CRLF and a lone CR all end a line, mixed freely within a file. Lines are read in
    bounded blocks so one enormous line (a binary blob, a whole book without line breaks) never
    has to fit in memory: it is cut into chunks of at most ``max_chars`` at spaces
    (``split=True``, each chunk yielded with the same line number) or dropped.
    Invalid UTF-8 is replaced with U+FFFD and reported once per file. Every byte read is
    added to ``stats.text_bytes``.
    """
    limit = 4 * max_chars  # a UTF-8 character is at most 4 bytes, so a legal line always fits
    lineno, bad_utf8 = 0, False
    raw = chain.from_iterable(_line_batches(stream, limit))

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
        # Decoded pieces of one long line, cut at character boundaries, without its line break
        # (which must not count toward the length: CRLF would be cut where LF is not).
        while not (data.endswith(BREAKS) or len(data) <= limit):
            cut = len(data) - _utf8_tail(data)
            yield decode(data[:cut])
            more = next(raw, b"")
            stats.text_bytes += len(more)
            data = data[cut:] + more
        yield decode(data).rstrip("\r\n")

    try:
        for data in raw:
            lineno += 1
            stats.text_bytes += len(data)
            # Over ``limit`` bytes without its line break, a line is too long whatever it
            # holds: it goes to the long-line path undecoded, however the reads fell.
            if len(data) <= limit or len(data.rstrip(b"\r\n")) <= limit:
                line = decode(data).rstrip("\r\n")
                if len(line) <= max_chars:
                    yield lineno, line
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
                yield lineno, pending
    except DECOMPRESS_ERRORS as exc:
        notes(
            f"{path}:{lineno + 1}: reading stopped early ({exc}); the file is truncated or "
            f"corrupt. Keeping the {lineno} line(s) read before it."
        )
