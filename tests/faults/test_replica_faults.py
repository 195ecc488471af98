"""Replicas that stop answering or die: ``serve(..., replicas=2, device="cpu")`` in a child
process, its replica processes frozen with SIGSTOP (what a deadlock or a hung device looks like
from outside) or killed with SIGKILL (an out-of-memory kill, a crash in native code).

What must hold: a batch sent to a replica has a deadline; a replica that misses it is killed and
its requests are answered at once with the JSON 503 (Retry-After, saying once to retry); a
replica that died or was killed is restarted with back-off, at most ``--replica-restarts`` times,
each restart counted in /metrics; ``/health`` says degraded and names the replica while it is
not ready, and the other replica answers everything meanwhile. Nothing here sleeps to
synchronise: each step waits for the state it needs (a /health field), within a generous bound.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import psutil
import pytest

from serving import ServeProcess, alive, save_tiny_classifier, stop_cleanly, survivors

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
         *"a good film with great acting bad boring plot".split()]
ROUTE = "/v1/text-classification"
ITEM = {"text": "a good film with great acting"}
READY_WITHIN_S = 120.0  # a restarted replica imports torch and loads the model: slow CI


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_classifier(tmp_path_factory.mktemp("replica_faults") / "classify", VOCAB)


def _health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=30).json()


def _until(url: str, check: Callable[[dict], bool], what: str,
           within: float = READY_WITHIN_S) -> dict:
    """The first /health answer for which ``check`` holds (fails after ``within`` seconds)."""
    deadline = time.monotonic() + within
    while True:
        health = _health(url)
        if check(health):
            return health
        assert time.monotonic() < deadline, f"{what} never happened: {health}"
        time.sleep(0.05)


def _series(url: str, name: str) -> dict[str, float]:
    """``{replica: value}`` of one ``bertforge_replica_*`` series of /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    return {sample.labels["replica"]: sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == name}


def _message_503(response: httpx.Response) -> str:
    """The message of a lost batch's answer: a JSON 503 with a Retry-After of whole seconds,
    telling the client once to retry."""
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1, response.headers
    message = response.json()["error"]["message"]
    assert message.lower().count("retry") == 1, message
    return message


def _row(health: dict, index: int) -> dict[str, Any]:
    return health["replicas"][index]


def _gone(pid: int) -> bool:
    try:
        return not alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_a_stopped_replica_misses_its_deadline_is_killed_and_restarted(
        model: Path, tmp_path: Path) -> None:
    server = ServeProcess(model, tmp_path / "log", replicas=2, device="cpu", max_wait_ms=0,
                          embeddings=False, replica_timeout=5).wait_ready()
    try:
        url = server.url
        stopped = _row(_health(url), 0)["pid"]
        # Frozen, replica 0 still looks idle, and takes the first batch (the lowest of the
        # replicas never used).
        os.kill(stopped, signal.SIGSTOP)
        started = time.monotonic()
        lost = httpx.post(url + ROUTE, json=ITEM, timeout=120)
        assert time.monotonic() - started < 60, "the request hung past its deadline"
        message = _message_503(lost)
        assert "replica 0" in message and "--replica-timeout" in message, message
        assert _gone(stopped), "the frozen replica was not killed"
        health = _health(url)
        assert health["status"] == "degraded" and health["ready"] is True, health
        assert health["unready_replicas"] == [0], health
        assert _row(health, 0)["state"] in ("restarting", "starting"), health
        assert _row(health, 0)["timeouts"] == 1, health
        # The live replica answers everything meanwhile.
        for _ in range(3):
            answer = httpx.post(url + ROUTE, json=ITEM, timeout=60)
            assert answer.status_code == 200, answer.text
        back = _until(url, lambda h: _row(h, 0)["state"] == "idle", "the restart of replica 0")
        assert back["status"] == "ok" and back["unready_replicas"] == [], back
        assert _row(back, 0)["pid"] != stopped and _row(back, 0)["restarts"] == 1, back
        assert _series(url, "bertforge_replica_restarts_total") == {"0": 1.0, "1": 0.0}
        assert _series(url, "bertforge_replica_up") == {"0": 1.0, "1": 1.0}
        # The restarted replica takes batches again (it is the one that waited longest).
        for _ in range(4):
            assert httpx.post(url + ROUTE, json=ITEM, timeout=60).status_code == 200
        assert _row(_health(url), 0)["batches"] >= 1
        assert "did not answer within 5 s" in server.log.read_text()
        stop_cleanly(server)
    finally:
        server.stop()


