"""The server's batching on its own: how batches form under the padded token budget, when an
idle model waits for company (and when it does not), where parsing runs, the model's thread
count, and an app answering concurrent requests as it answers them one at a time."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.inference.pipelines import load_pipeline
from bertforge.commands.serve import ServeConfig
from bertforge.serve.batching import BatchStats, DynamicBatcher
from bertforge.serve.execution import (CPU_CALL_TOKENS, BatchRunner, ThreadChoice, model_threads,
                                       thread_counts)
from bertforge.serve.settings import SETTING_NAMES, ServeSettings
from serving import running, save_tiny_classifier

WORDS = "a good film with great acting bad boring plot long short story of the".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def _echo(calls: list[list[Any]], delay: float = 0.0, threads: list[str] | None = None):
    def run(requests):
        calls.append(list(requests))
        if threads is not None:
            threads.append(threading.current_thread().name)
        time.sleep(delay)
        return [f"<{r}>" for r in requests]
    return run


def _batcher(run, *, items: int = 8, tokens: int = 1000, wait_ms: float = 300.0, **kw):
    return DynamicBatcher(run, max_batch_tokens=tokens, max_batch_items=items,
                          max_wait_ms=wait_ms, **kw)


# ------------------------------------------------------------------------- batch formation


def test_budget_counts_padded_tokens_and_groups_similar_lengths() -> None:
    calls: list[list[Any]] = []
    stats: list[BatchStats] = []

    async def main() -> None:
        batcher = _batcher(_echo(calls, 0.01), tokens=100, on_batch=stats.append)
        await batcher.start()
        # (name, tokens, longest row): "qa" is two windows of 30 (60 tokens, 2 rows).
        shapes = [("s1", 10, 10), ("long", 50, 50), ("s2", 12, 12), ("s3", 9, 9),
                  ("qa", 60, 30), ("s4", 11, 11), ("s5", 10, 10)]
        out = await asyncio.gather(*(batcher.submit(n, t, w) for n, t, w in shapes))
        assert out == [f"<{n}>" for n, _, _ in shapes]
        await batcher.close()

    asyncio.run(main())
    # All queued before the first batch forms. The oldest (s1) takes the short ones closest to
    # its length while rows x the longest row stay within 100 (5 x 12 = 60): the QA request's
    # 2 rows of 30 would make it 7 x 30. "long" runs next, alone (with the QA request it would
    # be 3 x 50), then the QA request.
    assert calls == [["s1", "s2", "s3", "s4", "s5"], ["long"], ["qa"]]
    assert [s.padded_tokens for s in stats] == [60, 50, 60]
    assert [s.tokens for s in stats] == [52, 50, 60]


def test_budget_counts_real_tokens_for_a_model_that_runs_real_tokens_only() -> None:
    calls: list[list[Any]] = []

    async def main() -> None:
        batcher = _batcher(_echo(calls, 0.01), tokens=100, padded=False)
        await batcher.start()
        shapes = [("s1", 10, 10), ("long", 50, 50), ("s2", 12, 12), ("qa", 60, 30)]
        await asyncio.gather(*(batcher.submit(n, t, w) for n, t, w in shapes))
        await batcher.close()

    asyncio.run(main())
    # Closest lengths first: 10 + 12 + 60 <= 100, where padded it would be 4 x 30 = 120 (the
    # QA request's two rows); "long" (50) does not fit beside them.
    assert calls == [["s1", "s2", "qa"], ["long"]]


def test_padding_that_costs_more_than_a_call_of_its_own_is_refused() -> None:
    calls: list[list[Any]] = []
    stats: list[BatchStats] = []

    async def main(overhead: int | None) -> None:
        batcher = _batcher(_echo(calls, 0.01), tokens=1000, call_overhead_tokens=overhead,
                           on_batch=stats.append)
        await batcher.start()
        shapes = [("s1", 10, 10), ("long", 60, 60), ("s2", 14, 14), ("s3", 9, 9),
                  ("qa", 60, 30), ("m1", 36, 36)]
        await asyncio.gather(*(batcher.submit(n, t, w) for n, t, w in shapes))
        await batcher.close()

    asyncio.run(main(None))
    assert calls == [["s1", "long", "s2", "s3", "qa", "m1"]]  # 7 rows x 60 = 420 <= 1000
    calls.clear()
    asyncio.run(main(16))
    # s1 takes s3 (2 x 10 = 20 <= 10 + 9 + 16) and s2 (3 x 14 = 42 <= 20 + 14 + 16); the QA
    # request's two rows of 30 would make it 5 x 30 = 150 > 42 + 60 + 16. "long" (the oldest
    # left) takes neither m1 (2 x 60 = 120 > 60 + 36 + 16) nor the QA request and runs alone;
    # the QA request takes m1 (3 x 36 = 108 <= 60 + 36 + 16).
    assert calls == [["s1", "s2", "s3"], ["long"], ["qa", "m1"]]
    batches = stats[-3:]
    assert [s.padded_tokens for s in batches] == [42, 60, 108]
    # No batch computes more than its requests alone, one call each, would have:
    alone = {"s1": 10, "s2": 14, "s3": 9, "long": 60, "qa": 60, "m1": 36}
    for batch, s in zip(calls, batches):
        assert s.padded_tokens <= sum(alone[n] for n in batch) + 16 * (len(batch) - 1)
    with pytest.raises(ValueError, match="call_overhead_tokens"):
        _batcher(_echo([]), call_overhead_tokens=-1)


def test_item_cap_and_a_request_over_the_budget_alone() -> None:
    calls: list[list[Any]] = []

    async def main() -> None:
        batcher = _batcher(_echo(calls, 0.01), items=3, tokens=40)
        await batcher.start()
        await asyncio.gather(*(batcher.submit(i, c) for i, c in
                               enumerate([5, 5, 5, 5, 90, 5])))
        await batcher.close()

    asyncio.run(main())
    assert calls == [[0, 1, 2], [3, 5], [4]]


# ------------------------------------------------------------------------- the adaptive window


def test_a_lone_request_is_not_delayed_by_the_window() -> None:
    stats: list[BatchStats] = []

    async def main() -> float:
        batcher = _batcher(_echo([]), wait_ms=500, on_batch=stats.append)
        await batcher.start()
        started = time.monotonic()
        for i in range(5):  # one client, one request after another
            assert await batcher.submit(i, 3) == f"<{i}>"
        elapsed = time.monotonic() - started
        await batcher.close()
        return elapsed

    # Five requests in well under one 500 ms window: none waited for company (generous bound
    # for a loaded machine; the queue time itself is a few hundred microseconds).
    assert asyncio.run(main()) < 1.0
    assert len(stats) == 5 and max(q for s in stats for q in s.queue_seconds) < 0.2


def test_clients_answered_together_are_waited_for_when_they_come_back() -> None:
    calls: list[list[Any]] = []

    async def client(batcher: DynamicBatcher, name: str, pause: float) -> None:
        for round_ in range(3):
            await batcher.submit(f"{name}{round_}", 1)
            await asyncio.sleep(pause)  # the client reads its answer, then sends the next

    async def main() -> None:
        batcher = _batcher(_echo(calls, 0.02), wait_ms=300)
        await batcher.start()
        await asyncio.gather(*(client(batcher, n, 0.01 * k) for k, n in enumerate("abc")))
        await batcher.close()

    asyncio.run(main())
    # The first round arrives together; each later round trickles in over 20 ms after the
    # batch that answered it, and the idle model waits for all three instead of running the
    # first alone.
    assert calls == [["a0", "b0", "c0"], ["a1", "b1", "c1"], ["a2", "b2", "c2"]]


def test_announced_requests_are_waited_for_and_withdrawing_them_ends_the_wait() -> None:
    calls: list[list[Any]] = []

    async def main() -> tuple[float, float]:
        batcher = _batcher(_echo(calls), wait_ms=400)
        await batcher.start()
        batcher.expect(2)  # two requests received, being tokenized
        batcher.expect(-1)  # the first is parsed: enqueued at once, as answer_items does
        first = batcher.enqueue("x", 1)
        await asyncio.sleep(0.05)
        assert not first.done()  # the idle model waits for the announced second one ...
        started = time.monotonic()
        batcher.expect(-1)  # ... whose parse failed: no reason to wait any longer
        await first
        withdrawn = time.monotonic() - started
        await asyncio.sleep(0.5)  # an idle spell longer than the window
        batcher.expect(1)
        batcher.expect(-1)
        started = time.monotonic()
        assert await batcher.enqueue("y", 1) == "<y>"  # nothing else announced: no wait
        alone = time.monotonic() - started
        await batcher.close()
        return withdrawn, alone

    withdrawn, alone = asyncio.run(main())
    assert withdrawn < 0.2 and alone < 0.2
    assert calls == [["x"], ["y"]]


# ------------------------------------------------------------------------- parsing thread


@pytest.mark.parametrize("apart", [True, False])
def test_parsing_runs_apart_from_the_model_only_when_allowed(apart: bool) -> None:
    model_threads_seen: list[str] = []

    async def main() -> str:
        batcher = _batcher(_echo([], threads=model_threads_seen), parse_apart=apart)
        await batcher.start()
        parsed_on = await batcher.parse(lambda: threading.current_thread().name)
        await batcher.submit("r", 1)
        await batcher.close()
        return parsed_on

    parsed_on = asyncio.run(main())
    assert (parsed_on != model_threads_seen[0]) is apart


# ------------------------------------------------------------------------- settings, threads


def test_model_threads_setting_and_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigError, match="--model-threads must be a whole number >= 0"):
            ServeSettings(model_threads=bad)
    assert "model_threads" in SETTING_NAMES
    assert ServeConfig(model="m", model_threads=2).model_threads == 2  # the command's option
    assert model_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert model_threads(0) == 5
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr("bertforge.serve.execution.cores", lambda: 2)
    assert model_threads(0) == 1
    monkeypatch.setattr("bertforge.serve.execution.cores", lambda: 1)
    assert model_threads(0) == 1


def test_threads_are_chosen_per_batch_only_when_automatic(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("bertforge.serve.execution.cores", lambda: 4)
    assert thread_counts(0) == (3, 4)
    assert thread_counts(2) is None  # --model-threads N: fixed
    monkeypatch.setattr("bertforge.serve.execution.cores", lambda: 1)
    assert thread_counts(0) is None  # nothing to choose between
    monkeypatch.setattr("bertforge.serve.execution.cores", lambda: 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert thread_counts(0) is None  # the environment's count: fixed
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    assert thread_counts(0) == (1, 2) and model_threads(0) == 1  # not a count: automatic, alike


class _Clock:
    """A fake clock the test moves by each batch's cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_thread_choice_measures_each_size_and_follows_a_change_of_load() -> None:
    """Short batches run faster on one core, long ones on two, until the second core gets
    busy; the first batch on each count (starting its threads) is not counted; a new size
    starts from a measured one; the other count is probed in about PROBE_SHARE of the time."""
    clock = _Clock()
    choice = ThreadChoice((1, 2), set_threads=lambda n: None, clock=clock)
    busy = False
    spent = {1: 0.0, 2: 0.0}

    def batches(tokens: int, count: int) -> list[int]:
        picked = []
        for _ in range(count):
            threads = choice.pick(tokens)
            per_token = 1.0 if threads == 1 else (0.6 if tokens >= 256 and not busy else 1.5)
            clock.now += per_token * tokens
            spent[threads] += per_token * tokens
            choice.record(tokens, threads, per_token * tokens)
            picked.append(threads)
        return picked

    # Each count starts its threads (not counted), then both are measured 3 times, taking
    # turns; 2 is faster there.
    assert batches(300, 10) == [1, 1, 2, 2, 1, 2, 1, 2, 2, 2]
    assert choice.preferred() == {"tokens 256-511, items 1": 2}
    # A new size starts from the measured one's means, so with 2, until its own batches show 2
    # costing more per token than 1 did there; then 1, which is faster at this size.
    assert batches(20, 7) == [2, 2, 2, 1, 1, 1, 1]
    assert choice.preferred() == {"tokens 16-31, items 1": 1, "tokens 256-511, items 1": 2}
    spent.update({1: 0.0, 2: 0.0})
    picked = batches(300, 2000)  # quiet: 1 only as a probe, in about 2% of the time
    assert picked.count(1) >= 10 and spent[1] / (spent[1] + spent[2]) < 0.03
    busy = True  # another job takes the second core: 2's batches slow down, 1 takes over
    picked = batches(300, 200)
    assert picked[:3] == [2, 2, 2] and 1 <= picked[3:].count(2) <= 5  # then 2 only as a probe
    assert choice.preferred()["tokens 256-511, items 1"] == 1
    busy = False  # the next probe of 2 sees the core free again, and 2 takes over
    picked = batches(300, 100)
    first = picked.index(2)
    assert first < 60 and set(picked[first:first + 40]) == {2}
    assert choice.preferred()["tokens 256-511, items 1"] == 2
    clock.now += 300 / ThreadChoice.PROBE_SHARE  # rare batches: probed once that long passed
    assert batches(300, 2) == [1, 2]


