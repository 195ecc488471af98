"""Running parsed request items through a route's dynamic batcher, shared by every route that
answers with the model (``/v1/<task>``, the OpenAI and TEI shapes): parse on the model's thread,
submit each item on its own, and turn what went wrong into the one error schema (a pipeline's
``InputError`` is a 422 naming the field, a closed batcher or a lost replica 503, anything else a
logged 500)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from bertforge.inference.pipelines import InputError, Pipeline
from bertforge.serve.batching import BatcherClosed, BatchLost, DynamicBatcher
from bertforge.serve.limits import ApiError, Items, check_generation
from bertforge.serve.settings import ServeSettings

log = logging.getLogger("bertforge.serve")


def input_error(exc: InputError, prefix: str | None, whole: tuple[str, ...] = ()) -> ApiError:
    """A pipeline's InputError as a 422, its field inside ``prefix`` (``inputs[i]``) for batch
    items. ``whole`` names the item fields that *are* the request's value in shapes where an
    item is a bare string (``"text"`` for ``{"input": ["a", "b"]}``): an error on one of them
    names ``prefix`` itself (``input[1]``), not ``input[1].text``."""
    if prefix is not None:
        exc = (InputError(prefix, exc.message) if exc.field in whole else exc.within(prefix))
    return ApiError(422, str(exc), exc.field)


def _parse_all(pipeline: Pipeline, items: Items,
               whole: tuple[str, ...]) -> list[tuple[Any, int]]:
    """``(request, cost)`` of every item; the first bad item raises its 422."""
    parsed = []
    for prefix, item in items:
        try:
            request = pipeline.parse(item)
        except InputError as exc:
            raise input_error(exc, prefix, whole) from None
        parsed.append((request, pipeline.cost(request)))
    return parsed


def closed() -> ApiError:
    return ApiError(503, "the server is shutting down; retry on another instance")


async def answer_items(pipeline: Pipeline, batcher: DynamicBatcher, items: Items,
                       settings: ServeSettings, batched: bool, *, route: str,
                       whole: tuple[str, ...] = ()
                       ) -> tuple[list[Any], list[int]]:
    """The results of ``items`` (``[(field prefix, item)]``) and each one's token cost, each
    item parsed by the pipeline on the model's thread and submitted to
    ``batcher`` on its own, so items of one request and of concurrent ones share model calls.
    Raises :class:`ApiError`: 422 for the first bad item, 413 for summaries over the decoding
    limits, 503 when shutting down or when the replica running the item died, 500 (logged)
    when the model fails on an item."""
    try:
        parsed = await batcher.in_worker(_parse_all, pipeline, items, whole)
    except BatcherClosed:
        raise closed() from None
    check_generation(items, [r for r, _ in parsed], settings, batched)
    answers = await asyncio.gather(*(batcher.submit(r, cost) for r, cost in parsed),
                                   return_exceptions=True)
    for (prefix, _), answer in zip(items, answers):
        if isinstance(answer, InputError):
            raise input_error(answer, prefix, whole)
        if isinstance(answer, BatcherClosed):
            raise closed()
        if isinstance(answer, BatchLost):  # a replica died under it: other replicas may answer
            raise ApiError(503, f"{answer}; retry the request")
        if isinstance(answer, BaseException):
            log.error("%s failed on an item", route, exc_info=answer)
            raise ApiError(500, "internal error while running the model on this request; "
                                "the server log has the details")
    return list(answers), [cost for _, cost in parsed]


__all__ = ["answer_items", "closed", "input_error"]
