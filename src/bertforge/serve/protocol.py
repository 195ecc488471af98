"""The HTTP/1.1 connection handling under the app: uvicorn's h11 protocol with a header timeout,
a head size limit that holds however the bytes arrive, closes that let an answer arrive, and
JSON errors.

uvicorn times out idle keep-alive connections only: a client that connects and sends nothing, or
sends a request's headers a byte at a time, holds a connection (and a file descriptor) for as long
as it likes, and a few hundred such clients exhaust the server. :class:`GuardedH11Protocol` gives
every request ``header_timeout`` seconds for its headers, counted from the connection's start or
from the first byte after the previous response; the connection is then closed, after a JSON 408
when part of a request had arrived. Once the headers are in, the app bounds the body's read time
(``body_timeout``, see :func:`bertforge.serve.limits.read_body`) and uvicorn's
``timeout_keep_alive`` the idle time between requests.

**Head size.** A request's line and headers may take :data:`HEAD_LIMIT` bytes (16 KiB); beyond
that the answer is a JSON 431. h11 counts only the bytes of a head it is still waiting for, so a
head that arrives whole in one read passed whatever its size; here every head is measured by the
bytes h11 took from its buffer to parse it, whether it came in one read or in many, alone or
pipelined behind another request. The same holds for the rest of a request's framing: a chunk's
header line (its extensions) and a chunked body's trailers.

**Closing without a reset.** A request refused before its body was read (413, 415, 503) or not
understood (400, 431) is answered, then the connection closes: its bytes cannot be skipped. But
closing a socket with received bytes unread makes the kernel send a reset, which can reach the
client before it has read the answer, and a client still uploading sees a broken pipe instead of
the 413. So the close lingers when the client may still be sending: the answer goes out, then the
end of sending (a half close), then the server reads and drops what still comes, up to
:data:`~bertforge.serve.limits.DRAIN_BYTES` bytes or ``body_timeout`` seconds, and closes once the
client has closed its side.

Bytes that are not HTTP at all are answered before the app sees them; uvicorn's plain-text 400
becomes the server's JSON error schema, so every answer a client can get is JSON.

The h11 protocol is used whatever else is installed (uvicorn picks httptools when present): its
state is what this module reads, and model calls, not HTTP parsing, bound a model server's speed.
:class:`DrainingServer` is uvicorn's server telling the app when a shutdown begins (SIGTERM), so
that it can stop admitting requests and bound the time it answers those it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import signal
import threading
from typing import Any, Iterator

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from bertforge.serve.limits import DRAIN_BYTES, error_body

HEAD_LIMIT = 16 * 1024
"""Bytes of a request's line and headers (h11's own limit for a head still arriving)."""


def raw_response(status: int, message: str, field: str | None = None) -> bytes:
    """A complete HTTP/1.1 response carrying the JSON error body, closing the connection."""
    payload = json.dumps(error_body(message, field)).encode()
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n"
            "connection: close\r\n\r\n")
    return head.encode("ascii") + payload


class _HeadLimitedConnection(h11.Connection):
    """h11's server connection with :data:`HEAD_LIMIT` applied to every complete event's
    framing as well (h11 applies it to incomplete ones only): a request's head, a chunk's
    header line, a chunked body's trailers. Framing is what an event took from the buffer
    beyond its body bytes. The protocol error raised is kept (``refused``) for the answer."""

    refused: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        # The buffer's length, not ``trailing_data``: that copies every unparsed byte, and
        # twice an event it made a body of small chunks quadratic in its size. (h11's
        # internals, like uvicorn's, are pinned by the tests: docs/decisions.md.)
        before = len(self._receive_buffer)
        try:
            event = super().next_event()
            body = len(event.data) if isinstance(event, h11.Data) else 0
            if before - len(self._receive_buffer) - body > HEAD_LIMIT:
                raise h11.RemoteProtocolError("request framing too large", error_status_hint=431)
        except h11.RemoteProtocolError as exc:
            self.refused = exc
            raise
        return event


def _refusal(exc: h11.RemoteProtocolError | None) -> tuple[int, str]:
    """The status and message answering bytes h11 refused."""
    status = getattr(exc, "error_status_hint", 400)
    if status == 431:
        return 431, (f"the request's headers are over {HEAD_LIMIT // 1024} KiB ({HEAD_LIMIT} "
                     "bytes with the request line; the same bound holds for a chunked body's "
                     "chunk headers and trailers); send fewer or shorter headers")
    if status == 501:  # h11 reads no transfer coding but chunked
        return 400, ("the request's Transfer-Encoding is not supported: only chunked is; send "
                     "the body as it is, with Content-Length or Transfer-Encoding: chunked")
    reason = f": {exc}" if exc is not None and str(exc) else ""
    return 400, (f"the request is not valid HTTP/1.1{reason} (a malformed request line or "
                 "header)")


class _LingeringTransport:
    """The connection's transport as uvicorn and the app see it: ``close`` lingers while the
    client may still be sending (see the module notes); everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11Protocol) -> None:
        self._transport, self._protocol = transport, protocol
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        if self.is_closing():
            return
        if not self._protocol.may_still_send() or not self._transport.can_write_eof():
            self._transport.close()
            return
        self.lingering = True
        self._transport.write_eof()  # after the answer already written
        self._transport.resume_reading()  # uvicorn may have paused it (flow control)
        self._protocol.start_lingering()

    def close_now(self) -> None:
        self._transport.close()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a header timeout, the head limit, lingering closes and JSON
    errors (see the module notes). :func:`guarded_protocol` makes the class for its timeouts."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _HeadLimitedConnection(h11.SERVER, HEAD_LIMIT)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._partial = False  # bytes of a request whose headers are not complete
        self._dropped = 0  # bytes read and dropped while lingering
        self._linger_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self.transport = _LingeringTransport(transport, self)  # type: ignore[assignment]
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        if self.transport.lingering:  # type: ignore[attr-defined]
            self._dropped += len(data)
            if self._dropped > DRAIN_BYTES:
                self.transport.close_now()  # type: ignore[attr-defined]
            return
        super().data_received(data)
        if self._awaiting_headers():
            self._partial = self._partial or bool(data)
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """The server is stopping: a lingering connection closes now (its answer is out)."""
        if self.transport.lingering:  # type: ignore[attr-defined]
            self.transport.close_now()  # type: ignore[attr-defined]
            return
        super().shutdown()

    def may_still_send(self) -> bool:
        """Whether the client may have request bytes under way: a body not read to its end, or
        bytes h11 refused. (Not a head the header timeout cut off: that client is too slow to
        be worth waiting for, and lingering would let it hold the connection longer.)"""
        return self.conn.their_state in (h11.SEND_BODY, h11.ERROR)

    def start_lingering(self) -> None:
        self._stop_timer()
        self._linger_timer = self.loop.call_later(
            self.body_timeout, self.transport.close_now)  # type: ignore[attr-defined]

    def _awaiting_headers(self) -> bool:
        """No request is being answered and the next one's headers are not complete."""
        return self.cycle is None or self.cycle.response_complete

    def _watch_headers(self) -> None:
        """Run the header clock while a request's headers are due; stop it once they came.
        After a response, the clock starts with the next request's first byte (until then
        uvicorn's keep-alive timeout applies)."""
        if self.transport.is_closing() or not self._awaiting_headers():
            self._stop_timer()
            self._partial = False
        elif self._header_timer is None and (self.cycle is None or self._partial):
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _stop_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._awaiting_headers():
            return
        if self._partial:
            self.transport.write(raw_response(
                408, f"the request's headers did not arrive within {self.header_timeout:g} s "
                     "(--header-timeout)"))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """Bytes h11 refused (not an HTTP/1.1 request, a head over the limit, a transfer coding
        it does not read): a JSON 4xx saying which, then close."""
        self.transport.write(raw_response(*_refusal(self.conn.refused)))
        self.transport.close()


def guarded_protocol(header_timeout: float, body_timeout: float = 30.0) -> type[Any]:
    """The protocol class uvicorn builds per connection, with its timeouts in seconds."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"header_timeout": header_timeout, "body_timeout": body_timeout})


class DrainingServer(uvicorn.Server):
    """uvicorn's server that calls its app's ``state.begin_drain()`` (when it has one) as a
    shutdown begins, before it stops listening and waits for the requests in flight. SIGUSR1 (a
    scheduler's notice of preemption, which training treats as SIGTERM) drains it as SIGTERM does,
    instead of killing the process with what it holds."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            with super().capture_signals():
                yield
            return
        previous = signal.signal(signal.SIGUSR1,
                                 lambda *_: self.handle_exit(signal.SIGTERM, None))
        try:
            with super().capture_signals():
                yield
        finally:
            signal.signal(signal.SIGUSR1, previous)

    async def shutdown(self, sockets: Any = None) -> None:
        begin = getattr(getattr(self.config.app, "state", None), "begin_drain", None)
        if begin is not None:
            begin()
        await super().shutdown(sockets)


__all__ = ["DrainingServer", "GuardedH11Protocol", "HEAD_LIMIT", "guarded_protocol",
           "raw_response"]
