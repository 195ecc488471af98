"""Answering a request with the model, shared by every route that does (``/v1/<task>``, the
OpenAI and TEI shapes): admit it (:mod:`bertforge.serve.admission`), read its body, parse its
items on the batcher's parsing thread, enqueue each item on its own, watch its client while it
waits, and turn what went wrong into the one error schema (a pipeline's ``InputError`` is a 422
naming the field, a full queue, a closed batcher or a lost replica 503, anything else a logged
500)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Awaitable, Callable, Mapping

from fastapi.responses import JSONResponse, Response

from bertforge.inference.pipelines import InputError, Pipeline
from bertforge.serve.admission import while_connected
from bertforge.serve.batching import BatcherClosed, BatchLost, DynamicBatcher
from bertforge.serve.limits import (ApiError, ClientGone, Items, check_generation, parse_json,
                                    read_body, shutting_down)
from bertforge.serve.settings import ServeSettings

log = logging.getLogger("bertforge.serve")


CUT_IN_A_REQUEST = 'send "truncate": true'
"""How a client asks for a long input to be cut (``InputError``'s ``{cut}``)."""


def input_error(exc: InputError, prefix: str | None,
                names: Mapping[str, str | None] | None = None) -> ApiError:
    """A pipeline's InputError as a 422 in the client's words: each field it names (its own
    and those its message mentions) as the route calls it, and how a request asks for a cut.
    A field is ``prefix.field`` for a batch item (``inputs[2].text``), or what ``names`` says
    for routes whose request fields are not the pipeline's: a name (``"text"`` -> ``"query"``
    for a reranker's query) or None for the item's value itself (``"text"`` -> ``input[1]``
    for ``{"input": ["a", "b"]}``)."""
    names = names or {}

    def client(field: str) -> str:
        if field in names:
            return names[field] or prefix or field
        if prefix is None:
            return field
        return f"{prefix}.{field}" if field else prefix

    renamed = exc.renamed({f: client(f) for f in (exc.field, *exc.refers)}, CUT_IN_A_REQUEST)
    return ApiError(422, str(renamed), renamed.field)


def row_width(request: Any, cost: int) -> int:
    """The longest padded row ``request`` takes in a batch, in tokens (the token budget counts
    rows x the longest row): its window, its longest QA window, its article (a summary's beams
    repeat it); else its cost, as one row."""
    window = getattr(request, "window", None)
    if window is not None:
        return len(window.ids)
    features = getattr(request, "features", None)
    if features is not None:
        return int(features.attention_mask.sum(1).max())
    ids = getattr(request, "ids", None)
    return len(ids) if ids is not None else cost


def _parse_one(pipeline: Pipeline, prefix: str | None, item: Any,
               names: Mapping[str, str | None] | None) -> tuple[Any, int, int]:
    """``(request, cost, longest row)`` of one item; a bad item raises its 422."""
    try:
        request = pipeline.parse(item)
    except InputError as exc:
        raise input_error(exc, prefix, names) from None
    cost = pipeline.cost(request)
    return request, cost, row_width(request, cost)


async def _parse_items(pipeline: Pipeline, batcher: DynamicBatcher, items: Items,
                       names: Mapping[str, str | None] | None) -> list[tuple[Any, int, int]]:
    """Every item parsed on the batcher's parsing thread, one item per turn: the thread takes
    turns in arrival order, so a request never has more than one item waiting there, and a
    small request waits behind one item of each request being parsed, not behind all their
    items (tokenization is work a large request must not make every other one wait for)."""
    return [await batcher.parse(_parse_one, pipeline, prefix, item, names)
            for prefix, item in items]


CLIENT_GONE = 499
"""The status recorded (in /metrics; nobody reads it) for a request whose client closed its
connection before the answer was ready: nginx's "client closed request"."""


async def answer_request(request: Any, settings: ServeSettings, admission: Any,
                         answer: Callable[[Any], Awaitable[Any]]) -> Response:
    """A model route's whole answer to ``request``: a 503 at once when ``admission`` (the
    server's :class:`~bertforge.serve.admission.Admission`, or None) can take nothing now,
    before the body is read; the body read and parsed within the limits; then
    ``answer(body)``, JSON-able, computed while the client is connected (when it goes, the
    work is cancelled: :func:`~bertforge.serve.admission.while_connected`)."""
    if admission is not None:
        admission.check()
    try:
        body = parse_json(await read_body(request, settings), settings)
        return JSONResponse(await while_connected(request, answer(body)))
    except ClientGone:
        return Response(status_code=CLIENT_GONE)


async def answer_items(pipeline: Pipeline, batcher: DynamicBatcher, items: Items,
                       settings: ServeSettings, batched: bool, *, route: str,
                       names: Mapping[str, str | None] | None = None
                       ) -> tuple[list[Any], list[int]]:
    """The results of ``items`` (``[(field prefix, item)]``) and each one's token cost, each
    item parsed by ``pipeline`` (the route's parser) on the batcher's parsing thread and
    enqueued on its own, so items of one request and of concurrent ones share model calls.
    The items are announced to the batcher while they are parsed, so an idle model waits for
    them rather than run the first alone. ``names``: the route's own names of the pipeline's
    fields, for its errors (``input_error``). Raises :class:`ApiError`: 422 for the first bad
    item, 413 for summaries over the decoding limits, 503 when shutting down or when the
    replica running the item died or the queue is full (the batcher's ``admission`` holds
    the items from before they are parsed until they are answered), 500 (logged) when the
    model fails on an item. Cancelled (its client went away), it withdraws what it queued."""
    admission = batcher.admission
    with admission.hold(len(items)) if admission is not None else contextlib.nullcontext():
        batcher.expect(len(items))
        try:
            parsed = await _parse_items(pipeline, batcher, items, names)
            check_generation(items, [r for r, _, _ in parsed], settings, batched)
            futures = [batcher.enqueue(r, cost, width) for r, cost, width in parsed]
        except BatcherClosed:
            raise shutting_down() from None
        except asyncio.CancelledError:
            if admission is not None:  # none of them reached the queue
                admission.dropped += len(items)
            raise
        finally:
            batcher.expect(-len(items))  # enqueued above (no await since), or never will be
        # Cancelling this gather (the client went away) cancels every item's future.
        answers = await asyncio.gather(*futures, return_exceptions=True)
    return _results(items, answers, parsed, names, route)


def _results(items: Items, answers: list[Any], parsed: list[tuple[Any, int, int]],
             names: Mapping[str, str | None] | None, route: str) -> tuple[list[Any], list[int]]:
    """The answers of ``answer_items``, or the first error among them as an ApiError."""
    for (prefix, _), answer in zip(items, answers):
        if isinstance(answer, InputError):
            raise input_error(answer, prefix, names)
        if isinstance(answer, BatcherClosed):
            raise shutting_down()
        if isinstance(answer, BatchLost):  # a replica died under it: other replicas may answer
            # The message is the pool's whole sentence, advice included: nothing is appended.
            raise ApiError(503, str(answer), retry_after=getattr(answer, "retry_after", 1.0))
        if isinstance(answer, BaseException):
            log.error("%s failed on an item", route, exc_info=answer)
            raise ApiError(500, "internal error while running the model on this request; "
                                "the server log has the details")
    return list(answers), [cost for _, cost, _ in parsed]


__all__ = ["CLIENT_GONE", "answer_items", "answer_request", "input_error"]
