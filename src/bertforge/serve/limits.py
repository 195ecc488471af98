"""What the server accepts, checked before any work is queued: the body (size, read time, JSON
shape), the items in it (count, text sizes, valid Unicode) and, for summaries, the decoding work
asked for. Each refusal is an :class:`ApiError` that names the field and the option to change.

The JSON checks close the gaps Python's parser leaves: it builds an int from any number of digits
(and raises ValueError past 4300), recurses once per nesting level (RecursionError near 1000),
accepts NaN and Infinity, and keeps ``"\\ud800"`` escapes as lone surrogates that no UTF-8
encoder can write back. Here a number over ``max_number_digits`` characters or nesting over
``max_json_depth`` is a 413, NaN/Infinity a 400, a float out of range or a lone surrogate a
422 (naming its field).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any, Mapping

from starlette.requests import ClientDisconnect

from bertforge.serve.settings import ServeSettings, option

Items = list[tuple[str | None, Mapping[str, Any]]]
"""``[(field prefix, item)]``: prefix ``inputs[i]`` for a batch item, None for a single item."""

_SURROGATE = re.compile("[\ud800-\udfff]")


class ApiError(Exception):
    """A request answered with ``status`` and the JSON error body; ``close`` also ends the
    connection (the request's body was not read to its end)."""

    def __init__(self, status: int, message: str, field: str | None = None, *,
                 close: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.field, self.close = status, message, field, close


def error_body(message: str, field: str | None = None) -> dict[str, Any]:
    """The one error schema of every answer: ``{"error": {"field": ..., "message": ...}}``."""
    return {"error": {"field": field, "message": message}}


DRAIN_BYTES = 1 << 20
"""A body declared at most this many bytes over ``max_body_bytes`` is read and dropped (within
``body_timeout``) before the 413: closing a connection whose sent data was never read makes the
kernel answer with a reset, which can reach the client before the 413 does. A larger one is
refused unread."""


async def _drain(request: Any, timeout: float) -> None:
    """Read and drop ``request``'s body, for at most ``timeout`` seconds."""
    async def drop() -> None:
        async for _ in request.stream():
            pass

    try:
        await asyncio.wait_for(drop(), timeout)
    except (asyncio.TimeoutError, OSError, ClientDisconnect):
        pass  # the 413 goes out all the same (or to nobody)


async def read_body(request: Any, settings: ServeSettings) -> bytes:
    """The raw body of ``request``: 413 beyond ``max_body_bytes`` (declared or counted while
    streaming, for chunked bodies), 408 when it takes longer than ``body_timeout``."""
    limit = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        if int(declared) <= limit + DRAIN_BYTES:
            await _drain(request, settings.body_timeout)
        raise ApiError(413, f"the request body is {declared} bytes; the limit is {limit} "
                            "(--max-body-bytes)", "body", close=True)

    async def collect() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the request body is over the limit of {limit} bytes "
                                    "(--max-body-bytes)", "body", close=True)
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(collect(), settings.body_timeout)
    except asyncio.TimeoutError:  # TimeoutError itself from 3.11 on
        raise ApiError(408, f"the request body did not arrive within {settings.body_timeout:g} "
                            "s (--body-timeout); send it at once", "body", close=True) from None


def parse_json(raw: bytes, settings: ServeSettings) -> Any:
    """``raw`` as JSON within the server's limits (see the module notes)."""
    digits = settings.max_number_digits

    def number(kind: type) -> Any:
        def parse(text: str) -> Any:
            # Called by the parser with the number's text, before Python converts it.
            if len(text) > digits:
                raise ApiError(413, f"a number in the request body is {len(text)} characters "
                                    f"long; the limit is {digits} (--max-number-digits)", "body")
            value = kind(text)
            if kind is float and not math.isfinite(value):
                raise ApiError(422, f"the number {text} in the request body is out of range "
                                    "of a 64-bit float", "body")
            return value
        return parse

    def constant(name: str) -> Any:
        raise ApiError(400, f"the request body is not valid JSON: {name} is not a JSON value "
                            "(use a number or null)", "body")

    try:
        value = json.loads(raw, parse_int=number(int), parse_float=number(float),
                           parse_constant=constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", "body") from None
    except RecursionError:  # deeper than Python's parser goes: over any depth limit
        raise _too_deep(settings.max_json_depth) from None
    _check_tree(value, settings.max_json_depth)
    return value


def _too_deep(max_depth: int) -> ApiError:
    return ApiError(413, f"the request body nests arrays or objects deeper than {max_depth} "
                         "levels (--max-json-depth)", "body")


def _check_tree(value: Any, max_depth: int) -> None:
    """413 for nesting deeper than ``max_depth``, 422 naming the field of a lone surrogate."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                raise ApiError(422, f"{path or 'the body'} holds a lone UTF-16 surrogate "
                                    "(a \\ud800-\\udfff escape not in a pair), which is not "
                                    "text; send valid Unicode", path or "body")
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth > max_depth:
            raise _too_deep(max_depth)
        entries = list(node.items() if isinstance(node, dict) else enumerate(node))
        for key, child in reversed(entries):  # popped in document order: the first bad field
            if isinstance(key, str) and _SURROGATE.search(key):
                raise ApiError(422, f"a key in {path or 'the body'} holds a lone UTF-16 "
                                    "surrogate, which is not text; send valid Unicode",
                               path or "body")
            name = f"{path}[{key}]" if isinstance(key, int) else (
                f"{path}.{key}" if path else key)
            stack.append((child, name, depth + 1))


def body_items(body: Any, settings: ServeSettings) -> tuple[Items, bool]:
    """The items of a parsed body and whether it was a ``{"inputs": [...]}`` batch."""
    if not isinstance(body, dict):
        raise ApiError(422, 'the body must be a JSON object: one item, or {"inputs": [items]}',
                       "body")
    if "inputs" not in body:
        items, batched = [(None, body)], False
    else:
        inputs = body["inputs"]
        if not isinstance(inputs, list) or not inputs:
            raise ApiError(422, "inputs must be a non-empty list of objects", "inputs")
        if len(inputs) > settings.max_batch_items:
            raise ApiError(413, f"inputs holds {len(inputs)} items; the limit is "
                                f"{settings.max_batch_items} per request (--max-batch-items)",
                           "inputs")
        for i, item in enumerate(inputs):
            if not isinstance(item, dict):
                raise ApiError(422, f"inputs[{i}] must be a JSON object", f"inputs[{i}]")
        items, batched = [(f"inputs[{i}]", item) for i, item in enumerate(inputs)], True
    for prefix, item in items:
        for key, value in item.items():
            if isinstance(value, str) and len(value) > settings.max_text_chars:
                name = _name(prefix, key)
                raise ApiError(413, f"{name} is {len(value)} characters; the limit is "
                                    f"{settings.max_text_chars} (--max-text-chars)", name)
    return items, batched


def _name(prefix: str | None, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def check_generation(items: Items, requests: list[Any], settings: ServeSettings,
                     batched: bool) -> None:
    """413 when summarization requests ask for more decoding than the server allows: beams
    over ``max_num_beams``, an output over ``max_generation_length`` tokens, or num_beams x
    output length summed over the request over ``max_generation_tokens``. Requests of other
    tasks carry no generation settings and pass."""
    from bertforge.models.generation.config import GenerationConfig

    total = 0
    for (prefix, item), request in zip(items, requests):
        gen = getattr(request, "settings", None)
        if not isinstance(gen, GenerationConfig):
            continue
        length = gen.max_new_tokens if gen.max_new_tokens is not None else gen.max_length
        for field, value, limit in (("num_beams", gen.num_beams, "max_num_beams"),
                                    ("max_length", length, "max_generation_length")):
            allowed = getattr(settings, limit)
            if value is not None and value > allowed:
                whose = "" if field in item else " (the model's generation_config.json)"
                raise ApiError(413, f"{_name(prefix, field)} is {value}{whose}; this server "
                                    f"allows at most {allowed} ({option(limit)})",
                               _name(prefix, field))
        total += gen.num_beams * (length or 0)
    if total > settings.max_generation_tokens:
        raise ApiError(413, f"this request asks for up to {total} decoded tokens (num_beams x "
                            f"output length, summed over its items); the limit is "
                            f"{settings.max_generation_tokens} (--max-generation-tokens)",
                       "inputs" if batched else "num_beams")


__all__ = ["ApiError", "Items", "body_items", "check_generation", "error_body", "parse_json",
           "read_body"]
