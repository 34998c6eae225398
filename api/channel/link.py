"""Frames on a local stream socket, and the two ends: :class:`Client` (a hot-path process) and
:class:`Peer` (one connection as the Spark process sees it).

A frame is a 4-byte big-endian length and that many bytes of one message
(:mod:`api.channel.messages`). The client reconnects by itself (backoff from 0.05 s to 1 s) and,
on every connect, sends what its ``on_connect`` returns before anything of the outbox, so the
other side always learns the desired state before any work that depends on it.

>>> import asyncio, tempfile, os
>>> from api.channel.messages import Check, Status, decode_to_spark
>>> async def demo() -> list[str]:
...     path = os.path.join(tempfile.mkdtemp(), "s.sock")
...     got: list[str] = []
...     async def handle(peer: Peer) -> None:
...         async for message in peer.messages(decode_to_spark):
...             got.append(type(message).__name__)
...             peer.send(Status(pid=1, state="ready"))
...     server = await asyncio.start_unix_server(lambda r, w: handle(Peer(r, w)), path)
...     answered = asyncio.Event()
...     client = Client(path, lambda: [Check(df="replayed")], lambda m: answered.set())
...     task = asyncio.create_task(client.run())
...     while not client.connected:
...         await asyncio.sleep(0.01)
...     assert client.offer(Check(df="d"))
...     await answered.wait()
...     await asyncio.sleep(0.05)
...     task.cancel(); server.close()
...     return got
>>> asyncio.run(demo())
['Check', 'Check']
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import msgspec

from api.channel.messages import ToHot, ToSpark, decode_to_hot, encode

log = logging.getLogger("tracker.channel")
STEADY_SECONDS = 5.0
"""How long a connection must last for the reconnect backoff to start over."""
HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30
"""A frame longer than this is refused (the connection closes): a corrupt length, not a message."""
M = TypeVar("M")


def frame(message: ToSpark | ToHot) -> bytes:
    """One message as a frame.

    >>> from api.channel.messages import Forget
    >>> frame(Forget(df="x"))[:4]
    b'\\x00\\x00\\x00\\x0f'
    """
    payload = encode(message)
    return HEADER.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's payload, or ``None`` at the end of the stream."""
    try:
        head = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"a frame of {size} bytes: over the limit of {MAX_FRAME}")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        return None


class Peer:
    """One connection's two directions: :meth:`messages` reads, :meth:`send` writes without
    waiting (the transport buffers; the peer reads promptly)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def messages(self, decode: Callable[[bytes], M]) -> AsyncIterator[M]:
        """Every message until the connection closes; a frame that is no message ends it."""
        while (payload := await read_frame(self.reader)) is not None:
            try:
                yield decode(payload)
            except msgspec.ValidationError as error:
                log.error("channel: a frame that is no message; closing", extra={"error": str(error)})
                return

    def send(self, message: ToSpark | ToHot) -> None:
        """Queue ``message`` on the connection (dropped if it is closed: the other side replays)."""
        if not self.writer.is_closing():
            self.writer.write(frame(message))

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with contextlib.suppress(Exception):
            self.writer.close()


class Client:
    """A hot-path process's end: connects to ``address`` (a Unix socket path) and keeps
    reconnecting; ``on_connect()`` gives the messages that go first on each connection (the
    replay of desired state and pending work); ``on_message`` gets every message that arrives,
    on the event loop; ``on_disconnect`` is told when a connection ends.

    The outbox holds at most ``outbox`` messages: :meth:`offer` answers ``False`` when it is full
    or the link is down, and the caller keeps the work for the next replay.
    """

    def __init__(self, address: str, on_connect: Callable[[], list[ToSpark]], on_message: Callable[[ToHot], None],
                 on_disconnect: Callable[[], None] = lambda: None, outbox: int = 1024) -> None:
        self.address = address
        self.on_connect = on_connect
        self.on_message = on_message
        self.on_disconnect = on_disconnect
        self.connected = False
        self.connects = 0
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue(outbox)

    def offer(self, message: ToSpark) -> bool:
        """Queue ``message`` if the link is up and the outbox has room; never waits."""
        if not self.connected:
            return False
        try:
            self._outbox.put_nowait(frame(message))
        except asyncio.QueueFull:
            return False
        return True

    async def run(self) -> None:
        """Connect, serve the connection, reconnect; forever (cancel to stop). The wait between
        attempts doubles from 0.05 s to 1 s, and starts over only after a connection that
        lasted :data:`STEADY_SECONDS`: a peer that drops every connection at once is not
        flooded with replays."""
        backoff = 0.05
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.address)
            except OSError:
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            began = time.monotonic()
            try:
                await self._serve(reader, writer)
            except (OSError, ValueError) as error:
                log.info("channel: connection lost", extra={"error": str(error)})
            finally:
                was = self.connected
                self.connected = False
                with contextlib.suppress(Exception):
                    writer.close()
                if was:
                    self.on_disconnect()
            backoff = 0.05 if time.monotonic() - began >= STEADY_SECONDS else min(1.0, backoff * 2)
            await asyncio.sleep(backoff)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not self._outbox.empty():  # from the last connection: its work is in the replay
            self._outbox.get_nowait()
        for message in self.on_connect():
            writer.write(frame(message))
        self.connected = True
        self.connects += 1
        await writer.drain()
        sender = asyncio.create_task(self._send(writer))
        try:
            async for answer in Peer(reader, writer).messages(decode_to_hot):
                self.on_message(answer)
        finally:
            sender.cancel()

    async def _send(self, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await self._outbox.get()
            writer.write(data)
            if self._outbox.empty():
                await writer.drain()
