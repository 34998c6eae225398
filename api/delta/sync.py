"""Delta sync: durable batches to ``progress``, published changes and states to the other
tables, and retirement of write-ahead log segments Delta holds.

Guarantees: every durable batch reaches the ``progress`` table exactly once, in version order
per dataflow (after a commit whose outcome is unknown, the table is asked which versions it
holds before anything is appended again); ``frontier_changes`` is never behind the
``pointstamps`` snapshot; a log segment is deleted only once every batch in it is in
``progress``. All Delta I/O runs on the single Delta thread, never on the event loop.

Each dataflow's :class:`DeltaLag` holds what Delta has not caught up with yet; the ingest path
feeds it (:meth:`DeltaLag.batch_durable`, :meth:`DeltaLag.changes_published`) and
:class:`Syncer` drains it.

>>> lag = DeltaLag()
>>> lag.batch_durable(1, "w", 0, [], 10.0); lag.changes_published(1, "[]", 10.0)
>>> lag.unflushed, lag.uncompacted, lag.delta_version
([(1, 'w', 0, [], 10.0)], [(1, '[]', 10.0)], 0)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from api.delta import columns
from api.delta.activity import ActivityRows
from api.delta.columns import RawBatch
from api.delta.store import Layout, Store
from api.delta.tidy import Tidier
from api.durability.records import Record
from api.durability.wal import WriteAheadLog
from api.live.ages import Ages, AgesCopy
from api.live.scopes import Hosting
from api.live.state import Counts, LiveState
from api.metrics import Metrics
from api.streams.publish import Publication
from tracker.graph import Graph, Location, Update
from tracker.timestamp import Timestamp

if TYPE_CHECKING:
    from progress_engine import ChangeBatch

log = logging.getLogger("tracker.sync")

ProgressItem = tuple[int, str, int, list[Update] | RawBatch, float]
"""A durable batch not yet in ``progress``: ``(version, worker, seq, updates, received_at)``;
the updates as the request body when there are any (Arrow decodes it, see :mod:`api.delta.columns`)."""
ChangeItem = tuple[int, "str | ChangeBatch", float]
"""A published version not yet in ``frontier_changes``: ``(version, changes, at)``, the changes
as the streams' JSON or the compiled engine's batch (see :mod:`api.delta.columns`)."""


@dataclass(eq=False)
class DeltaLag:
    """What the Delta tables do not hold yet of one dataflow, and how far they got."""

    unflushed: list[ProgressItem] = field(default_factory=list)
    uncompacted: list[ChangeItem] = field(default_factory=list)
    delta_version: int = 0
    """The highest version in ``progress``."""
    compacted_version: int = -1
    """The highest version in ``frontier_changes``."""
    compacted_state: int = -1
    """The version of the last ``pointstamps``/``frontiers`` written."""
    places: columns.Places | None = None
    """The compiled engine's locations as Arrow columns, once a flush needed them."""
    graph_stored: bool = False
    """The graph tables (and, without Spark, the native ``Psi``) are written."""

    def batch_durable(self, version: int, worker: str, seq: int, updates: list[Update] | RawBatch,
                      received: float) -> None:
        """A batch is durable: queue it for ``progress``."""
        self.unflushed.append((version, worker, seq, updates, received))

    def changes_published(self, version: int, changes: str | ChangeBatch, at: float) -> None:
        """A version's changes are published: queue them for ``frontier_changes``."""
        self.uncompacted.append((version, changes, at))


class Synced(Protocol):
    """What the syncer reads of a dataflow."""

    @property
    def id(self) -> str: ...
    @property
    def graph(self) -> Graph: ...
    @property
    def live(self) -> LiveState: ...
    @property
    def publication(self) -> Publication: ...
    @property
    def lag(self) -> DeltaLag: ...
    @property
    def hosting(self) -> Hosting | None:
        """A nested dataflow's stand-ins and their real locations (``None``: flat)."""
        ...
    @property
    def ages(self) -> Ages: ...

    def counts(self) -> Counts:
        """Occurrence counts as of the published frontier's version."""
        ...


