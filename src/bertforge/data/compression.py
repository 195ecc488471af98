"""Compressed corpus files, opened as byte streams: gzip, bzip2, xz and Zstandard.

The first three come with Python. ``.zst``/``.zstd`` (the form of most web corpora published as
JSON Lines: Dolma, RedPajama, The Pile) need the ``zstandard`` package, imported only when such
a file is opened. Its own stream reader ends quietly when a file is cut short, so
:class:`ZstdReader` decompresses frame by frame and raises ``EOFError`` when the input ends
inside a frame: a truncated download is reported like a truncated ``.gz``, not read as if whole.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from typing import IO, Any, Callable

ZSTD_HINT = "install it with `pip install zstandard` (a dependency of bertforge)"


class ZstdError(OSError):
    """Damaged Zstandard data (the library's own error, as an ``OSError`` like gzip's)."""


# What reading a damaged compressed stream can raise part-way through.
DECOMPRESS_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)
READ_BYTES = 1 << 17  # compressed bytes per read


class ZstdReader(io.RawIOBase):
    """The decompressed bytes of a Zstandard stream of one or more frames, read forwards.

    ``EOFError`` when the input ends inside a frame; :class:`ZstdError` for corrupt data.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        try:
            import zstandard
        except ImportError:
            raise ModuleNotFoundError(f"reading .zst needs zstandard; {ZSTD_HINT}") from None
        self._zstd: Any = zstandard
        self._raw = raw
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self._started = False  # the current frame has taken input
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        view = memoryview(target).cast("B")
        while not self._buffer:
            data = self._raw.read(READ_BYTES)
            if not data:
                if self._started and not self._frame.eof:
                    raise EOFError("the compressed stream ends inside a Zstandard frame")
                return 0
            self._buffer = self._decompress(data)
        n = min(len(view), len(self._buffer))
        view[:n], self._buffer = self._buffer[:n], self._buffer[n:]
        return n

    def _decompress(self, data: bytes) -> bytes:
        """Everything ``data`` completes, across frame boundaries."""
        out = []
        while data:
            if self._frame.eof:  # a new frame starts in what the last one left over
                self._frame = self._zstd.ZstdDecompressor().decompressobj()
            self._started = True
            try:
                out.append(self._frame.decompress(data))
            except self._zstd.ZstdError as exc:
                raise ZstdError(f"corrupt Zstandard data ({exc})") from None
            data = self._frame.unused_data if self._frame.eof else b""
        return b"".join(out)


def _zstd(raw: IO[bytes]) -> IO[bytes]:
    return io.BufferedReader(ZstdReader(raw), buffer_size=READ_BYTES)


# Suffix -> a function opening the decompressed stream of a raw binary file.
COMPRESSORS: dict[str, Callable[[IO[bytes]], IO[bytes]]] = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    ".bz2": lambda raw: bz2.BZ2File(raw, mode="rb"),
    ".xz": lambda raw: lzma.LZMAFile(raw, mode="rb"),
    ".zst": _zstd,
    ".zstd": _zstd,
}

__all__ = ["COMPRESSORS", "DECOMPRESS_ERRORS", "ZSTD_HINT", "ZstdError", "ZstdReader"]
