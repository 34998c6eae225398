"""The HTTP/1.1 protocol ``tracker serve`` runs: uvicorn's httptools protocol with a bound on
the size of a request's head and on the time it may take to arrive.

Guarantees: a request whose line and headers exceed ``max_head`` bytes is answered 431 with the
JSON error body and its connection closed, and the server never buffers more than ``max_head``
plus one socket read (at most 256 KiB) of a head; a connection that has not delivered a complete
head ``head_timeout`` seconds after it opened, or after the first byte of its next request, is
closed (408 if part of a head had arrived). A request body must keep arriving: no byte of it
for ``head_timeout`` seconds (while the server is reading) answers 408 and closes (a body that
never came held its connection 40 s and more, with a dataflow token). Long responses (SSE) and
upgraded WebSockets are not timed. Idle keep-alive connections are uvicorn's
(``timeout_keep_alive``, 5 s).

Why a protocol subclass: httptools (llhttp) puts no bound on header size (it concatenates a
16 MiB header chunk by chunk), uvicorn times only idle keep-alive connections, and h11, which
does bound its buffer, costs more per request on the hot path.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

LINGER_SECONDS = 2.0
"""How long a refused connection keeps reading (and dropping) what the client still sends, so that
the 431 is not lost to a TCP reset when the server closes with unread data."""


class _HeadTooLarge(Exception):
    """Raised from a parser callback to abort parsing (httptools wraps it)."""


class GuardedHttp(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` with the head limits of :func:`guarded_http` (class attributes,
    since uvicorn builds one instance per connection from the class)."""

    max_head = 64 * 1024
    head_timeout = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # waiting for (the rest of) a request line and headers
        self._raw_head = 0  # bytes received since the head began (an upper bound of its size)
        self._parsed_head = 0  # bytes of the head the parser has handed over (exact)
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._in_body = False  # the head announced a body not complete yet
        self._body_at = 0.0  # when a byte of it last came (loop time)
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        self._in_body = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering: drop what the client still sends
        self._unset_keepalive_if_required()
        if self._in_head:
            self._raw_head += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as error:
            if isinstance(error.__context__, _HeadTooLarge):
                self._refuse()
                return
            self._bad_request()
            return
        except httptools.HttpParserError:
            self._bad_request()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._in_head and self.max_head and self._raw_head > self.max_head:
            self._refuse()  # an unfinished head already over the limit: stop buffering it
        elif self._in_body and self._body_timer is None and self.head_timeout > 0:
            # Armed only when a read ends inside a body: most bodies come whole with their head.
            self._body_timer = self.loop.call_later(self.head_timeout, self._body_timed_out)

    def _bad_request(self) -> None:
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)

    # Parser callbacks: count the head exactly as the parser hands it over.
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._parsed_head = 0
        if self._head_timer is None:  # the first byte of a request on a kept-alive connection
            self._start_head_timer()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._raw_head = 0
        self._stop_head_timer()
        super().on_headers_complete()
        self._in_body = not self.parser.should_upgrade() and any(
            (name == b"content-length" and value.strip() != b"0") or name == b"transfer-encoding"
            for name, value in self.headers)
        self._body_at = self.loop.time()

    def on_body(self, body: bytes) -> None:
        self._body_at = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_head = True  # what comes next is the next request's head
        self._in_body = False
        super().on_message_complete()

    def _count(self, size: int) -> None:
        self._parsed_head += size
        if self.max_head and self._parsed_head > self.max_head:
            raise _HeadTooLarge

    # Timer and answers.
    def _start_head_timer(self) -> None:
        if self.head_timeout > 0:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        if self._raw_head and not self._answering():
            self._answer(408, "request_timeout", f"the request line and headers must arrive within "
                                                 f"{self.head_timeout:g} s (TRACKER_HEADER_TIMEOUT)")
        self.transport.close()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if not self._in_body or self.transport.is_closing():
            return
        idle = self.loop.time() - self._body_at
        if idle < self.head_timeout or self.flow.read_paused:  # bytes came since, or the server is not reading
            self._body_timer = self.loop.call_later(max(self.head_timeout - idle, 0.05), self._body_timed_out)
            return
        self._in_body = False
        if self.cycle is not None and not self.cycle.response_started:
            self._answer(408, "request_timeout", f"the request body stopped arriving: no byte of it for "
                                                 f"{self.head_timeout:g} s (TRACKER_HEADER_TIMEOUT)")
        self.transport.close()  # the route waiting for the body sees the client gone

    def _answering(self) -> bool:
        """An earlier request's answer is still being sent (a pipelined head came meanwhile):
        nothing may be written between its bytes, so a refusal only closes."""
        return self.cycle is not None and not self.cycle.response_complete

    def _refuse(self) -> None:
        self._refused = True
        self._stop_head_timer()
        if self._answering():
            self.transport.close()
            return
        self._answer(431, "headers_too_large", f"the request line and headers are limited to {self.max_head} bytes "
                                               "(TRACKER_MAX_HEADER_BYTES)")
        # Half-close: the client reads the answer and the end of the stream, while whatever it is
        # still sending is read and dropped until it closes too or the linger time is over.
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)
        else:
            self.transport.close()

    def _answer(self, status: int, error: str, detail: str) -> None:
        self.transport.write(refusal(status, error, detail, self.server_state.default_headers))


def refusal(status: int, error: str, detail: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole HTTP answer that closes its connection: ``status`` with the JSON error body, and
    the server's default headers (the security headers among them).

    >>> refusal(414, "uri_too_long", "too long", [])[:42]
    b'HTTP/1.1 414 Request-URI Too Long\\r\\ncontent'
    """
    body = json.dumps({"error": error, "detail": detail}).encode()
    head = [STATUS_LINE[status]]
    for name, value in default_headers:
        head += [name, b": ", value, b"\r\n"]
    head += [b"content-type: application/json\r\n", b"content-length: ", str(len(body)).encode(), b"\r\n",
             b"connection: close\r\n\r\n", body]
    return b"".join(head)


def guarded_http(max_head: int, head_timeout: float) -> type[GuardedHttp]:
    """The protocol class to give uvicorn (``Config(http=...)``) for these limits (0: none).

    >>> guarded_http(16384, 2.5).max_head
    16384
    """
    return type("GuardedHttp", (GuardedHttp,), {"max_head": max_head, "head_timeout": head_timeout})
