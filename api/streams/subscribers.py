"""Frontier subscribers: bounded queues, resynchronisation of the slow, and the SSE stream.

Guarantees: a subscriber receives every published version after its starting point exactly
once, in order, or (if it fell behind) a ``resync`` marker followed by a fresh snapshot; a
slow subscriber never slows down publishing, and what the service holds for one subscriber is
bounded (``maxsize`` events and ``max_bytes`` of them queued, a resume backlog within the same
bounds), whether it reads or not.

Publishing never waits for a subscriber: :meth:`Subscriber.offer` is ``put_nowait`` on a bounded
queue. A subscriber whose queue is full (in events or in bytes) is marked *lagged*: its queue
is emptied and replaced by one ``resync`` marker, so the stream tells it so and then sends a
fresh ``snapshot`` (taken when the marker is consumed), after which changes continue from the
snapshot's version. A resume (``Last-Event-ID``) further back than those bounds gets a fresh
``snapshot`` instead of the backlog. Progress of other dataflows and other subscribers is never
slowed down by one slow reader.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TypeVar

from api.streams.encoding import Selection
from api.streams.publish import Publication

RESYNC = (-1, "")
END = (-2, "")
MAX_BYTES = 4 * 1024 * 1024
"""Default bound on the bytes of events queued for one subscriber (``TRACKER_SUBSCRIBER_BYTES``)."""
WRITE_BYTES = 64 * 1024
"""Events a subscriber fell behind on go out in writes of about this size: the transport then
holds one such write (plus its 64 KiB high-water mark) per slow subscriber, not the backlog."""

_Wire = TypeVar("_Wire", str, bytes)


class _SharedForms:
    """The wire forms of recent events, built once and shared by every subscriber: 500 SSE
    subscribers of a busy dataflow otherwise copy each version's changes three times each
    (payload, frame, bytes), gigabytes a second of allocations that also stay resident.

    Keyed by the identity of the text a form is built from (held while cached, so its identity
    is not reused), bounded in entries and characters; an evicted form lives on in whoever holds it.

    >>> forms = _SharedForms()
    >>> text = "[1]"
    >>> forms.get("x", 1, text, lambda: text * 2) is forms.get("x", 1, text, lambda: "other")
    True
    """

    def __init__(self, entries: int = 512, chars: int = 32 * 1024 * 1024) -> None:
        self._forms: OrderedDict[tuple[str, int, int], tuple[str, str | bytes]] = OrderedDict()
        self._entries, self._chars, self._held = entries, chars, 0

    def get(self, form: str, version: int, source: str, build: Callable[[], _Wire]) -> _Wire:
        """``build()``, the ``form`` of ``version``'s event made from ``source``, or the one made before."""
        key = (form, version, id(source))
        found = self._forms.get(key)
        if found is not None and found[0] is source:
            self._forms.move_to_end(key)
            return found[1]  # type: ignore[return-value]  # the form's builder made it: same type
        built = build()
        if found is not None:
            self._held -= len(found[1])
        self._forms[key] = (source, built)
        self._held += len(built)
        while self._forms and (len(self._forms) > self._entries or self._held > self._chars):
            _, (_, old) = self._forms.popitem(last=False)
            self._held -= len(old)
        return built


_SHARED = _SharedForms()


