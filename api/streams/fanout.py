"""Fan-out of published versions to a dataflow's subscribers, in bounded slices.

Guarantees: every subscriber present when a version's fan-out reaches it is offered that
version (in version order, each version once, at its selection's locations); a version's
change list is encoded once per distinct selection, shared by every subscriber naming it;
and handing a version to many subscribers never holds the event loop for more than one slice
(at most :data:`SLICE` subscribers, as many as send in about :data:`TURN_SECONDS`) at a time.

Why slices: offering a version wakes each subscriber's sending task, and those wake-ups run in
the event loop's next turn, all of them, before any socket is read again. With 500 SSE
subscribers that turn took tens of milliseconds, during which no other dataflow's batch was
read or acknowledged (and the poster's own next batch waited too). A small audience
(:data:`INLINE`, nothing pending) is still offered inline, as before; a larger one is handed a slice
per turn of the loop by a task of its own, which then rests as long as the slice's sends took,
so the turns stay short, every other connection's I/O is served between them, and under
overload versions published meanwhile go out together (one wake-up, and for SSE one write,
per subscriber for several versions). A subscriber that joins while a fan-out is under way
missed nothing: it attached at the published version (:func:`api.streams.subscribers.attach`), which
covers every version already published, and skips the offers of those it already has.

>>> import asyncio
>>> class Listener:
...     selection = None
...     def __init__(self) -> None: self.got: list[int] = []
...     def offer(self, version: int, encoded: str) -> None: self.got.append(version)
>>> async def main() -> list[list[int]]:
...     listeners = {Listener() for _ in range(3 * SLICE)}
...     fanout = FanOut(lambda: listeners, lambda changes, selection: "[]")
...     fanout.push(1, [], "[1]"); fanout.push(2, [], "[2]")
...     await fanout.idle()
...     return sorted({tuple(listener.got) for listener in listeners})
>>> asyncio.run(main())
[(1, 2)]
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Set
from typing import Any, Protocol

SLICE = 32
"""At most this many subscribers offered a version per turn of the event loop (each offer
schedules one send); fewer when their sends are slow (:data:`TURN_SECONDS`)."""
INLINE = 8
"""An audience of at most this many, with nothing pending, is offered inline."""
TURN_SECONDS = 0.002
"""What one slice's sends should take."""

Pending = tuple[int, Any, str]
"""``(version, its changes as published, their JSON)``."""


class Listener(Protocol):
    """What a fan-out offers to (:class:`api.streams.publish.Listener`, restated so as not to import it)."""

    @property
    def selection(self) -> Any: ...
    def offer(self, version: int, encoded: str) -> None: ...


class FanOut:
    """Offers published versions to the subscribers ``subscribers()`` returns (the
    publication's own set, read at each version: a deleted dataflow's is replaced)."""

    def __init__(self, subscribers: Callable[[], Set[Listener]], encode: Callable[[Any, Any], str]) -> None:
        """``encode(changes, selection)`` is the JSON of ``changes`` at ``selection``'s locations."""
        self._subscribers = subscribers
        self._encode = encode
        self._pending: list[Pending] = []
        self._task: asyncio.Task[None] | None = None
        self._size = SLICE
        self.selected_encodings = 0
        """How many selection encodings were made (one per distinct selection per version)."""

    @property
    def busy(self) -> bool:
        """Whether versions pushed earlier are still being offered."""
        return self._task is not None

    def push(self, version: int, changes: Any, encoded: str) -> None:
        """Hand one published version to every subscriber: inline for a small audience with
        nothing pending, else in slices, after what is pending (so the order holds)."""
        subscribers = self._subscribers()
        if not subscribers and self._task is None:
            return
        if self._task is None and len(subscribers) <= INLINE:
            self._offer(list(subscribers), [(version, changes, encoded)], {})
            return
        self._pending.append((version, changes, encoded))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def idle(self) -> None:
        """Wait until every pushed version was offered to every subscriber (for tests)."""
        while self._task is not None:
            await asyncio.sleep(0)

    async def _run(self) -> None:
        try:
            while self._pending:
                # Everything pushed meanwhile goes out together: a busy dataflow's fan-out
                # catches up instead of queueing one round per version.
                batch, self._pending = self._pending, []
                listeners = list(self._subscribers())
                selected: dict[tuple[int, int], str] = {}
                start = 0
                while start < len(listeners):
                    began = time.perf_counter()
                    self._offer(listeners[start:start + self._size], batch, selected)
                    start += self._size
                    await asyncio.sleep(0)  # the offered ones send in this next turn; others' I/O too
                    spent = time.perf_counter() - began
                    # Size the next slice so that its sends take about TURN_SECONDS (a send to a
                    # client that does not read costs up to ~1 ms), then rest as long as this
                    # one took: at most half of the loop goes to a big audience.
                    self._size = max(1, min(SLICE, int(self._size * TURN_SECONDS / max(spent, 1e-6))))
                    await asyncio.sleep(min(spent, 0.005))
        finally:
            self._task = None

    def _offer(self, listeners: list[Listener], batch: list[Pending], selected: dict[tuple[int, int], str]) -> None:
        """Offer each version of ``batch`` to each of ``listeners``; ``selected`` caches the
        encodings per ``(version, selection)`` across the slices of one batch."""
        for subscriber in listeners:
            selection = subscriber.selection
            for version, changes, encoded in batch:
                if selection is None:
                    subscriber.offer(version, encoded)
                    continue
                key = (version, id(selection))
                text = selected.get(key)
                if text is None:
                    text = selected[key] = self._encode(changes, selection)
                    self.selected_encodings += 1
                if text != "[]":
                    subscriber.offer(version, text)
