"""The server under overload: a burst larger than its queue, clients that give up, SIGTERM while
requests wait, and requests whose tokenization alone is large.

Servers are the product's (``create_app`` under uvicorn with ``bertforge serve``'s protocol and
timeouts, on loopback, ``tests/serving.py``; ``serve`` itself in a child process for signals)
around a tiny classifier loaded by the real ``load_pipeline``. Nothing here waits on a clock to
know what the server did: a gate holds the model (or the tokenizer) while the test looks, and the
server's own ``/metrics`` say when it has seen what the test did.
"""

from __future__ import annotations

import asyncio
import copy
import random
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.inference.pipelines import load_pipeline
from bertforge.serve.app import create_app
from bertforge.serve.settings import ServeSettings
from bertforge.tokenization import BertTokenizer
from bertforge.tokenization.bpe import BpeTokenizer
from bertforge.tokenization.prefix import (FIRST_CHARS_PER_TOKEN, GROWTH, encode_ids_capped,
                                            encode_window_capped)
from bertforge.tokenization.training import train_wordpiece
from serving import ServeProcess, running, save_tiny_classifier

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
         *"a good film with great acting bad boring plot held after slow".split()]
ROUTE = "/v1/text-classification"
CORPUS = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"
WAIT_S = 30.0  # the most a test waits for the server to reach a state ("does not hang")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_classifier(tmp_path_factory.mktemp("overload") / "classify", VOCAB)


@pytest.fixture(scope="module")
def pipeline(model_dir: Path) -> Any:
    return load_pipeline(model_dir, device="cpu")


class Gate:
    """Holds every model call until :meth:`open`; records the texts of each batch it ran."""

    def __init__(self) -> None:
        self.opened, self.entered = threading.Event(), threading.Event()
        self.batches: list[list[str]] = []

    def open(self) -> None:
        self.opened.set()

    def __call__(self, requests: Any) -> None:
        self.batches.append([r.text for r in requests])
        self.entered.set()
        assert self.opened.wait(WAIT_S), "the test never opened the gate"


def gated(pipeline: Any, gate: Gate) -> Any:
    """``pipeline`` (the product's class, so the server parses apart from the model as it does
    for a real model) whose every batch passes ``gate`` before it runs."""
    base = type(pipeline)

    class Gated(base):  # type: ignore[misc, valid-type]
        def run(self, requests: Any) -> list[dict]:
            gate(requests)
            return base.run(self, requests)

    clone = copy.copy(pipeline)
    clone.__class__ = Gated
    return clone


