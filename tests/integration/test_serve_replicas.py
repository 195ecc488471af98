"""``bertforge serve --replicas``: one port and one queue in front of several model processes.

First the parts on their own (the replica plan, the batcher running batches side by side and
failing a lost batch whole), then real servers: ``serve(..., replicas=2, device="cpu")`` in a
child process serving a tiny random-weight QA model through two spawned replica processes. The
answers must be those of the pipeline run in one process; requests must reach both replicas
(their own series in /metrics and rows in /health); a replica killed while it holds a request
must fail that request at once and be reported (restarts: tests/faults/test_replica_faults.py);
SIGTERM must leave no process behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.models import BertConfig, BertForQuestionAnswering
from bertforge.serve.batching import BatchLost, DynamicBatcher
from bertforge.serve.replicas import plan_replicas
from bertforge.tokenization import BertTokenizer
from serving import ServeProcess as Server
from serving import stop_cleanly as _stop_cleanly

WORDS = ("the report was written by ada in 1843 . who wrote it ? when did she write a long "
         "and careful note about engines , numbers and music lovelace worked london").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(WORDS)]
CONTEXTS = ["the report was written by ada in 1843 .",
            "ada wrote a long and careful note about engines , numbers and music in london . " * 3,
            "lovelace worked in london .",
            "she wrote it in 1843 , a note about engines ."]
QUESTIONS = ["who wrote the report ?", "when did she write it ?", "who worked in london ?"]
ITEMS = [{"question": QUESTIONS[i % 3], "context": CONTEXTS[(i * 7) % 4][: 20 + 9 * i]}
         for i in range(12)]
QA = "/v1/question-answering"


# ------------------------------------------------------------------------------ the parts


def test_plan_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    from bertforge.serve import replicas

    monkeypatch.setattr(replicas, "core_ids", lambda: [0, 1, 2, 3])  # a core per CPU replica
    assert plan_replicas(None, "cpu") is None  # the default: the model in the server process
    assert plan_replicas(1, "auto") is None and plan_replicas("1", "cpu") is None
    assert plan_replicas("auto", "cpu") is None  # one replica on a CPU
    assert plan_replicas("2", "cpu") == ["cpu", "cpu"]
    assert plan_replicas(None, "cpu, cpu") == ["cpu", "cpu"]  # one per listed device
    assert plan_replicas(3, "cpu,cpu") == ["cpu"] * 3
    with pytest.raises(ConfigError, match="5 CPU replicas need a core each, but this process may "
                                          "use 4"):
        plan_replicas(5, "cpu")
    if not torch.cuda.is_available():
        assert plan_replicas("auto", "auto") is None
        assert plan_replicas(2, "auto") == ["cpu", "cpu"]
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            plan_replicas(None, "cuda:0,cuda:1")
    for bad in ("0", "-1", "two", "1.5", True):
        with pytest.raises(ConfigError, match="--replicas must be a whole number"):
            plan_replicas(bad, "cpu")
    with pytest.raises(ConfigError, match="--replicas 1 is fewer than the 2 devices"):
        plan_replicas(1, "cpu,cpu")
    with pytest.raises(ConfigError, match="empty entry"):
        plan_replicas(2, "cpu,")
    with pytest.raises(ConfigError, match="is not a device"):
        plan_replicas(2, "gpu0")


def test_batcher_runs_up_to_concurrency_batches_at_once() -> None:
    active, peak = [0], [0]
    lock = threading.Lock()

    def run(requests: list[Any]) -> list[Any]:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        return [f"<{r}>" for r in requests]

    async def main() -> tuple[list[Any], float]:
        batcher = DynamicBatcher(run, max_batch_tokens=100, max_batch_items=1, max_wait_ms=0,
                                 concurrency=2)
        await batcher.start()
        started = time.monotonic()
        out = await asyncio.gather(*(batcher.submit(i, 1) for i in range(4)))
        elapsed = time.monotonic() - started
        assert await batcher.parse(lambda x: x + 1, 1) == 2  # parsing has its own thread
        await batcher.close()
        return out, elapsed

    out, elapsed = asyncio.run(main())
    assert out == ["<0>", "<1>", "<2>", "<3>"]
    # Four batches of 0.2 s on two runners: two rounds, never three at once.
    assert peak[0] == 2 and elapsed < 0.75


def test_batcher_fails_a_lost_batch_whole_without_retrying() -> None:
    calls: list[list[Any]] = []

    def run(requests: list[Any]) -> list[Any]:
        calls.append(list(requests))
        if len(calls) == 1:
            raise BatchLost("replica 0 stopped while running this request")
        return [f"<{r}>" for r in requests]

    async def main() -> tuple[list[Any], Any]:
        batcher = DynamicBatcher(run, max_batch_tokens=100, max_batch_items=8, max_wait_ms=20,
                                 concurrency=2)
        await batcher.start()
        out = await asyncio.gather(*(batcher.submit(r, 1) for r in "abc"),
                                   return_exceptions=True)
        after = await batcher.submit("d", 1)
        await batcher.close()
        return out, after

    out, after = asyncio.run(main())
    assert all(isinstance(o, BatchLost) for o in out) and after == "<d>"
    assert calls == [["a", "b", "c"], ["d"]]  # no request of the lost batch was run again


# ------------------------------------------------------------------------------ real servers


@pytest.fixture(scope="module")
def qa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = BertConfig.from_preset("bert-tiny", vocab_size=len(VOCAB),
                                    max_position_embeddings=128, finetuning_task="squad")
    directory = tmp_path_factory.mktemp("replica_model") / "qa"
    BertForQuestionAnswering(config).save_pretrained(directory, tokenizer=BertTokenizer(VOCAB))
    return directory


@pytest.fixture(scope="module")
def replicated(qa_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("replica_logs") / "two.log"
    server = Server(qa_model, log, replicas=2, device="cpu", max_wait_ms=20,
                    max_batch_items=4).wait_ready()
    yield server
    _stop_cleanly(server)


def _same(a: Any, b: Any) -> bool:
    """Equal JSON, floats within float32 rounding (a padded batch and a lone request run
    different matrix shapes)."""
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-5, abs=1e-6)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _reference(model: Path, items: list[dict], task: str | None = None) -> list[Any]:
    """What a single-process server answers, each item alone, as JSON: the pipeline run as the
    server runs a batch (``BatchRunner``) with the torch threads of one of two CPU replicas
    (another thread count sums matrix products in another order, which moves scores by float32
    rounding)."""
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.serve.execution import BatchRunner

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // 2))
    try:
        pipeline = load_pipeline(model, task, device="cpu")
        run = BatchRunner(pipeline)
        return [json.loads(json.dumps(run([pipeline.parse(item)])[0])) for item in items]
    finally:
        torch.set_num_threads(before)


def _series(text: str, name: str) -> dict[str, float]:
    """``{replica: value}`` of one ``bertforge_replica_*`` series in a /metrics scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    return {sample.labels["replica"]: sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == name}


