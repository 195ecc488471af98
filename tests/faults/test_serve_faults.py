"""The HTTP server against hostile and careless clients: requests that ask for unbounded decoding,
JSON that breaks Python's parser, clients that send a request a byte at a time, and every error a
client can get answered as JSON in the one schema.

Servers are the product's: ``create_app`` under uvicorn with ``uvicorn_config`` (the guarded h11
protocol and the timeouts ``bertforge serve`` runs with), on a free localhost port, in a thread of
this process, around pipelines loaded by the real ``load_pipeline`` from tiny random models. The
classification pipeline is wrapped so an item holding "explode" raises inside parsing, the one
thing random weights cannot be asked to do.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from bertforge.inference.pipelines import load_pipeline
from bertforge.serve.app import create_app
from bertforge.serve.settings import ServeSettings
from serving import running, save_tiny_classifier

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
         *"a good film with great acting bad boring plot explode".split()]
KEY = {"Authorization": "Bearer sesame"}
ROUTE = "/v1/text-classification"
TIMEOUT = 0.5  # header, body and keep-alive timeouts of the guarded server


class Exploding:
    """A pipeline whose parse raises an unexpected (non-input) error for "explode" items."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.task = inner, inner.task

    def parse(self, item: Any) -> Any:
        if "explode" in str(item.get("text", "")):
            raise RuntimeError("a bug in parsing")
        return self.inner.parse(item)

    def cost(self, request: Any) -> int:
        return self.inner.cost(request)

    def describe(self) -> dict:
        return self.inner.describe()

    def __call__(self, requests: Any) -> list:
        return self.inner(requests)


@pytest.fixture(scope="module")
def classify_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = save_tiny_classifier(tmp_path_factory.mktemp("serve_faults") / "classify", VOCAB)
    return load_pipeline(root, device="cpu")


GUARDED = ServeSettings(max_body_bytes=8000, max_json_depth=8, max_number_digits=30,
                        header_timeout=TIMEOUT, body_timeout=TIMEOUT,
                        keep_alive_timeout=TIMEOUT, api_key="sesame")


@pytest.fixture(scope="module")
def guarded(classify_pipeline: Any) -> Iterator[str]:
    with running(create_app(Exploding(classify_pipeline), GUARDED), GUARDED) as url:
        yield url


@pytest.fixture(scope="module")
def client(guarded: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=guarded, headers=KEY, timeout=10) as c:
        yield c


def _error(response: httpx.Response, status: int, field: str | None = None) -> str:
    """The message of a JSON error in the server's one schema, after checking status and field."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json", response.headers
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"field", "message"}, body
    assert body["error"]["field"] == field, body
    message = body["error"]["message"]
    assert isinstance(message, str) and message and "\n" not in message
    return message


def _raw(url: str, data: bytes, *, wait: float = 5.0) -> tuple[bytes, float]:
    """Send ``data`` on a fresh connection, then read until the server closes it (or ``wait``
    seconds pass: a socket timeout fails the test). Returns what came back and when the
    connection was closed, in seconds from sending."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        started = time.monotonic()
        if data:
            sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received, time.monotonic() - started


