"""How the server runs its model: how many CPU threads a forward pass takes, and which
batches run on their real tokens only.

**Threads.** A forward pass of a small encoder does not scale across cores the way training
steps do, and on a small machine the server's other work (the event loop's HTTP, the tokenizer
thread) needs a core too: when torch's intra-op threads take every core, each parallel region
of a pass waits for the thread the event loop displaced, and a pass can take ten times as long
(measured on 2 shared cores: docs/serving.md). :func:`model_threads` therefore leaves one core
free unless told otherwise. That core is idle while a long batch computes, though: paragraphs
on 2 quiet cores were served 1.3x to 1.5x faster with both (docs/serving.md). With automatic
threads, :class:`ThreadChoice` therefore measures, per batch size, whether every core or every
core but one runs faster, and keeps measuring, since the answer changes with the machine's load
and with the server's own (the requests waiting while a batch runs: a server that runs one
request at a time sees its load there alone). Replicas split the cores among themselves
instead, each pinned to its own (``runtime.cpu.split_cores`` and ``use_cores``;
:mod:`bertforge.serve.replicas`).

**Unpadded batches.** The PyTorch pipelines run their encoders on the real tokens of a batch
(``unpad``, set when they load): a batch of questions and paragraphs of 40 to 380 tokens then
costs what its items cost, where a padded one computes every row at the longest width (twice
the work, measured). A lone sequence has no padding to remove, only the gathers and scatters
around every layer: :class:`BatchRunner` runs it padded (about 15% faster for a sentence and
up to a third for a paragraph on the development CPU), so batching costs nothing at batch 1.
Outputs agree to float32 rounding either way.

**Padded batches on a CPU.** Other backends (ONNX) pad every row of a batch to its longest; on
a CPU a padded token costs what a real one does, so a batch saves only the fixed cost of one
call (:data:`CPU_CALL_TOKENS`). :attr:`BatchRunner.call_overhead_tokens` tells the dynamic
batcher that cost, and the batcher bounds padding with it (``bertforge.serve.batching``;
measured in docs/serving.md).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from bertforge.core.numbers import ascii_int
from bertforge.runtime.cpu import core_ids

CPU_CALL_TOKENS = 16
"""The fixed cost of one padded model call on a CPU, in tokens of its forward pass: MiniLM-L6
under onnxruntime on one core took 4.2 ms for 8 tokens and about 0.21 ms per token beyond
(1-thread measurements on the development CPU, docs/serving.md), so a call costs ~12 tokens
before its first; rounded up, since a bigger value only lets a batch pad a little more."""


def cores() -> int:
    """The cores this process may run on."""
    return len(core_ids())


def _fixed_threads(requested: int) -> int | None:
    """The count a user fixed: ``requested``, else ``OMP_NUM_THREADS`` when it is set to a
    whole number; None when the threads are automatic."""
    if requested > 0:
        return requested
    # Not a count (OpenMP itself warns about it): automatic, as when unset.
    return ascii_int(os.environ.get("OMP_NUM_THREADS", "")) or None


def model_threads(requested: int = 0) -> int:
    """The intra-op threads of a forward pass: ``requested``, else ``OMP_NUM_THREADS`` when it
    is set to a whole number, else every core but one (at least 1)."""
    fixed = _fixed_threads(requested)
    return fixed if fixed is not None else max(1, cores() - 1)


def set_model_threads(requested: int = 0) -> int:
    """Apply :func:`model_threads` to torch in this process and return the count."""
    import torch

    threads = model_threads(requested)
    torch.set_num_threads(threads)
    return threads


def thread_counts(requested: int = 0) -> tuple[int, int] | None:
    """The two intra-op thread counts :class:`ThreadChoice` picks between when the threads are
    automatic (``requested`` 0 and no ``OMP_NUM_THREADS``) and there are at least 2 cores:
    every core but one, every core. None otherwise (the count is then fixed)."""
    if _fixed_threads(requested) is not None:
        return None
    n = cores()
    return (n - 1, n) if n > 1 else None


class ThreadChoice:
    """The intra-op threads of each batch, picked between ``counts`` (every core but one, every
    core) by measurement.

    Which count is faster depends on the batch and on what else runs: a sentence's pass is too
    short for one more thread to pay, a paragraph's is compute-bound and scales; a batch of many
    small requests comes with HTTP and tokenization work that the free core does; and with
    another job on a core, every parallel region waits for the displaced thread. Batches are
    therefore grouped by their real tokens, their items and the request items waiting besides
    them (the load: what the server parses and answers while the batch runs), each in powers
    of two, and each group keeps a mean of seconds per token for each count. A batching server
    shows its load mostly in its batches' items; one that runs a request at a time
    (``--max-batch-items 1``) shows it only in what waits, so without that its quiet and busy
    spells would share one mean and each count be judged by the other's conditions. The first
    group runs :attr:`MEASURE` batches with each count, alternating; every other group starts
    from the means of the nearest group that has them (its neighbours by size scale alike), so
    that measuring half its first batches with the slower count is paid once, not per size. A
    group then runs the faster count and probes the other so that a change of load (or a
    neighbour's wrong guess) is seen: once the time since that count last ran in the group is
    its expected batch time over :attr:`PROBE_SHARE`, once the time since the last probe of
    any group is that probe's time over :attr:`PROBE_SHARE`, and in its turn among the groups
    that are due (the order they became due in). Probes so take about that share of the time
    however many groups the batches fall into, and a group of long batches is not starved by
    frequent probes of short ones. A probe's time replaces the other count's mean (old by
    then); the preferred count's batches move its mean gradually. The first batch ever run with
    a count is not counted: it starts that count's threads. ``set_threads`` applies a count
    (``torch.set_num_threads``, in the thread that runs the model); ``clock`` times a batch."""

    MEASURE = 3
    PROBE_SHARE = 0.02
    SMOOTHING = 0.25  # weight of the newest batch in the preferred count's mean

    def __init__(self, counts: tuple[int, int], set_threads: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.counts = counts
        self._set_threads = set_threads
        self._clock = clock
        self._current: int | None = None
        self._started: set[int] = set()  # counts whose threads have run a batch
        self._runs: dict[tuple, int] = {}  # (group, count) -> batches measured
        self._cost: dict[tuple, float] = {}  # (group, count) -> mean seconds per token
        self._last: dict[tuple, float] = {}  # (group, count) -> when it last ran (clock)
        self._quiet_until = -float("inf")  # no probe before (the last probe's quiet time)
        self._due: list[tuple] = []  # groups due for a probe, in the order they got due
        self._seen: dict[tuple, tuple[float, float]] = {}  # group -> (its last pick, its wait)

    @staticmethod
    def group(tokens: int, items: int = 1, waiting: int = 0) -> tuple[int, int, int]:
        """The group of a batch: (g, h, w) with 2^(g-1) <= tokens < 2^g, 2^(h-1) <= items < 2^h
        and 2^(w-1) <= waiting < 2^w (w 0: nothing waiting)."""
        return (max(1, tokens).bit_length(), max(1, items).bit_length(),
                max(0, waiting).bit_length())

    def pick(self, tokens: int, items: int = 1, waiting: int = 0) -> int:
        """The count the next batch of ``tokens`` in ``items`` runs with, ``waiting`` request
        items held by the server besides it."""
        g = self.group(tokens, items, waiting)
        runs = {c: self._runs.get((g, c), 0) for c in self.counts}
        if min(runs.values()) < self.MEASURE and self._start_from_neighbour(g):
            runs = dict.fromkeys(self.counts, self.MEASURE)
        fewest = min(self.counts, key=runs.__getitem__)  # the first count on a tie
        if runs[fewest] < self.MEASURE:
            return fewest
        best, other = sorted(self.counts, key=lambda c: self._cost[g, c])
        wait = self._cost[g, other] * max(1, tokens) / self.PROBE_SHARE  # seconds
        now = self._clock()
        self._seen[g] = (now, wait)
        if now - self._last[g, other] < wait:  # not due (any more: its counts may have swapped)
            if g in self._due:
                self._due.remove(g)
            return best
        return other if self._probe_turn(g, now) else best

    def _probe_turn(self, g: tuple[int, int, int], now: float) -> bool:
        """Whether group ``g``, due for a probe, probes now: groups take turns in the order they
        became due (a group that has not run a batch for its own wait leaves the line), once
        the last probe's quiet time is over."""
        if g not in self._due:
            self._due.append(g)
        while self._due[0] != g:  # groups ahead that stopped coming leave the line
            last_pick, wait = self._seen[self._due[0]]
            if now - last_pick <= wait:
                break
            self._due.pop(0)
        if self._due[0] != g or now < self._quiet_until:
            return False
        self._due.pop(0)
        return True

    def _settled(self, cost: dict[tuple, float], runs: dict[tuple, int]
                 ) -> list[tuple[int, int, int]]:
        """The groups measured with every count in ``cost`` and ``runs`` (the means and
        counts, or copies of them), in order."""
        return sorted({g for g, _ in cost
                       if all(runs.get((g, c), 0) >= self.MEASURE for c in self.counts)})

    def _start_from_neighbour(self, g: tuple[int, int, int]) -> bool:
        """Give group ``g``, not measured with every count yet, the means of the nearest group
        that is (fewest powers of two apart in tokens, items and waiting together; on a tie,
        the nearer in tokens, then the smaller), as if it had measured them now, dropping its
        own first measurements; False when no group is measured yet (``g`` then measures)."""
        settled = self._settled(self._cost, self._runs)
        if not settled:
            return False
        near = min(settled, key=lambda h: (sum(abs(a - b) for a, b in zip(h, g)),
                                           abs(h[0] - g[0]), h))
        now = self._clock()
        for c in self.counts:
            self._cost[g, c] = self._cost[near, c]
            self._runs[g, c] = self.MEASURE
            self._last[g, c] = now
        return True

    def record(self, tokens: int, count: int, seconds: float, items: int = 1,
               waiting: int = 0) -> None:
        """A batch of ``tokens`` in ``items`` (``waiting`` held besides it) took ``seconds``
        with ``count`` threads."""
        if count not in self._started:  # it paid for starting the threads
            self._started.add(count)
            return
        g = self.group(tokens, items, waiting)
        per_token, old = seconds / max(1, tokens), self._cost.get((g, count))
        runs = self._runs[g, count] = self._runs.get((g, count), 0) + 1
        self._last[g, count] = self._clock()
        others = [self._cost.get((g, c)) for c in self.counts if c != count]
        if runs <= self.MEASURE:  # the mean of the first measurements
            self._cost[g, count] = per_token if old is None else old + (per_token - old) / runs
        elif any(o is not None and o < old for o in others):  # a probe of the slower count
            self._cost[g, count] = per_token
            self._quiet_until = self._last[g, count] + seconds / self.PROBE_SHARE
        else:
            self._cost[g, count] = old + self.SMOOTHING * (per_token - old)

    def run(self, tokens: int, items: int, call: Callable[[], Any], waiting: int = 0) -> Any:
        """``call()`` with the threads picked for ``tokens`` in ``items`` with ``waiting``
        request items held besides them; its time recorded unless it raised."""
        count = self.pick(tokens, items, waiting)
        if count != self._current:
            if self._set_threads is None:
                import torch

                self._set_threads = torch.set_num_threads
            self._set_threads(count)
            self._current = count
        started = self._clock()
        result = call()
        self.record(tokens, count, self._clock() - started, items, waiting)
        return result

    def preferred(self) -> dict[str, int]:
        """The count each group with means (measured, or started from a neighbour's) prefers
        now (for /health), keyed by the group's ranges: ``"tokens 128-255, items 1"``, with
        ``", waiting 8-15"`` where request items were waiting."""
        cost, runs = dict(self._cost), dict(self._runs)  # copies: the model thread adds entries
        return {f"tokens {_span(g[0])}, items {_span(g[1])}"
                + (f", waiting {_span(g[2])}" if g[2] else ""):
                min(self.counts, key=lambda c: cost[g, c]) for g in self._settled(cost, runs)}


def _span(bits: int) -> str:
    """The numbers whose bit length is ``bits``: ``"128-255"``, ``"1"``."""
    low, high = 1 << (bits - 1), (1 << bits) - 1
    return str(low) if low == high else f"{low}-{high}"


def _rows(request: Any) -> int:
    """Padded rows a parsed request takes: its windows (question answering), else one."""
    features = getattr(request, "features", None)
    return int(features.attention_mask.shape[0]) if features is not None else 1


class BatchRunner:
    """Calls ``pipeline`` on a batch of parsed requests; a batch of a single row runs padded
    when the pipeline's encoder runs on real tokens (its ``unpad`` flags), any other batch as
    the pipeline runs it. The callable the dynamic batcher runs, on its one model thread.

    ``thread_counts`` (:func:`thread_counts`): each batch's torch threads are then picked
    between them by a :class:`ThreadChoice`, where that can work: a PyTorch model on a CPU
    (onnxruntime fixes its threads when a session opens). ``held``: the request items the
    server holds (admitted, not answered), read as each batch starts; those beyond the batch's
    own are its load (``waiting``). None: no load is seen (every batch waits on nothing)."""

    def __init__(self, pipeline: Any, thread_counts: tuple[int, int] | None = None,
                 held: Callable[[], int] | None = None) -> None:
        self.pipeline = pipeline
        self._held = held
        model = getattr(pipeline, "model", None)
        modules = list(model.modules()) if callable(getattr(model, "modules", None)) else []
        self._unpadded = [m for m in modules if getattr(m, "unpad", False) is True]
        on_cpu = getattr(getattr(pipeline, "device", None), "type", None) == "cpu"
        self.threads: ThreadChoice | None = None
        if thread_counts is not None and modules and on_cpu and hasattr(pipeline, "cost"):
            self.threads = ThreadChoice(thread_counts)

    @property
    def unpadded(self) -> bool:
        """Whether batches of several rows run on their real tokens (their cost is the sum of
        their tokens, not rows x the longest row)."""
        return bool(self._unpadded)

    @property
    def call_overhead_tokens(self) -> int | None:
        """The fixed cost of a call in tokens (:data:`CPU_CALL_TOKENS`) when the batches are
        padded, run on a CPU and gain nothing else from batching (not a decoding loop, which
        shares each step's cost); else None: padding is then bounded by the token budget alone
        (a GPU, where a call's fixed cost dwarfs the padding; a replicated route, whose devices
        this process does not see)."""
        # Imported here: the command line imports this module and must not import torch.
        from bertforge.inference.pipelines.base import Pipeline

        pipeline = self.pipeline
        if self.unpadded or not isinstance(pipeline, Pipeline) or pipeline.decodes:
            return None
        return CPU_CALL_TOKENS if pipeline.device.type == "cpu" else None

    def __call__(self, requests: Sequence[Any]) -> list[Any]:
        if self._unpadded:
            several = len(requests) > 1 or _rows(requests[0]) > 1
            for module in self._unpadded:
                module.unpad = several
        if self.threads is None:
            return self.pipeline(requests)
        tokens = sum(self.pipeline.cost(r) for r in requests)
        waiting = max(0, self._held() - len(requests)) if self._held is not None else 0
        return self.threads.run(tokens, len(requests), lambda: self.pipeline(requests), waiting)


__all__ = ["CPU_CALL_TOKENS", "BatchRunner", "ThreadChoice", "cores", "model_threads",
           "set_model_threads", "thread_counts"]
