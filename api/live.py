"""One dataflow's live state: its frontier engine, versions and the workers' sequence numbers.

Guarantees: batches of one worker are applied in ``seq`` order exactly once (a repeated ``seq``
is answered as a duplicate, a skipped one raises :class:`SequenceGap`), each applied batch gets
the next version, and :attr:`LiveState.durable_version` never passes a version whose log record
is not durable. Nothing here awaits: the caller (:mod:`api.ingest`) orders, logs and applies a
batch with no ``await`` in between, which on the single-threaded event loop makes a batch
atomic and the batches of one dataflow totally ordered without a lock.

A dataflow whose batches change many frontier entries (:data:`OFF_LOOP_CHANGES`) has them
applied by the compiled engine's thread instead, without the GIL, while the event loop serves
other dataflows: they are handed over in the same turn, in order, and every read of the
engine's state (:meth:`LiveState.counts`, :meth:`LiveState.frontier_copy_at`, the tracker's
own reads) sees all of them, because the engine applies each batch under its lock and reads
wait for the batches handed over first (:meth:`LiveState.settle`).

>>> from tracker.graph import Edge, Graph, Location, Node
>>> from tracker.reachability import Tracker
>>> graph = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
>>> live = LiveState(Tracker(graph))
>>> live.admit("w", 0), live.admit("w", 0)
(1, None)
>>> live.admit("w", 5)
Traceback (most recent call last):
...
api.live.SequenceGap: expected seq 1
>>> live.duplicate_version("w", 0)
1
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from api.parsing import Indexed
from tracker.engine import FrontierEngine
from tracker.graph import GraphError, Location, Update
from tracker.reachability import FrontierChange
from tracker.timestamp import Timestamp

RECENT_BATCHES = 10_000
"""``(worker, seq) -> version`` pairs remembered, so that a duplicate gets the exact version
that applied it while it is recent (older duplicates get the worker's latest version)."""

if TYPE_CHECKING:
    from progress_engine import ChangeBatch, Frontiers

Counts = dict[tuple[Location, Timestamp], int]

OFF_LOOP_CHANGES = 4096
"""After a batch that changed at least this many frontier entries, a dataflow's next batches
are applied by :data:`_APPLIER` until one changes fewer: a batch on an 8,000-operator chain
(32,000 changes) held the event loop 1.3 ms in the engine. Smaller batches stay on the loop:
handing one to a thread and back costs more than applying it."""

_APPLIER = ThreadPoolExecutor(1, thread_name_prefix="engine-apply")
"""One thread for every dataflow: batches are applied in the order handed over, so each
dataflow's stay in order (and a batch applied on the loop waits for its dataflow's before it:
:meth:`LiveState.settle`)."""


class SequenceGap(Exception):
    """A batch skipped a sequence number; ``expected`` is the one the worker must send."""

    def __init__(self, expected: int) -> None:
        super().__init__(f"expected seq {expected}")
        self.expected = expected


@dataclass(frozen=True)
class Pending:
    """An applied batch whose log record is not durable yet."""

    version: int
    worker: str
    seq: int
    updates: list[Update] | Indexed
    received: float


@dataclass(eq=False)
class LiveState:
    """The tracker's state of one dataflow, as applied (which may run ahead of durable)."""

    tracker: FrontierEngine
    version: int = 0
    durable_version: int = 0
    workers: dict[str, tuple[int, int]] = field(default_factory=dict)
    """worker -> ``(last seq, the version that applied it)``, admitted batches included"""
    durable_workers: dict[str, tuple[int, int]] = field(default_factory=dict)
    """The same as of :attr:`durable_version`: what the workers were acknowledged (a batch
    whose log record never became durable does not use up its seq here)."""
    last_batch_at: float | None = None
    """When the last applied batch arrived (POSIX seconds), ``None`` before the first."""
    _recent: dict[tuple[str, int], int] = field(default_factory=dict)
    _pending: dict[int, Pending] = field(default_factory=dict)
    _handed: Future[ChangeBatch] | None = None
    """The last batch handed to :data:`_APPLIER` (done once it and every one before it are)."""
    _big: bool = False
    """The last batch applied changed at least :data:`OFF_LOOP_CHANGES` frontier entries."""
    native: Any = field(init=False, default=None)
    """The compiled ``progress_engine.Engine`` behind a ``CompiledTracker`` (``--engine native``),
    applied directly: flat integer batches in, a ``ChangeBatch`` out."""

    def __post_init__(self) -> None:
        self.native = getattr(self.tracker, "engine", None)

    def _apply(self, updates: list[Update] | Indexed) -> list[FrontierChange] | ChangeBatch:
        native = self.native
        if native is None:
            return self.tracker.apply(updates, validated=True)
        if isinstance(updates, Indexed):
            return native.apply_indexed(updates.locations, updates.times, updates.deltas)
        return native.apply(updates)

    def admit(self, worker: str, seq: int) -> int | None:
        """The version a new batch ``(worker, seq)`` gets, or ``None`` for a duplicate.

        Raises:
            SequenceGap: ``seq`` skips one; nothing changed.
        """
        last = self.workers.get(worker)
        expected = 0 if last is None else last[0] + 1
        if seq < expected:
            return None
        if seq > expected:
            raise SequenceGap(expected)
        self.version += 1
        self.workers[worker] = (seq, self.version)
        self._remember(worker, seq, self.version)
        return self.version

    def duplicate_version(self, worker: str, seq: int) -> int:
        """A version whose state contains the already applied batch ``(worker, seq)``: the one
        that applied it if still remembered, else the worker's latest."""
        last = self.workers.get(worker)
        return self._recent.get((worker, seq), last[1] if last is not None else self.version)

    def apply(self, pending: Pending, then: Callable[[ChangeBatch], None] | None = None
              ) -> list[FrontierChange] | ChangeBatch | Future[ChangeBatch]:
        """Apply an admitted, validated batch whose log record is on its way to disk: its
        changes, or, for a dataflow of big batches, a future of them (:meth:`changes_of`).
        ``then`` is called with a compiled engine's changes as soon as they exist, in whichever
        thread applied them."""
        self._pending[pending.version] = pending
        self.last_batch_at = pending.received
        updates = pending.updates
        if self.native is not None and isinstance(updates, Indexed) and (self._big or self._handed is not None):
            self._handed = _APPLIER.submit(self._apply_detached, updates, then)
            return self._handed
        changes = self._apply(updates)
        if not isinstance(changes, list):
            self._big = len(changes) >= OFF_LOOP_CHANGES
            if then is not None:
                then(changes)
        return changes

    def _apply_detached(self, updates: Indexed, then: Callable[[ChangeBatch], None] | None) -> ChangeBatch:
        changes: ChangeBatch = self.native.apply_indexed(updates.locations, updates.times, updates.deltas, detach=True)
        self._big = len(changes) >= OFF_LOOP_CHANGES
        if then is not None:
            then(changes)
        return changes

    def changes_of(self, applied: list[FrontierChange] | ChangeBatch | Future[ChangeBatch]
                   ) -> list[FrontierChange] | ChangeBatch:
        """The changes :meth:`apply` returned, waiting (without the GIL) for a batch still in the
        engine's thread."""
        if not isinstance(applied, Future):
            return applied
        changes = applied.result()
        if applied is self._handed:  # nothing handed over after it: the next batch may stay on the loop
            self._handed = None
        return changes

    def settle(self) -> None:
        """Wait until every batch handed to the engine's thread is applied (at once if none is)."""
        if self._handed is not None:
            self.changes_of(self._handed)

    def made_durable(self, version: int) -> None:
        """The log record of ``version`` is durable (called in version order)."""
        self.durable_version = version
        pending = self._pending.pop(version, None)
        if pending is not None:
            self.durable_workers[pending.worker] = (pending.seq, version)

    def replay(self, version: int, worker: str, seq: int, updates: list[Update]
               ) -> list[FrontierChange] | ChangeBatch:
        """Apply a recovered batch (already durable) without logging it again.

        Raises:
            GraphError: ``version`` does not follow the current version.
        """
        if version != self.version + 1:
            raise GraphError(f"recovered version {version} does not follow {self.version}")
        changes = self._apply(updates)
        self.version = self.durable_version = version
        self.workers[worker] = self.durable_workers[worker] = (seq, version)
        self._remember(worker, seq, version)
        return changes

    def restore_positions(self, positions: dict[str, tuple[int, int]]) -> None:
        """Recovery: set every worker's durable position (no batch is in flight)."""
        self.workers = dict(positions)
        self.durable_workers = dict(positions)

    def frontier_copy_at(self, version: int) -> Frontiers | None:
        """A copy of the compiled engine's frontiers if it is exactly at ``version`` (no batch
        applied beyond it), else ``None``."""
        if self.native is None or version != self.version:
            return None
        self.settle()
        copy: Frontiers = self.native.frontier_copy()
        return copy

    def inflight(self) -> list[Pending]:
        """Applied batches whose log record is not durable yet, oldest first."""
        return list(self._pending.values())

    def counts(self, later: Iterable[Iterable[Update]] = ()) -> Counts:
        """Occurrence counts as of the durable version: the tracker's counts with in-flight
        batches (and ``later`` batches, applied but not yet reflected in the frontier) undone."""
        self.settle()  # the engine's counts include every admitted batch, undone below
        counts = self.tracker.pointstamps()
        for updates in [*(p.updates for p in self._pending.values()), *later]:
            for loc, t, d in updates:
                key = (loc, t)
                counts[key] = counts.get(key, 0) - d
        return {k: c for k, c in counts.items() if c != 0}

    def _remember(self, worker: str, seq: int, version: int) -> None:
        self._recent[(worker, seq)] = version
        if len(self._recent) > RECENT_BATCHES:
            del self._recent[next(iter(self._recent))]