def test_a_new_batch_size_starts_from_the_nearest_measured_one() -> None:
    """Its means come from the measured group fewest powers of two away (tokens plus items),
    so it runs that group's choice from its first batch, without measuring the slower count."""
    choice = ThreadChoice((1, 2), set_threads=lambda n: None, clock=_Clock())
    for count in (1, 2):
        choice.record(1, count, 1.0)  # each count's first batch starts its threads
    for _ in range(ThreadChoice.MEASURE):
        choice.record(20, 1, 20 * 1.0)  # sentences: 1 thread faster
        choice.record(20, 2, 20 * 1.5)
        choice.record(300, 1, 300 * 1.0)  # paragraphs: 2 threads faster
        choice.record(300, 2, 300 * 0.6)
    assert choice.pick(40) == 1  # one power of two above the sentences, three below
    assert choice.pick(600) == 2
    assert choice.pick(300, items=16) == 2  # four powers of two from the paragraphs
    assert choice.pick(20, items=2) == 1
    # A group that began measuring before any group was measured drops what it has (here 1
    # far faster than 2) and starts from the nearest measured group too.
    choice.record(600, 1, 1.0, items=4)
    choice.record(600, 2, 600.0, items=4)
    assert choice.pick(600, items=4) == 2
    assert choice.preferred() == {
        "tokens 16-31, items 1": 1, "tokens 16-31, items 2-3": 1, "tokens 32-63, items 1": 1,
        "tokens 256-511, items 1": 2, "tokens 256-511, items 16-31": 2,
        "tokens 512-1023, items 1": 2, "tokens 512-1023, items 4-7": 2}