def metric(url: str, name: str) -> float:
    """The sum of a series of the server's /metrics (0 when it has no sample yet)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if re.match(rf"{name}(\{{.*\}})? ", line))


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"the server never got there: {what}"
        time.sleep(0.02)


# ------------------------------------------------------------------------- the admission queue

def test_the_queue_and_drain_settings_are_checked_and_shown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The automatic queue follows the token budget (and holds one full request at least); a
    queue no request of --max-batch-items fits in, or a drain timeout of 0, is one line before
    anything loads."""
    assert ServeSettings().limits()["max_queue"] == 512
    assert ServeSettings(max_batch_tokens=256, max_batch_items=32).queue_limit == 32
    assert ServeSettings(max_queue=40).limits()["max_queue"] == 40
    for option, value, says in (("--max-queue", "8", "at least --max-batch-items (32)"),
                                ("--drain-timeout", "0", "must be > 0 seconds")):
        assert main(["serve", "--model", str(tmp_path), option, value]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize("name", ["max_wait_ms", "header_timeout", "body_timeout",
                                  "keep_alive_timeout", "drain_timeout", "replica_timeout"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_setting_that_is_no_finite_number_is_refused(name: str, value: float,
                                                        tmp_path: Path, capsys) -> None:
    """From Python and from the command line alike: an infinite drain or header timeout would
    turn the server's bounds off, and NaN passes every comparison written as ``x < limit``."""
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError, match=f"{flag} must be a finite number"):
        ServeSettings(**{name: value})
    assert main(["serve", "--model", str(tmp_path), flag, str(value)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and flag[2:].replace("-", "_") in \
        err.replace("-", "_"), err


def test_a_burst_beyond_the_queue_gets_503_at_once_and_the_rest_one_answer_each(
        pipeline: Any) -> None:
    """30 concurrent requests against a queue of 8 items while the model is held: the 22 that do
    not fit are answered 503 with Retry-After before the model computes anything; once it runs,
    each of the 8 admitted gets exactly one answer, and nothing else is computed."""
    gate = Gate()
    settings = ServeSettings(max_queue=8, max_batch_items=4, max_wait_ms=0)
    texts = [f"good film {'a ' * i}" for i in range(30)]
    with running(create_app(gated(pipeline, gate), settings), settings) as url:
        async def burst() -> tuple[list[httpx.Response], list[httpx.Response]]:
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(base_url=url, timeout=WAIT_S, limits=limits) as c:
                tasks = [asyncio.create_task(c.post(ROUTE, json={"text": t})) for t in texts]
                deadline = time.monotonic() + WAIT_S
                while sum(t.done() for t in tasks) < 22 and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                early = [t.result() for t in tasks if t.done()]
                held = not gate.opened.is_set()
                gate.open()
                assert held
                return early, list(await asyncio.gather(*tasks))

        early, answers = asyncio.run(burst())
    assert len(early) == 22, "the requests beyond the queue were not answered at once"
    for response in early:
        assert response.status_code == 503, response.text
        assert int(response.headers["retry-after"]) >= 1
        assert "--max-queue" in response.json()["error"]["message"]
    served = [t for t, r in zip(texts, answers) if r.status_code == 200]
    assert len(served) == 8 and sum(r.status_code == 503 for r in answers) == 22
    computed = [text for batch in gate.batches for text in batch]
    assert sorted(computed) == sorted(served)  # each admitted request computed exactly once


def test_requests_whose_client_went_away_are_never_computed(pipeline: Any) -> None:
    """Clients that disconnect while their requests wait behind a held model: the server notices,
    drops them from the queue and counts them; the model then computes only what someone still
    waits for."""
    gate = Gate()
    settings = ServeSettings(max_batch_items=4, max_wait_ms=0)
    with running(create_app(gated(pipeline, gate), settings), settings) as url:
        host, port = url.removeprefix("http://").split(":")
        holder = threading.Thread(target=httpx.post, args=(url + ROUTE,),
                                  kwargs={"json": {"text": "held"}, "timeout": WAIT_S})
        holder.start()
        assert gate.entered.wait(WAIT_S)
        body = b'{"text": "boring plot"}'
        head = (f"POST {ROUTE} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        gone = [socket.create_connection((host, int(port)), timeout=WAIT_S) for _ in range(6)]
        for sock in gone:
            sock.sendall(head + body)
        # Admitted (their bodies read): the held request and the six.
        wait_until(lambda: metric(url, "bertforge_queue_items") >= 7, "6 requests in")
        for sock in gone:
            sock.close()
        wait_until(lambda: metric(url, "bertforge_requests_in_flight") <= 2,
                   "the server noticed the 6 clients had gone")  # the held one and this scrape
        assert metric(url, "bertforge_dropped_items_total") == 6
        gate.open()
        holder.join(WAIT_S)
        after = httpx.post(url + ROUTE, json={"text": "after"}, timeout=WAIT_S)
        assert after.status_code == 200, after.text
    assert gate.batches == [["held"], ["after"]]


# Serve with a model whose batches holding "slow" take a second (random weights cannot be asked
# to be slow); everything else is the product's serve().
SLOW_MODEL = """
import time
import bertforge.inference.pipelines as pipelines

real = pipelines.load_pipeline

def slow(*args, **kwargs):
    pipeline = real(*args, **kwargs)
    base = type(pipeline)
    class Slow(base):
        def run(self, requests):
            if any("slow" in r.text for r in requests):
                time.sleep(1.0)
            return base.run(self, requests)
    pipeline.__class__ = Slow
    return pipeline

pipelines.load_pipeline = slow
"""


def test_sigterm_under_load_answers_or_refuses_every_request_and_exits_within_the_drain_timeout(
        model_dir: Path, tmp_path: Path) -> None:
    """20 requests of a second each (batches of one) and SIGTERM: what runs within the drain
    timeout is answered, every other request gets a 503 (none is left without an answer), and
    the server exits 0 soon after the drain timeout, not after the 20 seconds the queue holds."""
    drain = 2.0
    server = ServeProcess(model_dir, tmp_path / "log", prelude=SLOW_MODEL, max_batch_items=1,
                          embeddings=False, drain_timeout=drain, max_wait_ms=0).wait_ready()
    try:
        url = server.url + ROUTE
        answers: list[httpx.Response | Exception] = []

        def call(i: int) -> None:
            try:
                answers.append(httpx.post(url, json={"text": f"slow film {'a ' * i}"},
                                          timeout=60))
            except httpx.HTTPError as exc:
                answers.append(exc)

        clients = [threading.Thread(target=call, args=(i,)) for i in range(20)]
        for t in clients:
            t.start()
        wait_until(lambda: metric(server.url, "bertforge_requests_in_flight") >= 21,
                   "20 requests in")
        stopped = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        status = server.proc.wait(timeout=60)
        took = time.monotonic() - stopped
        for t in clients:
            t.join(WAIT_S)
    finally:
        server.stop()
    assert status == 0, server.log.read_text()
    # The drain timeout, the batch running at its end, and a generous margin for a slow machine.
    assert took < drain + 1.0 + 6.0, f"exited {took:.1f} s after SIGTERM"
    assert all(isinstance(a, httpx.Response) for a in answers), answers
    codes = sorted(a.status_code for a in answers)  # type: ignore[union-attr]
    assert len(codes) == 20 and set(codes) <= {200, 503} and 503 in codes, codes
    refused = [a for a in answers if a.status_code == 503]  # type: ignore[union-attr]
    assert all("shutting down" in a.json()["error"]["message"] for a in refused)


# ---------------------------------------------------------------------- tokenization is bounded

class Counting:
    """A tokenizer backend that records the text it is asked to encode (and can hold the first
    call until opened); everything else goes to the real one. Copies share the records."""

    def __init__(self, inner: Any, seen: list[str], hold: threading.Event | None = None) -> None:
        self._inner, self.seen, self.hold = inner, seen, hold
        self.holding = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __deepcopy__(self, memo: dict) -> Counting:
        twin = Counting(copy.deepcopy(self._inner, memo), self.seen, self.hold)
        twin.holding = self.holding
        return twin

    def _record(self, texts: list[Any]) -> None:
        for text in texts:
            self.seen.append(text if isinstance(text, str) else " | ".join(text))
        if self.hold is not None and not self.hold.is_set():
            self.holding.set()
            assert self.hold.wait(WAIT_S), "the test never let tokenization go on"

    def encode(self, text: Any, *args: Any, **kwargs: Any) -> Any:
        self._record([text])
        return self._inner.encode(text, *args, **kwargs)

    def encode_batch(self, texts: Any, *args: Any, **kwargs: Any) -> Any:
        self._record(list(texts))
        return self._inner.encode_batch(texts, *args, **kwargs)


def counting(model_dir: Path, seen: list[str], hold: threading.Event | None = None,
             **options: Any) -> Any:
    pipeline = load_pipeline(model_dir, device="cpu", **options)
    pipeline.tokenizer.backend = Counting(pipeline.tokenizer.backend, seen, hold)
    return pipeline


LONG = "good film with great acting " * 3000  # 84,000 characters, ~15,000 tokens
POSITIONS = 64  # the tiny model's max_position_embeddings


@pytest.fixture(scope="module")
def counted(model_dir: Path) -> Iterator[tuple[str, list[str]]]:
    """A server whose classifier and embedding model record every text they tokenize."""
    seen: list[str] = []
    settings = ServeSettings()
    app = create_app(counting(model_dir, seen), settings,
                     embeddings=counting(model_dir, seen, task="feature-extraction"))
    with running(app, settings) as url:
        yield url, seen


@pytest.mark.parametrize("route, body", [
    (ROUTE, {"text": LONG, "truncate": True}),
    (ROUTE, {"text": LONG}),  # refused as too long: measuring that needs no more
    (ROUTE, {"text": "good film", "text_pair": LONG, "truncate": True}),
    ("/v1/embeddings", {"text": LONG, "truncate": True}),
    ("/v1/embeddings", {"input": [LONG, "good film"], "truncate": True}),
    ("/embed", {"inputs": LONG, "truncate": True}),
    ("/rerank", {"query": "good film", "texts": [LONG, "bad plot"], "truncate": True}),
])
def test_a_long_text_is_cut_while_it_is_tokenized(counted: tuple[str, list[str]], route: str,
                                                  body: dict) -> None:
    """Every route that tokenizes a client's text reads only as much of a long one as its
    model's positions need: the work is bounded by the limit, not by the text."""
    url, seen = counted
    seen.clear()
    response = httpx.post(url + route, json=body, timeout=WAIT_S)
    assert response.status_code in (200, 422), response.text
    assert seen, "nothing was tokenized"
    assert max(len(text) for text in seen) <= POSITIONS * 64, [len(t) for t in seen]


def test_a_cut_text_gets_the_answer_of_its_whole_tokenization(
        counted: tuple[str, list[str]]) -> None:
    """Cutting while tokenizing changes nothing in the answer: the long text is scored as the
    first tokens of the whole text are."""
    url, _ = counted
    long = httpx.post(url + ROUTE, json={"text": LONG, "truncate": True}, timeout=WAIT_S).json()
    enough = httpx.post(url + ROUTE, json={"text": LONG[:2000], "truncate": True},
                        timeout=WAIT_S).json()
    assert long == enough and long["truncated"] is True
    refused = httpx.post(url + ROUTE, json={"text": LONG}, timeout=WAIT_S)
    assert refused.status_code == 422 and f"{POSITIONS}" in refused.json()["error"]["message"]


def _random_text(rng: random.Random, words: list[str], chars: int) -> str:
    """Corpus words mixed with what makes tokenization uneven: runs of spaces, tabs and
    newlines, accents, CJK, punctuation, unknown and very long words."""
    odd = ["  ", "\t", "\n", "\r\n", "   \t  ", "é", "Ünïcödé", "漢字テキスト", ",", "!!",
           "don't", "3.14", "xqz" * 40, "a" * 150]
    out: list[str] = []
    while sum(map(len, out)) < chars:
        out += [rng.choice(words) if rng.random() < 0.7 else rng.choice(odd),
                rng.choice([" ", " ", " ", "", "\n", "  "])]
    return "".join(out).strip() or "word"


def test_cutting_while_tokenizing_keeps_the_tokens_of_the_whole_text(
        tmp_path: Path, tiny_bart: Path) -> None:
    """Texts and pairs of every length around the limit, cut while tokenized, give exactly the
    window (ids, offsets, word ids, segments) of the whole text cut by the tokenizer, pairs cut
    longest-first included (odd and even room); the count is the whole text's, or a lower
    bound over the limit when only a prefix was read. BART's ids likewise."""
    train_wordpiece([CORPUS], vocab_size=1000, output=tmp_path / "vocab.txt", progress=False)
    wordpiece = BertTokenizer.from_file(tmp_path / "vocab.txt")
    bpe = BpeTokenizer.from_pretrained(tiny_bart)
    words, rng = CORPUS.read_text().split(), random.Random(0)
    for _ in range(400):
        limit = rng.choice([5, 6, 8, 9, 16, 17, 33])
        text = _random_text(rng, words, rng.randint(1, 700))
        pair = _random_text(rng, words, rng.randint(1, 700)) if rng.random() < 0.5 else None
        pairs = None if pair is None else [pair]
        whole = wordpiece.encode_windows([text], pairs, max_length=limit)[0]
        tokens = len(wordpiece.encode_windows([text], pairs, max_length=1 << 30)[0].ids)
        capped = encode_window_capped(wordpiece, text, pair, limit)
        got = capped.tokens
        assert (got.ids, got.offsets, got.word_ids, got.sequence_ids, got.type_ids) == (
            whole.ids, whole.offsets, whole.word_ids, whole.sequence_ids, whole.type_ids)
        assert capped.length == tokens if capped.counted else limit < capped.length <= tokens
        ids = encode_ids_capped(bpe, text, limit)
        assert ids.tokens == bpe.encode_truncated([text], limit)[0]
        assert (ids.length == len(bpe.encode(text)) if ids.counted
                else limit < ids.length <= len(bpe.encode(text)))


def _unspaced_text(rng: random.Random, chars: int) -> str:
    """Text with no whitespace to cut at: CJK runs, words joined by punctuation, digits."""
    pieces = ["漢字テキスト", "中文文本", "東京", "good,film", "a.b.c", "3.14", "don't", "！", "é"]
    out = ""
    while len(out) < chars:
        out += rng.choice(pieces)
    return out


def test_text_without_whitespace_is_cut_inside_words_with_the_whole_texts_tokens(
        tmp_path: Path) -> None:
    """A text with no whitespace (Chinese, Japanese, words joined by punctuation) is tokenized
    only as far as the limit needs, like a spaced one, and gives the window the whole text cut by
    the tokenizer gives, pairs included. (Before, such a text was tokenized whole.)"""
    train_wordpiece([CORPUS], vocab_size=1000, output=tmp_path / "vocab.txt", progress=False)
    wordpiece = BertTokenizer.from_file(tmp_path / "vocab.txt")
    encode, seen = wordpiece.encode_windows, []

    def spy(texts: Any, pairs: Any = None, **options: Any) -> Any:
        seen.append(max(len(t) for t in [*texts, *(pairs or [])]))
        return encode(texts, pairs, **options)

    rng = random.Random(1)
    for _ in range(200):
        limit = rng.choice([5, 8, 9, 16, 33])
        text = _unspaced_text(rng, rng.randint(1, 3000))
        # (Pairs at the largest limits only: the reference, the tokenizer cutting the whole
        # pair, builds every overflowing window of both texts, their product.)
        pair = (_unspaced_text(rng, rng.randint(1, 1500))
                if limit >= 16 and rng.random() < 0.5 else None)
        pairs = None if pair is None else [pair]
        whole = encode([text], pairs, max_length=limit)[0]
        tokens = len(encode([text], pairs, max_length=1 << 30)[0].ids)
        seen.clear()
        wordpiece.encode_windows = spy  # type: ignore[method-assign]
        try:
            capped = encode_window_capped(wordpiece, text, pair, limit)
        finally:
            wordpiece.encode_windows = encode  # type: ignore[method-assign]
        got = capped.tokens
        assert (got.ids, got.offsets, got.word_ids, got.sequence_ids, got.type_ids) == (
            whole.ids, whole.offsets, whole.word_ids, whole.sequence_ids, whole.type_ids)
        assert capped.length == tokens if capped.counted else limit < capped.length <= tokens
        # Bounded by the limit, but for a pair cut to an odd room with both texts over it:
        # which keeps the odd token depends on which is longer, so the shorter is read whole.
        if pair is None or (limit - 3) % 2 == 0:
            assert max(seen) <= limit * FIRST_CHARS_PER_TOKEN * GROWTH, (max(seen), limit)


def test_tokenize_answers_a_bounded_body(counted: tuple[str, list[str]]) -> None:
    """/tokenize of about a megabyte of text: refused with a 413 that names the limit, after
    tokenizing no more than the limit needs; a request within it is answered whole."""
    url, seen = counted
    seen.clear()
    response = httpx.post(url + "/tokenize", json={"inputs": [LONG[:30000]] * 32},
                          timeout=WAIT_S)
    assert response.status_code == 413, response.status_code
    assert len(response.content) < 2000
    assert "--max-batch-tokens" in response.json()["error"]["message"]
    assert sum(len(text) for text in seen) <= ServeSettings().max_batch_tokens * 16
    small = httpx.post(url + "/tokenize", json={"inputs": "good film"}, timeout=WAIT_S)
    assert small.status_code == 200
    assert [t["text"] for t in small.json()[0]] == ["[CLS]", "good", "film", "[SEP]"]


def test_large_requests_do_not_starve_a_small_one(model_dir: Path) -> None:
    """Three requests of 32 long texts each are being tokenized when a one-word request comes:
    it is tokenized after at most one text of each of them, not after all 96."""
    seen: list[str] = []
    hold = threading.Event()
    settings = ServeSettings()
    pipeline = counting(model_dir, seen, hold)
    with running(create_app(pipeline, settings), settings) as url:
        def big(r: int) -> None:
            items = [{"text": f"big{r}x{i} {LONG[:30000]}", "truncate": True} for i in range(32)]
            httpx.post(url + ROUTE, json={"inputs": items}, timeout=WAIT_S)

        clients = [threading.Thread(target=big, args=(r,)) for r in range(3)]
        for t in clients:
            t.start()
        wait_until(lambda: metric(url, "bertforge_queue_items") >= 96, "3 requests in")
        small = threading.Thread(target=httpx.post, args=(url + ROUTE,),
                                 kwargs={"json": {"text": "small"}, "timeout": WAIT_S})
        small.start()
        wait_until(lambda: metric(url, "bertforge_queue_items") >= 97, "the small one in")
        hold.set()
        for t in [small, *clients]:
            t.join(WAIT_S)
    order = [text.split(" ", 1)[0] for text in seen]
    before = order[:order.index("small")]
    assert len(set(before)) <= 4, before  # the held text, then at most one of each


def test_health_says_draining_from_the_start_of_a_shutdown(pipeline: Any) -> None:
    """Once the server drains (SIGTERM calls the app's drain hook), /health answers 503 with
    status "draining" and ready false, so that a load balancer stops routing requests that
    would only get the shutting-down 503; a request admitted before is still answered. (Over
    HTTP uvicorn closes its listening socket and idle connections at SIGTERM, so the hook is
    called here as DrainingServer calls it: in the server's event loop.)"""
    gate = Gate()
    settings = ServeSettings(max_wait_ms=0)
    app = create_app(gated(pipeline, gate), settings)
    held: list[httpx.Response] = []
    with TestClient(app) as client:
        assert client.get("/health").json()["status"] == "ok"
        caller = threading.Thread(target=lambda: held.append(
            client.post(ROUTE, json={"text": "held"})))
        caller.start()
        assert gate.entered.wait(WAIT_S)
        client.portal.call(app.state.begin_drain)
        health = client.get("/health")
        late = client.post(ROUTE, json={"text": "late"})
        gate.open()
        caller.join(WAIT_S)
    assert health.status_code == 503, health.text
    assert health.json()["status"] == "draining" and health.json()["ready"] is False
    assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
    assert [r.status_code for r in held] == [200], held