@pytest.mark.slow
def test_a_killed_replica_is_restarted_until_its_restarts_are_spent(
        model: Path, tmp_path: Path) -> None:
    server = ServeProcess(model, tmp_path / "log", replicas=2, device="cpu", max_wait_ms=0,
                          embeddings=False, replica_restarts=1).wait_ready()
    try:
        url = server.url
        first = _row(_health(url), 0)["pid"]
        os.kill(first, signal.SIGKILL)  # idle: noticed without any request
        back = _until(url, lambda h: _row(h, 0)["state"] == "idle"
                      and _row(h, 0)["pid"] != first, "the restart of replica 0")
        assert _row(back, 0)["restarts"] == 1 and _row(back, 0)["exit_code"] == -9, back
        assert back["status"] == "ok", back
        os.kill(_row(back, 0)["pid"], signal.SIGKILL)
        gone = _until(url, lambda h: _row(h, 0)["state"] == "dead", "giving replica 0 up")
        assert gone["status"] == "degraded" and gone["ready"] is True, gone
        assert gone["unready_replicas"] == [0] and _row(gone, 0)["restarts"] == 1, gone
        for _ in range(3):
            assert httpx.post(url + ROUTE, json=ITEM, timeout=60).status_code == 200
        assert _series(url, "bertforge_replica_restarts_total") == {"0": 1.0, "1": 0.0}
        assert _series(url, "bertforge_replica_up") == {"0": 0.0, "1": 1.0}
        assert "--replica-restarts" in server.log.read_text()
        stop_cleanly(server)
    finally:
        server.stop()


@pytest.mark.slow
def test_sigterm_with_a_stopped_replica_holding_a_batch(model: Path, tmp_path: Path) -> None:
    """The drain gives up on the frozen replica's batch (a 503 for its request) and the server
    exits 0 with no replica left behind, without waiting out the batch's deadline."""
    server = ServeProcess(model, tmp_path / "log", replicas=2, device="cpu", max_wait_ms=0,
                          embeddings=False, drain_timeout=2).wait_ready()
    try:
        url = server.url
        os.kill(_row(_health(url), 0)["pid"], signal.SIGSTOP)
        answer: list[httpx.Response] = []
        caller = threading.Thread(target=lambda: answer.append(
            httpx.post(url + ROUTE, json=ITEM, timeout=120)))
        caller.start()
        _until(url, lambda h: _row(h, 0)["state"] == "busy", "replica 0 taking the batch", 30)
        family = server.family()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0, server.log.read_text()
        caller.join(timeout=30)
        assert answer and answer[0].status_code == 503, answer
        assert survivors(family) == [], server.log.read_text()
    finally:
        server.stop()


def test_a_lost_batch_says_once_to_retry(model: Path) -> None:
    """Every way a replica pool loses a batch answers a 503 whose message says to retry once
    (the answer's text is the pool's own, never extended with a second hint)."""
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app
    from bertforge.serve.replicas import ReplicaPipeline, ReplicaPool, ReplicaSpec, load_parsers
    from bertforge.serve.settings import ServeSettings

    parser, _ = load_parsers(model, None, "torch", None, False)
    pool = ReplicaPool(ReplicaSpec(str(model), None, "torch", None, False), ["cpu", "cpu"])
    pool.close()  # what a request meets while the server shuts down
    app = create_app(ReplicaPipeline(parser, pool, "task"), ServeSettings(), replicas=pool)
    with TestClient(app) as client:
        _message_503(client.post(ROUTE, json=ITEM))


