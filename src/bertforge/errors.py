"""User-facing errors.

A ``UserError`` is a problem with what the user gave us (a path, a flag, a file's content), not a
bug. The CLI prints its message on one line and exits with status 2; it never shows a traceback.
Messages say what is wrong, where (file, field, line) and what to do about it.
"""


class UserError(Exception):
    """Bad input from the user; the message is shown as-is."""


class ConfigError(UserError):
    """A configuration key or value is invalid."""


class CheckpointError(UserError):
    """A checkpoint or model directory cannot be loaded as asked."""


class DataError(UserError):
    """Input data (corpus, vocab, prepared shards) is missing or malformed."""