def test_probes_stay_within_their_share_of_the_time_across_many_batch_sizes() -> None:
    """Batches that fall into eight groups, in turn: each group's probes alone would take
    eight times the share; together they stay within it."""
    clock = _Clock()
    choice = ThreadChoice((1, 2), set_threads=lambda n: None, clock=clock)
    spent = {1: 0.0, 2: 0.0}
    for i in range(4000):
        items = 1 << (i % 8)  # 300 tokens in 1, 2, 4, ... 128 items: eight groups
        threads = choice.pick(300, items)
        seconds = 300 * (1.0 if threads == 1 else 0.6)
        clock.now += seconds
        choice.record(300, threads, seconds, items)
        if i >= 100:  # after the first group's measurements
            spent[threads] += seconds
    assert len(choice.preferred()) == 8 and set(choice.preferred().values()) == {2}
    assert 0 < spent[1] / (spent[1] + spent[2]) < 1.5 * ThreadChoice.PROBE_SHARE


def test_frequent_probes_of_short_batches_do_not_starve_a_size_of_long_ones() -> None:
    """Twenty short batches to each long one: the short group's probes come every ~50 of its
    batch times; the long group, whose wait is 100 times as long, still gets probes."""
    clock = _Clock()
    choice = ThreadChoice((1, 2), set_threads=lambda n: None, clock=clock)
    long_picks = []
    for i in range(21 * 600):
        tokens = 2000 if i % 21 == 20 else 20
        threads = choice.pick(tokens)
        seconds = tokens * (1.0 if threads == 1 else 0.6)
        clock.now += seconds
        choice.record(tokens, threads, seconds)
        if tokens == 2000:
            long_picks.append(threads)
    assert choice.preferred() == {"tokens 16-31, items 1": 2, "tokens 1024-2047, items 1": 2}
    assert long_picks[-500:].count(1) >= 2  # probed, long after the first measurements


