"""Sequences per second per core of one model directory's pipeline (``bertforge bench
inference``): at batch 1 (one sequence per call, latency percentiles over calls) and saturated
(batches of ``batch_size``), for one precision, in one or more replicas at once.

What is timed is the real serving path after parsing: ``pipe.run(requests)`` on requests that
``pipe.parse`` made before the clock starts, as the server's model thread runs them (its
tokenizer works on another thread). So a call includes padding, the forward pass in the
pipeline's precision and the task's post-processing (pooling, softmax, the QA span search, the
JSON-able result), and no tokenization.

The inputs are real English (the probe texts of ``pipelines.numerics``) grown into the task's
example item (``pipe.example()``: the longest text field) and cut, word by word, to the most
words whose item takes at most ``seq_length`` tokens (one window for QA), then filled up with
"a" where the next word would take several tokens: each request is ``seq_length`` tokens long
(with a WordPiece vocabulary; the report gives the range). Requests start at different words,
so a batch is not one text repeated.

Replicas: ``run_replicas`` starts one process per replica, each pinned to its own disjoint
cores with as many torch threads (``runtime.cpu.split_cores`` and ``use_cores``, as the server
pins its replicas), all measuring at once (a barrier starts each phase together). A replica of
one is measured in this process, pinned the same way for the measurement and restored after.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_errors
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from bertforge.errors import ConfigError, RunError
from bertforge.inference.pipelines.base import InputError, Pipeline
from bertforge.inference.pipelines.numerics import PROBE
from bertforge.runtime.cpu import core_ids, use_cores

WORDS: tuple[str, ...] = tuple(" ".join(t + (" " + p if p else "") for t, p in PROBE).split())
"""The words the inputs are made of, in order (about 190 of them, reused cyclically)."""
BARRIER_SECONDS = 900.0
"""How long a replica waits for the others at the start of a phase before giving up."""


@dataclass(frozen=True)
class BenchSettings:
    """What every replica loads and measures (picklable: it goes to the workers)."""

    model: str
    task: str | None
    seq_length: int
    batch_size: int
    seconds: float                 # per phase, when iterations is None
    iterations: int | None         # calls per phase
    warmup: int                    # untimed calls per phase


@dataclass
class Timings:
    """One replica's measured calls, in seconds: batch-1 calls and saturated batches."""

    single: list[float]
    batches: list[float]
    batch_size: int
    tokens: list[int]


def load(settings: BenchSettings, precision: str) -> Pipeline:
    """The pipeline on the CPU in ``precision``, cutting inputs at ``seq_length`` tokens and
    refusing longer ones (so that the input search below sees their length)."""
    from bertforge.inference.pipelines.loading import load_pipeline

    try:
        return load_pipeline(settings.model, settings.task, device="cpu", precision=precision,
                             max_length=settings.seq_length, truncation="error")
    except ConfigError as exc:  # the loader's max_length is the command's --seq-length
        said = f"max_length={settings.seq_length} "
        if not str(exc).startswith(said):
            raise
        raise ConfigError(f"--seq-length {settings.seq_length} {str(exc)[len(said):]}") from None


def _item(pipe: Pipeline, start: int, words: int, fill: int = 0) -> dict[str, Any]:
    """The task's example item with ``words`` words from ``WORDS[start:]`` and ``fill`` times
    "a" added to its longest text field (QA's context, a text to embed or classify,
    fill-mask's masked text)."""
    item = dict(pipe.example())
    field = max((k for k, v in item.items() if isinstance(v, str)), key=lambda k: len(item[k]))
    extra = [WORDS[(start + i) % len(WORDS)] for i in range(words)] + ["a"] * fill
    item[field] = " ".join([item[field], *extra])
    return item


def _fitting(pipe: Pipeline, start: int, seq_length: int) -> Any:
    """The request of the most words from ``start`` whose tokens fit ``seq_length``, filled up
    with one-token words where the next word would take several."""
    def parsed(words: int, fill: int = 0) -> Any | None:
        try:
            request = pipe.parse(_item(pipe, start, words, fill))
        except InputError:  # longer than max_length (truncation="error")
            return None
        return request if pipe.cost(request) <= seq_length else None  # QA: one window

    best = parsed(0)
    if best is None:
        raise ConfigError(f"--seq-length {seq_length} is shorter than the task's example input "
                          f"{pipe.example()}; give a longer --seq-length")
    low, high = 0, 2 * seq_length  # every word takes at least one token: high never fits
    while high - low > 1:
        middle = (low + high) // 2
        found = parsed(middle)
        low, high, best = (middle, high, found) if found is not None else (low, middle, best)
    for fill in range(1, seq_length - pipe.cost(best) + 1):
        found = parsed(low, fill)
        if found is None:
            break
        best = found
    return best


def bench_requests(pipe: Pipeline, seq_length: int, count: int) -> list[Any]:
    """``count`` parsed requests of ``seq_length`` tokens (or one fewer), each starting at
    another word."""
    return [_fitting(pipe, 7 * i, seq_length) for i in range(count)]


