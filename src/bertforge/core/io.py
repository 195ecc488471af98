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
import logging
import math
import os
import secrets
import socket
import stat
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from bertforge.core.paths import named_file
from bertforge.errors import ConfigError, UserError

TMP_MARK = ".tmp-"
log = logging.getLogger(__name__)


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
    mode = os.stat(tmp).st_mode & 0o777  # 0o666 less the umask
    try:
        write(tmp)
        if os.stat(tmp).st_mode & 0o777 != mode:
            # A writer that replaced the file (safetensors writes its own 0600 file) does not
            # decide who may read what bertforge publishes: the umask does.
            os.chmod(tmp, mode)
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


def finite_json(obj: Any, where: str) -> Any:
    """``obj`` with every NaN and infinity (at any depth) replaced by None, so that it can be
    written as standard JSON (``json.dumps`` would write the bare ``NaN`` no JSON parser takes).

    A value that is not finite is a metric undefined for its inputs (Pearson's r of constant
    labels, a no-answer probability of an empty set...); each replacement is named in one
    warning, ``where`` saying which file or line it was bound for."""
    replaced: list[str] = []

    def clean(value: Any, key: str) -> Any:
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            replaced.append(f"{key}={value}")
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{key}[{i}]") for i, v in enumerate(value)]
        return value

    out = clean(obj, "")
    if replaced:
        more = f" and {len(replaced) - 1} more" if len(replaced) > 1 else ""
        log.warning("%s: %s%s is undefined (not a finite number) and is written as null",
                    where, replaced[0], more)
    return out


def json_text(obj: Any, where: str, **dumps: Any) -> str:
    """``json.dumps(obj, **dumps)`` that always gives standard JSON: non-finite numbers become
    null with a warning naming them (:func:`finite_json`)."""
    return json.dumps(finite_json(obj, where), allow_nan=False, **dumps)


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2,
                      sort_keys: bool = True, ensure_ascii: bool = True,
                      fsync: bool = True) -> Path:
    """Write ``obj`` as JSON plus a final newline to ``path`` atomically.

    Keys are sorted by default so the bytes depend only on the content; pass
    ``sort_keys=False`` where the insertion order is meant for human readers. Non-finite
    numbers are written as null, with a warning (:func:`finite_json`).
    """
    text = json_text(obj, str(path), indent=indent, sort_keys=sort_keys,
                     ensure_ascii=ensure_ascii)
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


def check_output_file(path: str | os.PathLike[str], key: str) -> Path:
    """Prove that a command can publish its one output file at ``path`` before it does any
    work: not a directory, in a writable directory (created if needed). ``ConfigError`` naming
    ``key`` and the path otherwise."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{key} {path} is a directory; give the file to write, e.g. "
                          f"{path / 'predictions.jsonl'}")
    ensure_writable_dir(path.parent, f"{key} {path}: its folder")
    return path


# --------------------------------------------------------------------------- output locks

LOCK_NAME = ".bertforge.lock"

# Lock descriptors this process holds; a forked child closes its copies at once
# (:func:`_drop_inherited_locks`).
_HELD: set[int] = set()

# Opening a file written in place never follows a link, never waits (a FIFO), never adopts a
# terminal, never leaks into an exec'd program.
_IN_PLACE = (os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
             | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
_LOCK_FLAGS = os.O_RDWR | _IN_PLACE
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | _IN_PLACE


def _drop_inherited_locks() -> None:
    """In a freshly forked child: close the copies of the lock descriptors it inherited.

    ``flock`` belongs to the open file description, which stays locked while any process holds
    a descriptor of it: a DataLoader worker orphaned by a SIGKILLed main process would keep the
    output locked until it noticed, and the refusal would name the dead process. Closing a
    copy never releases the parent's lock (only its last descriptor or ``LOCK_UN`` does).
    """
    for fd in _HELD:
        with suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_locks)


def _kind(mode: int, links: int) -> str | None:
    """What a path holds when it is not a regular file with one name; None when it is."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    if not stat.S_ISREG(mode):
        return "not a file"
    return f"a file with {links} names (a hard link)" if links != 1 else None


def _not_ours(path: Path, what: str, where: str, kind: str) -> ConfigError:
    return ConfigError(f"{where}: its {what} {path} is {kind}, not a regular file; it was left "
                       f"untouched: remove it and run the command again (bertforge creates its "
                       f"own {what})")


def check_in_place(path: str | os.PathLike[str], what: str, where: str) -> None:
    """``ConfigError`` unless ``path`` is absent or a regular file with one name (checked
    without following a link), for a file bertforge writes in place (a lock, an appended log):
    writing through a link planted there would change the link's target, opening a FIFO would
    hang, and writing to a hard link would change the file's other name too."""
    with suppress(FileNotFoundError):
        st = os.lstat(path)
        if kind := _kind(st.st_mode, st.st_nlink):
            raise _not_ours(Path(path), what, where, kind)


