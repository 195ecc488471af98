"""Dynamic batching: concurrent requests grouped into one model call, answered one by one.

A model runs a padded batch of 16 short requests in about the time it runs one, so a server that
calls it per request wastes most of the hardware under load. :class:`DynamicBatcher` keeps a
queue of pending requests, each with its *cost* (the tokens it will occupy in a padded batch). A
single worker task takes the oldest request, adds the next ones while they fit in
``max_batch_tokens`` and ``max_batch_items``, and waits for more at most ``max_wait_ms`` after
that oldest request arrived; then it runs the batch in a worker thread (so the event loop keeps
accepting connections) and resolves each request's future with its own result.

Guarantees the server relies on:

* Bounded waiting: no request waits for company longer than ``max_wait_ms`` after it arrived. A
  request whose cost alone exceeds the budget runs in a batch of its own; it is never refused.
* One batch at a time, in arrival order, on one thread: the model is never called concurrently,
  and :meth:`DynamicBatcher.in_worker` runs other pipeline work (parsing) on that same thread.
  With ``concurrency=N`` (N model replicas behind ``run``, :mod:`bertforge.serve.replicas`) up
  to N batches run at once, each formed only when one of them has finished, and parsing gets a
  thread of its own (the replicas hold the models; the pipeline here only parses).
* Failure isolation: when a batch raises, each of its requests is retried alone, so only the
  request that fails by itself gets the exception; the worker keeps serving. A batch whose
  runner was lost (:class:`BatchLost`: its replica process died) fails as a whole, unretried.
* Draining: :meth:`DynamicBatcher.close` refuses new requests and returns once every queued and
  running request has its answer (graceful shutdown answers what it already accepted).

It is pure asyncio plus one thread, with no HTTP in it, so it is unit-testable on its own.
"""

from __future__ import annotations

import asyncio
import collections
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
    """What one model call did, for metrics: its size, token cost, each request's queue time
    (seconds from submission to the start of the call) and the call's duration in seconds."""

    items: int
    tokens: int
    queue_seconds: tuple[float, ...]
    run_seconds: float


@dataclass
class _Pending:
    request: Any
    cost: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


class DynamicBatcher:
    """Groups concurrent :meth:`submit` calls into calls of ``run(requests) -> results``.

    ``run`` takes a list of requests and returns one result per request, in order (a pipeline's
    ``__call__``). ``on_batch`` (optional) receives a :class:`BatchStats` after every model call,
    retries included. ``concurrency``: how many calls of ``run`` may overlap (``run`` must then be
    thread-safe: a replica pool's). Create the batcher, ``await start()`` inside the event loop
    that will submit, and ``await close()`` before the loop ends.
    """

    def __init__(self, run: Callable[[Sequence[Any]], list[Any]], *, max_batch_tokens: int,
                 max_batch_items: int, max_wait_ms: float,
                 on_batch: Callable[[BatchStats], None] | None = None,
                 concurrency: int = 1) -> None:
        if max_batch_tokens < 1 or max_batch_items < 1 or max_wait_ms < 0 or concurrency < 1:
            raise ValueError("max_batch_tokens, max_batch_items and concurrency must be >= 1 and "
                             f"max_wait_ms >= 0 (got {max_batch_tokens}, {max_batch_items}, "
                             f"{concurrency}, {max_wait_ms})")
        self.run = run
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_items = max_batch_items
        self.max_wait = max_wait_ms / 1000.0
        self.on_batch = on_batch
        self._queue: collections.deque[_Pending] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._closing = False
        self.concurrency = concurrency
        # One thread per concurrent batch: with one, the model is called from a single thread.
        self._executor = ThreadPoolExecutor(max_workers=concurrency,
                                            thread_name_prefix="bertforge-batch")
        # Parsing is serialized on one thread too: the model's own when there is one runner (a
        # pipeline is not thread-safe), else a thread of its own so it never waits for a batch.
        self._parser = self._executor if concurrency == 1 else ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="bertforge-parse")

    @property
    def queued(self) -> int:
        """Requests waiting for a batch (not counting the one running)."""
        return len(self._queue)

    async def start(self) -> None:
        """Start the worker task in the running event loop."""
        self._wakeup = asyncio.Event()
        self._worker = asyncio.get_running_loop().create_task(self._work(), name="batcher")

    async def submit(self, request: Any, cost: int) -> Any:
        """The result of ``request`` once its batch has run; raises what running it alone raised,
        or :class:`BatcherClosed` after :meth:`close` began."""
        if self._closing or self._wakeup is None:
            raise BatcherClosed("the server is shutting down")
        pending = _Pending(request, max(int(cost), 1), asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        self._wakeup.set()
        return await pending.future

    async def in_worker(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the model's thread, between batches. Pipelines are not thread-safe
        (their tokenizer's truncation settings are shared state), so parsing a request must not
        overlap a batch being run."""
        if self._closing:
            raise BatcherClosed("the server is shutting down")
        return await asyncio.get_running_loop().run_in_executor(self._parser, fn, *args)

    async def close(self) -> None:
        """Refuse new requests, answer every queued one, then stop the worker and its thread."""
        self._closing = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._worker is not None:
            await self._worker
        self._executor.shutdown(wait=True)
        self._parser.shutdown(wait=True)

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

    def _fitting(self) -> tuple[int, bool]:
        """How many queued requests (from the oldest) form the next batch, and whether that batch
        is full (the next request would break a budget, or the item limit is reached)."""
        tokens = count = 0
        for pending in self._queue:
            if count == self.max_batch_items:
                return count, True
            # The oldest always goes in, even when it alone is over the token budget.
            if count and tokens + pending.cost > self.max_batch_tokens:
                return count, True
            tokens += pending.cost
            count += 1
        return count, count == self.max_batch_items

    async def _next_batch(self) -> list[_Pending]:
        """The next batch to run, or ``[]`` when closing with nothing left to answer."""
        assert self._wakeup is not None
        while True:
            # Requests whose client went away are dropped before they take a batch slot.
            while self._queue and self._queue[0].future.done():
                self._queue.popleft()
            if not self._queue:
                if self._closing:
                    return []
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            count, full = self._fitting()
            # Wait for company until the oldest request's bound; never when draining.
            remaining = self._queue[0].arrived + self.max_wait - time.monotonic()
            if not (full or self._closing or remaining <= 0):
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except asyncio.TimeoutError:  # TimeoutError itself from 3.11 on
                    pass
                continue
            # A client may have gone away during the wait: skip it rather than compute for nobody.
            taken = [self._queue.popleft() for _ in range(count)]
            batch = [p for p in taken if not p.future.done()]
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
            if self.on_batch is not None:
                self.on_batch(BatchStats(
                    items=len(batch), tokens=sum(p.cost for p in batch),
                    queue_seconds=tuple(started - p.arrived for p in batch),
                    run_seconds=time.monotonic() - started))

    async def _run_batch(self, batch: list[_Pending]) -> None:
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


__all__ = ["BatchLost", "BatchStats", "BatcherClosed", "DynamicBatcher"]