def test_a_size_no_longer_due_for_a_probe_leaves_the_line() -> None:
    """A size that became due during another's quiet time, then stopped being due (its counts
    swapped), does not hold up the next probe of another size."""
    clock = _Clock()
    choice = ThreadChoice((1, 2), set_threads=lambda n: None, clock=clock)
    for count in (1, 2):
        choice.record(1, count, 1.0)  # each count's first batch starts its threads
    for _ in range(ThreadChoice.MEASURE):
        choice.record(20, 1, 20 * 1.0)
        choice.record(20, 2, 20 * 0.6)
    assert choice.pick(300) == 2  # a new size, from the measured one: waits 15000 to probe
    clock.now = 14500
    assert choice.pick(20) == 1  # the short size's probe (its wait: 1000) ...
    clock.now += 20
    choice.record(20, 1, 20.0)  # ... then no probe for 1000
    clock.now = 15000
    assert choice.pick(300) == 2  # due, but in that quiet time: in line
    choice.record(300, 2, 300 * 5.0)  # 2 got slow here: 1 is this size's choice now
    clock.now = 15100
    assert choice.pick(300) == 1  # not due for a probe any more
    clock.now = 15600
    assert choice.pick(20) == 1  # the short size probes in its time


def test_thread_choice_applies_a_count_only_when_it_changes_and_skips_failed_batches() -> None:
    clock, applied = _Clock(), []
    choice = ThreadChoice((1, 2), set_threads=applied.append, clock=clock)

    def batch() -> str:
        clock.now += 1.0
        return "done"

    assert [choice.run(100, 1, batch) for _ in range(8)] == ["done"] * 8
    assert applied == [1, 2, 1, 2, 1, 2]  # picked 1, 1, 2, 2, 1, 2, 1, 2: applied on changes

    def fails() -> str:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        choice.run(1000, 1, fails)
    # The failed batch's size started from the measured one's means (a tie: the first count)
    # and its count was applied, but its time was not recorded: the means are unchanged.
    assert applied[-1] == 1
    assert choice.preferred() == {"tokens 64-127, items 1": 1, "tokens 512-1023, items 1": 1}
    assert choice._cost[(10, 1, 0), 1] == choice._cost[(7, 1, 0), 1] == 1.0 / 100
    assert choice._cost[(10, 1, 0), 2] == choice._cost[(7, 1, 0), 2] == 1.0 / 100