class Subscriber:
    """One stream's bounded queue of ``(version, encoded changes)`` (a
    :class:`~api.streams.publish.Listener`).

    >>> subscriber = Subscriber(1)
    >>> subscriber.offer(1, "[]"); subscriber.offer(2, "[]")
    >>> subscriber.lagged, subscriber.queue.get_nowait() == RESYNC
    (True, True)

    The bytes queued are bounded too (an event larger than the bound still goes to an empty queue):

    >>> subscriber = Subscriber(100, max_bytes=10)
    >>> subscriber.offer(1, "[" + "x" * 20 + "]"); subscriber.lagged
    False
    >>> subscriber.offer(2, "[]"); subscriber.lagged, subscriber.queued_bytes
    (True, 0)
    """

    def __init__(self, maxsize: int, on_lag: Callable[[], None] | None = None,
                 selection: Selection | None = None, max_bytes: int = MAX_BYTES) -> None:
        self.queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue(maxsize)
        self.lagged = False
        self.after = 0
        self.selection = selection
        """Only these locations (snapshot and changes), or every location."""
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        """Characters of the encoded changes in :attr:`queue` (shared with the history while it
        holds them, but a subscriber must not pin evicted ones without bound)."""
        self._on_lag = on_lag

    def end(self) -> None:
        """Queue the end of the stream (the dataflow was deleted) without ever blocking; a full
        queue makes room for it (the stream ends either way)."""
        if self.queue.full():
            self.take(self.queue.get_nowait())
        self.queue.put_nowait(END)

    def offer(self, version: int, encoded: str) -> None:
        """Queue an event without ever blocking the publisher."""
        if self.lagged:
            return
        size = len(encoded)
        if self.queued_bytes and self.queued_bytes + size > self.max_bytes:
            self._lag()
            return
        try:
            self.queue.put_nowait((version, encoded))
        except asyncio.QueueFull:
            self._lag()
            return
        self.queued_bytes += size

    def take(self, item: tuple[int, str]) -> None:
        """Account for ``item`` having left the queue."""
        self.queued_bytes = max(0, self.queued_bytes - len(item[1]))

    def _lag(self) -> None:
        self.lagged = True
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queued_bytes = 0
        self.queue.put_nowait(RESYNC)
        if self._on_lag is not None:
            self._on_lag()


def attach(publication: Publication, last_event_id: str | None, maxsize: int,
           on_lag: Callable[[], None] | None = None, selection: Selection | None = None,
           max_bytes: int = MAX_BYTES) -> tuple[Subscriber, Iterable[tuple[str, int, str]]]:
    """Subscribe and compute what to send first: a snapshot, or the missed changes (of
    ``selection``'s locations only, if given).

    Synchronous on purpose: between subscribing and reading the history nothing else runs, so
    the backlog and the queue together hold every version exactly once. A resume further back
    than ``maxsize`` versions or ``max_bytes`` of changes gets a snapshot instead: a backlog is
    what a subscriber that never reads would pin, and the snapshot is the bounded answer.
    Returns the subscriber and the ``(event, version, data)`` items to send before the queue
    (as :func:`next_events`'s),
    built one at a time as they are consumed: the backlog shares the history's strings, so a
    client that does not read pins one event's payload, not a copy of the backlog.
    """
    subscriber = Subscriber(maxsize, on_lag, selection, max_bytes)
    if publication.ended:  # deleted since the request was accepted: end after the first events
        subscriber.end()
    else:
        publication.subscribers.add(subscriber)
    resume = _parse_event_id(last_event_id)
    backlog = None
    if resume is not None and _within(publication, resume, maxsize, max_bytes):
        backlog = publication.changes_since(resume, selection)
    if backlog is None:
        version, data = publication.snapshot_json(selection)
        subscriber.after = version
        return subscriber, [("snapshot", version, data)]
    subscriber.after = publication.frontier_version
    return subscriber, (("changes", v, encoded) for v, encoded in backlog)


def _within(publication: Publication, after: int, count: int, size: int) -> bool:
    """Whether the history's versions after ``after`` are at most ``count`` and ``size``
    characters; walks back from the newest and stops at the first bound crossed, so its cost
    is bounded too."""
    total = 0
    for seen, (version, changes, encoded) in enumerate(reversed(publication.history)):
        if version <= after:
            return True
        total += len(encoded) if encoded is not None else 40 * changes  # not encoded yet: at least 40 a change
        if seen >= count or total > size:
            return False
    return True


def ws_message(event: str, version: int, data: str) -> str:
    """``{"type": event, ...}`` as a WebSocket text message: for ``changes``, ``data`` is the
    version's encoded change list and the message is built once per version and shared; else
    ``data`` is the event's JSON object.

    >>> ws_message("changes", 3, "[]")
    '{"type":"changes","version":3,"changes":[]}'
    >>> ws_message("snapshot", 1, '{"version":1}')
    '{"type":"snapshot","version":1}'
    """
    if event == "changes":  # one copy of the (maybe megabytes of) changes, not one per wrapping
        return _SHARED.get("ws", version, data, lambda: f'{{"type":"changes","version":{version},"changes":{data}}}')
    return f'{{"type":"{event}",{data[1:]}' if len(data) > 2 else f'{{"type":"{event}"}}'


