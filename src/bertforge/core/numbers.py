"""Whole numbers read from text people type: options, settings, environment variables, labels,
numbered file names.

Python is generous where a setting should be strict: ``str.isdigit`` is true for "²" (which
``int`` then refuses with a ValueError), and ``int`` reads "３", "٣", "1_000" and "+2" as
numbers nobody meant to type. Every integer read by hand goes through here instead: the ASCII
digits 0-9, a leading "-" only where negative values are allowed, surrounding spaces ignored;
anything else is one line naming the option and what to give.
"""

from __future__ import annotations

import re
from typing import Sequence

from bertforge.errors import ConfigError

_DIGITS = re.compile(r"[0-9]+")
_SIGNED = re.compile(r"-?[0-9]+")


def ascii_int(text: str, *, negative: bool = False) -> int | None:
    """``text`` (spaces around it ignored) as an int when it is ASCII digits, with a leading
    "-" if ``negative``; else None."""
    if not isinstance(text, str):
        return None
    stripped = text.strip()
    return int(stripped) if (_SIGNED if negative else _DIGITS).fullmatch(stripped) else None


def whole_number(text: str | int, name: str, *, minimum: int | None = None,
                 words: Sequence[str] = (), error: type[Exception] = ConfigError,
                 hint: str = "") -> int | str:
    """``text`` as an int of at least ``minimum``, or one of ``words`` (any case, returned as
    written in ``words``); else ``error`` with one line naming ``name``. An int (not a bool)
    passes through the same bounds. ``hint`` ends the message (what to do, when not obvious)."""
    if isinstance(text, str):
        word = text.strip().lower()
        chosen = next((w for w in words if w.lower() == word), None)
        if chosen is not None:
            return chosen
        value = ascii_int(text, negative=minimum is None or minimum < 0)
    else:
        value = text if isinstance(text, int) and not isinstance(text, bool) else None
    if value is not None and (minimum is None or value >= minimum):
        return value
    bound = f" >= {minimum}" if minimum is not None else ""
    alternatives = "".join(f" or {w}" for w in words)
    raise error(f"{name} must be a whole number{bound} written with the digits 0-9"
                f"{alternatives} (got {text!r}){hint}")


__all__ = ["ascii_int", "whole_number"]
