"""Running parsed request items through a route's dynamic batcher, shared by every route that
answers with the model (``/v1/<task>``, the OpenAI and TEI shapes): parse on the batcher's
parsing thread, enqueue each item on its own, and turn what went wrong into the one error
schema (a pipeline's ``InputError`` is a 422 naming the field, a closed batcher or a lost
replica 503, anything else a logged 500)."""

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


def _parse_all(pipeline: Pipeline, items: Items,
               whole: tuple[str, ...]) -> list[tuple[Any, int, int]]:
    """``(request, cost, longest row)`` of every item; the first bad item raises its 422."""
    parsed = []
    for prefix, item in items:
        try:
            request = pipeline.parse(item)
        except InputError as exc:
            raise input_error(exc, prefix, whole) from None
        cost = pipeline.cost(request)
        parsed.append((request, cost, row_width(request, cost)))
    return parsed


def closed() -> ApiError:
    return ApiError(503, "the server is shutting down; retry on another instance")


async def answer_items(pipeline: Pipeline, batcher: DynamicBatcher, items: Items,
                       settings: ServeSettings, batched: bool, *, route: str,
                       whole: tuple[str, ...] = ()
                       ) -> tuple[list[Any], list[int]]:
    """The results of ``items`` (``[(field prefix, item)]``) and each one's token cost, each
    item parsed by ``pipeline`` (the route's parser) on the batcher's parsing thread and
    enqueued on its own, so items of one request and of concurrent ones share model calls.
    The items are announced to the batcher while they are parsed, so an idle model waits for
    them rather than run the first alone. Raises :class:`ApiError`: 422 for the first bad
    item, 413 for summaries over the decoding limits, 503 when shutting down or when the
    replica running the item died, 500 (logged) when the model fails on an item."""
    batcher.expect(len(items))
    try:
        parsed = await batcher.parse(_parse_all, pipeline, items, whole)
        check_generation(items, [r for r, _, _ in parsed], settings, batched)
        futures = [batcher.enqueue(r, cost, width) for r, cost, width in parsed]
    except BatcherClosed:
        raise closed() from None
    finally:
        batcher.expect(-len(items))  # enqueued above (no await since), or never will be
    answers = await asyncio.gather(*futures, return_exceptions=True)
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
    return list(answers), [cost for _, cost, _ in parsed]


__all__ = ["answer_items", "closed", "input_error"]