def test_answers_equal_one_process_and_spread_over_both_replicas(
        replicated: Server, qa_model: Path) -> None:
    expected = _reference(qa_model, ITEMS)
    with httpx.Client(base_url=replicated.url, timeout=60) as client:
        alone = [client.post(QA, json=item) for item in ITEMS]
        assert [r.status_code for r in alone] == [200] * len(ITEMS), alone[0].text
        assert [r.json() for r in alone] == expected  # the very same JSON, floats included
        embedded = client.post("/v1/embeddings", json={"text": CONTEXTS[0]})
        assert embedded.status_code == 200, embedded.text
        assert embedded.json() == _reference(qa_model, [{"text": CONTEXTS[0]}],
                                             "feature-extraction")[0]

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=replicated.url, timeout=60) as client:
            return await asyncio.gather(*(client.post(QA, json=item) for item in ITEMS * 2))

    responses = asyncio.run(together())
    assert [r.status_code for r in responses] == [200] * 2 * len(ITEMS)
    # Batched with others now: padding changes the matrix shapes, so floats agree to rounding.
    assert _same([r.json() for r in responses], expected * 2)
    with httpx.Client(base_url=replicated.url, timeout=60) as client:
        metrics, health = client.get("/metrics").text, client.get("/health").json()
    batches = _series(metrics, "bertforge_replica_batches_total")
    items = _series(metrics, "bertforge_replica_items_total")
    # The free replica used least recently takes the next batch: even one client at a time
    # (the first twelve requests) is served by both in turn.
    assert set(batches) == {"0", "1"} and min(batches.values()) >= 6, metrics
    assert sum(items.values()) == 3 * len(ITEMS) + 1  # every item ran on one of them, once
    assert _series(metrics, "bertforge_replica_up") == {"0": 1.0, "1": 1.0}
    assert health["status"] == "ok" and health["ready"] is True
    rows = health["replicas"]
    assert [(r["replica"], r["device"], r["state"]) for r in rows] == [(0, "cpu", "idle"),
                                                                       (1, "cpu", "idle")]
    assert [r["batches"] for r in rows] == [batches["0"], batches["1"]]
    assert all(r["busy_seconds"] > 0 and r["errors"] == 0 for r in rows)
    assert health["endpoints"][QA]["model"]["replicas"] == 2
    assert {p.pid for p in replicated.family()} >= {r["pid"] for r in rows}


