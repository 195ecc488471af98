"""The HTTP server against hostile and careless clients: requests that ask for unbounded decoding,
JSON that breaks Python's parser, clients that send a request a byte at a time, bodies the server
cannot read (compressed, not JSON), heads over the limit however they arrive, clients still
uploading past a refusal (which must read it, not a reset), and every error a client can get
answered as JSON in the one schema.

Servers are the product's: ``create_app`` under uvicorn with ``uvicorn_config`` (the guarded h11
protocol and the timeouts ``bertforge serve`` runs with), on a free localhost port, in a thread of
this process, around pipelines loaded by the real ``load_pipeline`` from tiny random models. The
classification pipeline is wrapped so an item holding "explode" raises inside parsing, the one
thing random weights cannot be asked to do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
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
WAIT = 30.0  # the most a test waits for an answer ("does not hang")


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


@pytest.fixture(scope="module")
def patient(classify_pipeline: Any) -> Iterator[str]:
    """The guarded server with time enough for a test's client to send a body (a slow machine
    must not turn a body the server waits for into a timeout)."""
    settings = dataclasses.replace(GUARDED, body_timeout=WAIT)
    with running(create_app(Exploding(classify_pipeline), settings), settings) as url:
        yield url


def _chunked_head() -> bytes:
    return (f"POST {ROUTE} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sesame\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _answer_then_clean_end(url: str, first: bytes, rest: bytes) -> tuple[int, dict, Any]:
    """Send ``first``, read the whole answer (up to the server's end of sending), then send
    ``rest`` as a client still uploading would, end our side and read the connection's end.
    A server that closed with our bytes unread makes the kernel answer them with a reset:
    sending or the last read then fails, so every step here must go through."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        sock.sendall(first)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        sock.sendall(rest)
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""
    return _parse_raw(received)


@pytest.mark.parametrize("first, rest", [
    # Declared over --max-body-bytes, by less and by more than the server reads to drop.
    (_over_limit_head(9000), b"x" * 9000),
    (_over_limit_head(100 << 20), b"x" * (400 << 10)),
    # Chunked: over the limit only once part of it has come.
    (_chunked_head() + _chunk(b'{"text": "' + b"x" * 9000), _chunk(b"x" * (400 << 10))),
], ids=["declared", "declared-huge", "chunked"])
def test_an_over_limit_body_gets_its_413_before_any_reset(patient: str, first: bytes,
                                                          rest: bytes) -> None:
    """The 413 goes out at once and the server then reads and drops the rest of the body (up to
    DRAIN_BYTES) before it closes, so a client that keeps uploading still reads the answer and
    the connection ends cleanly."""
    status, headers, answer = _answer_then_clean_end(patient, first, rest)
    assert status == 413 and headers["connection"] == "close"
    assert answer["error"]["field"] == "body" and "--max-body-bytes" in answer["error"]["message"]


@pytest.mark.parametrize("headers, field", [
    ({"Content-Encoding": "gzip"}, "Content-Encoding"),
    ({"Content-Encoding": "BR"}, "Content-Encoding"),
    ({"Content-Encoding": "identity, deflate"}, "Content-Encoding"),
    ({"Content-Type": "text/plain"}, "Content-Type"),
    ({"Content-Type": "application/x-www-form-urlencoded"}, "Content-Type"),
    ({"Content-Type": "multipart/form-data; boundary=x"}, "Content-Type"),
    ({"Content-Type": "application/json; charset=utf-16"}, "Content-Type"),
])
@pytest.mark.parametrize("route", [ROUTE, "/tokenize", "/rerank"])
def test_a_body_the_server_cannot_read_is_a_415_naming_the_header(
        client: httpx.Client, route: str, headers: dict, field: str) -> None:
    body = b'{"text": "good"}'
    if "Content-Encoding" in headers:
        body = gzip.compress(body)
    response = client.post(route, content=body, headers=headers)
    message = _error(response, 415, field)
    assert field in message and headers[field] in message


@pytest.mark.parametrize("headers", [
    {}, {"Content-Type": "application/json"}, {"Content-Type": "Application/JSON; charset=UTF-8"},
    {"Content-Type": "application/vnd.api+json"}, {"Content-Encoding": "identity"},
])
def test_json_bodies_are_read_whatever_their_accepted_headers(client: httpx.Client,
                                                              headers: dict) -> None:
    response = client.post(ROUTE, content=b'{"text": "good"}', headers=headers)
    assert response.status_code == 200, response.text


def test_an_unsupported_transfer_encoding_is_a_4xx_naming_it(guarded: str) -> None:
    head = (f"POST {ROUTE} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n"
            "\r\n").encode()
    status, headers, body = _parse_raw(_raw(guarded, head)[0])
    assert status == 400 and headers["content-type"] == "application/json"
    assert "Transfer-Encoding" in body["error"]["message"]


HEADERS_54K = "".join(f"X-Pad-{i:04d}: {'v' * 40}\r\n" for i in range(1000)).encode()
BODY = b'{"text": "good"}'
OVER_THE_HEAD_LIMIT = {
    "headers": b"GET /health HTTP/1.1\r\nHost: x\r\n" + HEADERS_54K + b"\r\n",
    # The rest of a request's framing: a chunked body's trailers, a chunk's extensions.
    "trailers": _chunked_head() + _chunk(BODY) + b"0\r\n" + HEADERS_54K + b"\r\n",
    "chunk-extension": (_chunked_head() + f"{len(BODY):x}".encode() + b";x=y" * 14000
                        + b"\r\n" + BODY + b"\r\n0\r\n\r\n"),
}


@pytest.mark.parametrize("framing", list(OVER_THE_HEAD_LIMIT))
@pytest.mark.parametrize("piece", [None, 1024, 7], ids=["one-write", "1k-writes", "7-byte-writes"])
def test_headers_over_16_kib_are_refused_however_they_arrive(patient: str, framing: str,
                                                             piece: int | None) -> None:
    """The head limit counts every byte of a request's head (and of the rest of its framing),
    in one write or in many."""
    request = OVER_THE_HEAD_LIMIT[framing]
    host, port = patient.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        for start in range(0, len(request), piece or len(request)):
            try:
                sock.sendall(request[start:start + (piece or len(request))])
            except OSError:
                break  # refused before the rest was sent
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    status, headers, body = _parse_raw(received)
    assert status == 431 and headers["content-type"] == "application/json", received[:200]
    assert "16 KiB" in body["error"]["message"]


def test_a_pipelined_request_over_the_head_limit_is_refused_after_the_one_before(
        patient: str) -> None:
    good = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    bad = b"GET /health HTTP/1.1\r\nHost: x\r\n" + HEADERS_54K + b"\r\n"
    raw, _ = _raw(patient, good + bad, wait=WAIT)
    first, _, second = raw.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200"), raw[:200]
    assert b"HTTP/1.1 431 " in second, raw[-400:]


def test_the_head_limit_measures_framing_without_copying_the_buffer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The head limit measures each event's framing by the length of what h11 holds, never by
    a copy of it: h11's ``trailing_data`` copies every unparsed byte, and read twice an event it
    made a body of one-byte chunks arriving in one read cost time quadratic in its size (3 s
    for 160,000 chunks against 0.6 s for h11 alone). The limit itself is tested above."""
    import h11

    from bertforge.serve.protocol import HEAD_LIMIT, _HeadLimitedConnection

    def copied(self: Any) -> Any:
        raise AssertionError("the unparsed buffer was copied to measure an event")

    monkeypatch.setattr(h11.Connection, "trailing_data", property(copied))
    conn = _HeadLimitedConnection(h11.SERVER, HEAD_LIMIT)
    conn.receive_data(_chunked_head() + _chunk(b"x") * 2000 + b"0\r\n\r\n")
    body = b""
    while not isinstance(event := conn.next_event(), h11.EndOfMessage):
        assert event is not h11.NEED_DATA, "the request was not parsed to its end"
        body += event.data if isinstance(event, h11.Data) else b""
    assert body == b"x" * 2000


def test_a_body_declared_over_the_drain_limit_is_answered_at_once(patient: str) -> None:
    """Answered without waiting for the body: well before the body timeout (WAIT) ran out."""
    from bertforge.serve.limits import DRAIN_BYTES

    raw, seconds = _raw(patient, _over_limit_head(GUARDED.max_body_bytes + DRAIN_BYTES + 1),
                        wait=WAIT)
    status, headers, _ = _parse_raw(raw)
    assert status == 413 and headers["connection"] == "close" and seconds < WAIT / 2


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
