"""One dataflow's live state: the native tracker, versions, worker sequence numbers, the
published frontier, its history and its subscribers.

The hot path is :meth:`Dataflow.submit`. It is synchronous on purpose: validation, the sequence
check, ``Tracker.apply`` and the enqueue into the write-ahead log happen with no ``await`` in
between, so on the single-threaded event loop a batch is atomic and batches of one dataflow are
totally ordered without a lock. The caller then awaits the returned future (the group commit);
only once the record is durable does :meth:`_publish` run (from the log's commit task, in log
order): it updates the *published* frontier, appends to the history and feeds subscribers.
Streams and frontier queries read the published state, so nobody ever sees a version that a
crash could take back.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from api.columns import RawBatch
from api.streams import Subscriber
from api.wal import LogFailed
from tracker.graph import Graph, GraphError, Location, Update
from tracker.reachability import FrontierChange, Tracker
from tracker.timestamp import Timestamp

RECENT_BATCHES = 10_000  # (worker, seq) -> version remembered for exact duplicate answers
_KIND_CODE = {"source": "s", "target": "t"}
_CODE_KIND = {"s": "source", "t": "target"}


class SequenceGap(Exception):
    """A batch skipped a sequence number; ``expected`` is the one the worker must send."""

    def __init__(self, expected: int) -> None:
        super().__init__(f"expected seq {expected}")
        self.expected = expected


@dataclass
class Outcome:
    """What :meth:`Dataflow.submit` did; ``durable`` resolves once the answer may be sent."""

    applied: bool
    duplicate: bool
    version: int
    durable: Any  # asyncio.Future[None]
    updates: int = 0


def encode_updates(updates: Iterable[Update]) -> list[list[Any]]:
    """Compact log form of updates: ``[node, port, "s"|"t", time, delta]``."""
    return [[loc.node, loc.port, _KIND_CODE[loc.kind], list(t), d] for loc, t, d in updates]


def decode_updates(rows: Iterable[list[Any]]) -> list[Update]:
    """Inverse of :func:`encode_updates`."""
    return [(Location(n, p, _CODE_KIND[k]), tuple(t), d) for n, p, k, t, d in rows]


_PREFIX: dict[Location, str] = {}  # '{"location":{...},"time":[' per location, shared by all dataflows
_TAIL = {1: '],"diff":1}', -1: '],"diff":-1}'}


def changes_json(changes: list[FrontierChange]) -> str:
    """The JSON array of a change list, built once and shared by every subscriber.

    Hand-assembled from cached per-location prefixes (a frontier change's diff is always +1 or
    -1): this runs for every published version, and ``json.dumps`` over dicts was a third of
    the end-to-end latency.

    >>> changes_json([FrontierChange(Location.target(3, 0), (7,), 1)])
    '[{"location":{"node":3,"port":0,"kind":"target"},"time":[7],"diff":1}]'
    """
    prefix, tail = _PREFIX, _TAIL
    try:
        if changes and len(changes[0].time) == 1:  # one arity per dataflow: the common case, specialised
            return "[" + ",".join([f"{prefix[loc]}{when[0]}{tail[diff]}" for loc, when, diff in changes]) + "]"
        return "[" + ",".join([f"{prefix[loc]}{','.join(map(str, when))}{tail[diff]}"
                               for loc, when, diff in changes]) + "]"
    except KeyError:  # a location seen for the first time (or, defensively, an unusual diff)
        for loc, _, _ in changes:
            if loc not in prefix:
                prefix[loc] = f'{{"location":{{"node":{loc.node},"port":{loc.port},"kind":"{loc.kind}"}},"time":['
        return "[" + ",".join([f'{prefix[loc]}{",".join(map(str, when))}],"diff":{diff}}}'
                               for loc, when, diff in changes]) + "]"


@dataclass
class Dataflow:
    """A registered dataflow and everything the service keeps about it in memory."""

    id: str
    name: str
    graph: Graph
    registration: dict[str, Any]
    token_hash: str
    created_at: str
    tracker: Tracker
    history_limit: int = 100_000
    version: int = 0
    durable_version: int = 0
    frontier_version: int = 0  # the version the published frontier is exact for (-1: none yet)
    engine_mode: str = "native"  # "spark": frontiers come from Spark micro-batches (api.engine)
    spark_queue: list[tuple[int, list[Update]]] = field(default_factory=list)
    engine: Any = None
    delta_version: int = 0
    workers: dict[str, tuple[int, int]] = field(default_factory=dict)
    _published: dict[Location, set[Timestamp]] = field(default_factory=dict)
    _unfolded: list[list[FrontierChange]] = field(default_factory=list)
    history: deque[tuple[int, int, str]] = field(default_factory=deque)  # (version, changes, JSON)
    history_changes: int = 0
    history_floor: int = 0
    subscribers: set[Subscriber] = field(default_factory=set)
    unflushed: list[tuple[int, str, int, list[Update] | RawBatch, float]] = field(default_factory=list)
    uncompacted: list[tuple[int, str, float]] = field(default_factory=list)  # (version, encoded changes, at)
    compacted_version: int = -1
    compacted_state: int = -1
    recent: dict[tuple[str, int], int] = field(default_factory=dict)
    pending: dict[int, tuple[int, str, int, list[Update], float]] = field(default_factory=dict)
    spark_check: str = "pending"
    spark_detail: str | None = None
    audit: dict[str, Any] | None = None
    ready: bool = False
    graph_stored: bool = False  # the graph tables (and, without Spark, the native Psi) are in Delta
    on_publish: Callable[[Dataflow, int, list[FrontierChange]], None] | None = None

    @property
    def published(self) -> dict[Location, set[Timestamp]]:
        """The frontier as of ``frontier_version``: location -> set of times."""
        self._fold()
        return self._published

    @published.setter
    def published(self, frontier: dict[Location, set[Timestamp]]) -> None:
        self._published = frontier
        self._unfolded = []

    def _fold(self) -> None:
        """Fold published versions' changes into :attr:`published`.

        Publishing only queues a version's changes and schedules this for right after the
        subscribers' sends (it runs on the event loop's next turn), which keeps ~2 set operations
        per change off the latency path without keeping change lists alive: thousands of them
        made the collector's full passes take tens of milliseconds.
        """
        if not self._unfolded:
            return
        published = self._published
        for changes in self._unfolded:
            for location, when, diff in changes:
                times = published.get(location)
                if times is None:
                    times = published[location] = set()
                if diff > 0:
                    times.add(when)
                else:
                    times.discard(when)
        self._unfolded = []

    def reset_published(self) -> None:
        """Take the published frontier from the tracker (after registration or recovery); with
        the Spark engine, queue the current counts as Spark's first micro-batch instead."""
        self.durable_version = self.version
        if self.engine_mode == "spark":
            self.published = {loc: set() for loc in self.graph.locations()}
            self.frontier_version = -1
            self.history_floor = self.version
            self.spark_queue = [(self.version, [(loc, t, c) for (loc, t), c in self.tracker.pointstamps().items()])]
            return
        self.published = {loc: set(ts) for loc, ts in self.tracker.frontiers().items()}
        self.frontier_version = self.version

    # -- the hot path ------------------------------------------------------------------------

    def submit(self, worker: str, seq: int, updates: list[Update], wal: Any, raw: bytes) -> Outcome:
        """Order and apply one batch (already validated against the graph, see
        :mod:`api.parsing`) and enqueue its log record, the request body ``raw`` itself.

        Raises :class:`SequenceGap`. A duplicate is acknowledged once everything before it is
        durable, so its acknowledgement also means durable.
        """
        if wal.failed is not None:  # refuse before touching any state
            raise LogFailed()
        last = self.workers.get(worker)
        expected = 0 if last is None else last[0] + 1
        if seq < expected:
            # The version that applied it if still remembered, else the worker's latest (which
            # includes it): either way the state as of that version contains the batch.
            version = self.recent.get((worker, seq), last[1] if last is not None else self.version)
            return Outcome(False, True, version, wal.barrier())
        if seq > expected:
            raise SequenceGap(expected)
        self.version += 1
        version = self.version
        self.workers[worker] = (seq, version)
        self._remember(worker, seq, version)
        received = time.time()
        record = {"t": "batch", "df": self.id, "v": version, "at": received}
        self.pending[version] = (version, worker, seq, updates, received)
        # Log first, apply second: the sync process syncs while this thread applies (the batch is
        # validated, so applying cannot fail); the publish callback runs after both.
        box: list[list[FrontierChange]] = []
        durable = wal.enqueue(record, lambda: self._publish(version, box[0], worker, seq, updates, received, raw), raw)
        box.append(self.tracker.apply(updates, validated=True))
        return Outcome(True, False, version, durable, len(updates))

    def replay(self, version: int, worker: str, seq: int, updates: list[Update]) -> list[FrontierChange]:
        """Apply a recovered batch (already durable) without logging it again."""
        if version != self.version + 1:
            raise GraphError(f"dataflow {self.id}: recovered version {version} does not follow {self.version}")
        changes = self.tracker.apply(updates, validated=True)
        self.version = version
        self.workers[worker] = (seq, version)
        self._remember(worker, seq, version)
        return changes

    def _remember(self, worker: str, seq: int, version: int) -> None:
        self.recent[(worker, seq)] = version
        if len(self.recent) > RECENT_BATCHES:
            del self.recent[next(iter(self.recent))]

    def _publish(self, version: int, changes: list[FrontierChange], worker: str, seq: int,
                 updates: list[Update], received: float, raw: bytes) -> None:
        self.durable_version = version
        del self.pending[version]
        # The body as received: the Delta flush has Arrow decode it (see api.columns).
        self.unflushed.append((version, worker, seq, RawBatch(raw, len(updates)) if updates else updates, received))
        if self.engine_mode == "spark":
            self.spark_queue.append((version, updates))
            return
        self.frontier_version = version
        self.record_changes(version, changes)
        if self.on_publish is not None:
            self.on_publish(self, version, changes)

    def record_changes(self, version: int, changes: list[FrontierChange], *, notify: bool = True,
                       at: float | None = None) -> None:
        """Fold durable changes into the published frontier, history and subscribers; ``at``
        (default now) is when the batch was applied, as ``frontier_changes`` will say."""
        if not changes:
            return
        # Encoded once, shared by every subscriber, and kept as the history entry: one string per
        # version rather than a tuple per change keeps the garbage collector's full passes (and so
        # the latency tail) short even with a long history.
        encoded = changes_json(changes)
        self.history.append((version, len(changes), encoded))
        self.history_changes += len(changes)
        while len(self.history) > 1 and (
            len(self.history) > self.history_limit or self.history_changes > 10 * self.history_limit
        ):
            old_version, old_count, _ = self.history.popleft()
            self.history_changes -= old_count
            self.history_floor = old_version
        self.uncompacted.append((version, encoded, time.time() if at is None else at))
        self._unfolded.append(changes)
        if notify:
            for subscriber in list(self.subscribers):
                subscriber.offer(version, encoded)
            if len(self._unfolded) == 1:  # scheduled after the subscribers' wake-ups, so after their sends
                asyncio.get_running_loop().call_soon(self._fold)
        elif len(self._unfolded) >= 256:  # replaying a recovered history: no loop to schedule on
            self._fold()

    def inflight(self) -> list[tuple[int, str, int, list[Update], float]]:
        """Applied batches whose log record is not durable yet."""
        return list(self.pending.values())

    # -- reads -------------------------------------------------------------------------------

    def frontier_at(self, version: int | None = None) -> tuple[int, dict[Location, set[Timestamp]]]:
        """The published frontier, or as of an earlier ``version`` by undoing the history.

        Raises ``LookupError`` when ``version`` is older than the retained history or newer
        than the durable version.
        """
        current = self.frontier_version
        if version is None or version == current:
            return current, self.published
        if version > current:
            raise LookupError(f"version {version} has not happened yet (current version is {current})")
        if version < self.history_floor:
            raise LookupError(f"version {version} is older than the retained history (oldest: {self.history_floor})")
        view = {loc: set(ts) for loc, ts in self.published.items()}
        for changed_version, _, encoded in reversed(self.history):
            if changed_version <= version:
                break
            for change in json.loads(encoded):
                where = change["location"]
                location = Location(where["node"], where["port"], where["kind"])
                if change["diff"] > 0:
                    view.setdefault(location, set()).discard(tuple(change["time"]))
                else:
                    view.setdefault(location, set()).add(tuple(change["time"]))
        return version, view

    def changes_since(self, version: int) -> list[tuple[int, str]] | None:
        """Encoded change events after ``version`` up to the durable version, or ``None`` if
        the history no longer reaches back that far."""
        if version < self.history_floor or version > self.frontier_version:
            return None
        return [(v, encoded) for v, _, encoded in self.history if v > version]

    def snapshot_json(self) -> tuple[int, str]:
        """``(version, '{"version":..,"locations":[..]}')`` of the published frontier."""
        return self.frontier_version, json.dumps(
            {"version": self.frontier_version, "locations": self.frontier_rows(self.published)},
            separators=(",", ":"),
        )

    def frontier_rows(self, view: dict[Location, set[Timestamp]], where: Callable[[Location], bool] | None = None
                      ) -> list[dict[str, Any]]:
        """Every location (matching ``where``) with its sorted frontier."""
        return [
            {"location": {"node": loc.node, "port": loc.port, "kind": loc.kind},
             "frontier": [list(t) for t in sorted(view.get(loc, ()))]}
            for loc in self.graph.locations()
            if where is None or where(loc)
        ]

    def psi(self) -> Any:
        """``Psi`` (minimal path summaries), computed natively; call it off the event loop.

        Not cached: Psi has up to n^2 entries, and keeping tens of thousands of small objects
        alive for the dataflow's lifetime made every full pass of the garbage collector (a
        latency spike) tens of milliseconds longer. It is needed at registration and by the
        rare whole-Psi query.
        """
        from tracker.structure import path_summaries

        return path_summaries(self.graph)

    def status(self) -> dict[str, Any]:
        """The ``status`` object of ``GET /v1/dataflows/{id}``."""
        return {
            "state": "active" if self.ready else "registering",
            "spark_check": self.spark_check,
            "spark_detail": self.spark_detail,
            "audit": self.audit,
            "durable_version": self.durable_version,
            "frontier_version": self.frontier_version,
            "engine": self.engine_mode,
            "graph_stored": self.graph_stored,
            "delta_version": self.delta_version,
            "workers": {w: s for w, (s, _) in sorted(self.workers.items())},
        }
