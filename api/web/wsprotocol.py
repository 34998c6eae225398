"""The WebSocket protocol ``tracker serve`` runs: uvicorn's websockets-sansio protocol, with
unfragmented text frames put on the wire directly, and every refused handshake answered.

Guarantees: the bytes sent are those uvicorn's protocol sends (an unmasked, unfragmented text
frame per ``websocket.send`` with ``text``); everything else (handshake, binary frames, close,
ping and pong, flow control, a connection that negotiated per-message deflate) is uvicorn's own
path, untouched. A handshake that websockets refuses before it is a request (a request line over
8 KiB: 414 ``uri_too_long``; a header line over 8 KiB or over 128 headers: 431
``headers_too_large``; not HTTP: 400 ``bad_request``) is answered with the JSON error body and
its connection closed: uvicorn wrote nothing and kept such a connection open (1,000 of them held
1,000 file descriptors, until Delta flushes failed for want of one).

Why: uvicorn has websockets build each frame (``Frame.serialize`` writes header and payload into
a buffer, ``data_to_send`` joins the result), so a 1.6 MB ``changes`` event (the 32,000 frontier
changes of an 8,000-operator chain) was copied four times, ~0.55 ms of the event loop per
subscriber; here it is encoded once and written behind its 2-10 byte header.

>>> text_frame_header(5)
b'\\x81\\x05'
>>> text_frame_header(70_000)[:2]
b'\\x81\\x7f'
"""

from __future__ import annotations

import struct
from typing import Any

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import HeaderLineTooLong, RequestLineTooLong, TooManyHeaders
from websockets.protocol import State

from api.web.protocol import refusal

_FIN_TEXT = 0x81  # FIN set, opcode 1 (text)
_SHORT, _MEDIUM, _LONG = struct.Struct("!BB"), struct.Struct("!BBH"), struct.Struct("!BBQ")


def text_frame_header(length: int) -> bytes:
    """The header of a server's (unmasked) final text frame of ``length`` payload bytes (RFC
    6455, section 5.2)."""
    if length < 126:
        return _SHORT.pack(_FIN_TEXT, length)
    if length < 1 << 16:
        return _MEDIUM.pack(_FIN_TEXT, 126, length)
    return _LONG.pack(_FIN_TEXT, 127, length)


class FramedWebSockets(WebSocketsSansIOProtocol):
    """:class:`WebSocketsSansIOProtocol` whose text messages skip websockets' frame objects (see
    the module docstring). Give it to uvicorn as ``Config(ws=FramedWebSockets)`` (or
    ``--ws api.web.wsprotocol:FramedWebSockets``)."""

    async def send(self, message: Any) -> None:
        text = message.get("text") if message["type"] == "websocket.send" else None
        if text is None or not self._direct():
            await super().send(message)
            return
        await self.writable.wait()  # flow control, as uvicorn's own path
        if self.disconnected:
            raise ClientDisconnected()
        if not self._direct():  # closed while waiting
            await super().send(message)
            return
        payload = text.encode()
        self.transport.writelines((text_frame_header(len(payload)), payload))

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

    def _direct(self) -> bool:
        """Whether a text message may go out as a plain frame now (else uvicorn's path)."""
        return (self.handshake_complete and not self.close_sent and self.initial_response is None
                and self.conn.state is State.OPEN and not self.conn.extensions)
