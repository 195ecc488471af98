"""Admission: how much work the server holds at once, and what becomes of work nobody waits for.

A server that takes in every request of a burst queues more than it can answer before its
clients give up; they time out, and it goes on computing answers nobody reads. Three rules keep
the work it holds to what it can answer:

* **A bounded queue.** :class:`Admission` counts the request items admitted and not answered
  yet (being tokenized, queued, or in a model call), one count for every route. A request that
  would take it past ``--max-queue`` is answered 503 with ``Retry-After`` at once: before its
  body is read when the queue is full already, else as soon as its JSON says how many items it
  holds, before any of them is tokenized. ``Retry-After`` is the time the server needs, at its
  recent rate, to answer what it holds (1 to 60 s).
* **Nobody waiting, nothing computed.** :func:`while_connected` runs a request's work while it
  watches the connection; when the client goes, the work is cancelled, so its items leave the
  batching queue (or are never tokenized) and no batch computes them. They are counted as
  dropped (``bertforge_dropped_items_total``).
* **Draining.** :meth:`Admission.close` (SIGTERM) refuses every new request with a 503 (and
  ``/health`` answers 503, ``draining``, so that load balancers route elsewhere); what was
  admitted is answered until the drain timeout, then refused too
  (:meth:`bertforge.serve.batching.DynamicBatcher.expire`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any, Awaitable, Iterator, TypeVar

from bertforge.serve.limits import ApiError, ClientGone, shutting_down

T = TypeVar("T")

RETRY_AFTER_S = (1.0, 60.0)
"""The bounds of a 503's Retry-After: a client retries no sooner than a second, and no later
than a minute whatever the estimate (a stalled model gives none worth waiting for)."""
_SMOOTHING = 0.2  # weight of the newest batch in the smoothed rate


class Admission:
    """The items a server holds, bounded by ``limit`` (see the module notes). One per app, read
    and changed on its event loop only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.admitted = 0
        self.closing = False
        self.rejected = {"queue_full": 0, "shutting_down": 0}
        self.dropped = 0
        self._rate: float | None = None  # items answered per second of model calls, smoothed

    def check(self) -> None:
        """503 for a request that cannot be admitted whatever it holds: the server is shutting
        down or its queue is full. For use before its body is read (the connection then
        closes: the unread body cannot be skipped)."""
        if self.closing:
            raise self._refuse("shutting_down")
        if self.admitted >= self.limit:
            raise self._refuse("queue_full", close=True)

    @contextlib.contextmanager
    def hold(self, items: int) -> Iterator[None]:
        """Admit ``items`` for the body of the ``with`` (503 when they do not fit). A request
        larger than the whole queue is admitted alone, when nothing else is held."""
        if self.closing:
            raise self._refuse("shutting_down")
        if self.admitted and self.admitted + items > self.limit:
            raise self._refuse("queue_full")
        self.admitted += items
        try:
            yield
        finally:
            self.admitted -= items

    def close(self) -> None:
        """Refuse every request from now on (the server is draining)."""
        self.closing = True

    def observe(self, items: int, seconds: float) -> None:
        """A model call answered ``items`` in ``seconds``: the rate Retry-After is estimated by."""
        if seconds > 0:
            rate = items / seconds
            self._rate = rate if self._rate is None else (
                (1 - _SMOOTHING) * self._rate + _SMOOTHING * rate)

    def retry_after(self) -> float:
        """Seconds the server needs to answer what it holds, at its recent rate."""
        low, high = RETRY_AFTER_S
        return low if not self._rate else min(high, max(low, self.admitted / self._rate))

    def _refuse(self, reason: str, close: bool = False) -> ApiError:
        self.rejected[reason] += 1
        if reason == "shutting_down":
            return shutting_down()
        wait = self.retry_after()
        return ApiError(503, f"the server is busy: it holds {self.admitted} request items, its "
                             f"limit (--max-queue {self.limit}); retry in {math.ceil(wait)} s",
                        close=close, retry_after=wait)


async def while_connected(request: Any, work: Awaitable[T]) -> T:
    """``work``'s result, unless ``request``'s client disconnects first: ``work`` is then
    cancelled and :class:`ClientGone` raised. For use once the request's body has been read:
    the connection then has nothing more to say but that it closed."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request's own handler was cancelled
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task  # its answer, or its error, would reach nobody
    raise ClientGone()


async def _disconnect(request: Any) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


__all__ = ["Admission", "ClientGone", "RETRY_AFTER_S", "while_connected"]
