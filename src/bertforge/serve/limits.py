"""What the server accepts, checked before any work is queued: the body (its encoding and media
type, size, read time, JSON shape), the items in it (count, text sizes, valid Unicode) and, for
summaries, the decoding work asked for. Each refusal is an :class:`ApiError` that names the field and the option to change.

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
    connection (the request's body was not read to its end); ``retry_after``: seconds sent as
    ``Retry-After`` (rounded up to a whole second, at least 1)."""

    def __init__(self, status: int, message: str, field: str | None = None, *,
                 close: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field, self.close = status, message, field, close
        self.retry_after = retry_after


SHUTTING_DOWN = "the server is shutting down; retry on another instance"
"""What a request the server refuses because it is stopping is told, whichever part refuses it
(admission, a batcher closed at the drain timeout, a replica pool closed under a batch)."""


def shutting_down() -> ApiError:
    """The 503 of a request refused because the server is stopping; the connection closes."""
    return ApiError(503, SHUTTING_DOWN, close=True)


class ClientGone(Exception):
    """The client closed its connection before its answer was ready (while it sent its body,
    or while it waited): nobody will read an answer."""


def error_body(message: str, field: str | None = None) -> dict[str, Any]:
    """The one error schema of every answer: ``{"error": {"field": ..., "message": ...}}``."""
    return {"error": {"field": field, "message": message}}


DRAIN_BYTES = 1 << 20
"""After refusing a request whose body it did not read (a 413, 415 or 503 sent at once), the
server reads and drops up to this many more bytes of it before it closes the connection
(:mod:`bertforge.serve.protocol`): closing a socket with received data unread makes the kernel
send a reset, which can destroy the answer before the client reads it. A client still sending
past this is cut off."""

JSON_TYPES = ("application/json", "text/json")
"""Media types of a JSON body, besides any ``application/...+json``."""
UTF8 = ("utf-8", "utf8")


def check_body_headers(headers: Any) -> None:
    """415 for a body in a form the server does not read, naming the header: a
    ``Content-Encoding`` other than identity (the body is read as it arrives: a compressed
    one would fail as JSON with a confusing message), or a ``Content-Type`` that is not JSON in
    UTF-8. A request without Content-Type is read as JSON."""
    for value in headers.getlist("content-encoding"):
        codings = [c.strip().lower() for c in value.split(",") if c.strip()]
        if any(c != "identity" for c in codings):
            raise ApiError(415, f"Content-Encoding: {value} is not supported: this server reads "
                                "request bodies as they are; send the JSON uncompressed, "
                                "without Content-Encoding", "Content-Encoding", close=True)
    value = headers.get("content-type")
    if value is None:
        return
    media, *params = [part.strip() for part in value.split(";")]
    media = media.lower()
    charset = next((p.split("=", 1)[1].strip(' "').lower() for p in params
                    if p.lower().startswith("charset=")), "utf-8")
    json_media = media in JSON_TYPES or (media.startswith("application/") and
                                         media.endswith("+json"))
    if not json_media or charset not in UTF8:
        what = "JSON" if not json_media else "UTF-8"
        raise ApiError(415, f"Content-Type: {value} is not supported: the body must be "
                            f"{what}; send Content-Type: application/json (curl: --json, or -H "
                            "'Content-Type: application/json')", "Content-Type", close=True)


async def read_body(request: Any, settings: ServeSettings) -> bytes:
    """The raw body of ``request``: 415 for a body the server does not read
    (:func:`check_body_headers`), 413 beyond ``max_body_bytes`` (declared, or counted while
    streaming for chunked bodies), 408 when it takes longer than ``body_timeout``. Refused at
    once, before the rest of the body is read (the connection then closes, see
    :data:`DRAIN_BYTES`). :class:`ClientGone` when the client disconnects meanwhile."""
    check_body_headers(request.headers)
    limit = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() \
            and int(declared) > limit:
        raise ApiError(413, f"the request body is {declared} bytes; the limit is {limit} "
                            "(--max-body-bytes)", "body", close=True)

    async def collect() -> bytes:
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"the request body is over the limit of {limit} bytes "
                                        "(--max-body-bytes)", "body", close=True)
                chunks.append(chunk)
        except ClientDisconnect:
            raise ClientGone() from None
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


__all__ = ["ApiError", "ClientGone", "DRAIN_BYTES", "Items", "SHUTTING_DOWN", "body_items",
           "check_body_headers", "check_generation", "error_body", "parse_json", "read_body",
           "shutting_down"]