def sse_frame(event: str, version: int, data: str) -> bytes:
    """One SSE event, as sse-starlette would encode it: for ``changes``, ``data`` is the
    version's encoded change list (the event's data is ``{"version", "changes"}``) and the frame
    is built once per version and shared; else ``data`` is the event's one line of JSON.

    >>> sse_frame("changes", 3, '[]')
    b'id: 3\\r\\nevent: changes\\r\\ndata: {"version":3,"changes":[]}\\r\\n\\r\\n'
    >>> sse_frame("snapshot", 3, '{"version":3}')
    b'id: 3\\r\\nevent: snapshot\\r\\ndata: {"version":3}\\r\\n\\r\\n'
    """
    if event == "changes":
        return _SHARED.get("sse", version, data,
                           lambda: _frame(event, version, f'{{"version":{version},"changes":{data}}}'))
    return _frame(event, version, data)


def _parse_event_id(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        parsed = int(value.strip())
    except ValueError:
        return None
    return parsed if parsed >= 0 else None


async def next_events(publication: Publication, subscriber: Subscriber) -> list[tuple[str, int, str]]:
    """Wait for the subscriber's next item, then take every item already queued (a subscriber
    that fell behind catches up in one send); a resync becomes ``resync`` + ``snapshot``, the
    end of the stream one ``deleted`` event (nothing follows it). A ``changes`` event's data is
    the version's encoded change list (:func:`ws_message` and :func:`sse_frame` wrap it)."""
    items = [await subscriber.queue.get()]
    while not subscriber.queue.empty() and items[-1] not in (RESYNC, END):
        items.append(subscriber.queue.get_nowait())
    events: list[tuple[str, int, str]] = []
    for version, encoded in items:
        subscriber.take((version, encoded))
        if (version, encoded) == END:
            events.append(("deleted", publication.frontier_version, json.dumps(
                {"reason": "the dataflow was deleted; this stream ends", "version": publication.frontier_version})))
        elif (version, encoded) == RESYNC:
            # Re-arm before taking the snapshot: both happen without an await, so nothing is lost.
            subscriber.lagged = False
            snap_version, data = publication.snapshot_json(subscriber.selection)
            subscriber.after = snap_version
            reason = json.dumps({"reason": "subscriber fell behind; a fresh snapshot follows",
                                 "version": snap_version})
            events += [("resync", snap_version, reason), ("snapshot", snap_version, data)]
        elif version > subscriber.after:
            subscriber.after = version
            events.append(("changes", version, encoded))
    return events


async def sse_events(publication: Publication, last_event_id: str | None, maxsize: int,
                     on_lag: Callable[[], None] | None = None,
                     on_change: Callable[[int], None] | None = None, selection: Selection | None = None,
                     max_bytes: int = MAX_BYTES) -> AsyncIterator[bytes]:
    """The SSE event source: ``snapshot`` or the missed ``changes``, then live ``changes``, as
    encoded SSE frames (several events a subscriber fell behind on go out as one write); a
    ``deleted`` event and the end of the response when the dataflow is deleted.

    Subscribes when the response starts streaming and unsubscribes in ``finally``, so a client
    that goes away at any point leaves nothing behind; ``on_change(+1/-1)`` counts subscribers.
    """
    subscriber, first = attach(publication, last_event_id, maxsize, on_lag, selection, max_bytes)
    if on_change is not None:
        on_change(1)
    try:
        for event, version, data in first:
            yield sse_frame(event, version, data)
        while True:
            events = await next_events(publication, subscriber)
            write: list[bytes] = []
            size = 0
            for event, version, data in events:
                frame = sse_frame(event, version, data)
                if write and size + len(frame) > WRITE_BYTES:
                    yield b"".join(write) if len(write) > 1 else write[0]
                    write, size = [], 0
                write.append(frame)
                size += len(frame)
            if write:
                yield b"".join(write) if len(write) > 1 else write[0]
            if any(event == "deleted" for event, _, _ in events):
                return
    finally:
        publication.subscribers.discard(subscriber)
        if on_change is not None:
            on_change(-1)


def _frame(event: str, version: int, data: str) -> bytes:
    return f"id: {version}\r\nevent: {event}\r\ndata: {data}\r\n\r\n".encode()
