"""Reading JSON files the one way: UTF-8 with or without a byte-order mark, errors at
``FILE:LINE:COLUMN`` (characters, from 1), and a key given twice in one object refused with both
places.

Python's ``json`` accepts a repeated key and keeps the last value, so a config.json with
``"num_labels"`` twice, a predictions file with one question id twice, or a tokenizer.json with
one token twice would be read as something its author did not write, without a word. Every JSON
file bertforge reads goes through :func:`read_json` (or :func:`parse_json` for text already in
memory), so each of them refuses that the same way.
"""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path
from typing import Any

from bertforge.core.kinds import json_kind
from bertforge.errors import DataError, UserError, os_error_text

_BOM = codecs.BOM_UTF8.decode("utf-8")


class _RepeatedKey(ValueError):
    """Raised inside the parser; turned into the caller's error with both places."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def place(text: str, pos: int) -> tuple[int, int]:
    """(line, column), both from 1, the column in characters, of offset ``pos`` of ``text``."""
    return text.count("\n", 0, pos) + 1, pos - text.rfind("\n", 0, pos)


def parse_json(text: str, source: str, *, error: type[UserError] = DataError,
               hint: str = "", line: int = 1) -> Any:
    """``text`` (a leading byte-order mark dropped) parsed as JSON; ``error`` naming
    ``source:LINE:COLUMN`` for invalid JSON and both places of a key repeated in one object.
    ``hint`` says what to do; it is added to every message. ``line``: the line of ``source``
    that ``text`` starts on (one line of a JSON Lines file)."""
    text = text.removeprefix(_BOM)
    tail = f"; {hint}" if hint else ""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        raise error(f"{source}:{exc.lineno + line - 1}:{exc.colno}: not valid JSON ({exc.msg})"
                    f"{tail}") from None
    except _RepeatedKey as exc:
        (first, first_col), (second, second_col) = _repeated_key_places(text, exc.key)
        raise error(f"{source}:{second + line - 1}:{second_col}: key {exc.key!r} was already "
                    f"given at line {first + line - 1}, column {first_col} of the same object; "
                    f"give each key once{tail}") from None
    except RecursionError:
        raise error(f"{source}: JSON nested too deeply to read{tail}") from None


def read_json(path: str | os.PathLike[str], *, error: type[UserError] = DataError,
              hint: str = "", what: str = "") -> Any:
    """The parsed JSON file at ``path`` (see :func:`parse_json`); a missing or unreadable file,
    or bytes that are not UTF-8, are ``error`` too (``what`` names the file's role, e.g.
    "model config")."""
    path = Path(path)
    role = f"{what} " if what else ""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{role}{path} does not exist; check the path") from None
    except OSError as exc:
        raise error(f"cannot read {role}{path}: {os_error_text(exc)}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the "
                    f"{role}file as UTF-8") from None
    return parse_json(text, str(path), error=error, hint=hint)


def read_json_object(path: str | os.PathLike[str], *, error: type[UserError] = DataError,
                     hint: str = "", what: str = "") -> dict[str, Any]:
    """:func:`read_json` of a file whose top level must be a JSON object."""
    data = read_json(path, error=error, hint=hint, what=what)
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object at the top level, got "
                    f"{json_kind(data)}{'; ' + hint if hint else ''}")
    return data


def _repeated_key_places(text: str, key: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(line, column) of the first two uses of ``key`` in one object of ``text`` (valid JSON
    apart from the repeat): a walk over its structure that records each object's keys."""
    decoder = json.JSONDecoder()
    objects: list[dict[str, int] | None] = []   # per open container: its keys, None for a list
    expect_key = False
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == '"':
            value, end = json.decoder.scanstring(text, i + 1)
            current = objects[-1] if objects else None
            if expect_key and current is not None:
                if value == key and key in current:
                    return place(text, current[key]), place(text, i)
                current[value] = i
            expect_key = False
            i = end
            continue
        if char in "{[":
            objects.append({} if char == "{" else None)
            expect_key = char == "{"
        elif char in "}]":
            objects.pop()
        elif char == ",":
            expect_key = bool(objects) and objects[-1] is not None
        elif char not in " \t\r\n:":
            _, i = decoder.raw_decode(text, i)  # a number or a literal
            continue
        i += 1
    return (0, 0), (0, 0)  # not reached: the parser found the repeat


__all__ = ["parse_json", "place", "read_json", "read_json_object"]
