"""The HTTP/1.1 connection handling under the app: uvicorn's h11 protocol with a header timeout
and JSON errors.

uvicorn times out idle keep-alive connections only: a client that connects and sends nothing, or
sends a request's headers a byte at a time, holds a connection (and a file descriptor) for as long
as it likes, and a few hundred such clients exhaust the server. :class:`GuardedH11Protocol` gives
every request ``header_timeout`` seconds for its headers, counted from the connection's start or
from the first byte after the previous response; the connection is then closed, after a JSON 408
when part of a request had arrived. Once the headers are in, the app bounds the body's read time
(``body_timeout``, see :func:`bertforge.serve.limits.read_body`) and uvicorn's
``timeout_keep_alive`` the idle time between requests.

Bytes that are not HTTP at all are answered before the app sees them; uvicorn's plain-text 400
becomes the server's JSON error schema, so every answer a client can get is JSON.

The h11 protocol is used whatever else is installed (uvicorn picks httptools when present): its
state is what this module reads, and model calls, not HTTP parsing, bound a model server's speed.
"""

from __future__ import annotations

import asyncio
import http
import json
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from bertforge.serve.limits import error_body


def raw_response(status: int, message: str, field: str | None = None) -> bytes:
    """A complete HTTP/1.1 response carrying the JSON error body, closing the connection."""
    payload = json.dumps(error_body(message, field)).encode()
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n"
            "connection: close\r\n\r\n")
    return head.encode("ascii") + payload


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a header timeout and a JSON 400 (see the module notes).
    :func:`guarded_protocol` makes the class for one timeout."""

    header_timeout: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._partial = False  # bytes of a request whose headers are not complete
        super().connection_made(transport)
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._awaiting_headers():
            self._partial = self._partial or bool(data)
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

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
        """Bytes that are not an HTTP/1.1 request (h11 refused them): a JSON 400, then close."""
        self.transport.write(raw_response(
            400, "the request is not valid HTTP/1.1 (a malformed request line or header, or "
                 "headers over 16 KiB)"))
        self.transport.close()


def guarded_protocol(header_timeout: float) -> type[Any]:
    """The protocol class uvicorn builds per connection, with ``header_timeout`` seconds."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout": header_timeout})


__all__ = ["GuardedH11Protocol", "guarded_protocol", "raw_response"]
