"""Atomic file writes: a reader sees the old file or the new one, never a partial one.

Every file bertforge publishes (configs, vocabularies, tokenizer files, weights, data shards,
manifests, reports) goes through :func:`atomic_write`: the content is written to a temporary
name in the target's directory, flushed to disk, then renamed over the target with
``os.replace`` (atomic on POSIX and Windows when both names are on one filesystem, which the
shared directory guarantees). If writing fails, the temporary file is removed and the target
is untouched.

Temporary names look like ``.NAME.tmp-PID-RANDOM``: hidden, unique per process and call, and
matched by the ``*.tmp-*`` pattern that interrupted-run cleanups look for.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Callable

TMP_MARK = ".tmp-"


def temp_name(path: Path) -> Path:
    """A fresh temporary sibling of ``path``: ``.NAME.tmp-PID-RANDOM`` in the same directory."""
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file's content to disk (any writer may have produced it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Persist a directory's entries (new names, renames). Not possible on Windows; skipped."""
    if os.name == "nt":
        return
    fsync_file(path)


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], None], *,
                 fsync: bool = True) -> Path:
    """Publish the file that ``write(tmp_path)`` creates as ``path``, atomically.

    ``write`` receives a path (not a handle) so writers that insist on a file name (h5py,
    safetensors, ``tokenizers``) work too; the file already exists, empty, and may be
    overwritten. With ``fsync`` the content is flushed before the rename and the directory
    entry after it, so a crash never leaves a renamed but empty file. On any exception
    (including KeyboardInterrupt) the temporary file is deleted and the exception propagates.
    Returns ``path``.
    """
    path = Path(path)
    tmp = temp_name(path)
    # O_EXCL reserves the name; mode 0o666 lets the umask decide, as a plain open() would
    # (tempfile.mkstemp would publish every file as 0600).
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(tmp)
        if fsync:
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(path.parent)
    return path


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_write`)."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data), fsync=fsync)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically.

    Newlines are written as given (no platform translation), so the bytes are the same on
    every operating system.
    """
    return write_bytes_atomic(path, text.encode("utf-8"), fsync=fsync)


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2,
                      sort_keys: bool = True, ensure_ascii: bool = True,
                      fsync: bool = True) -> Path:
    """Write ``obj`` as JSON plus a final newline to ``path`` atomically.

    Keys are sorted by default so the bytes depend only on the content; pass
    ``sort_keys=False`` where the insertion order is meant for human readers.
    """
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=ensure_ascii)
    return write_text_atomic(path, text + "\n", fsync=fsync)


__all__ = ["TMP_MARK", "atomic_write", "fsync_dir", "fsync_file", "temp_name",
           "write_bytes_atomic", "write_json_atomic", "write_text_atomic"]