def test_the_automatic_deadline_follows_the_slowest_measured_batch(model: Path) -> None:
    """600 s until a batch was measured; then 10x the slowest seconds per token of a batch
    (each replica process's first, a warm-up, left out) times the batch's tokens, at least
    60 s; --replica-timeout replaces it."""
    from bertforge.serve.replica_pool import ReplicaPool
    from bertforge.serve.replicas import ReplicaSpec

    spec = ReplicaSpec(str(model), None, "torch", None, False)
    pool = ReplicaPool(spec, ["cpu", "cpu"])
    try:
        first, second = pool._replicas
        assert pool.deadline("task", 1000) == 600.0
        pool._release(first, "task", 4, 100, 50.0, answered=True)  # a warm-up: not measured
        assert pool.deadline("task", 1000) == 600.0
        pool._release(first, "task", 4, 1000, 2.0, answered=True)  # 2 ms per token
        pool._release(second, "task", 4, 1000, 9.0, answered=True)  # its warm-up
        assert pool.deadline("task", 1000) == 60.0  # 10 x 2 ms x 1000 = 20 s: the floor
        assert pool.deadline("task", 8000) == pytest.approx(160.0)
        assert pool.deadline("embeddings", 8000) == 600.0  # each pipeline its own
        pool._release(first, "task", 4, 1000, 0.5, answered=False)  # failed: not measured
        assert pool.deadline("task", 8000) == pytest.approx(160.0)
    finally:
        pool.close()
    fixed = ReplicaPool(spec, ["cpu", "cpu"], timeout=2.5)
    assert fixed.deadline("task", 10**6) == 2.5
    fixed.close()


def test_docs_give_a_lost_replica_batch_503() -> None:
    text = (Path(__file__).parents[2] / "docs" / "serving.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 503 |"))
    assert "replica" in row and "Retry-After" in row, row
    assert "JSON 500" not in text.split("## Replicas", 1)[1].split("\n## ", 1)[0]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1],
                         ids=lambda s: signal.Signals(s).name)
def test_a_signal_to_the_whole_group_drains_the_server_and_spares_the_replicas(
        model: Path, tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C in a terminal, or a scheduler's SIGTERM or SIGUSR1 notice, reaches the server and
    its replicas at once: the replicas ignore it, the server drains (a request sent before the
    signal is answered) and exits 0 with no process left."""
    server = ServeProcess(model, tmp_path / "log", group=True, replicas=2, device="cpu",
                          max_wait_ms=0, embeddings=False).wait_ready()
    try:
        assert httpx.post(server.url + ROUTE, json=ITEM, timeout=60).status_code == 200
        family = server.family()
        os.killpg(server.proc.pid, sig)
        assert server.proc.wait(timeout=60) == 0, server.log.read_text()
        assert survivors(family) == [], server.log.read_text()
        assert "Traceback" not in server.log.read_text()
    finally:
        server.stop()


def test_an_input_error_raised_in_a_replica_arrives_whole(model: Path) -> None:
    """An InputError raised by a replica's pipeline crosses the pipe whole (its message's
    template, the fields it names, whether it says how to cut), so a route's client reads it in
    its own words, as from a single-process server: a reranker's pair by ``query`` and
    ``texts[1]``, the cut by ``"truncate": true``. The replica's side is the worker's own loop
    on a real pipe; the pool's is its own ``run``."""
    from multiprocessing import Pipe
    from types import SimpleNamespace

    from bertforge.inference.pipelines import InputError
    from bertforge.inference.pipelines.base import too_long
    from bertforge.serve.answering import input_error
    from bertforge.serve.replica_pool import ReplicaPool
    from bertforge.serve.replica_worker import _answer
    from bertforge.serve.replicas import ReplicaSpec

    def refuse(requests: Any) -> None:
        raise too_long(900, 64, pair=True)

    pool = ReplicaPool(ReplicaSpec(str(model), None, "torch", None, False), ["cpu"])
    mine, theirs = Pipe()
    never, unused = os.pipe()  # the replica's "process ended" handle: it never ends
    worker = threading.Thread(target=_answer, args=(theirs, {"task": refuse}), daemon=True)
    worker.start()
    replica = pool._replicas[0]
    replica.process = SimpleNamespace(sentinel=never, exitcode=None, pid=os.getpid())
    replica.conn, replica.state = mine, "idle"
    try:
        with pytest.raises(InputError) as raised:
            pool.run("task", ["a pair"])
    finally:
        mine.send(None)
        worker.join(30)
        replica.process = None
        pool.close()
        os.close(never)
        os.close(unused)
    error = input_error(raised.value, None, {"text_pair": "texts[1]", "text": "query"})
    assert error.field == "texts[1]", error.field
    assert "together with query" in error.message, error.message
    assert 'send "truncate": true' in error.message, error.message
