"""Errors that end a command with a one-line message instead of a traceback.

A ``UserError`` is a problem with what the user gave us (a path, a flag, a file's content), not a
bug: the CLI prints its message on one line and exits with status 2. A ``RunError`` is a run that
cannot go on for a reason outside the code (training diverged, a rank stopped answering, the disk
filled up): one line too, exit status 1. Messages say what is wrong, where (file, field, line,
rank) and what to do about it. Anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input from the user; the message is shown as-is."""

    exit_code = 2


class ConfigError(UserError):
    """A configuration key or value is invalid."""


class CheckpointError(UserError):
    """A checkpoint or model directory cannot be loaded as asked."""


class DataError(UserError):
    """Input data (corpus, vocab, prepared shards) is missing or malformed."""


class RunError(Exception):
    """A run stopped for a reason outside the code; what was saved before it is intact."""

    exit_code = 1


class TrainingDiverged(RunError):
    """Too many consecutive optimizer steps had non-finite gradients or weights."""


class CollectiveTimeout(RunError):
    """A distributed collective timed out: another rank stopped responding."""


def os_error_text(exc: OSError) -> str:
    """``No space left on device: /path`` rather than ``[Errno 28] No space left ...: '/path'``."""
    what = exc.strerror or str(exc)
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    return f"{what}: {' -> '.join(names)}" if names else what


def in_context(context: str, message: object, subject: str | None = None) -> str:
    """``context: message`` for an error re-raised with what it was about, unless the message
    already names ``subject`` (by default the context itself): a wrapped message that says
    "model X: X holds no tokenizer" reads as a stutter, and one that names a thing twice
    usually repeats its advice too."""
    text = str(message)
    return text if (subject or context) in text else f"{context}: {text}"
