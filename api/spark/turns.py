"""Turns at the one Spark thread, served fairly: round-robin over dataflows.

Guarantees: one turn at a time; waiting turns are granted one dataflow after another, in the
order the dataflows first queued, so a dataflow with many queued jobs (audits, micro-batches)
delays another dataflow's job by at most one of its own; within a dataflow turns keep their
order. A turn given up while waiting (its task cancelled) is skipped. Combined with the time
limit of :meth:`api.spark.session.Spark.run`, every queued job starts within a bounded time.

>>> import asyncio
>>> async def demo() -> list[str]:
...     turns, order = SparkQueue(), []
...     async def job(owner: str, name: str) -> None:
...         async with turns.turn(owner):
...             order.append(name)
...             await asyncio.sleep(0)
...     await asyncio.gather(job("a", "a1"), job("a", "a2"), job("a", "a3"), job("b", "b1"))
...     return order
>>> asyncio.run(demo())
['a1', 'b1', 'a2', 'a3']
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class SparkQueue:
    """Waiting turns per dataflow and the one turn being served."""

    def __init__(self) -> None:
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._busy = False
        self._serving: str | None = None  # whose turn is being served

    def waiting(self, owner: str | None = None) -> int:
        """Turns waiting (of ``owner``, or of everyone).

        >>> SparkQueue().waiting()
        0
        """
        if owner is not None:
            return len(self._waiting.get(owner, ()))
        return sum(len(turns) for turns in self._waiting.values())

    @asynccontextmanager
    async def turn(self, owner: str) -> AsyncIterator[None]:
        """Wait for ``owner``'s turn, hold it for the ``async with`` body, then pass it on."""
        if self._busy or self._waiting:
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(owner, deque()).append(granted)
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():  # granted as it was cancelled: pass it on
                    self._next()
                else:
                    self._forget(owner, granted)
                raise
        else:
            self._busy = True
        self._serving = owner
        try:
            yield
        finally:
            self._next()

    def _forget(self, owner: str, granted: asyncio.Future[None]) -> None:
        turns = self._waiting.get(owner)
        if turns is not None and granted in turns:
            turns.remove(granted)
            if not turns:
                del self._waiting[owner]

    def _next(self) -> None:
        """Grant the first waiting turn of the next dataflow in the rotation, which then moves
        to the end of it (if it still waits)."""
        serving = self._serving
        if serving is not None and serving in self._waiting and len(self._waiting) > 1:
            self._waiting.move_to_end(serving)  # the others come first
        while self._waiting:
            owner, turns = next(iter(self._waiting.items()))
            granted = turns.popleft()
            del self._waiting[owner]
            if turns:
                self._waiting[owner] = turns
            if not granted.done():
                granted.set_result(None)
                return
        self._busy, self._serving = False, None
