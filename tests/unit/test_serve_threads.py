"""Where a served model's threads run: CPU replicas split the server's cores, each pinned to its
own share with one intra-op thread per core, and the thread choice of an in-process model
groups its batches by the load they meet, so that a server running one request at a time
(``--max-batch-items 1``) tells its busy spells from its quiet ones as a batching one does."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.serve import replica_pool, replicas
from bertforge.runtime.cpu import core_ids, listed_cores, pin_process, split_cores
from bertforge.serve.execution import BatchRunner, ThreadChoice
from bertforge.serve.replica_pool import ReplicaPool
from bertforge.serve.replica_worker import ReplicaSpec, take_cores
from serving import save_tiny_classifier

LINUX = hasattr(os, "sched_setaffinity")
SPEC = ReplicaSpec("unused", None, "torch", None, False)


# ------------------------------------------------------------------------- splitting the cores


def test_split_cores_gives_disjoint_runs_of_neighbours_as_even_as_can_be() -> None:
    assert split_cores(list(range(8)), 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split_cores(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_cores([0, 2, 4, 6, 8], 2) == [[0, 2, 4], [6, 8]]  # the ids it was given
    assert split_cores([3, 5], 2) == [[3], [5]]
    assert split_cores([0, 1, 2], 1) == [[0, 1, 2]]
    for total in range(1, 13):
        ids = [10 + 2 * i for i in range(total)]  # not starting at 0, with gaps
        for parts in range(1, total + 1):
            runs = split_cores(ids, parts)
            sizes = [len(r) for r in runs]
            assert len(runs) == parts and min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)  # the longer ones first
            assert [i for r in runs for i in r] == ids  # disjoint, contiguous, every core


def test_more_replicas_than_cores_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        split_cores([0, 1], 3)
    assert str(caught.value) == ("--replicas: 3 CPU replicas need a core each, but this process "
                                 "may use 2 (cores 0-1); give --replicas 2 or fewer, or run "
                                 "on more cores")
    with pytest.raises(ValueError, match="parts must be >= 1"):
        split_cores([0, 1], 0)
    assert listed_cores([0, 1, 2, 3, 8, 10, 11]) == "cores 0-3, 8, 10-11"
    assert listed_cores([5]) == "core 5"


def test_core_ids_are_this_process_affinity() -> None:
    ids = core_ids()
    assert ids == sorted(ids) and len(set(ids)) == len(ids) >= 1
    if LINUX:
        assert set(ids) == os.sched_getaffinity(0)


def test_plan_replicas_refuses_more_cpu_replicas_than_cores(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setattr(replicas, "core_ids", lambda: [4, 5])
    assert replicas.plan_replicas(2, "cpu") == ["cpu", "cpu"]
    with pytest.raises(ConfigError, match=r"3 CPU replicas need a core each, but this process "
                                          r"may use 2 \(cores 4-5\); give --replicas 2"):
        replicas.plan_replicas(3, "cpu")
    assert replicas.plan_replicas(None, "cpu") is None  # in-process: every core, as before


# ------------------------------------------------------------------------- the pool's plan


def _rows(pool: ReplicaPool) -> list[tuple[Any, Any]]:
    return [(row["cores"], row["threads"]) for row in pool.snapshot()]


def test_the_pool_gives_each_cpu_replica_its_share_and_a_thread_per_core(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica_pool, "core_ids", lambda: list(range(8)))
    pool = ReplicaPool(SPEC, ["cpu"] * 3)
    try:
        assert _rows(pool) == [([0, 1, 2], 3), ([3, 4, 5], 3), ([6, 7], 2)]
    finally:
        pool.close()
    fixed = ReplicaPool(SPEC, ["cpu", "cpu"], threads=1)  # --model-threads 1
    assert _rows(fixed) == [([0, 1, 2, 3], 1), ([4, 5, 6, 7], 1)]
    fixed.close()
    mixed = ReplicaPool(SPEC, ["cpu", "cuda:0", "cpu"])  # a GPU replica is not pinned
    assert _rows(mixed) == [([0, 1, 2, 3], 4), (None, None), ([4, 5, 6, 7], 4)]
    mixed.close()
    with pytest.raises(ConfigError, match="9 CPU replicas need a core each"):
        ReplicaPool(SPEC, ["cpu"] * 9)


def test_each_replica_process_is_started_with_its_cores_and_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica_pool, "core_ids", lambda: [0, 1, 2, 3])
    started: list[tuple] = []

    class End:
        def close(self) -> None:
            pass

    class FakeProcess:
        pid = None

        def __init__(self, target: Any, name: str, daemon: bool, args: tuple) -> None:
            started.append(args)

        def start(self) -> None:
            pass

    class Context:
        Process = FakeProcess

        @staticmethod
        def Pipe() -> tuple[End, End]:
            return End(), End()

    pool = ReplicaPool(SPEC, ["cpu", "cuda:1", "cpu"])
    pool._context = Context()
    try:
        for replica in pool._replicas:
            pool._spawn(replica)
    finally:
        pool._replicas = []  # nothing was started: nothing to stop
        pool.close()
    assert [args[1:4] for args in started] == [("cpu", [0, 1], 2), ("cuda:1", None, None),
                                              ("cpu", [2, 3], 2)]


def test_without_pinning_the_replicas_say_so_once_and_still_split_the_threads(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(replica_pool, "core_ids", lambda: [0, 1, 2, 3])
    if LINUX:
        monkeypatch.delattr(os, "sched_setaffinity")
    with caplog.at_level(logging.INFO, logger="bertforge.serve"):
        pool = ReplicaPool(SPEC, ["cpu", "cpu"])
    pool.close()
    assert _rows(pool) == [(None, 2), (None, 2)]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [("this platform cannot pin a process to cores (os.sched_setaffinity is "
                      "Linux only): the 2 CPU replicas are not pinned and share every core "
                      "(threads: 2, 2)")]
    assert pin_process([0]) is False


@pytest.mark.skipif(not LINUX, reason="pinning is Linux only")
def test_the_pool_logs_each_replicas_cores(monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(replica_pool, "core_ids", lambda: [0, 1, 2, 3, 4])
    with caplog.at_level(logging.INFO, logger="bertforge.serve"):
        ReplicaPool(SPEC, ["cpu", "cpu"], threads=3).close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == ("2 CPU replicas, each pinned to cores of its own: replica 0 cores 0-2, "
                        "3 threads; replica 1 cores 3-4, 3 threads")
    assert lines[1].startswith("--model-threads 3 is more than the 2 core(s) of replica 1")
    assert len(lines) == 2


# ------------------------------------------------------------------------- a replica's start


def test_a_replica_pins_every_thread_and_sets_its_threads(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    calls: list[tuple[int, tuple]] = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda tid, ids: calls.append((tid, tuple(ids))),
                        raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # restored afterwards; the replica sets its own
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    before = torch.get_num_threads()
    try:
        take_cores([2, 3], 2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert os.environ["OMP_NUM_THREADS"] == "2"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert calls and {ids for _, ids in calls} == {(2, 3)}
    if os.path.isdir("/proc/self/task"):  # every thread this process has, each once
        assert sorted(tid for tid, _ in calls) == sorted(
            int(t) for t in os.listdir("/proc/self/task"))
    calls.clear()
    take_cores(None, None)  # a GPU replica: nothing pinned, nothing set
    assert calls == [] and os.environ["OMP_NUM_THREADS"] == "2"


@pytest.mark.skipif(not LINUX, reason="pinning is Linux only")
def test_a_pinned_process_and_the_threads_it_starts_run_on_its_cores_only(
        tmp_path: Path) -> None:
    """For real, in a child: the core it is given (the last this process may use), for the
    process, for a thread started before and one started after, and torch's thread count."""
    core = core_ids()[-1]
    script = textwrap.dedent(f"""
        import os, threading
        seen = {{}}
        gate = threading.Event()
        def early():
            gate.wait()
            seen["early"] = sorted(os.sched_getaffinity(0))
        before = threading.Thread(target=early)
        before.start()
        from bertforge.serve.replica_worker import take_cores
        take_cores([{core}], 1)
        gate.set()
        before.join()
        late = threading.Thread(target=lambda: seen.update(late=sorted(os.sched_getaffinity(0))))
        late.start()
        late.join()
        import torch
        torch.ones(256, 256) @ torch.ones(256, 256)
        print(sorted(os.sched_getaffinity(0)), seen["early"], seen["late"],
              torch.get_num_threads(), os.environ["OMP_NUM_THREADS"])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "OMP_NUM_THREADS": "4"}, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == f"[{core}] [{core}] [{core}] 1 1"


@pytest.mark.skipif(not LINUX or len(core_ids()) < 2, reason="needs 2 cores to pin 2 replicas")
def test_two_cpu_replicas_run_on_disjoint_cores_and_answer(tmp_path: Path) -> None:
    """The pool's replicas for real: each process is confined to the cores its /health row
    names, the rows together cover the server's cores once, and both answer."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "film", "bad", "plot"]
    model = save_tiny_classifier(tmp_path / "classify", vocab)
    parser, _ = replicas.load_parsers(model, None, "torch", None, False)
    pool = ReplicaPool(ReplicaSpec(str(model), None, "torch", None, False), ["cpu", "cpu"])
    try:
        pool.start()
        rows = pool.snapshot()
        for row in rows:
            assert sorted(os.sched_getaffinity(row["pid"])) == row["cores"]
            assert row["threads"] == len(row["cores"])
        assert sorted(i for row in rows for i in row["cores"]) == core_ids()
        request = parser.parse({"text": "a good film"})
        answers = [pool.run("task", [request], parser.cost(request)) for _ in range(2)]
        assert answers[0] == answers[1] and answers[0][0]["label"] in ("LABEL_0", "LABEL_1")
        assert [row["batches"] for row in pool.snapshot()] == [1, 1]  # one batch each
    finally:
        pool.close()


# ------------------------------------------------------------------------- threads under load


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# Seconds for a lone 171-token paragraph with 1 and 2 threads: on a quiet machine the second
# core pays (1.5x); while 15 requests wait, their HTTP and tokenization take that core from the
# pass, and its barriers wait for the displaced thread.
QUIET = {1: 0.016, 2: 0.0107}
BUSY = {1: 0.018, 2: 0.030}


def _serve_one_at_a_time(see_load: bool) -> tuple[ThreadChoice, float, float]:
    """Paragraphs served one at a time (``--max-batch-items 1``) in spells of 10 batches, quiet
    (nothing waiting) and busy (15 requests waiting) in turn: the choice, then the share of the
    time spent on the slower count once the first 200 batches are past, and the total time."""
    clock = _Clock()
    choice = ThreadChoice((1, 2), set_threads=lambda n: None, clock=clock)
    wrong = late = 0.0
    for batch in range(1200):
        costs = QUIET if batch // 10 % 2 == 0 else BUSY
        waiting = 15 if costs is BUSY and see_load else 0
        count = choice.pick(171, 1, waiting)
        clock.now += costs[count]
        choice.record(171, count, costs[count], 1, waiting)
        if batch >= 200:
            late += costs[count]
            wrong += costs[count] if costs[count] > min(costs.values()) else 0.0
    return choice, wrong / late, clock.now


def test_one_request_at_a_time_the_thread_choice_sees_the_load() -> None:
    choice, wrong, seconds = _serve_one_at_a_time(see_load=True)
    assert choice.preferred() == {"tokens 128-255, items 1": 2,
                                  "tokens 128-255, items 1, waiting 8-15": 1}
    # Each load keeps its own means, so every spell runs the right count from its first
    # batch; the slower count runs only as probes, about 2% of the time (PROBE_SHARE).
    assert 0 < wrong < 1.5 * ThreadChoice.PROBE_SHARE
    # Blind to the load (as a server that ran one request at a time was: all its batches are
    # of 1 item), one group's means mix the spells, each spell is judged by the one before,
    # and the slower count ran 44% to 50% of the time (spells of 5 to 20 batches).
    blind, blind_wrong, blind_seconds = _serve_one_at_a_time(see_load=False)
    assert list(blind.preferred()) == ["tokens 128-255, items 1"]
    assert blind_wrong > 0.3 and seconds < 0.9 * blind_seconds


def test_the_load_of_a_batch_is_what_the_server_holds_besides_it() -> None:
    """BatchRunner reads the server's held items as each batch starts: those beyond the
    batch's own are its ``waiting``, and its group."""
    calls: list[tuple] = []

    class Choice:
        def run(self, tokens: int, items: int, call: Any, waiting: int = 0) -> Any:
            calls.append((tokens, items, waiting))
            return call()

    class Pipeline:
        def cost(self, request: str) -> int:
            return len(request)

        def __call__(self, requests: list[str]) -> list[str]:
            return [r.upper() for r in requests]

    held = [1]
    runner = BatchRunner(Pipeline(), held=lambda: held[0])
    runner.threads = Choice()  # as a PyTorch model on a CPU with automatic threads has one
    assert runner(["abc"]) == ["ABC"]
    held[0] = 16  # 16 held: this one and 15 waiting
    runner(["abcd"])
    held[0] = 20
    runner(["ab", "cd", "ef", "gh"])
    assert calls == [(3, 1, 0), (4, 1, 15), (8, 4, 16)]
    assert ThreadChoice.group(171, 1, 15) == (8, 1, 4) and ThreadChoice.group(171) == (8, 1, 0)
    runner = BatchRunner(Pipeline())  # nothing to read: no load seen
    runner.threads = Choice()
    runner(["abc"])
    assert calls[-1] == (3, 1, 0)


def test_a_new_load_starts_from_the_nearest_measured_group() -> None:
    """A group met for the first time copies the means of the nearest measured one, counting
    powers of two of tokens, items and waiting alike, so a load level met for the first time
    is not measured half with the slower count."""
    clock = _Clock()
    choice = ThreadChoice((1, 2), set_threads=lambda n: None, clock=clock)
    for _ in range(2 * ThreadChoice.MEASURE + 2):  # the first group measures both counts
        count = choice.pick(171, 1, 15)
        choice.record(171, count, BUSY[count], 1, 15)
        clock.now += 1
    assert choice.pick(171, 1, 31) == 1  # 16-31 waiting: next to 8-15, which prefers 1
    assert choice.preferred()["tokens 128-255, items 1, waiting 16-31"] == 1