# ------------------------------------------------------------------------- real pipelines


@pytest.fixture(scope="module")
def classify_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_classifier(tmp_path_factory.mktemp("serve_batching") / "classify", VOCAB,
                                id2label={0: "negative", 1: "positive"})


TEXTS = ["a good film", "bad plot", "a long story of a boring film with bad acting and a plot",
         "great", "the story of a film with great acting", "short"]


def test_parsing_copy_parses_alike_with_its_own_tokenizer(classify_dir: Path) -> None:
    pipe = load_pipeline(classify_dir, device="cpu", max_length=8)
    parser = pipe.parsing_copy()
    assert parser.tokenizer is not pipe.tokenizer and parser.model is pipe.model
    item = {"text": TEXTS[2], "truncate": True}
    assert parser.parse(item) == pipe.parse(item)
    assert parser.truncation == pipe.truncation == "error"  # an item's choice is put back


def test_lone_items_run_padded_and_batches_on_real_tokens(classify_dir: Path) -> None:
    pipe = load_pipeline(classify_dir, device="cpu")
    flags = [m for m in pipe.model.modules() if hasattr(m, "unpad")]
    assert flags and all(m.unpad for m in flags)  # the pipeline's own setting
    runner = BatchRunner(pipe)
    requests = [pipe.parse({"text": t}) for t in TEXTS]
    alone = [pipe([r])[0] for r in requests]
    (lone,) = runner(requests[:1])
    assert not any(m.unpad for m in flags)  # no padding to remove: run padded
    together = runner(requests)
    assert all(m.unpad for m in flags)  # a mixed-length batch: its real tokens only
    for a, b in zip([alone[0], *alone], [lone, *together]):
        assert a["label"] == b["label"] and a["score"] == pytest.approx(b["score"], abs=1e-6)
    assert BatchRunner(object())._unpadded == []  # a wrapper without a model: called as is