def test_a_killed_replica_fails_its_requests_fast_and_is_reported(
        qa_model: Path, tmp_path: Path) -> None:
    # Not restarted (tests/faults/test_replica_faults.py covers restarts): it stays dead.
    server = Server(qa_model, tmp_path / "log", replicas=2, device="cpu", max_wait_ms=0,
                    embeddings=False, replica_restarts=0).wait_ready()
    try:
        url = server.url
        first = httpx.get(url + "/health").json()["replicas"][0]
        # Frozen, replica 0 takes the first batch (the lowest of the replicas never used) and
        # holds it.
        os.kill(first["pid"], signal.SIGSTOP)
        answer: list[httpx.Response] = []
        caller = threading.Thread(target=lambda: answer.append(
            httpx.post(url + QA, json=ITEMS[0], timeout=60)))
        caller.start()
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health").json()["replicas"][0]["state"] != "busy":
            assert time.monotonic() < deadline, "replica 0 never got the request"
            time.sleep(0.02)
        killed = time.monotonic()
        os.kill(first["pid"], signal.SIGKILL)
        caller.join(timeout=30)
        assert answer and time.monotonic() - killed < 10, "the request hung"
        failed = answer[0]
        assert failed.status_code == 503, failed.text  # a lost replica: retry elsewhere
        assert "retry the request" in failed.json()["error"]["message"]
        health = httpx.get(url + "/health").json()
        assert health["status"] == "degraded" and health["ready"] is True
        dead, alive = health["replicas"]
        assert (dead["state"], dead["exit_code"], dead["errors"]) == ("dead", -9, 1)
        assert alive["state"] == "idle"
        # The other replica answers everything from now on.
        for item in ITEMS[:3]:
            assert httpx.post(url + QA, json=item, timeout=60).status_code == 200
        metrics = httpx.get(url + "/metrics").text
        assert _series(metrics, "bertforge_replica_up") == {"0": 0.0, "1": 1.0}
        assert _series(metrics, "bertforge_replica_errors_total")["0"] == 1.0
        assert "replica 0 (cpu" in server.log.read_text()
        _stop_cleanly(server)
    finally:
        server.stop()


def test_health_is_503_once_every_replica_is_gone(qa_model: Path) -> None:
    """A load balancer reads the status code: ready answers 200, no replica left 503."""
    from fastapi.testclient import TestClient

    from bertforge.inference.pipelines import load_pipeline
    from bertforge.serve.app import create_app
    from bertforge.serve.settings import ServeSettings

    class Replicas:  # the pool's interface as create_app reads it
        size = 2
        rows = [{"replica": 0, "device": "cpu", "state": "idle", "pid": 1, "exit_code": None,
                 "batches": 0, "items": 0, "busy_seconds": 0.0, "errors": 0}]

        def snapshot(self) -> list[dict]:
            return self.rows

        def health(self) -> dict:
            alive = any(r["state"] != "dead" for r in self.rows)
            return {"status": "ok" if alive else "down", "ready": alive, "replicas": self.rows}

    replicas = Replicas()
    app = create_app(load_pipeline(qa_model, device="cpu"), ServeSettings(), replicas=replicas)
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        replicas.rows = [{**replicas.rows[0], "state": "dead", "exit_code": -9}]
        gone = client.get("/health")
        assert gone.status_code == 503
        assert gone.json()["status"] == "down" and gone.json()["ready"] is False
