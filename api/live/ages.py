"""Wall-clock bookkeeping of one dataflow: when each location's frontier last moved, when each
live pointstamp appeared and which worker last reported it, and when each worker's last durable
batch arrived.

Guarantees: the hot path only appends (a published version's change batch, a durable batch's
updates, as they are). The queues are folded in when someone reads (lag, blame, ``/metrics``),
or the versions every 1024 of them, and the batches once they hold more updates than four times
the live pointstamps (plus 8192); the per-change and per-update work of a fold is done in C
(``dict.fromkeys`` over each batch's locations or ``(location, time)`` keys), its Python work
is per live pointstamp. A pointstamp's *birth* is the
arrival of the first queued batch that touched it, for a pointstamp that was not live at the
previous fold (and is live, by the dataflow's counts, at this one); a live one keeps its birth;
the worker is that of the last batch that touched it. So a pointstamp retired and reported
again between two folds keeps the earlier birth. A flat dataflow on the compiled engine keeps
its births in the engine instead (:meth:`Ages.births_in_engine`): each durable batch is folded
in at once, in C, and a birth is exactly the arrival of the batch that last made the
pointstamp's count positive (a batch's own updates summed first). Times are ``time.time()``
seconds.

>>> from tracker.graph import Location
>>> out, into = Location.source(0, 0), Location.target(1, 0)
>>> counts = {}
>>> ages = Ages(created=100.0, counts=lambda: counts)
>>> def batch(at, worker, updates):
...     for loc, t, d in updates:
...         counts[(loc, t)] = counts.get((loc, t), 0) + d
...     ages.batch_durable(at, worker, updates)
>>> batch(110.0, "w1", [(out, (0,), 1)])
>>> batch(120.0, "w2", [(out, (0,), 1), (out, (1,), 1)])
>>> ages.blame(out, (0,))
(110.0, 'w2')
>>> batch(130.0, "w1", [(out, (0,), -2)])
>>> counts = {k: c for k, c in counts.items() if c}
>>> ages.blame(out, (0,)) is None, ages.oldest(out)
(True, ((1,), 120.0, 'w2'))
>>> ages.frontier_moved([(into, (1,), 1)], 125.0)
>>> ages.moved_at(into), ages.moved_at(out)
(125.0, 100.0)
>>> ages.all_reported_after(115.0), ages.all_reported_after(125.0)
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from api.schema.parsing import Indexed
from tracker.graph import Location, Update
from tracker.timestamp import Timestamp

if TYPE_CHECKING:
    from progress_engine import ChangeBatch, MovedAt

Key = tuple[Location, Timestamp]
_KEY = itemgetter(0, 1)


def _keys(updates: Sequence[Update] | Indexed) -> list[Key]:
    """The ``(location, time)`` of each update, built in C: from an :class:`Indexed` batch's
    flat lists, or a list of core updates."""
    if not isinstance(updates, Indexed):
        return list(map(_KEY, updates))
    order = updates.order
    flat = iter(updates.times)
    times = zip(*[flat] * updates.arity, strict=True)  # the flat times, ``arity`` at a time
    return list(zip(map(order.__getitem__, updates.locations), times, strict=True))


class _EngineBirths:
    """The births of a flat dataflow on the compiled engine, kept by ``progress_engine.Births``
    on the engine's location indices (:meth:`Ages.births_in_engine`); workers are numbered here."""

    __slots__ = ("births", "index", "order", "worker_names", "workers")

    def __init__(self, index: Callable[[Location], int], order: Sequence[Location], arity: int) -> None:
        from progress_engine import Births

        self.births, self.index, self.order = Births(arity), index, order
        self.workers: dict[str | None, int] = {None: 0}
        self.worker_names: list[str | None] = [None]

    def add(self, at: float, worker: str | None, updates: Sequence[Update] | Indexed) -> None:
        number = self.workers.get(worker)
        if number is None:
            number = self.workers[worker] = len(self.worker_names)
            self.worker_names.append(worker)
        if isinstance(updates, Indexed):
            self.births.add(updates.locations, updates.times, updates.deltas, at, number)
            return
        index = self.index
        self.births.add([index(location) for location, _, _ in updates],
                        [coordinate for _, time_, _ in updates for coordinate in time_],
                        [delta for _, _, delta in updates], at, number)

    def blame(self, location: Location, time: Timestamp) -> tuple[float, str | None] | None:
        found = self.births.get(self.index(location), time)
        return None if found is None else (found[0], self.worker_names[found[1]])

    def oldest_by_location(self) -> dict[Location, tuple[Timestamp, float, str | None]]:
        order, names = self.order, self.worker_names
        return {order[index]: (time_, born, names[worker]) for index, time_, born, worker in self.births.oldest()}


