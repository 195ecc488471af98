"""``bertforge serve``: the dynamic batcher on its own, then real server processes on free
localhost ports driven by httpx, serving tiny random-weight models built here through the real
``load_pipeline``.

The servers run ``bertforge.serve.serve`` in a child process whose pipelines are wrapped (see
``PRELUDE``) so a test can make one request fail inside the model call ("poison" in its text) or
take long ("slow"), which random weights cannot be asked to do. Everything else is the product:
the same app, batcher, limits, metrics and shutdown a user gets.
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.models import BertConfig, BertForQuestionAnswering, BertForSequenceClassification
from bertforge.serve.batching import BatcherClosed, BatchStats, DynamicBatcher
from bertforge.tokenization import BertTokenizer
from serving import ServeProcess

WORDS = ("the report was written by ada in 1843 . who wrote it ? when did she write a long "
         "and careful note about engines , numbers and music lovelace worked london film good "
         "bad movie plot acting great boring").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(WORDS)]
CONTEXTS = ["the report was written by ada in 1843 .",
            "ada wrote a long and careful note about engines , numbers and music in london . " * 3,
            "lovelace worked in london .",
            "she wrote it in 1843 , a note about engines ."]
QUESTIONS = ["who wrote the report ?", "when did she write it ?", "who worked in london ?"]

# Run in the child before serve(): each loaded pipeline wrapped so that an item whose text holds
# "poison" makes the model call raise and one holding "slow" makes it take a second.
PRELUDE = """
import time
import bertforge.inference.pipelines as pipelines

real = pipelines.load_pipeline

class Wrapped:
    def __init__(self, inner):
        self.inner, self.task, self.marks = inner, inner.task, {}
    def parse(self, item):
        request = self.inner.parse(item)
        text = " ".join(str(v) for v in item.values())
        self.marks[id(request)] = [m for m in ("poison", "slow") if m in text]
        return request
    def cost(self, request):
        return self.inner.cost(request)
    def describe(self):
        return self.inner.describe()
    def __call__(self, requests):
        marks = [m for r in requests for m in self.marks.get(id(r), ())]
        if "poison" in marks:
            raise RuntimeError("a poisoned request reached the model")
        if "slow" in marks:
            time.sleep(1.0)
        return self.inner(requests)

