"""Wall-clock bookkeeping of one dataflow: when each location's frontier last moved, and when
each live pointstamp appeared and which worker last reported it.

Guarantees: the hot path only appends (a published version's changed locations go into one
dict in C, ``dict.fromkeys``; a durable batch is queued as it is), and the per-update work of
finding pointstamps whose count left zero is done later, in bulk, when someone reads (or when
the queue is long). A pointstamp is *born* when its accumulated count leaves zero and
forgotten when it returns to zero, so a pointstamp retired and reported again is young again.
Times are ``time.time()`` seconds.

>>> from tracker.graph import Location
>>> out, into = Location.source(0, 0), Location.target(1, 0)
>>> ages = Ages(created=100.0)
>>> ages.batch_durable(110.0, "w1", [(out, (0,), 1)])
>>> ages.batch_durable(120.0, "w2", [(out, (0,), 1), (out, (1,), 1)])
>>> ages.blame(out, (0,))
(110.0, 'w2')
>>> ages.batch_durable(130.0, "w1", [(out, (0,), -2)])
>>> ages.blame(out, (0,)) is None, ages.oldest(out)
(True, ((1,), 120.0, 'w2'))
>>> ages.frontier_moved([(into, (1,), 1)], 125.0)
>>> ages.moved_at(into, []), ages.moved_at(out, [])
(125.0, 100.0)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tracker.graph import Location, Update
from tracker.timestamp import Timestamp

if TYPE_CHECKING:
    from progress_engine import ChangeBatch

_QUEUE_LIMIT = 512
"""Queued batches folded in at once beyond this, so memory stays bounded with nobody reading."""


class Ages:
    """When things happened to one dataflow's locations and pointstamps (see the module doc)."""

    __slots__ = ("_born", "_by_index", "_moved", "_queue", "created")

    def __init__(self, created: float) -> None:
        self.created = created
        """When a location's frontier counts as last moved if it never moved since (the
        registration, or the restart for a dataflow recovered from a compacted snapshot)."""
        self._moved: dict[Location, float] = {}
        self._by_index: dict[int, float] = {}
        """Locations the compiled engine reported by index (into ``sorted(graph.locations())``)."""
        self._queue: list[tuple[float, str | None, Iterable[Update]]] = []
        self._born: dict[tuple[Location, Timestamp], list[Any]] = {}
        """``(location, time) -> [count, born at, last worker]`` of every live pointstamp."""

    # -- the hot path: appends only ----------------------------------------------------------

    def frontier_moved(self, changes: list[Any] | ChangeBatch, at: float) -> None:
        """A published version changed the frontier at these changes' locations at ``at``."""
        if isinstance(changes, list):
            self._moved.update(dict.fromkeys([change[0] for change in changes], at))
        else:
            self._by_index.update(dict.fromkeys(changes.locations(), at))

    def batch_durable(self, at: float, worker: str | None, updates: Iterable[Update]) -> None:
        """A batch of ``worker`` received at ``at`` is durable (folded in when next read)."""
        self._queue.append((at, worker, updates))
        if len(self._queue) > _QUEUE_LIMIT:
            self._fold()

    def seed(self, counts: Mapping[tuple[Location, Timestamp], int], at: float) -> None:
        """Replace every pointstamp with ``counts`` (recovered from a compacted snapshot, whose
        births are unknown): born ``at``."""
        self._queue = []
        self._born = {}
        for key, count in counts.items():
            if count:
                self._born[key] = [count, at, None]

    # -- readers -----------------------------------------------------------------------------

    def _fold(self) -> None:
        born = self._born
        for at, worker, updates in self._queue:
            for location, when, delta in updates:
                key = (location, when)
                entry = born.get(key)
                if entry is None:
                    if delta:
                        born[key] = [delta, at, worker]
                    continue
                entry[0] += delta
                entry[2] = worker
                if entry[0] == 0:
                    del born[key]
        self._queue = []

    def moved_at(self, location: Location, order: list[Location]) -> float:
        """When the frontier at ``location`` last changed (``order``: the compiled engine's
        location order, ``sorted(graph.locations())``, or ``[]`` when it reports none)."""
        if self._by_index:
            for index, at in self._by_index.items():
                loc = order[index]
                if self._moved.get(loc, 0.0) < at:
                    self._moved[loc] = at
            self._by_index.clear()
        return self._moved.get(location, self.created)

    def blame(self, location: Location, time: Timestamp) -> tuple[float, str | None] | None:
        """``(born at, the worker that last reported it)`` of a live pointstamp, else ``None``
        (``None`` worker: recovered from a snapshot, or an initial pointstamp)."""
        self._fold()
        entry = self._born.get((location, time))
        return None if entry is None else (entry[1], entry[2])

    def oldest(self, location: Location) -> tuple[Timestamp, float, str | None] | None:
        """The live pointstamp at ``location`` that appeared first: ``(time, born at, worker)``."""
        return self.oldest_by_location().get(location)

    def oldest_by_location(self) -> dict[Location, tuple[Timestamp, float, str | None]]:
        """For every location holding live pointstamps, its oldest (as :meth:`oldest`)."""
        self._fold()
        found: dict[Location, tuple[Timestamp, float, str | None]] = {}
        for (location, when), (count, at, worker) in self._born.items():
            if count > 0 and (location not in found or (at, when) < found[location][1::-1]):
                found[location] = (when, at, worker)
        return found
