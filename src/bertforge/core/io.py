"""Atomic file writes (a reader sees the old file or the new one, never a partial one) and
per-file checksums (a reader can tell that a file's bytes are the ones that were written).

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

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any, Callable, Iterable

from bertforge.errors import ConfigError

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


def ensure_writable_dir(path: str | os.PathLike[str], key: str) -> Path:
    """Create directory ``path`` if needed and prove it writable; ``ConfigError`` naming ``key``
    otherwise (a file in the way, a read-only file system, no permission). Checked before any
    work starts, so a long run never fails at its first save."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key} {path} is a file, not a directory; choose a directory path")
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe := temp_name(path / "write-test"), os.O_WRONLY | os.O_CREAT |
                         os.O_EXCL, 0o666))
        os.unlink(probe)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
        raise ConfigError(f"{key} {path} is not writable: {exc.strerror or exc}{where}; choose "
                          "a writable directory or fix its permissions") from None
    return path


# --------------------------------------------------------------------------- checksums

CHECKSUMS_NAME = "checksums.sha256"
_HASH_BLOCK = 4 << 20


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in blocks (memory stays flat for any size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(directory: str | os.PathLike[str], names: Iterable[str]) -> Path:
    """Write ``directory/checksums.sha256`` for the files ``names`` (relative, '/'-separated).

    The format is ``sha256sum``'s, so ``sha256sum -c checksums.sha256`` checks a copy by hand.
    """
    directory = Path(directory)
    lines = [f"{sha256_file(directory / name)}  {name}\n" for name in sorted(names)]
    return write_text_atomic(directory / CHECKSUMS_NAME, "".join(lines))


def read_checksums(directory: str | os.PathLike[str]) -> dict[str, str] | None:
    """``{relative name: hex digest}`` from ``directory/checksums.sha256``, or None without one.

    Raises ``ValueError`` naming the line when the file is not in ``sha256sum`` format.
    """
    path = Path(directory) / CHECKSUMS_NAME
    if not path.is_file():
        return None
    out: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            raise ValueError(f"{path}:{lineno}: not a 'SHA256  NAME' line")
        out[name] = digest
    return out


def verify_checksums(directory: str | os.PathLike[str], recorded: dict[str, str]) -> list[str]:
    """Problems with the files of ``recorded`` (``{name: digest}``, from :func:`read_checksums`)
    under ``directory``: ``"NAME is missing"`` or ``"NAME does not match its checksum"``. Empty
    when every file is intact."""
    directory = Path(directory)
    problems = []
    for name, digest in recorded.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif sha256_file(path) != digest:
            problems.append(f"{name} does not match its checksum")
    return problems


__all__ = ["CHECKSUMS_NAME", "TMP_MARK", "atomic_write", "ensure_writable_dir", "fsync_dir",
           "fsync_file", "read_checksums", "sha256_file", "temp_name", "verify_checksums",
           "write_bytes_atomic", "write_checksums", "write_json_atomic", "write_text_atomic"]
