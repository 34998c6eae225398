"""One dataflow's live state: its frontier engine, versions and the workers' sequence numbers.

Guarantees: batches of one worker are applied in ``seq`` order exactly once (a repeated ``seq``
is answered as a duplicate, a skipped one raises :class:`SequenceGap`), each applied batch gets
the next version, and :attr:`LiveState.durable_version` never passes a version whose log record
is not durable. An update that moves a frontier backwards (a pointstamp at a time its
location's frontier did not allow before the batch: nothing held could have produced it) is
applied and counted in :attr:`LiveState.regressions`, which makes the dataflow's state
``violation`` (:mod:`api.live.lifecycle`).

Nothing here awaits: the caller (:mod:`api.host.ingest`) orders, logs and applies a batch with
no ``await`` in between, which on the single-threaded event loop makes a batch
atomic and the batches of one dataflow totally ordered without a lock. A costly dataflow's
batches are ordered the same way and propagated by its :class:`~api.live.lane.Lane` in that
order (:meth:`LiveState.uses_lane`); what reads the engine reads it between two of them.

>>> from tracker.graph import Edge, Graph, Location, Node
>>> from tracker.reachability import Tracker
>>> graph = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
>>> live = LiveState(Tracker(graph))
>>> live.admit("w", 0), live.admit("w", 0)
(1, None)
>>> live.admit("w", 5)
Traceback (most recent call last):
...
api.live.state.SequenceGap: expected seq 1
>>> live.duplicate_version("w", 0)
1
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from api.live.cost import LANE_UNITS
from api.live.counts import CountsOnly
from api.live.lane import LANE_SECONDS, Lane
from api.schema.parsing import Indexed
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
Propagated = tuple["list[FrontierChange] | ChangeBatch", list[int]]
"""A propagated batch: its frontier changes, and its updates that moved a frontier backwards."""
MAX_REGRESSIONS = 20
"""Regressions kept (with their location, time and version) per dataflow; all are counted."""


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
    regressions: list[tuple[Location, Timestamp, int]] = field(default_factory=list)
    """The first updates that moved a frontier backwards, ``(location, time, version)``
    (since the service started: replayed batches are checked again, a snapshot's are not)."""
    regression_count: int = 0
    _recent: dict[tuple[str, int], int] = field(default_factory=dict)
    _pending: dict[int, Pending] = field(default_factory=dict)
    native: Any = field(init=False, default=None)
    """The compiled ``progress_engine.Engine`` behind a ``CompiledTracker`` (``--engine native``),
    applied directly: flat integer batches in, a ``ChangeBatch`` out."""
    lane_seconds: float = LANE_SECONDS
    """A batch that takes longer than this on the event loop sends the next ones to the lane."""
    lane_backlog: int = 256
    """Batches that may wait for the lane; beyond, new ones are refused (``TRACKER_LANE_BACKLOG``)."""
    lane: Lane | None = field(init=False, default=None)
    """The thread propagating this dataflow's batches while they are costly (see
    :mod:`api.live.lane`); ``None`` until a batch was."""
    _in_lane: bool = field(init=False, default=False)
    _counts_read: Counts = field(init=False, default_factory=dict)
    lane_batches: int = field(init=False, default=0)
    """Batches given to the lane since the service started."""
    counts_version: int = field(init=False, default=-1)
    """The durable version of the counts :meth:`counts` last returned (-1 before any)."""
    last_in_lane: Any = field(init=False, default=None)
    """The caller's future of the last batch given to the lane (a duplicate's answer waits for
    it: what it duplicates may still be propagating)."""

    def __post_init__(self) -> None:
        self.native = getattr(self.tracker, "engine", None)

    def index_of(self) -> Callable[[Location], int] | None:
        """The compiled engine's index of a location (it reports changed locations by index),
        or ``None`` without the compiled engine."""
        return None if self.native is None else self.native.index

    def propagate(self, updates: list[Update] | Indexed, *, in_lane: bool = True) -> Propagated:
        """Apply one validated batch to the engine: its changes, and the indices of its updates
        that moved a frontier backwards (checked against the frontier before the batch). In the
        lane the compiled engine runs without the GIL."""
        native = self.native
        if native is None:
            tracker = self.tracker
            backwards: list[int] = [] if isinstance(tracker, CountsOnly) else [  # Spark's frontier: checked nowhere
                i for i, (loc, t, d) in enumerate(updates) if d > 0 and tracker.can_notify(loc, t)]
            return tracker.apply(updates, validated=True), backwards
        if isinstance(updates, Indexed):
            changes: ChangeBatch = native.apply_indexed(updates.locations, updates.times, updates.deltas,
                                                        release_gil=in_lane)
        else:
            changes = native.apply(updates)
        return changes, changes.regressions

    def _apply(self, updates: list[Update] | Indexed, version: int) -> list[FrontierChange] | ChangeBatch:
        started = time.perf_counter()
        changes, backwards = self.propagate(updates, in_lane=False)
        took = time.perf_counter() - started
        if took > self.lane_seconds:
            self._enter_lane(version, took)
        self._regressed(version, updates, backwards)
        return changes

    def _enter_lane(self, version: int, took: float) -> None:
        if self.lane is None:
            self.lane = Lane(self.propagate, version)
        self.lane.applied_through = version  # the lane is idle: the engine holds this batch's version
        self.lane.last_seconds = took  # what decides when to leave, until the lane's first batch
        self._in_lane = True

    @property
    def in_lane(self) -> bool:
        """Whether batches propagate in the lane now (see :meth:`uses_lane`)."""
        return self._in_lane

    def uses_lane(self, cost: float = 0.0) -> bool:
        """Whether the admitted batch, estimated at ``cost`` units (:mod:`api.live.cost`), goes to
        :meth:`apply_in_lane` (else :meth:`apply`): yes if its cost is over
        :data:`~api.live.cost.LANE_UNITS`, whatever came before, and from the batch after one
        that took over :data:`~api.live.lane.LANE_SECONDS` on the event loop, until the lane is
        idle and its last batch was cheap."""
        if cost > LANE_UNITS and not self._in_lane:
            self._enter_lane(self.version - 1, self.lane_seconds)  # every batch before this one is applied
        lane, last = self.lane, self.last_in_lane
        # Left only once the lane's last batch is published, not just propagated: a batch on the
        # event loop must not publish before it.
        cheap = lane is not None and lane.last_seconds < self.lane_seconds / 4 and cost <= LANE_UNITS
        if self._in_lane and cheap and (last is None or last.done()):
            self._in_lane = False
        return self._in_lane

    def apply_in_lane(self, pending: Pending, then: Callable[[Propagated], None]) -> Future[Propagated]:
        """Apply an admitted, validated batch (whose log record is on its way to disk) in the
        lane, after the batches before it; ``then(result)`` runs on the lane's thread. Call
        :meth:`lane_applied` with the result, on the event loop, before publishing its changes."""
        assert self.lane is not None
        self._pending[pending.version] = pending
        self.last_batch_at = pending.received
        self.lane_batches += 1
        return self.lane.submit(pending.version, pending.updates, then)

    def lane_applied(self, pending: Pending, result: Propagated) -> bool:
        """A batch of the lane is applied: count the updates that moved a frontier backwards;
        whether they are the dataflow's first."""
        first = not self.regression_count
        self._regressed(pending.version, pending.updates, result[1])
        return first and bool(self.regression_count)

    def busy(self) -> int:
        """Batches waiting for the lane (0 out of it)."""
        return self.lane.queued if self.lane is not None and self._in_lane else 0

    def _regressed(self, version: int, updates: list[Update] | Indexed, indices: list[int]) -> None:
        if not indices:
            return
        self.regression_count += len(indices)
        for i in indices[:MAX_REGRESSIONS - len(self.regressions)]:
            if isinstance(updates, Indexed):
                arity = updates.arity
                found = (updates.order[updates.locations[i]], tuple(updates.times[i * arity:(i + 1) * arity]))
            else:
                found = updates[i][:2]
            self.regressions.append((*found, version))

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

    def apply(self, pending: Pending) -> list[FrontierChange] | ChangeBatch:
        """Apply an admitted, validated batch whose log record is on its way to disk."""
        self._pending[pending.version] = pending
        self.last_batch_at = pending.received
        return self._apply(pending.updates, pending.version)

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
        changes = self._apply(updates, version)
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
        applied beyond it), else ``None``; ``None`` too while the lane propagates (never waits)."""
        if self.native is None:
            return None
        if self.lane is None:
            return self.native.frontier_copy() if version == self.version else None
        with self.lane.held() as applied:
            if applied is None:
                return None
            return self.native.frontier_copy() if version == (applied if self._in_lane else self.version) else None

    def inflight(self) -> list[Pending]:
        """Applied batches whose log record is not durable yet, oldest first."""
        return list(self._pending.values())

    def counts(self, later: Iterable[Iterable[Update]] = ()) -> Counts:
        """Occurrence counts as of the durable version: the tracker's counts with in-flight
        batches (and ``later`` batches, applied but not yet reflected in the frontier) undone.
        Never waits: while the lane propagates, the counts last read (as of
        :attr:`counts_version`, an earlier durable version)."""
        if self.lane is not None and self._in_lane:  # between two of the lane's batches
            with self.lane.held() as applied:
                if applied is None:
                    return dict(self._counts_read)
                counts = self.tracker.pointstamps()
                pending = [p.updates for p in self._pending.values() if p.version <= applied]
        else:
            counts = self.tracker.pointstamps()
            pending = [p.updates for p in self._pending.values()]
        for updates in [*pending, *later]:
            for loc, t, d in updates:
                key = (loc, t)
                counts[key] = counts.get(key, 0) - d
        found = {k: c for k, c in counts.items() if c != 0}
        self._counts_read, self.counts_version = found, self.durable_version
        return found

    def _remember(self, worker: str, seq: int, version: int) -> None:
        self._recent[(worker, seq)] = version
        if len(self._recent) > RECENT_BATCHES:
            del self._recent[next(iter(self._recent))]