def test_padded_batches_on_a_cpu_tell_the_batcher_what_a_call_costs(classify_dir: Path) -> None:
    """Only a padded encoder on a CPU bounds its padding: the PyTorch pipelines run batches on
    their real tokens, a GPU's call costs more than any padding, a decoding loop shares its
    steps, and a wrapper (a replicated route) does not say where it runs."""
    pipe = load_pipeline(classify_dir, device="cpu")
    assert BatchRunner(pipe).call_overhead_tokens is None  # unpadded batches

    def padded(**changes: Any) -> Any:
        other = copy.copy(pipe)
        other.model = lambda **inputs: pipe.model(**inputs)  # a backend without modules (ONNX)
        for name, value in changes.items():
            setattr(other, name, value)
        return other

    assert BatchRunner(padded()).call_overhead_tokens == CPU_CALL_TOKENS
    assert BatchRunner(padded(device=torch.device("cuda"))).call_overhead_tokens is None
    assert BatchRunner(padded(decodes=True)).call_overhead_tokens is None
    assert BatchRunner(object()).call_overhead_tokens is None


def test_a_pytorch_model_on_a_cpu_runs_each_batch_with_the_threads_chosen_for_it(
        classify_dir: Path) -> None:
    pipe = load_pipeline(classify_dir, device="cpu")
    runner = BatchRunner(pipe, (1, 2))
    assert isinstance(runner.threads, ThreadChoice) and runner.threads.counts == (1, 2)
    assert BatchRunner(pipe).threads is None  # fixed threads
    onnx_like = copy.copy(pipe)
    onnx_like.model = lambda **inputs: pipe.model(**inputs)  # no modules: threads fixed at load
    assert BatchRunner(onnx_like, (1, 2)).threads is None
    assert BatchRunner(object(), (1, 2)).threads is None  # a wrapper (replicated route)
    seen: list[int] = []
    original = pipe.run

    def run(requests: Any) -> Any:
        seen.append(torch.get_num_threads())
        return original(requests)

    pipe.run = run
    requests = [pipe.parse({"text": t}) for t in TEXTS]
    before = torch.get_num_threads()
    try:
        for _ in range(8):
            runner(requests)
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1, 2, 2, 1, 2, 1, 2]  # each count starts, then 3 measured batches each
    assert set(runner.threads.preferred()) == {"tokens 32-63, items 4-7"}  # 34 tokens, 6 texts


