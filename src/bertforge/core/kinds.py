"""What a message calls the kind of a value a user sent, in JSON's words, one wording for every
layer: a server's client and a caller of the Python API read the same "got a list of strings"
whether the request parser or a pipeline refused the value."""

from __future__ import annotations

from typing import Any

_KINDS = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
          dict: "object", type(None): "null"}


def json_kind(value: Any) -> str:
    """A JSON value as a client would name what it sent: "a string", "an object", "null", "a
    list of strings", "a list of lists of integers", "a list mixing integers and strings"."""
    if not isinstance(value, list):
        kind = _KINDS.get(type(value), type(value).__name__)
        return {"null": "null", "integer": "a number", "object": "an object"}.get(kind,
                                                                                  f"a {kind}")
    if not value:
        return "an empty list"
    kinds = sorted({_plural(v) for v in value})
    return f"a list of {kinds[0]}" if len(kinds) == 1 else f"a list mixing {' and '.join(kinds)}"


def _plural(value: Any) -> str:
    if isinstance(value, list) and value:
        inner = {_plural(v) for v in value}
        return f"lists of {inner.pop()}" if len(inner) == 1 else "lists"
    kind = _KINDS.get(type(value), type(value).__name__)
    return "nulls" if kind == "null" else f"{kind}s"


__all__ = ["json_kind"]