def _parse_raw(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


# --------------------------------------------------------------------- JSON the parser chokes on

@pytest.mark.parametrize("body, status, field, says", [
    (b'{"text": "a good \\ud800 film"}', 422, "text", "surrogate"),
    (b'{"inputs": [{"text": "good"}, {"text": "\\udfff"}]}', 422, "inputs[1].text", "surrogate"),
    (b'{"\\ud800": "good"}', 422, "body", "surrogate"),
    (b'{"text": "good", "pad": ' + b"7" * 5000 + b"}", 413, "body", "--max-number-digits"),
    (b'{"text": "good", "pad": 1.' + b"5" * 40 + b"}", 413, "body", "--max-number-digits"),
    (b'{"text": "good", "pad": ' + b"[" * 1500 + b"]" * 1500 + b"}", 413, "body",
     "--max-json-depth"),
    (b'{"text": "good", "pad": ' + b"[" * 9 + b"]" * 9 + b"}", 413, "body", "--max-json-depth"),
    (b'{"text": "good", "pad": NaN}', 400, "body", "NaN"),
    (b'{"text": "good", "pad": 1e999}', 422, "body", "out of range"),
])
def test_json_that_breaks_pythons_parser_is_a_json_4xx(client: httpx.Client, body: bytes,
                                                       status: int, field: str, says: str) -> None:
    response = client.post(ROUTE, content=body, headers={"Content-Type": "application/json"})
    assert says in _error(response, status, field)


def test_json_within_the_limits_still_works(client: httpx.Client) -> None:
    nested = {"text": "a good film"}
    response = client.post(ROUTE, json=nested)
    assert response.status_code == 200 and response.json()["label"], response.text
    # Depth 8 (the limit) is accepted as JSON: the pipeline then names the unknown field.
    deep = client.post(ROUTE, content=b'{"text": "good", "x": ' + b"[" * 7 + b"]" * 7 + b"}")
    _error(deep, 422, "x")


# --------------------------------------------------------------------------------- slow clients

def test_headers_sent_too_slowly_get_408_and_the_connection_closed(guarded: str) -> None:
    raw, seconds = _raw(guarded, f"POST {ROUTE} HTTP/1.1\r\nHost: x\r\nContent-Ty".encode())
    status, headers, body = _parse_raw(raw)
    assert status == 408 and headers["content-type"] == "application/json"
    assert "--header-timeout" in body["error"]["message"]
    assert TIMEOUT * 0.8 <= seconds < TIMEOUT + 3


def test_a_connection_that_sends_nothing_is_closed(guarded: str) -> None:
    raw, seconds = _raw(guarded, b"")
    assert raw == b"" and seconds < TIMEOUT + 3


def test_a_body_sent_too_slowly_gets_408_and_the_connection_closed(guarded: str) -> None:
    head = (f"POST {ROUTE} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sesame\r\n"
            "Content-Type: application/json\r\nContent-Length: 60\r\n\r\n").encode()
    raw, seconds = _raw(guarded, head + b'{"text": "a go')
    status, headers, body = _parse_raw(raw)
    assert status == 408 and headers["connection"] == "close"
    assert body["error"]["field"] == "body" and "--body-timeout" in body["error"]["message"]
    assert seconds < TIMEOUT + 3


def _over_limit_head(length: int) -> bytes:
    return (f"POST {ROUTE} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sesame\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


def test_an_over_limit_body_is_read_before_the_413(guarded: str) -> None:
    """A body declared over --max-body-bytes is read and dropped before the 413 goes out:
    closing on unread data makes the kernel send a reset, which can reach the client before the
    answer. So nothing comes back while the body has not been sent, and the 413 after it."""
    body = b'{"text": "' + b"x" * 9000 + b'"}'
    host, port = guarded.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(_over_limit_head(len(body)))
        sock.settimeout(0.2)  # under the body timeout (TIMEOUT)
        with pytest.raises(socket.timeout):
            sock.recv(1)
        sock.settimeout(5)
        sock.sendall(body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    status, headers, answer = _parse_raw(received)
    assert status == 413 and headers["connection"] == "close"
    assert answer["error"]["field"] == "body" and "--max-body-bytes" in answer["error"]["message"]


def test_a_body_declared_over_the_drain_limit_is_refused_unread(guarded: str) -> None:
    from bertforge.serve.limits import DRAIN_BYTES

    raw, seconds = _raw(guarded, _over_limit_head(GUARDED.max_body_bytes + DRAIN_BYTES + 1))
    status, headers, _ = _parse_raw(raw)
    assert status == 413 and headers["connection"] == "close" and seconds < TIMEOUT


def test_an_idle_keep_alive_connection_is_closed(guarded: str) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    raw, seconds = _raw(guarded, request)
    assert raw.startswith(b"HTTP/1.1 200") and seconds < TIMEOUT + 3


def test_many_slow_clients_are_all_cut_off_while_others_are_served(
        guarded: str, client: httpx.Client) -> None:
    """Slow connections do not pile up: each is closed at the header timeout, and a normal
    client is answered meanwhile."""
    port = int(guarded.rsplit(":", 1)[1])
    slow = [socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT + 3) for _ in range(20)]
    try:
        for sock in slow:
            sock.sendall(b"POST " + ROUTE.encode() + b" HTTP/1.1\r\n")
        assert client.post(ROUTE, json={"text": "good film"}).status_code == 200
        for sock in slow:  # a socket timeout here fails the test: the server kept it open
            received = b""
            while chunk := sock.recv(4096):
                received += chunk
            assert received.startswith(b"HTTP/1.1 408 "), received
    finally:
        for sock in slow:
            sock.close()


# ---------------------------------------------------------------------- one schema for errors

def test_every_error_is_json_in_one_schema(guarded: str, client: httpx.Client,
                                           classify_pipeline: Any) -> None:
    item = {"text": "a good film"}
    assert "is not a route" in _error(client.get("/nothing"), 404)
    assert "POST" in _error(client.get(ROUTE), 405)
    _error(client.post(ROUTE, json={"text": "x" * 9000}), 413, "body")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streaming
        yield b'{"text": "'
        for _ in range(20):
            yield b"good " * 100
        yield b'"}'

    _error(client.post(ROUTE, content=chunks()), 413, "body")
    _error(client.post(ROUTE, content=b'{"text": '), 400, "body")
    _error(client.post(ROUTE, json={"txt": "good"}), 422, "txt")
    _error(client.post(ROUTE, json=item, headers={"Authorization": "Bearer wrong"}), 401,
           "Authorization")
    assert "internal error" in _error(client.post(ROUTE, json={"text": "explode"}), 500)
    assert client.post(ROUTE, json=item).status_code == 200  # still serving
    status, headers, body = _parse_raw(_raw(guarded, b"NOT HTTP AT ALL\r\n\r\n")[0])
    assert status == 400 and headers["content-type"] == "application/json"
    assert body["error"]["field"] is None and "HTTP/1.1" in body["error"]["message"]

    # 503: an app whose batchers are not running (before start-up, or after shutdown).
    app = create_app(classify_pipeline, ServeSettings())

    async def unstarted() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            return await c.post(ROUTE, json=item)

    assert "shutting down" in _error(asyncio.run(unstarted()), 503)


# ------------------------------------------------------------------- summarization limits

GENERATION = ServeSettings(max_num_beams=4, max_generation_length=24, max_generation_tokens=100)
ARTICLE = "the city council met on monday and approved the new budget for schools and parks ."


@pytest.fixture(scope="module")
def summarizer(tiny_bart: Path) -> Iterator[httpx.Client]:
    app = create_app(load_pipeline(tiny_bart, device="cpu"), GENERATION)
    with running(app, GENERATION) as url, httpx.Client(base_url=url, timeout=10) as c:
        yield c


def test_generation_limits_answer_413_before_any_work(summarizer: httpx.Client) -> None:
    route = "/v1/summarization"
    started = time.monotonic()
    beams = summarizer.post(route, json={"text": ARTICLE, "num_beams": 20000})
    assert "--max-num-beams" in _error(beams, 413, "num_beams")
    assert time.monotonic() - started < 5  # refused, not decoded
    long = summarizer.post(route, json={"inputs": [{"text": ARTICLE},
                                                   {"text": ARTICLE, "max_length": 40}]})
    assert "--max-generation-length" in _error(long, 413, "inputs[1].max_length")
    huge = summarizer.post(route, json={"text": ARTICLE, "max_length": 100000})
    assert huge.status_code in (413, 422) and _error(huge, huge.status_code, "max_length")
    work = summarizer.post(route, json={"inputs": [{"text": ARTICLE, "num_beams": 3,
                                                    "max_length": 20}] * 2})
    assert "--max-generation-tokens" in _error(work, 413, "inputs")
    ok = summarizer.post(route, json={"text": ARTICLE, "num_beams": 2, "max_length": 12})
    assert ok.status_code == 200 and isinstance(ok.json()["summary"], str), ok.text
    limits = summarizer.get("/health").json()["limits"]
    assert limits["max_num_beams"] == 4 and limits["header_timeout"] == 10.0