def test_serve_precision_reaches_the_pipeline(classify_dir: Path) -> None:
    """``serve --precision bf16`` on a CPU: the pipeline computes under bf16 autocast (what
    /health shows), the same labels as fp32 and scores within bf16 rounding; ONNX backends
    refuse it before loading anything."""
    from bertforge.serve import serve
    from bertforge.serve.replica_worker import ReplicaSpec, load_pipelines

    fp32, _ = load_pipelines(classify_dir, None, "torch", "cpu", None, False)
    bf16, _ = load_pipelines(classify_dir, None, "torch", "cpu", None, False, precision="bf16")
    assert (fp32.describe()["precision"], bf16.describe()["precision"]) == ("fp32", "bf16")
    want, got = (p([p.parse({"text": t}) for t in TEXTS]) for p in (fp32, bf16))
    assert [w["label"] for w in want] == [g["label"] for g in got]
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], abs=2e-2)
    assert [g["score"] for g in got] != [w["score"] for w in want]  # it did run in bf16
    assert ServeConfig(model="m", precision="bf16").precision == "bf16"
    assert ReplicaSpec("m", None, "torch", None, False).precision == "auto"
    with pytest.raises(ConfigError, match="--precision bf16: the onnx backend"):
        serve(classify_dir, backend="onnx", precision="bf16")


@pytest.fixture
def served(classify_dir: Path) -> Iterator[str]:
    from bertforge.serve.app import create_app

    settings = ServeSettings(max_wait_ms=50)
    with running(create_app(load_pipeline(classify_dir, device="cpu"), settings), settings) as url:
        yield url


def test_concurrent_requests_share_batches_and_get_the_answers_of_lone_ones(served: str) -> None:
    route = "/v1/text-classification"
    with httpx.Client(base_url=served, timeout=30) as client:
        alone = [client.post(route, json={"text": t}).json() for t in TEXTS]
        lone_queue = _queue_seconds(client.get("/metrics").text)

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=served, timeout=30) as client:
            return await asyncio.gather(*(client.post(route, json={"text": t}) for t in TEXTS * 3))

    responses = asyncio.run(together())
    assert [r.status_code for r in responses] == [200] * len(TEXTS) * 3
    for got, want in zip([r.json() for r in responses], alone * 3):
        assert got["label"] == want["label"]
        assert got["scores"] == pytest.approx(want["scores"], abs=1e-6)
    with httpx.Client(base_url=served, timeout=30) as client:
        text = client.get("/metrics").text
    sizes = [s for s in _samples(text, "bertforge_batch_size_bucket")
             if s.labels["task"] == "text-classification"]
    ones = next(s.value for s in sizes if s.labels["le"] == "1.0")
    assert ones < next(s.value for s in sizes if s.labels["le"] == "+Inf")  # some shared
    # One client, one request at a time: none waited for the 50 ms window.
    assert lone_queue[1] == len(TEXTS) and lone_queue[0] / lone_queue[1] < 0.02


def _samples(text: str, name: str) -> list[Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return [s for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name]


def _queue_seconds(text: str) -> tuple[float, float]:
    """(sum, count) of the classification route's queue times."""
    total = sum(s.value for s in _samples(text, "bertforge_queue_seconds_sum")
                if s.labels["task"] == "text-classification")
    count = sum(s.value for s in _samples(text, "bertforge_queue_seconds_count")
                if s.labels["task"] == "text-classification")
    return total, count


def test_health_shows_the_threads_each_batch_size_prefers(classify_dir: Path) -> None:
    from bertforge.serve.app import create_app

    n = torch.get_num_threads()  # both counts the test process's own: nothing else changes
    settings = ServeSettings(max_wait_ms=0)
    app = create_app(load_pipeline(classify_dir, device="cpu"), settings, thread_counts=(n, n))
    with running(app, settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/health").json()["model_threads"] == {
            "/v1/text-classification": {"counts": [n, n], "preferred": {}}}
        for _ in range(4):  # the first starts the threads, then 3 measured
            assert client.post("/v1/text-classification", json={"text": "a good film"}
                               ).status_code == 200
        health = client.get("/health").json()
    assert health["model_threads"]["/v1/text-classification"]["preferred"] == {
        "tokens 4-7, items 1": n}
    assert torch.get_num_threads() == n
