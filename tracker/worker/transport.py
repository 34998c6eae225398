"""Data messages between worker processes: one TCP connection per ordered pair (asyncio streams).

Each process listens on its own address; the first message for a peer opens a connection to
it (retrying while the peer starts up). Messages queued for a peer are written together as one
JSON line ``[[stage, port, time, message], ...]`` (one encode, one write, one drain per burst),
so messages must be JSON values. Delivery is reliable while both processes live;
order is *not* part of the contract (timely dataflow does not need it), and ``delay`` makes
each message wait a random time before it is written, reordering them on purpose (tests).

Two workers in one process, on loopback ports picked by the system:

>>> async def exchange() -> list:
...     peers = [Transport(i, [("127.0.0.1", 0)] * 2) for i in range(2)]
...     for t in peers:
...         await t.start()
...     for t in peers:  # tell each the ports the other one got
...         t.addresses = [p.addresses[p.index] for p in peers]
...     received = []
...     peers[1].attach(lambda stage, port, time, message: received.append((stage, time, message)))
...     await asyncio.gather(*(t.connect_all() for t in peers))
...     peers[0].send(1, 2, 0, (5,), {"word": "hi"})  # to worker 1, stage 2, input 0, time (5,)
...     while not received:
...         await asyncio.sleep(0.01)
...     for t in peers:
...         await t.close()
...     return received
>>> asyncio.run(exchange())
[(2, (5,), {'word': 'hi'})]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from tracker.timestamp import Timestamp

Deliver = Callable[[int, int, Timestamp, Any], None]
_LIMIT = 1 << 26  # longest accepted line (64 MiB): one message, however large


class TransportError(RuntimeError):
    """A peer could not be reached in time, or a connection broke while messages were due."""


class Transport:
    """Point-to-point exchange for worker ``index`` among ``addresses`` (one per worker)."""

    def __init__(self, index: int, addresses: Sequence[tuple[str, int]], *, delay: float = 0.0,
                 seed: int | None = None, connect_timeout: float = 30.0) -> None:
        self.index = index
        self.addresses = list(addresses)
        self.peers = len(self.addresses)
        self.delay = delay
        self.rng = random.Random(seed)
        self.connect_timeout = connect_timeout
        self._backlog: list[tuple[int, int, Timestamp, Any]] = []
        self.deliver: Deliver = lambda *message: self._backlog.append(message)  # kept until attach()
        self._queues: dict[int, asyncio.Queue[bytes]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self.failure: BaseException | None = None
        self._hellos: set[int] = set()
        self._everyone = asyncio.Event()

    def attach(self, deliver: Deliver) -> None:
        """Route incoming messages to ``deliver``, first those that arrived before (a peer may
        start sending as soon as both ends are up, before this worker's scheduler runs)."""
        self.deliver = deliver
        backlog, self._backlog = self._backlog, []
        for message in backlog:
            deliver(*message)

    async def start(self) -> None:
        """Listen on this worker's address (port 0 picks a free one, stored back)."""
        host, port = self.addresses[self.index]
        self._server = await asyncio.start_server(self._serve, host, port, limit=_LIMIT)
        self.addresses[self.index] = (host, self._server.sockets[0].getsockname()[1])

    async def connect_all(self) -> None:
        """Wait until every peer is up and connected both ways (a start barrier, so that no
        worker's clock runs while the others are still starting)."""
        for dest in range(self.peers):
            if dest != self.index:
                self._queue(dest).put_nowait(("hello", self.index))
        if self.peers > 1:
            await asyncio.wait_for(self._everyone.wait(), self.connect_timeout)

    def _queue(self, dest: int) -> asyncio.Queue[Any]:
        queue = self._queues.get(dest)
        if queue is None:
            queue = self._queues[dest] = asyncio.Queue()
            self._tasks.append(asyncio.create_task(self._pump(dest, queue)))
        return queue

    def send(self, dest: int, stage: int, port: int, time: Timestamp, message: Any) -> None:
        """Queue ``message`` for ``(stage, port)`` on worker ``dest``; never blocks."""
        item = (stage, port, time, message)
        queue = self._queue(dest)
        if self.delay:
            asyncio.get_running_loop().call_later(self.rng.random() * self.delay, queue.put_nowait, item)
        else:
            queue.put_nowait(item)

    async def _pump(self, dest: int, queue: asyncio.Queue[Any]) -> None:
        try:
            writer = await self._connect(dest)
            while True:
                burst = [await queue.get()]
                while not queue.empty():  # everything queued by now goes in one line
                    burst.append(queue.get_nowait())
                writer.write(json.dumps(burst, separators=(",", ":")).encode() + b"\n")
                await writer.drain()
        except (OSError, TransportError) as error:
            self.failure = error

    async def _connect(self, dest: int) -> asyncio.StreamWriter:
        host, port = self.addresses[dest]
        deadline = asyncio.get_running_loop().time() + self.connect_timeout
        while True:
            try:
                _, writer = await asyncio.open_connection(host, port)
                self._writers.append(writer)
                return writer
            except OSError as error:
                if asyncio.get_running_loop().time() > deadline:
                    raise TransportError(f"worker {dest} at {host}:{port} unreachable: {error}") from None
                await asyncio.sleep(0.05)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            while line := await reader.readline():
                for item in json.loads(line):
                    if len(item) == 2:  # ["hello", index]: see connect_all
                        self._hellos.add(item[1])
                        if len(self._hellos) == self.peers - 1:
                            self._everyone.set()
                        continue
                    stage, port, time, message = item
                    self.deliver(stage, port, tuple(time), message)
        except (OSError, asyncio.IncompleteReadError):
            pass

    async def close(self) -> None:
        """Stop pumping and listening; messages still queued are dropped (call when done)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            # Python 3.12 waits for served connections too; never hang on a stuck peer.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