class Syncer:
    """Copies what :class:`DeltaLag` holds to the Delta tables, on the Delta thread."""

    def __init__(self, store: Store | None, pool: Executor, wal: WriteAheadLog, metrics: Metrics,
                 dataflows: Mapping[str, Synced], header: Callable[[], list[Record | bytes]], *,
                 segment_bytes: int, tidier: Tidier | None = None) -> None:
        """``dataflows`` is the live registry (read at every pass); ``header()`` gives the
        records a new log segment starts with."""
        self.store = store
        self.pool = pool
        self.wal = wal
        self.metrics = metrics
        self.dataflows = dataflows
        self.header = header
        self.segment_bytes = segment_bytes
        self.tidier = tidier
        self._uncertain = False  # the last progress commit failed: its outcome is unknown
        self.failing_since: float | None = None
        """When the Delta writes started failing (POSIX time), ``None`` while they succeed."""
        self.last_error: str | None = None
        """The last failed Delta write's error, while they fail."""
        self._rotation: tuple[int, dict[str, int]] | None = None
        self._segment_seen: int | None = None  # the log's segment at the last pass
        self.activity = ActivityRows()
        """The programs' statistics waiting for ``operator_stats`` and ``channel_stats``, appended
        after the progress of each flush."""

    async def run(self, stop: asyncio.Event, *, flush_seconds: float, compact_seconds: float,
                  tidy_seconds: float) -> None:
        """Every ``flush_seconds``: :meth:`flush`; every ``compact_seconds``: :meth:`compact`;
        then log rotation and one tidy step. When ``stop`` is set, one last flush and
        compaction, then return (never cancelled mid-commit, so a commit's outcome is always
        known)."""
        last_compaction = last_tidy = time.monotonic()
        untidy: list[tuple[str, str, list[str]]] = []
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), flush_seconds)
            try:
                await self.flush()
                await self.activity.flush(self.store, self.pool)
                if stop.is_set() or time.monotonic() - last_compaction >= compact_seconds:
                    last_compaction = time.monotonic()
                    await self.compact()
                if not stop.is_set():
                    await self.rotate()
                if self.tidier is not None:
                    if not untidy and tidy_seconds > 0 and time.monotonic() - last_tidy >= tidy_seconds:
                        last_tidy = time.monotonic()
                        untidy = await self.tidier.next_pass(sorted(self.dataflows))
                    if untidy and not stop.is_set():  # one small step per pass, so flushes keep their pace
                        await self.tidier.step(*untidy.pop(0))
                self.failing_since = self.last_error = None
            except Exception as error:
                self.metrics.delta_errors.inc()
                if self.failing_since is None:
                    self.failing_since = time.time()
                self.last_error = f"{type(error).__name__}: {error}"[:500]
                log.exception("delta flush failed; will retry")
            self.measure_lag()

    def measure_lag(self) -> int:
        """Set (and return) ``tracker_delta_lag_versions``: durable versions not yet in
        ``progress``, summed over the dataflows; measured every pass, failed ones included."""
        lag = sum(max(d.live.durable_version - d.lag.delta_version, 0) for d in self.dataflows.values())
        self.metrics.flush_lag.set(lag)
        return lag

    async def flush(self) -> None:
        """Append every durable, unflushed batch to ``progress`` in one Delta commit.

        After a failed commit its outcome is unknown (the commit may have landed before the
        error), so the next attempt first asks the table which versions it holds and drops
        those: appending a batch twice would make recovery apply it twice.

        Raises:
            Exception: the commit failed; the batches are queued again, in order.
        """
        loop = asyncio.get_running_loop()
        store = self.store
        if store is not None and self._uncertain:
            for dataflow in list(self.dataflows.values()):
                lag = dataflow.lag
                if lag.unflushed:
                    held = await loop.run_in_executor(self.pool, store.max_progress_version, dataflow.id)
                    lag.unflushed = [item for item in lag.unflushed if item[0] > held]
                    lag.delta_version = max(lag.delta_version, held)
            self._uncertain = False
        taken: list[tuple[DeltaLag, list[ProgressItem]]] = []
        rows: list[tuple[str, Layout, int, str, int, list[Update] | RawBatch, float]] = []
        for dataflow in list(self.dataflows.values()):
            lag = dataflow.lag
            if not lag.unflushed:
                continue
            batch, lag.unflushed = lag.unflushed, []
            if store is None:
                continue
            taken.append((lag, batch))
            layout: Layout = dataflow.graph if dataflow.hosting is None else dataflow.hosting
            rows.extend((dataflow.id, layout, *item) for item in batch)
        if not rows or store is None:
            return
        try:
            await loop.run_in_executor(self.pool, store.append_progress, rows)
        except BaseException:
            for lag, batch in taken:  # put them back, in order, before anything newer
                lag.unflushed[:0] = batch
            self._uncertain = True
            raise
        for lag, batch in taken:
            lag.delta_version = max(lag.delta_version, max(item[0] for item in batch))
        self.measure_lag()

    async def compact(self) -> None:
        """Append the new ``frontier_changes`` of every changed dataflow, then write the
        consolidated ``pointstamps`` and current ``frontiers`` of all of them (each as of its
        published version): three commits in all, whatever the number of dataflows.

        The changes go first: a crash between the commits then leaves ``frontier_changes``
        ahead of the ``pointstamps`` snapshot, never behind it. Recovery starts from the
        snapshot and skips replayed changes the table already holds; the other order would lose
        the changes between the old and the new snapshot for good.
        """
        store = self.store
        if store is None:
            return
        loop = asyncio.get_running_loop()
        # A dataflow whose lane is propagating waits for the next pass: its counts cannot be
        # read as of its published version without waiting, and the event loop never waits.
        due = [d for d in self.dataflows.values() if d.publication.frontier_version >= 0 and not d.live.busy() and (
            d.lag.uncompacted or d.lag.compacted_state != d.publication.frontier_version)]
        # Read on the loop, so that counts, frontiers, ages and changes agree on a version.
        states = [Snapshot(d.id, d.publication.frontier_version, d.counts(),
                           {loc: sorted(ts) for loc, ts in d.publication.published.items() if ts},
                           d.ages.copy(d.live.index_of()), d.hosting) for d in due]
        changes: list[tuple[Synced, ChangeItem]] = []
        for dataflow in due:
            changes.extend((dataflow, item) for item in dataflow.lag.uncompacted)
            dataflow.lag.uncompacted = []
        if changes:
            rows: list[columns.ChangeItem] = [
                (d.id, version, encoded if isinstance(encoded, str) else (encoded, _places(d)), at)
                for d, (version, encoded, at) in changes]
            try:
                await loop.run_in_executor(self.pool, store.append_changes, rows)
            except Exception:
                for dataflow, item in reversed(changes):
                    dataflow.lag.uncompacted.insert(0, item)
                raise
            for dataflow, (version, _, _) in changes:
                dataflow.lag.compacted_version = max(dataflow.lag.compacted_version, version)
        if states:
            await loop.run_in_executor(self.pool, _write_states, store, states)
            for dataflow, snapshot in zip(due, states, strict=True):
                dataflow.lag.compacted_state = snapshot.version

    async def rotate(self) -> None:
        """Start a new log segment when the current one is large and has grown since its header
        by at least the header's size, and delete old segments once every batch in them is in
        the Delta ``progress`` table *and* in the ``pointstamps`` snapshot: then either table
        alone, with the log, still rebuilds every dataflow (the new segment's header holds the
        workers' positions). The growth condition means an idle log never rotates, and a
        rotation never writes more than the records since the last one did (a header larger
        than a segment, after the segment size was lowered, rotated every pass, idle)."""
        if self.store is None:
            return
        wal = self.wal
        if self._rotation is None:
            # At the first pass, older segments are those a burst of registrations made before
            # it (on a busy machine the whole burst can come first) or a restart found.
            older = self._segment_seen is None and any(number < wal.segment for number, _ in wal.segments())
            if older or self._segment_seen not in (None, wal.segment):
                # The log rotated itself (a registration found its high-water marks block full):
                # its older segments, each starting with every registration, go under the same
                # condition as after a rotation of ours (versions read now are at least those at
                # the rotation). Kept, a burst of 2,500 registrations left 9 segments, twice the
                # registrations for a restart to decode.
                self._rotation = (wal.segment, {d.id: d.live.version for d in self.dataflows.values()})
            self._segment_seen = wal.segment
        if self._rotation is not None:
            segment, versions = self._rotation
            if all(self.dataflows[d].lag.delta_version >= v and self.dataflows[d].lag.compacted_state >= v
                   for d, v in versions.items() if d in self.dataflows):
                removed = wal.delete_segments_before(segment)
                log.info("wal segments removed", extra={"removed": removed, "segment": segment})
                self._rotation = None
            return
        try:
            size = os.path.getsize(wal.path(wal.segment))
        except OSError:
            return
        if size < self.segment_bytes or size - wal.header_end < wal.header_end:
            return
        versions = {d.id: d.live.version for d in self.dataflows.values()}
        segment = await wal.rotate(self.header)
        self._rotation = (segment, versions)
        log.info("wal rotated", extra={"segment": segment})