pipelines.load_pipeline = lambda *a, **k: Wrapped(real(*a, **k))
"""


# ------------------------------------------------------------------------------ the batcher


def _echo(calls: list[list[Any]], delay: float = 0.0):
    def run(requests):
        calls.append(list(requests))
        if any(r == "bad" for r in requests):
            raise RuntimeError("bad request in the batch")
        time.sleep(delay)
        return [f"<{r}>" for r in requests]
    return run


def _batched(run, *, items: int = 4, tokens: int = 100, wait_ms: float = 30.0, **kw):
    return DynamicBatcher(run, max_batch_tokens=tokens, max_batch_items=items, max_wait_ms=wait_ms,
                          **kw)


def test_batcher_groups_concurrent_requests_within_both_budgets() -> None:
    calls: list[list[Any]] = []
    stats: list[BatchStats] = []

    async def main() -> list[Any]:
        batcher = _batched(_echo(calls, 0.01), items=4, tokens=10, on_batch=stats.append)
        await batcher.start()
        costs = [3, 3, 3, 3, 2, 2, 2, 2, 25, 1]
        out = await asyncio.gather(*(batcher.submit(i, c) for i, c in enumerate(costs)))
        await batcher.close()
        return out

    assert asyncio.run(main()) == [f"<{i}>" for i in range(10)]
    # Padded tokens (rows x the longest row) cap the first batch at 3 (3 x 3 <= 10 < 4 x 3) and
    # the second at 3 too (the 3 pads the 2s to its width); the third takes the 1 with the 2s
    # (3 x 2); the request over the whole budget (25) runs alone instead of being refused.
    assert calls == [[0, 1, 2], [3, 4, 5], [6, 7, 9], [8]]
    assert [s.items for s in stats] == [3, 3, 3, 1] and stats[3].tokens == 25
    assert [s.padded_tokens for s in stats] == [9, 9, 6, 25] and stats[2].tokens == 5
    assert all(q >= 0 for s in stats for q in s.queue_seconds)


def test_batcher_waits_at_most_max_wait_for_company() -> None:
    async def main() -> tuple[float, float]:
        batcher = _batched(_echo([]), wait_ms=50)
        await batcher.start()
        started = time.monotonic()
        assert await batcher.submit("alone", 1) == "<alone>"
        alone = time.monotonic() - started
        await asyncio.sleep(0.1)  # an idle spell: the last batch's client is not coming back
        batcher.expect(3)  # announced (being parsed), but only one ever comes
        started = time.monotonic()
        assert await batcher.submit("first", 1) == "<first>"
        announced = time.monotonic() - started
        await batcher.close()
        return alone, announced

    alone, announced = asyncio.run(main())
    # A lone request on an idle model runs at once; one whose company was announced waits for
    # it until the 50 ms bound, not longer (generous upper bound for a loaded CI machine).
    assert alone < 0.04 and 0.04 <= announced < 5.0


def test_batcher_failure_fails_only_the_bad_request_and_keeps_serving() -> None:
    calls: list[list[Any]] = []

    async def main() -> tuple[list[Any], Any]:
        batcher = _batched(_echo(calls), items=8)
        await batcher.start()
        out = await asyncio.gather(*(batcher.submit(r, 1) for r in ("a", "bad", "c")),
                                   return_exceptions=True)
        after = await batcher.submit("d", 1)
        await batcher.close()
        return out, after

    (a, bad, c), after = asyncio.run(main())
    assert (a, c, after) == ("<a>", "<c>", "<d>")
    assert isinstance(bad, RuntimeError)
    # The failed batch, then each of its requests alone, then the next request.
    assert calls == [["a", "bad", "c"], ["a"], ["bad"], ["c"], ["d"]]


def test_batcher_close_drains_the_queue_then_refuses() -> None:
    calls: list[list[Any]] = []

    async def main() -> list[Any]:
        batcher = _batched(_echo(calls, 0.05), items=1, wait_ms=1000)
        await batcher.start()
        pending = [asyncio.ensure_future(batcher.submit(i, 1)) for i in range(3)]
        await asyncio.sleep(0.01)  # all three queued, the first running
        await batcher.close()
        with pytest.raises(BatcherClosed):
            await batcher.submit("late", 1)
        return [p.result() for p in pending]

    assert asyncio.run(main()) == ["<0>", "<1>", "<2>"]


def test_batcher_skips_requests_whose_client_went_away() -> None:
    calls: list[list[Any]] = []

    async def main() -> Any:
        batcher = _batched(_echo(calls), wait_ms=50)
        await batcher.start()
        gone = asyncio.ensure_future(batcher.submit("gone", 1))
        kept = asyncio.ensure_future(batcher.submit("kept", 1))
        await asyncio.sleep(0)
        gone.cancel()
        result = await kept
        await batcher.close()
        return result

    assert asyncio.run(main()) == "<kept>"
    assert calls == [["kept"]]


def test_settings_reject_bad_limits() -> None:
    from bertforge.serve.app import ServeSettings

    for kwargs, flag in (({"max_batch_tokens": 0}, "--max-batch-tokens"),
                         ({"max_wait_ms": -1}, "--max-wait-ms"),
                         ({"max_body_bytes": 0}, "--max-body-bytes"),
                         ({"max_num_beams": 0}, "--max-num-beams"),
                         ({"max_json_depth": 0}, "--max-json-depth"),
                         ({"header_timeout": 0}, "--header-timeout"),
                         ({"body_timeout": -1}, "--body-timeout"),
                         ({"api_key": " "}, "--api-key")):
        with pytest.raises(ConfigError, match=flag):
            ServeSettings(**kwargs)


def test_serve_rejects_bad_options_before_loading(tmp_path: Path) -> None:
    from bertforge.serve import serve

    with pytest.raises(ConfigError, match="--backend"):
        serve(tmp_path, backend="tensorrt")
    with pytest.raises(ConfigError, match="--port"):
        serve(tmp_path, port=70000)


# ------------------------------------------------------------------------------ real servers


def _save(model: torch.nn.Module, directory: Path) -> Path:
    model.save_pretrained(directory, tokenizer=BertTokenizer(VOCAB))
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve_models")
    torch.manual_seed(0)
    shape = {"vocab_size": len(VOCAB), "max_position_embeddings": 128}
    qa = BertForQuestionAnswering(BertConfig.from_preset("bert-tiny", **shape,
                                                         finetuning_task="squad"))
    cls = BertForSequenceClassification(BertConfig.from_preset(
        "bert-tiny", **shape, num_labels=2, id2label={0: "negative", 1: "positive"},
        finetuning_task="classification"))
    return {"qa": _save(qa, root / "qa"), "classify": _save(cls, root / "classify")}


@pytest.fixture(scope="module")
def servers(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, ServeProcess]]:
    logs = tmp_path_factory.mktemp("serve_logs")
    # Started together: each spends its first seconds importing torch.
    started = {
        # A wait long enough that concurrent requests reliably share batches.
        "qa": ServeProcess(models["qa"], logs / "qa.log", prelude=PRELUDE, max_wait_ms=100,
                     max_batch_items=8, max_body_bytes=20_000, max_text_chars=2_000),
        "classify": ServeProcess(models["classify"], logs / "classify.log", prelude=PRELUDE,
                           env={"BERTFORGE_API_KEY": "sesame"}),
    }
    try:
        yield {name: server.wait_ready() for name, server in started.items()}
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def qa(servers: dict[str, ServeProcess]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=servers["qa"].url, timeout=30) as client:
        yield client


KEY = {"Authorization": "Bearer sesame"}


def _same(a: Any, b: Any) -> bool:
    """Equal JSON, floats within float32 rounding: a padded batch and a lone request run
    different matrix shapes, whose sums may round differently in the last bits."""
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-5, abs=1e-6)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _assert_error(response: httpx.Response, status: int, field: str | None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["field"] == field, error
    assert error["message"]
    return error["message"]


def test_question_answering_single_and_batch(qa: httpx.Client) -> None:
    item = {"question": QUESTIONS[0], "context": CONTEXTS[0]}
    one = qa.post("/v1/question-answering", json=item)
    assert one.status_code == 200, one.text
    answer = one.json()
    assert CONTEXTS[0][answer["start"]:answer["end"]] == answer["answer"]
    assert 0.0 <= answer["score"] <= 1.0
    both = qa.post("/v1/question-answering", json={"inputs": [item, {
        "question": QUESTIONS[1], "context": CONTEXTS[1]}]})
    assert both.status_code == 200 and _same(both.json()["outputs"][0], answer)


def test_concurrent_requests_are_batched_and_equal_unbatched_answers(
        qa: httpx.Client, servers: dict[str, ServeProcess]) -> None:
    items = [{"question": QUESTIONS[i % 3], "context": CONTEXTS[(i * 7) % 4][: 20 + 9 * i]}
             for i in range(16)]
    # One at a time first: each request alone in its batch.
    alone = [qa.post("/v1/question-answering", json=item).json() for item in items]

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=servers["qa"].url, timeout=30) as client:
            return await asyncio.gather(*(client.post("/v1/question-answering", json=item)
                                          for item in items))

    responses = asyncio.run(together())
    assert [r.status_code for r in responses] == [200] * 16
    assert _same([r.json() for r in responses], alone)
    families = _metrics(qa.get("/metrics").text)
    sizes = {s.labels.get("le"): s.value for s in families["bertforge_batch_size"].samples
             if s.labels.get("task") == "question-answering" and s.name.endswith("_bucket")}
    # Some model call held more than one request: fewer calls of size <= 1 than calls in all.
    assert sizes["1.0"] < sizes["+Inf"]


def test_embeddings_endpoint_on_any_model(qa: httpx.Client) -> None:
    response = qa.post("/v1/embeddings", json={"inputs": [{"text": CONTEXTS[0]},
                                                          {"text": CONTEXTS[2]}]})
    assert response.status_code == 200, response.text
    vectors = [o["embedding"] for o in response.json()["outputs"]]
    assert [len(v) for v in vectors] == [128, 128] and vectors[0] != vectors[1]
    assert all(isinstance(x, float) for x in vectors[0])


def test_health_openapi_docs_and_page(qa: httpx.Client) -> None:
    health = qa.get("/health").json()
    assert health["ready"] is True and health["task"] == "question-answering"
    assert set(health["endpoints"]) == {"/v1/question-answering", "/v1/embeddings"}
    schema = qa.get("/openapi.json").json()
    assert {"/v1/question-answering", "/v1/embeddings", "/health", "/metrics"} <= set(
        schema["paths"])
    body = schema["paths"]["/v1/question-answering"]["post"]["requestBody"]
    assert body["content"]["application/json"]["example"]["question"]
    docs = qa.get("/docs")
    assert docs.status_code == 200 and "text/html" in docs.headers["content-type"]
    # Every route of the schema, with the request example, on a page that works offline.
    for path in schema["paths"]:
        assert f"<code>{path}</code>" in docs.text, path
    assert "&quot;question&quot;" in docs.text
    page = qa.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    # Self-contained: no script, style or font fetched from another host.
    for html_page in (page, docs):
        assert not re.search(r"(src|href)=\"(https?:)?//", html_page.text)
        assert "<script src" not in html_page.text


@pytest.mark.parametrize("body, status, field", [
    (b'{"question": "who?", "context": ', 400, "body"),
    (b"\xff\xfe", 400, "body"),
    (b'["a list"]', 422, "body"),
    (b'{"context": "ada wrote it ."}', 422, "question"),
    (b'{"question": "who?", "context": 5}', 422, "context"),
    (b'{"question": "   ", "context": "ada wrote it ."}', 422, "question"),
    (b'{"inputs": []}', 422, "inputs"),
    (b'{"inputs": {"question": "who?"}}', 422, "inputs"),
    (b'{"inputs": [{"question": "who?", "context": "ada ."}, "text"]}', 422, "inputs[1]"),
    (b'{"inputs": [{"question": "who?", "context": "ada ."}, {"question": "who?"}]}', 422,
     "inputs[1].context"),
])
def test_bad_input_answers_4xx_naming_the_field(qa: httpx.Client, body: bytes, status: int,
                                                field: str) -> None:
    response = qa.post("/v1/question-answering", content=body,
                       headers={"Content-Type": "application/json"})
    _assert_error(response, status, field)


def test_size_limits_answer_413(qa: httpx.Client) -> None:
    item = {"question": "who?", "context": "ada wrote it ."}
    too_many = qa.post("/v1/question-answering", json={"inputs": [item] * 9})
    assert "--max-batch-items" in _assert_error(too_many, 413, "inputs")
    long_text = qa.post("/v1/question-answering", json={**item, "context": "ada " * 600})
    assert "--max-text-chars" in _assert_error(long_text, 413, "context")
    big = qa.post("/v1/question-answering", json={**item, "pad": "x" * 30_000})
    assert "--max-body-bytes" in _assert_error(big, 413, "body")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted while reading
        yield b'{"question": "who?", "context": "'
        for _ in range(40):
            yield b"ada " * 200
        yield b'"}'

    streamed = qa.post("/v1/question-answering", content=chunks(),
                       headers={"Content-Type": "application/json"})
    _assert_error(streamed, 413, "body")


def test_unknown_route_and_method(qa: httpx.Client) -> None:
    _assert_error(qa.post("/v1/nothing", json={}), 404, None)
    _assert_error(qa.get("/v1/question-answering"), 405, None)


def test_internal_failure_is_500_for_that_request_only(qa: httpx.Client,
                                                       servers: dict[str, ServeProcess]) -> None:
    good = [{"question": q, "context": CONTEXTS[0]} for q in QUESTIONS]
    bad = {"question": "who poison ?", "context": CONTEXTS[0]}
    expected = [qa.post("/v1/question-answering", json=item).json() for item in good]

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=servers["qa"].url, timeout=30) as client:
            return await asyncio.gather(*(client.post("/v1/question-answering", json=item)
                                          for item in [good[0], bad, *good[1:]]))

    first, failed, *rest = asyncio.run(together())
    message = _assert_error(failed, 500, None)
    assert "poison" not in message and "Traceback" not in failed.text
    assert _same([first.json(), *(r.json() for r in rest)], expected)
    # Still serving, and the traceback is in the server's log.
    assert _same(qa.post("/v1/question-answering", json=good[0]).json(), expected[0])
    log = servers["qa"].log.read_text()
    assert "Traceback" in log and "a poisoned request reached the model" in log


def test_metrics_are_prometheus_text(qa: httpx.Client) -> None:
    qa.post("/v1/question-answering", json={"context": "x"})
    response = qa.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    families = _metrics(response.text)
    for name in ("bertforge_requests", "bertforge_errors", "bertforge_request_latency_seconds",
                 "bertforge_requests_in_flight", "bertforge_batch_size",
                 "bertforge_queue_seconds", "bertforge_batch_seconds", "bertforge_batch_tokens"):
        assert name in families, name
    statuses = {(s.labels["endpoint"], s.labels["status"])
                for s in families["bertforge_requests"].samples if s.name.endswith("_total")}
    assert ("/v1/question-answering", "422") in statuses
    assert families["bertforge_request_latency_seconds"].type == "histogram"


def _metrics(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name: family for family in text_string_to_metric_families(text)}


def test_classification_with_api_key(servers: dict[str, ServeProcess]) -> None:
    with httpx.Client(base_url=servers["classify"].url, timeout=30) as client:
        item = {"text": "a good film with great acting"}
        missing = client.post("/v1/text-classification", json=item)
        _assert_error(missing, 401, "Authorization")
        assert missing.headers["www-authenticate"] == "Bearer"
        _assert_error(client.post("/v1/text-classification", json=item,
                                  headers={"Authorization": "Bearer wrong"}), 401,
                      "Authorization")
        _assert_error(client.get("/metrics"), 401, "Authorization")
        assert client.get("/health").status_code == 200
        bearer = client.post("/v1/text-classification", json=item, headers=KEY)
        assert bearer.status_code == 200, bearer.text
        result = bearer.json()
        assert result["label"] in ("negative", "positive")
        assert set(result["scores"]) == {"negative", "positive"}
        assert _same(client.post("/v1/text-classification", json=item,
                                 headers={"X-API-Key": "sesame"}).json(), result)
        assert client.post("/v1/embeddings", json=item, headers=KEY).status_code == 200
        # Over the model's 128 positions: the default truncation policy is an error naming text.
        too_long = client.post("/v1/text-classification", json={"text": "good " * 200},
                               headers=KEY)
        _assert_error(too_long, 422, "text")
        assert client.get("/metrics", headers={"X-API-Key": "sesame"}).status_code == 200


def test_sigterm_drains_in_flight_and_queued_requests_then_exits_0(
        models: dict[str, Path], tmp_path: Path) -> None:
    server = ServeProcess(models["classify"], tmp_path / "log", prelude=PRELUDE, max_batch_items=1,
                    embeddings=False).wait_ready()
    try:
        url = server.url + "/v1/text-classification"
        results: list[httpx.Response] = []

        def call(text: str) -> None:
            results.append(httpx.post(url, json={"text": text}, timeout=30))

        threads = [threading.Thread(target=call, args=(f"slow film {i}",)) for i in range(2)]
        for t in threads:
            t.start()
        # One request in the model (a second long), the other queued behind it (batches of 1).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            gauge = [line for line in httpx.get(server.url + "/metrics").text.splitlines()
                     if line.startswith("bertforge_requests_in_flight ")]
            if gauge and float(gauge[0].split()[1]) >= 3:  # the two calls + this scrape
                break
            time.sleep(0.02)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):  # no longer accepting
            httpx.post(url, json={"text": "too late"}, timeout=5)
        for t in threads:
            t.join(timeout=30)
        assert [r.status_code for r in results] == [200, 200]
        assert server.proc.wait(timeout=30) == 0
    finally:
        server.stop()