@dataclass(frozen=True)
class AgesCopy:
    """The ages of one dataflow, copied on the event loop (:meth:`Ages.copy`) and read from
    another thread (the Delta thread, which keeps them with the compacted state)."""

    born: Callable[[Location, Timestamp], tuple[float, str | None] | None]
    """``(born at, last worker)`` of a pointstamp live when the copy was taken, else ``None``."""
    moved: Callable[[Location], float]
    """When a location's frontier last changed (the dataflow's registration if never)."""


def _birth_order(item: tuple[Key, tuple[float, str | None]]) -> tuple[float, str]:
    return item[1][0], item[1][1] or ""


MOVES_HELD = 4_096
"""At most about this many frontier changes wait unfolded in :meth:`Ages.frontier_moved` (a
fold of that many holds the event loop about a millisecond at most)."""


class Ages:
    """When things happened to one dataflow's locations and pointstamps (see the module doc)."""

    __slots__ = ("_births", "_born", "_last_batch", "_moved", "_moves", "_moves_changes", "_queue", "_queued",
                 "_stamps", "counts", "created", "unknown_before")

    def __init__(self, created: float, counts: Callable[[], Mapping[Key, int]] = dict) -> None:
        self.created = created
        """When a location's frontier counts as last moved if it never moved since (the
        registration, or the restart for a dataflow recovered from a compacted snapshot)."""
        self.counts = counts
        """The dataflow's non-zero counts as of its durable version (its tenant's ``counts``)."""
        self._moved: dict[Location, float] = {}
        self._moves: list[tuple[float, list[Any]]] = []
        self._moves_changes = 0
        self._stamps: MovedAt | None = None
        """When each location the compiled engine reported (by its index) last moved."""
        self._queue: list[tuple[float, str | None, Sequence[Update] | Indexed]] = []
        self._queued = 0
        self._born: dict[Key, tuple[float, str | None]] = {}
        """``(location, time) -> (born at, last worker)`` of every live pointstamp, as of the last fold."""
        self._births: _EngineBirths | None = None
        """With :meth:`births_in_engine`: every pointstamp's birth, kept by the compiled engine."""
        self.unknown_before: float | None = None
        """Set by :meth:`seed` (a restart from a compacted snapshot): what happened before it is
        not known, so a birth or a last move dated at or before it is a lower bound of the age."""
        self._last_batch: dict[str, float] = {}
        """worker -> when its last durable batch arrived (of those this process saw or replayed)."""

    def at_least(self, at: float) -> bool:
        """Whether an age counted from ``at`` (a birth, a frontier's last move) is only a lower
        bound: ``at`` is the restart that :meth:`seed` dates unknown pasts to.

        >>> ages = Ages(created=50.0)
        >>> ages.at_least(50.0), ages.seed({}, 50.0), ages.at_least(50.0), ages.at_least(51.0)
        (False, None, True, False)
        """
        return self.unknown_before is not None and at <= self.unknown_before

    def births_in_engine(self, index: Callable[[Location], int], order: Sequence[Location], arity: int) -> None:
        """Keep the births of a flat dataflow on the compiled engine in a ``progress_engine.Births``
        (before its first batch): each batch is folded in as it becomes durable, in C, with no
        Python object per update, and births are exact (a pointstamp retired and reported again
        is born again). ``index`` and ``order`` are the engine's location index and its inverse."""
        self._births = _EngineBirths(index, order, arity)

    # -- the hot path: appends only ----------------------------------------------------------

    def frontier_moved(self, changes: list[Any] | ChangeBatch, at: float) -> None:
        """A published version changed the frontier at these changes' locations at ``at``: the
        compiled engine's batch is stamped in the engine (no Python object per change); a list
        is kept as given and read when someone asks, or every 1024 versions or
        :data:`MOVES_HELD` changes, whichever comes first."""
        if not isinstance(changes, list):
            if self._stamps is None:
                from progress_engine import MovedAt  # only the compiled engine makes batches

                self._stamps = MovedAt()
            self._stamps.stamp(changes, at)
            return
        self._moves.append((at, changes))
        self._moves_changes += len(changes)
        if len(self._moves) >= 1024 or self._moves_changes >= MOVES_HELD:
            self._fold_moves()

    def _fold_moves(self) -> None:
        for at, changes in self._moves:  # oldest first: the newest time wins
            self._moved.update(dict.fromkeys([change[0] for change in changes], at))
        self._moves, self._moves_changes = [], 0

    def batch_durable(self, at: float, worker: str | None, updates: Sequence[Update] | Indexed) -> None:
        """A batch of ``worker`` received at ``at`` is durable (folded in when next read, or at
        once by the engine's ``Births``)."""
        if worker is not None:
            self._last_batch[worker] = at
        if self._births is not None:
            self._births.add(at, worker, updates)
            return
        self._queue.append((at, worker, updates))
        self._queued += len(updates)
        if self._queued > 4 * len(self._born) + 8192:
            self._fold()

    def seed(self, counts: Mapping[Key, int], at: float, births: Mapping[Key, tuple[float, str | None]] | None = None,
             moved: Mapping[Location, float] | None = None) -> None:
        """Replace every pointstamp with ``counts`` (recovered from a compacted snapshot), each
        born as ``births`` says (kept with the snapshot), and each location's last move as
        ``moved`` says. A pointstamp without a known birth (a snapshot written before births
        were kept) is born ``at`` (the restart), which :meth:`at_least` then reports as a lower
        bound; so is the last move of a location ``moved`` does not name.

        >>> from tracker.graph import Location
        >>> here = Location.target(1, 0)
        >>> ages = Ages(created=10.0, counts=lambda: {(here, (3,)): 1, (here, (4,)): 1})
        >>> ages.seed({(here, (3,)): 1, (here, (4,)): 1}, 99.0, {(here, (3,)): (20.0, "w")}, {here: 30.0})
        >>> ages.blame(here, (3,)), ages.blame(here, (4,)), ages.moved_at(here), ages.at_least(99.0)
        ((20.0, 'w'), (99.0, None), 30.0, True)
        """
        births = births or {}
        if any(key not in births for key, count in counts.items() if count > 0) or moved is None:
            self.unknown_before = at
        self._moved = dict(moved or {})
        self._moves, self._moves_changes = [], 0
        live = [(key, births.get(key, (at, None))) for key, count in counts.items() if count > 0]
        if self._births is not None:
            engine = self._births
            engine.births.clear()
            for (born, worker), same in groupby(sorted(live, key=_birth_order), key=itemgetter(1)):
                engine.add(born, worker, [(loc, time_, counts[(loc, time_)]) for (loc, time_), _ in same])
            return
        self._queue, self._queued = [], 0
        self._born = dict(live)

    def copy(self, index_of: Callable[[Location], int] | None = None) -> AgesCopy:
        """A copy of every live pointstamp's birth and every location's last move, taken now
        (on the event loop: a copy in C of the engine's, a dict copy otherwise), to read from
        another thread (``index_of``: as for :meth:`moved_all`)."""
        moved = self.moved_all(index_of)
        if self._births is not None:
            engine = self._births
            births, index, names = engine.births.copy(), engine.index, list(engine.worker_names)

            def born(location: Location, time_: Timestamp) -> tuple[float, str | None] | None:
                found = births.get(index(location), time_)
                return None if found is None else (found[0], names[found[1]])

            return AgesCopy(born, moved)
        self._fold()
        kept = dict(self._born)
        return AgesCopy(lambda location, time_: kept.get((location, time_)), moved)

    # -- readers -----------------------------------------------------------------------------

    def all_reported_after(self, at: float) -> bool:
        """Whether every worker known to have sent a batch sent one after ``at`` (and one did):
        a pointstamp born at ``at`` and live still has outlived every worker's last batch."""
        floor = self.reported_floor()
        return floor is not None and floor > at

    def reported_floor(self) -> float | None:
        """The earliest of the workers' last batches (``None`` before any worker's first): a
        pointstamp born before it has seen every worker report since."""
        return min(self._last_batch.values(), default=None)

    def _fold(self) -> None:
        queue = self._queue
        if not queue:
            return
        keyed = [(at, worker, _keys(updates)) for at, worker, updates in queue]
        first: dict[Key, float] = {}
        for at, _, keys in reversed(keyed):  # the oldest batch writes last
            first.update(dict.fromkeys(keys, at))
        last: dict[Key, str | None] = {}
        for _, worker, keys in keyed:  # the newest batch writes last
            last.update(dict.fromkeys(keys, worker))
        born, now = self._born, queue[-1][0]
        fresh: dict[Key, tuple[float, str | None]] = {}
        for key, count in self.counts().items():
            if count <= 0:
                continue
            old = born.get(key)
            if old is None:
                fresh[key] = (first.get(key, now), last.get(key))
            else:
                fresh[key] = (old[0], last.get(key, old[1]))
        self._born, self._queue, self._queued = fresh, [], 0

    def moved_at(self, location: Location, index_of: Callable[[Location], int] | None = None) -> float:
        """When the frontier at ``location`` last changed (``index_of``: the compiled engine's
        index of a location, when it reports changes by index)."""
        return self.moved_all(index_of, copy=False)(location)

    def moved_all(self, index_of: Callable[[Location], int] | None = None, *, copy: bool = True
                  ) -> Callable[[Location], float]:
        """A reader of :meth:`moved_at` for every location, over a copy taken now (unless not
        ``copy``): safe to call from a worker thread."""
        created = self.created
        self._fold_moves()
        moved = dict(self._moved) if copy else self._moved  # folded lists, and what a restart seeded
        if self._stamps is not None and index_of is not None:
            stamps = self._stamps.copy() if copy else self._stamps

            def stamped(location: Location) -> float:
                at = stamps.get(index_of(location))
                return moved.get(location, created) if at is None else at

            return stamped
        return lambda location: moved.get(location, created)

    def moved_copy(self) -> tuple[MovedAt | None, dict[Location, float]]:
        """Copies, taken now, of what :meth:`moved_all` reads: the compiled engine's stamps (by
        location index; ``None`` without the compiled engine) and, for a location without a
        stamp, its move as of a restart or a reference engine's batch (else :attr:`created`)."""
        self._fold_moves()
        return (None if self._stamps is None else self._stamps.copy()), dict(self._moved)

    def blame(self, location: Location, time: Timestamp) -> tuple[float, str | None] | None:
        """``(born at, the worker that last reported it)`` of a live pointstamp, else ``None``
        (``None`` worker: recovered from a snapshot, or an initial pointstamp)."""
        if self._births is not None:
            return self._births.blame(location, time)
        self._fold()
        return self._born.get((location, time))

    def oldest(self, location: Location) -> tuple[Timestamp, float, str | None] | None:
        """The live pointstamp at ``location`` that appeared first: ``(time, born at, worker)``."""
        return self.oldest_by_location().get(location)

    def oldest_by_location(self) -> dict[Location, tuple[Timestamp, float, str | None]]:
        """For every location holding live pointstamps, its oldest (as :meth:`oldest`)."""
        if self._births is not None:
            return self._births.oldest_by_location()
        self._fold()
        found: dict[Location, tuple[Timestamp, float, str | None]] = {}
        for (location, when), (at, worker) in self._born.items():
            if location not in found or (at, when) < found[location][1::-1]:
                found[location] = (when, at, worker)
        return found
