"""Dynamic batching: concurrent requests grouped into one model call, answered one by one.

A model runs a padded batch of 16 short requests in a fraction of 16 times what one costs (the
per-call overhead is paid once), so a server that calls it per request wastes the hardware under
load. :class:`DynamicBatcher` keeps a queue of parsed requests, each with its token count and
its longest row. A worker task forms a batch whenever the model is free:

* **Token budget** (as text-embeddings-inference does): a batch holds at most
  ``max_batch_items`` requests and ``max_batch_tokens`` tokens, counted as a padded forward
  pass computes them (its rows times its longest row), or as their sum when ``run`` computes
  real tokens only (``padded=False``: the PyTorch pipelines' unpadded encoders). The oldest
  request always goes in; the others are taken by how close their length is to its length, so
  a batch groups similar lengths and a long request does not pad twenty short ones to its
  width when the queue holds more than one batch.
* **Padding that pays** (``call_overhead_tokens``, a padded model on a CPU): where a padded
  token costs what a real one does, a batch saves only the fixed cost of one call, so a request
  joins a padded batch only if the batch with it computes no more tokens than the batch
  without it plus the request alone plus that fixed cost. Batching then never computes more
  than running the requests one by one would; requests of very different lengths run in
  separate batches, one after the other.
* **Adaptive window**: when the model is idle, a request waits for company only when company is
  known to be coming: requests already received and still being tokenized (announced with
  :meth:`DynamicBatcher.expect`), or, right after a batch of N was answered, the N clients it
  answered (closed-loop clients send their next request at once). It then waits until the batch
  is full, the expected requests are in, or ``max_wait_ms`` after it arrived, whichever is first.
  A lone request on an idle server (one client) never waits, so batching costs nothing at batch
  1. While the model runs, requests simply queue; the next batch takes them as soon as it ends.

Guarantees the server relies on:

* Bounded waiting: no request waits for company longer than ``max_wait_ms`` after it arrived. A
  request whose cost alone exceeds the budget runs in a batch of its own; it is never refused.
  A request passed over for closer lengths becomes the oldest after at most as many batches as
  there were requests ahead of it, and the oldest always runs next.
* One batch at a time on one thread: the model is never called concurrently. Parsing
  (tokenization) runs through :meth:`DynamicBatcher.parse`: on a thread of its own when the
  caller parses with an object independent of the model's (``parse_apart``, or several
  runners), else serialized with the batches on the model's thread.
  With ``concurrency=N`` (N model replicas behind ``run``, :mod:`bertforge.serve.replicas`) up
  to N batches run at once, each formed only when one of them has finished.
* Failure isolation: when a batch raises, each of its requests is retried alone, so only the
  request that fails by itself gets the exception; the worker keeps serving. A batch whose
  runner was lost (:class:`BatchLost`: its replica process died) fails as a whole, unretried.
* Nothing computed for nobody: a request whose future is cancelled (its client went away)
  leaves the queue before the next batch is formed and takes no place in it; it is counted as
  withdrawn by the ``admission`` (:mod:`bertforge.serve.admission`) unless its batch had
  already started.
* Draining: :meth:`DynamicBatcher.close` refuses new requests and returns once every queued and
  running request has its answer (graceful shutdown answers what it already accepted).
  :meth:`DynamicBatcher.expire` (the drain timeout ran out) answers every request not answered
  yet, queued, being parsed or in the running call, with :class:`BatcherClosed` at once; a
  later ``close`` then does not wait for the running call.

It is pure asyncio plus threads, with no HTTP in it, so it is unit-testable on its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


class BatcherClosed(RuntimeError):
    """The batcher is shutting down and accepts no new requests."""


class BatchLost(RuntimeError):
    """The runner of a batch was lost with it (a replica process died). Every request of the
    batch fails with this error and none is retried alone: a request that crashes the process
    running it would otherwise crash the remaining replicas one after another."""


@dataclass(frozen=True)
class BatchStats:
    """What one model call did, for metrics: its size, real and padded token counts, each
    request's queue time (seconds from submission to the start of the call) and the call's
    duration in seconds."""

    items: int
    tokens: int
    queue_seconds: tuple[float, ...]
    run_seconds: float
    padded_tokens: int = 0


_order = itertools.count()  # arrival order, unique: ties in length are broken by it


@dataclass
class _Pending:
    request: Any
    tokens: int   # real tokens of all its rows
    width: int    # its longest row, in tokens
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)
    order: int = field(default_factory=lambda: next(_order))
    started: bool = False  # in a batch: cancelling it now saves no work

    @property
    def rows(self) -> int:
        """Padded rows it takes (QA windows, beams): its tokens over its longest row."""
        return max(1, -(-self.tokens // self.width))


def padded_tokens(batch: Sequence[_Pending]) -> int:
    """What a padded forward pass of ``batch`` computes: its rows times its longest row."""
    return sum(p.rows for p in batch) * max(p.width for p in batch) if batch else 0


class DynamicBatcher:
    """Groups concurrent :meth:`submit` calls into calls of ``run(requests) -> results``.

    ``run`` takes a list of requests and returns one result per request, in order (a pipeline's
    ``__call__``). ``on_batch`` (optional) receives a :class:`BatchStats` after every model call,
    retries included. ``concurrency``: how many calls of ``run`` may overlap (``run`` must then be
    thread-safe: a replica pool's). ``parse_apart``: what :meth:`parse` runs is independent of
    ``run`` (a parser with its own tokenizer), so it gets a thread of its own instead of the
    model's. ``padded``: the token budget counts padded tokens (else real ones).
    ``call_overhead_tokens`` (padded only): the fixed cost of one model call in tokens; a
    request then joins a batch only where that does not cost more than running it alone
    (None: padding is bounded by the token budget alone). ``admission``: the server's
    :class:`~bertforge.serve.admission.Admission` (its routes hold their items there; the
    batcher counts the items it withdraws in its ``dropped``). Create the
    batcher, ``await start()`` inside the event loop that will submit, and
    ``await close()`` before the loop ends.
    """

    def __init__(self, run: Callable[[Sequence[Any]], list[Any]], *, max_batch_tokens: int,
                 max_batch_items: int, max_wait_ms: float,
                 on_batch: Callable[[BatchStats], None] | None = None,
                 concurrency: int = 1, parse_apart: bool = False, padded: bool = True,
                 call_overhead_tokens: int | None = None, admission: Any = None) -> None:
        if max_batch_tokens < 1 or max_batch_items < 1 or max_wait_ms < 0 or concurrency < 1:
            raise ValueError("max_batch_tokens, max_batch_items and concurrency must be >= 1 and "
                             f"max_wait_ms >= 0 (got {max_batch_tokens}, {max_batch_items}, "
                             f"{concurrency}, {max_wait_ms})")
        if call_overhead_tokens is not None and call_overhead_tokens < 0:
            raise ValueError(f"call_overhead_tokens must be >= 0 (got {call_overhead_tokens})")
        self.run = run
        self.max_batch_tokens = max_batch_tokens
        self.padded = padded
        self.call_overhead_tokens = call_overhead_tokens if padded else None
        self.max_batch_items = max_batch_items
        self.max_wait = max_wait_ms / 1000.0
        self.on_batch = on_batch
        self.admission = admission
        self._queue: collections.deque[_Pending] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._closing = False
        self._expired = False
        self._running: list[list[_Pending]] = []  # the batches in a model call
        self._expected = 0       # announced requests not submitted yet (being tokenized)
        self._last_size = 0      # items of the last batch formed ...
        self._last_done = -1.0   # ... and when its call ended (monotonic seconds)
        self.concurrency = concurrency
        # One thread per concurrent batch: with one, the model is called from a single thread.
        self._executor = ThreadPoolExecutor(max_workers=concurrency,
                                            thread_name_prefix="bertforge-batch")
        # Parsing is serialized on one thread: its own when the parser is independent of the
        # model (a pipeline is not thread-safe: its tokenizer's truncation is shared state),
        # else the model's, between batches.
        apart = parse_apart or concurrency > 1
        self._parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-parse"
                                          ) if apart else self._executor

    @property
    def queued(self) -> int:
        """Requests waiting for a batch (not counting the one running)."""
        return len(self._queue)

    async def start(self) -> None:
        """Start the worker task in the running event loop."""
        self._wakeup = asyncio.Event()
        self._worker = asyncio.get_running_loop().create_task(self._work(), name="batcher")

    def expect(self, count: int) -> None:
        """Announce ``count`` requests that will be enqueued soon (received, being parsed), so an
        idle model waits for them; ``-count`` once they are enqueued or their parse failed."""
        self._expected = max(0, self._expected + count)
        if count < 0 and self._wakeup is not None:
            self._wakeup.set()  # a batch may have been waiting for them

    def enqueue(self, request: Any, cost: int, width: int | None = None) -> asyncio.Future:
        """Queue ``request``; the future gets its result once its batch has run, or what running
        it alone raised. ``cost``: its real tokens (all rows); ``width``: its longest row
        (default ``cost``: one row). Synchronous, so that requests enqueued together are all in
        the queue before the worker looks again. :class:`BatcherClosed` after :meth:`close`
        began. Cancelling the future withdraws the request if it has not run yet."""
        if self._closing or self._wakeup is None:
            raise BatcherClosed("the server is shutting down")
        tokens = max(int(cost), 1)
        pending = _Pending(request, tokens, max(1, min(int(width or tokens), tokens)),
                           asyncio.get_running_loop().create_future())
        pending.future.add_done_callback(lambda _, p=pending: self._withdrawn(p))
        self._queue.append(pending)
        self._wakeup.set()
        return pending.future

    def _withdrawn(self, pending: _Pending) -> None:
        """A request's future is done: count it dropped when it was cancelled before its batch
        started (the next batch leaves it out)."""
        if pending.future.cancelled() and not pending.started and self.admission is not None:
            self.admission.dropped += 1

    async def submit(self, request: Any, cost: int, width: int | None = None) -> Any:
        """:meth:`enqueue` ``request`` and wait for its result."""
        return await self.enqueue(request, cost, width)

    async def parse(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the parsing thread (see ``parse_apart``)."""
        if self._closing:
            raise BatcherClosed("the server is shutting down")
        return await asyncio.get_running_loop().run_in_executor(self._parser, fn, *args)

    async def close(self) -> None:
        """Refuse new requests, answer every queued one, then stop the worker and its thread.
        After :meth:`expire` nothing is left to answer, and the running call (which cannot be
        interrupted) is not waited for."""
        self._closing = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._worker is not None:
            if self._expired:
                self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._executor.shutdown(wait=not self._expired, cancel_futures=True)
        self._parser.shutdown(wait=not self._expired, cancel_futures=True)

    def expire(self) -> None:
        """Answer every request not answered yet with :class:`BatcherClosed` at once, queued or
        in the running call, and refuse new ones (and parses): the drain timeout ran out."""
        self._closing = self._expired = True
        gone = BatcherClosed("the server is shutting down")
        for pending in [*self._queue, *(p for batch in self._running for p in batch)]:
            _resolve(pending, exception=gone)
        self._queue.clear()
        if self._wakeup is not None:
            self._wakeup.set()

    # ------------------------------------------------------------------ worker

    async def _work(self) -> None:
        if self.concurrency == 1:
            while batch := await self._next_batch():
                await self._run_batch(batch)
            return
        free = asyncio.Semaphore(self.concurrency)
        running: set[asyncio.Task] = set()

        def finished(task: asyncio.Task) -> None:
            running.discard(task)
            free.release()

        while True:
            # The next batch is formed only once a runner is free, so it takes in every request
            # that arrived while all of them were busy.
            await free.acquire()
            batch = await self._next_batch()
            if not batch:
                break
            task = asyncio.get_running_loop().create_task(self._run_batch(batch))
            running.add(task)
            task.add_done_callback(finished)
        if running:
            await asyncio.wait(running)

    def _select(self) -> tuple[list[_Pending], bool]:
        """The next batch (the oldest request, then the closest lengths while both budgets
        hold and the padding pays), and whether it is full: some queued request did not fit,
        or the item cap."""
        oldest = self._queue[0]
        chosen, rows, width, tokens = [oldest], oldest.rows, oldest.width, oldest.tokens
        others = sorted(itertools.islice(self._queue, 1, None),
                        key=lambda p: (abs(p.width - oldest.width), p.order))
        full = False
        for pending in others:
            if len(chosen) == self.max_batch_items:
                return chosen, True
            wider = max(width, pending.width)
            cost = ((rows + pending.rows) * wider if self.padded
                    else tokens + pending.tokens)
            if cost > self.max_batch_tokens or not self._pays(rows * width, cost, pending):
                full = True  # a shorter one further on may still fit
                continue
            chosen.append(pending)
            rows, width, tokens = rows + pending.rows, wider, tokens + pending.tokens
        return chosen, full or len(chosen) == self.max_batch_items

    def _pays(self, before: int, after: int, pending: _Pending) -> bool:
        """Whether a padded batch computing ``before`` tokens may take ``pending`` and compute
        ``after``: not more than ``pending`` alone in a call of its own would add."""
        if self.call_overhead_tokens is None:
            return True
        return after <= before + pending.rows * pending.width + self.call_overhead_tokens

    def _wait_for(self, count: int, full: bool) -> float:
        """Seconds an idle model should wait for more requests before running the ``count``
        selected: 0 unless company is coming (see the module notes), at most until the oldest
        request's bound."""
        if full or self._closing:
            return 0.0
        now = time.monotonic()
        oldest = self._queue[0]
        remaining = oldest.arrived + self.max_wait - now
        if remaining <= 0:
            return 0.0
        # Requests answered by the last batch come back together when it ended just before
        # the oldest arrived (closed-loop clients); an idle spell since means nobody is due.
        returning = (self._last_size if 0 <= oldest.arrived - self._last_done <= self.max_wait
                     else 0)
        wanted = max(returning, len(self._queue) + self._expected)
        return remaining if count < min(wanted, self.max_batch_items) else 0.0

    async def _next_batch(self) -> list[_Pending]:
        """The next batch to run, or ``[]`` when closing with nothing left to answer."""
        assert self._wakeup is not None
        while True:
            # Requests whose client went away are dropped before they take a batch slot.
            if any(p.future.done() for p in self._queue):
                self._queue = collections.deque(p for p in self._queue if not p.future.done())
            if not self._queue:
                if self._closing:
                    return []
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            chosen, full = self._select()
            wait = self._wait_for(len(chosen), full)
            if wait > 0:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), wait)
                except asyncio.TimeoutError:  # TimeoutError itself from 3.11 on
                    pass
                continue
            taken = {id(p) for p in chosen}
            self._queue = collections.deque(p for p in self._queue if id(p) not in taken)
            # A client may have gone away during the wait: skip it rather than compute for nobody.
            batch = sorted((p for p in chosen if not p.future.done()), key=lambda p: p.order)
            for pending in batch:
                pending.started = True
            if batch:
                return batch

    async def _call(self, batch: list[_Pending]) -> list[Any]:
        """Run ``batch`` in the worker thread; results checked to be one per request."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            results = await loop.run_in_executor(self._executor, self.run,
                                                  [p.request for p in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"the pipeline returned {len(results)} results for a batch "
                                   f"of {len(batch)} requests")
            return results
        finally:
            self._last_size, self._last_done = len(batch), time.monotonic()
            if self.on_batch is not None:
                self.on_batch(BatchStats(
                    items=len(batch), tokens=sum(p.tokens for p in batch),
                    queue_seconds=tuple(started - p.arrived for p in batch),
                    run_seconds=self._last_done - started, padded_tokens=padded_tokens(batch)))

    async def _run_batch(self, batch: list[_Pending]) -> None:
        self._running.append(batch)
        try:
            await self._answer(batch)
        finally:
            self._running.remove(batch)

    async def _answer(self, batch: list[_Pending]) -> None:
        try:
            results = await self._call(batch)
        except BatchLost as exc:
            for pending in batch:
                _resolve(pending, exception=exc)
            return
        except Exception as exc:
            if len(batch) == 1:
                _resolve(batch[0], exception=exc)
                return
            # Which request broke the batch is unknown: each one alone tells. Only the bad one
            # then fails; the others get exactly the results they would have had anyway.
            for pending in batch:
                if pending.future.done():
                    continue
                try:
                    (result,) = await self._call([pending])
                except Exception as alone:
                    _resolve(pending, exception=alone)
                else:
                    _resolve(pending, result=result)
            return
        for pending, result in zip(batch, results):
            _resolve(pending, result=result)


def _resolve(pending: _Pending, *, result: Any = None, exception: Exception | None = None) -> None:
    """Answer one request unless its client already went away (its future was cancelled)."""
    if pending.future.done():
        return
    if exception is not None:
        pending.future.set_exception(exception)
    else:
        pending.future.set_result(result)


__all__ = ["BatchLost", "BatchStats", "BatcherClosed", "DynamicBatcher", "padded_tokens"]