def _phase(call: Callable[[int], Any], settings: BenchSettings, start: Callable[[], None]
           ) -> list[float]:
    """Seconds per call of ``call(i)``: ``warmup`` untimed calls, then ``start()`` (the
    replicas' barrier), then ``iterations`` calls or as many as ``seconds`` takes (>= 2)."""
    for i in range(settings.warmup):
        call(i)
    start()
    times: list[float] = []
    began = time.perf_counter()
    while True:
        if settings.iterations is not None:
            if len(times) >= settings.iterations:
                break
        elif len(times) >= 2 and time.perf_counter() - began >= settings.seconds:
            break
        tick = time.perf_counter()
        call(len(times))
        times.append(time.perf_counter() - tick)
    return times


def measure(pipe: Pipeline, settings: BenchSettings,
            start: Callable[[], None] = lambda: None) -> Timings:
    """Batch-1 calls, then saturated batches, of ``pipe`` on the bench inputs; ``start`` is
    called before each phase's timed calls (a barrier across replicas)."""
    requests = bench_requests(pipe, settings.seq_length, settings.batch_size)
    single = _phase(lambda i: pipe.run([requests[i % len(requests)]]), settings, start)
    batches = _phase(lambda i: pipe.run(requests), settings, start)
    return Timings(single, batches, settings.batch_size, [pipe.cost(r) for r in requests])


def measure_here(pipe: Pipeline, settings: BenchSettings, cores: Sequence[int]) -> Timings:
    """One replica in this process, pinned to ``cores`` for the measurement only."""
    before, threads = core_ids(), torch.get_num_threads()
    use_cores(cores, len(cores))
    try:
        return measure(pipe, settings)
    finally:
        use_cores(before, threads)


def _replica(settings: BenchSettings, precision: str, cores: list[int], barrier: Any,
             results: Any, index: int) -> None:
    """A worker process: pin, load, measure in step with the others, send the timings (or
    the error's one line; a broken barrier releases the others)."""
    try:
        use_cores(cores, len(cores))  # one torch thread per core, as a server replica
        pipe = load(settings, precision)
        timings = measure(pipe, settings, lambda: barrier.wait(BARRIER_SECONDS))
        results.put((index, timings, None))
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, which raises)
        barrier.abort()
        results.put((index, None, f"{type(exc).__name__}: {exc}"))


def run_replicas(settings: BenchSettings, precision: str, plan: Sequence[Sequence[int]]
                 ) -> list[Timings]:
    """One process per entry of ``plan`` (its cores), all measuring ``precision`` at once;
    their timings in plan order. ``RunError`` naming the first replica that failed."""
    context = multiprocessing.get_context("spawn")  # no forked torch thread pools
    barrier, results = context.Barrier(len(plan)), context.Queue()
    workers = [context.Process(target=_replica, daemon=True, name=f"bench-replica-{i}",
                               args=(settings, precision, list(cores), barrier, results, i))
               for i, cores in enumerate(plan)]
    for worker in workers:
        worker.start()
    found: dict[int, tuple[Timings | None, str | None]] = {}
    try:
        while len(found) < len(workers):
            try:
                index, timings, error = results.get(timeout=5.0)
            except queue_errors.Empty:
                dead = [w for w in workers if not w.is_alive() and w.exitcode != 0]
                if dead and len(found) < len(workers):
                    raise RunError(f"bench replica {dead[0].name} exited with status "
                                   f"{dead[0].exitcode} before reporting") from None
                continue
            found[index] = (timings, error)
    finally:
        for worker in workers:
            worker.join(timeout=30.0)
            if worker.is_alive():
                worker.terminate()
    failed = sorted((i, e) for i, (_, e) in found.items() if e is not None)
    if failed:
        first = next((f for f in failed if "BrokenBarrierError" not in f[1]), failed[0])
        raise RunError(f"bench replica {first[0]} on cores {list(plan[first[0]])} failed: "
                       f"{first[1]}")
    return [found[i][0] for i in range(len(plan))]  # type: ignore[misc]


def summarize(timings: Sequence[Timings], cores: int) -> dict[str, Any]:
    """Replicas' timings as one cell: sequences/s in all and per core (each replica's rate
    summed), batch-1 latency p50/p99 over every replica's calls, in ms."""
    def rate(calls: Sequence[float], size: int) -> float:
        return size * len(calls) / sum(calls)

    single = [t for r in timings for t in r.single]
    batches = [t for r in timings for t in r.batches]
    one = sum(rate(r.single, 1) for r in timings)
    full = sum(rate(r.batches, r.batch_size) for r in timings)
    p50, p99 = np.percentile(np.array(single) * 1e3, [50, 99])
    b50 = float(np.percentile(np.array(batches) * 1e3, 50))
    tokens = [n for r in timings for n in r.tokens]
    return {"batch_1": {"seq_per_s": one, "seq_per_s_per_core": one / cores,
                        "p50_ms": float(p50), "p99_ms": float(p99), "calls": len(single)},
            "saturated": {"seq_per_s": full, "seq_per_s_per_core": full / cores,
                          "batch_size": timings[0].batch_size, "batch_p50_ms": b50,
                          "calls": len(batches)},
            "tokens_per_sequence": {"min": min(tokens), "max": max(tokens)}}


__all__ = ["WORDS", "BenchSettings", "Timings", "bench_requests", "load", "measure",
           "measure_here", "run_replicas", "summarize"]