def open_in_place(path: str | os.PathLike[str], flags: int, what: str, where: str) -> int:
    """A descriptor of the file bertforge writes in place at ``path`` (created if absent, with
    ``flags``: :data:`APPEND_FLAGS` for a log): a regular file with one name, opened without
    following a link and without blocking. Anything else there (a link to a file someone cares
    about, a directory, a FIFO, a socket, a device, a hard link) is a ``ConfigError`` naming the
    path and ``what`` it was to be, and is neither written nor removed."""
    path = Path(path)
    check_in_place(path, what, where)  # devices and FIFOs are refused before they are opened
    try:
        fd = os.open(path, flags | _IN_PLACE, 0o666)
    except OSError as exc:
        check_in_place(path, what, where)  # ELOOP, EISDIR, ENXIO: something put there since
        raise ConfigError(f"{where}: its {what} {path} cannot be opened ({exc.strerror or exc});"
                          " remove it or fix its permissions, and run the command again"
                          ) from None
    opened = os.fstat(fd)
    if kind := _kind(opened.st_mode, opened.st_nlink):
        os.close(fd)
        raise _not_ours(path, what, where, kind)
    return fd


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _still_named(path: Path, fd: int) -> bool:
    """True while ``path`` names the very file open as ``fd`` (not a replacement, not a link)."""
    try:
        return _identity(os.lstat(path)) == _identity(os.fstat(fd))
    except FileNotFoundError:
        return False


def _holder(fd: int) -> str:
    """What the lock file says about the process that holds it (best effort)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return (f" (pid {info['pid']} on {info['host']}: `{info['command']}`, since "
                f"{info['since']})")
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _acquire(path: Path, directory: Path, key: str) -> int:
    """The locked descriptor of ``path``; ``ConfigError`` naming the holder when it is taken."""
    while True:
        fd = open_in_place(path, _LOCK_FLAGS, "lock file", f"{key} {directory}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise ConfigError(f"{key} {directory} is in use by another bertforge command"
                              f"{holder}; wait for it to finish, or choose another {key}") from None
        # The holder before us may have removed the file between our open and our lock.
        if _still_named(path, fd):
            return fd
        os.close(fd)


def _release(path: Path, fd: int, owner: int) -> None:
    """Remove the lock file (if it is still ours) and unlock. Only the process that took the
    lock does anything: a forked child that unwinds this far has already closed its copy."""
    if os.getpid() != owner:
        return
    if _still_named(path, fd):  # never a file another command created in its place
        with suppress(OSError):
            os.unlink(path)  # before unlocking: no one can lock this file after us
    _HELD.discard(fd)
    os.close(fd)  # releases the lock


@contextmanager
def output_lock(directory: str | os.PathLike[str], key: str, command: str, *,
                beside: bool = False) -> Iterator[Path]:
    """Hold an exclusive lock on ``directory`` while the body runs, so that two commands never
    write into one output at once; a second one fails at once with a ``ConfigError`` naming the
    first (pid, host, command, start time).

    The lock is ``flock`` on ``directory/.bertforge.lock`` (the directory is created), or with
    ``beside`` on ``.NAME.bertforge.lock`` next to it, for an output published whole by a
    rename (a directory that must not exist yet, or a single file). The lock file is a regular
    file that the lock opened itself, without following links; anything else at its path is a
    one-line ``ConfigError`` and is never written. Only this process holds the lock: a forked
    child (a DataLoader worker) closes its copy at once, so the kernel releases the lock the
    moment this process exits, however it exits (a SIGKILLed run leaves no stale lock). The
    file is removed on release if it is still the one we locked, and so is the directory if
    this call created it and it is still empty (a command refused by its first checks leaves
    nothing behind). Where ``flock`` does not exist (Windows), nothing is locked.
    """
    directory = Path(directory)
    created = not beside and not directory.exists()
    if beside:
        ensure_writable_dir(directory.parent, f"{key} {directory}: its folder")
        path = directory.with_name(f".{directory.name}{LOCK_NAME}")
    else:
        path = ensure_writable_dir(directory, key) / LOCK_NAME
    if fcntl is None:
        yield directory
        return
    fd, owner = _acquire(path, directory, key), os.getpid()
    _HELD.add(fd)
    try:
        info = {"pid": owner, "host": socket.gethostname(), "command": command,
                "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield directory
    finally:
        _release(path, fd, owner)
        if created and os.getpid() == owner:
            with suppress(OSError):  # fails unless empty: nothing written is ever removed
                directory.rmdir()


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

    Raises ``ValueError`` naming the line when the file is not in ``sha256sum`` format, names
    a file twice, or names one outside ``directory`` (a checkpoint may come from anyone: its
    list must not make bertforge read elsewhere).
    """
    path = Path(directory) / CHECKSUMS_NAME
    if not path.is_file():
        return None
    out: dict[str, str] = {}
    first: dict[str, int] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            raise ValueError(f"{path}:{lineno}: not a 'SHA256  NAME' line")
        if name in first:
            raise ValueError(f"{path}:{lineno}: {name} is listed again (first at line "
                             f"{first[name]}); each file once")
        try:
            named_file(path.parent, name, named_by=f"{path}:{lineno}")
        except UserError as exc:
            raise ValueError(str(exc)) from None
        out[name], first[name] = digest, lineno
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


__all__ = ["APPEND_FLAGS", "CHECKSUMS_NAME", "LOCK_NAME", "TMP_MARK", "atomic_write",
           "check_in_place", "check_output_file", "ensure_writable_dir", "finite_json",
           "fsync_dir", "fsync_file", "json_text", "open_in_place", "output_lock",
           "read_checksums", "sha256_file", "temp_name", "verify_checksums", "write_bytes_atomic",
           "write_checksums", "write_json_atomic", "write_text_atomic"]