def _places(dataflow: Synced) -> columns.Places:
    """The Arrow columns of a flat dataflow's compiled engine locations, built at its first flush."""
    if dataflow.lag.places is None:
        dataflow.lag.places = columns.Places.of(dataflow.live.tracker.locations)  # type: ignore[attr-defined]
    return dataflow.lag.places


@dataclass(frozen=True)
class Snapshot:
    """One dataflow's state as of its published ``version``, read on the event loop for
    ``pointstamps`` and ``frontiers``: counts, frontiers and ages on its tracker's locations."""

    id: str
    version: int
    counts: Counts
    frontiers: dict[Location, list[Timestamp]]
    ages: AgesCopy
    hosting: Hosting | None


def _write_states(store: Store, snapshots: list[Snapshot]) -> None:
    """Write ``snapshots`` (on the Delta thread): each pointstamp with its birth and each
    frontier with its last move, on the real (scoped) locations of a nested dataflow."""
    states: dict[str, tuple[int, Any, Any]] = {}
    ages: dict[str, tuple[Any, Any]] = {}
    for snapshot in snapshots:
        born, moved = snapshot.ages.born, snapshot.ages.moved
        births = {key: found for key in snapshot.counts if (found := born(*key)) is not None}
        since = {location: moved(location) for location in snapshot.frontiers}
        hosting = snapshot.hosting
        if hosting is None:
            states[snapshot.id] = (snapshot.version, snapshot.counts, snapshot.frontiers)
            ages[snapshot.id] = (births, since)
            continue
        scoped = hosting.scoped
        states[snapshot.id] = (snapshot.version, hosting.scoped_counts(snapshot.counts),
                               hosting.scoped_frontiers(snapshot.frontiers))
        ages[snapshot.id] = ({(scoped(loc), t): found for (loc, t), found in births.items()},
                             {scoped(loc): at for loc, at in since.items()})
    store.write_states(states, ages)
