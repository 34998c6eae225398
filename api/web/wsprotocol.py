"""The WebSocket protocol ``tracker serve`` runs: uvicorn's websockets-sansio protocol, with every
handshake that websockets refuses answered and closed.

Guarantees: a handshake that websockets refuses before it is a request (a request line over
8 KiB: 414 ``uri_too_long``; a header line over 8 KiB or over 128 headers: 431
``headers_too_large``; not HTTP: 400 ``bad_request``) is answered with the service's JSON error
body and its connection closed. Everything else is uvicorn's own path, untouched.

Why: uvicorn writes nothing for such a handshake and keeps its connection open (1,000 of them
held 1,000 file descriptors, until Delta flushes failed for want of one).
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import HeaderLineTooLong, RequestLineTooLong, TooManyHeaders

from api.web.protocol import refusal


class AnsweringWebSockets(WebSocketsSansIOProtocol):
    """:class:`WebSocketsSansIOProtocol` that answers refused handshakes (see the module
    docstring). Give it to uvicorn as ``Config(ws=AnsweringWebSockets)``."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        refused = self.conn.handshake_exc
        if refused is None or self.handshake_initiated:
            return
        # websockets queued its own answer, which uvicorn never writes: answer, and close.
        self.conn.data_to_send()
        if isinstance(refused, RequestLineTooLong):
            answer = refusal(414, "uri_too_long", f"the request line is limited to 8 KiB ({refused})",
                             self.default_headers)
        elif isinstance(refused, HeaderLineTooLong | TooManyHeaders):
            answer = refusal(431, "headers_too_large", f"a WebSocket handshake's header lines are limited to 8 KiB "
                                                       f"each and 128 in all ({refused})", self.default_headers)
        else:
            answer = refusal(400, "bad_request", f"not a WebSocket handshake ({refused})", self.default_headers)
        self.handshake_initiated = self.handshake_complete = self.close_sent = True
        self.transport.write(answer)
        self.transport.close()
