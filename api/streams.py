"""Frontier subscribers: bounded queues, resynchronisation of the slow, and the SSE stream.

Guarantees: a subscriber receives every published version after its starting point exactly
once, in order, or (if it fell behind) a ``resync`` marker followed by a fresh snapshot; a
slow subscriber never slows down publishing.

Publishing never waits for a subscriber: :meth:`Subscriber.offer` is ``put_nowait`` on a bounded
queue. A subscriber whose queue is full is marked *lagged*: its queue is emptied and replaced
by one ``resync`` marker, so the stream tells it so and then sends a fresh ``snapshot`` (taken
when the marker is consumed), after which changes continue from the snapshot's version. Progress
of other dataflows and other subscribers is never slowed down by one slow reader.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from api.publish import Publication, Selection

RESYNC = (-1, "")
END = (-2, "")


class Subscriber:
    """One stream's bounded queue of ``(version, encoded changes)`` (a
    :class:`~api.publish.Listener`).

    >>> subscriber = Subscriber(1)
    >>> subscriber.offer(1, "[]"); subscriber.offer(2, "[]")
    >>> subscriber.lagged, subscriber.queue.get_nowait() == RESYNC
    (True, True)
    """

    def __init__(self, maxsize: int, on_lag: Callable[[], None] | None = None,
                 selection: Selection | None = None) -> None:
        self.queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue(maxsize)
        self.lagged = False
        self.after = 0
        self.selection = selection
        """Only these locations (snapshot and changes), or every location."""
        self._on_lag = on_lag

    def end(self) -> None:
        """Queue the end of the stream (the dataflow was deleted) without ever blocking; a full
        queue makes room for it (the stream ends either way)."""
        if self.queue.full():
            self.queue.get_nowait()
        self.queue.put_nowait(END)

    def offer(self, version: int, encoded: str) -> None:
        """Queue an event without ever blocking the publisher."""
        if self.lagged:
            return
        try:
            self.queue.put_nowait((version, encoded))
        except asyncio.QueueFull:
            self.lagged = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(RESYNC)
            if self._on_lag is not None:
                self._on_lag()


def attach(publication: Publication, last_event_id: str | None, maxsize: int,
           on_lag: Callable[[], None] | None = None, selection: Selection | None = None
           ) -> tuple[Subscriber, list[tuple[str, int, str]]]:
    """Subscribe and compute what to send first: a snapshot, or the missed changes (of
    ``selection``'s locations only, if given).

    Synchronous on purpose: between subscribing and reading the history nothing else runs, so
    the backlog and the queue together hold every version exactly once.
    Returns the subscriber and ``(event, version, data)`` items to send before the queue.
    """
    subscriber = Subscriber(maxsize, on_lag, selection)
    if publication.ended:  # deleted since the request was accepted: end after the first events
        subscriber.end()
    else:
        publication.subscribers.add(subscriber)
    resume = _parse_event_id(last_event_id)
    backlog = publication.changes_since(resume, selection) if resume is not None else None
    if backlog is None:
        version, data = publication.snapshot_json(selection)
        subscriber.after = version
        return subscriber, [("snapshot", version, data)]
    subscriber.after = publication.frontier_version
    return subscriber, [("changes", v, change_event(v, encoded)) for v, encoded in backlog]


def change_event(version: int, encoded: str) -> str:
    """The ``changes`` payload around a pre-encoded change list."""
    return f'{{"version":{version},"changes":{encoded}}}'


def _parse_event_id(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        parsed = int(value.strip())
    except ValueError:
        return None
    return parsed if parsed >= 0 else None


async def next_events(publication: Publication, subscriber: Subscriber) -> list[tuple[str, int, str]]:
    """Wait for the subscriber's next item(s); a resync becomes ``resync`` + ``snapshot``, the
    end of the stream one ``deleted`` event (nothing follows it)."""
    version, encoded = await subscriber.queue.get()
    if (version, encoded) == END:
        return [("deleted", publication.frontier_version, json.dumps(
            {"reason": "the dataflow was deleted; this stream ends", "version": publication.frontier_version}))]
    if (version, encoded) == RESYNC:
        # Re-arm before taking the snapshot: both happen without an await, so nothing is lost.
        subscriber.lagged = False
        snap_version, data = publication.snapshot_json(subscriber.selection)
        subscriber.after = snap_version
        reason = json.dumps({"reason": "subscriber fell behind; a fresh snapshot follows", "version": snap_version})
        return [("resync", snap_version, reason), ("snapshot", snap_version, data)]
    if version <= subscriber.after:
        return []
    subscriber.after = version
    return [("changes", version, change_event(version, encoded))]


async def sse_events(publication: Publication, last_event_id: str | None, maxsize: int,
                     on_lag: Callable[[], None] | None = None,
                     on_change: Callable[[int], None] | None = None, selection: Selection | None = None
                     ) -> AsyncIterator[dict[str, Any]]:
    """The SSE event source: ``snapshot`` or the missed ``changes``, then live ``changes``;
    a ``deleted`` event and the end of the response when the dataflow is deleted.

    Subscribes when the response starts streaming and unsubscribes in ``finally``, so a client
    that goes away at any point leaves nothing behind; ``on_change(+1/-1)`` counts subscribers.
    """
    subscriber, first = attach(publication, last_event_id, maxsize, on_lag, selection)
    if on_change is not None:
        on_change(1)
    try:
        for event, version, data in first:
            yield {"event": event, "id": str(version), "data": data}
        while True:
            for event, version, data in await next_events(publication, subscriber):
                yield {"event": event, "id": str(version), "data": data}
                if event == "deleted":
                    return
    finally:
        publication.subscribers.discard(subscriber)
        if on_change is not None:
            on_change(-1)
