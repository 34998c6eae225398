"""The live views: what the service holds now, as Arrow tables for DuckDB.

=================== ===================================================================================
view                one row per
=================== ===================================================================================
``live_dataflows``  dataflow this process hosts (deleted and damaged ones too, with their state)
``live_frontiers``  element of a location's current frontier (a location with an empty frontier has
                    none), as the Delta ``frontiers`` table, with the operator's name
``live_pointstamps`` live pointstamp (non-zero count), as the Delta ``pointstamps`` table: when it was
                    born and which worker last reported it (the blame)
``live_lag``        location, as ``GET /v1/dataflows/{id}/lag`` answers it: its frontier, the seconds
                    since that frontier changed, its oldest live pointstamp
=================== ===================================================================================

Every view's location columns are those of the Delta tables (``scope``, ``node``, ``port``,
``kind``), times ``BIGINT[]``, instants ``TIMESTAMPTZ`` (UTC).

How they are read: the dataflows' state is copied on the event loop (the published frontier,
its ages, the counts: copies made in C or a dict copy, as ``GET .../lag`` and the dashboard's
frames take them), each dataflow at one published version; the rows are built from those
copies by what :func:`read_live` returns, in a worker thread. Only the views a query names are
read, and only the dataflows the caller may see.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from api.durability.recovery import Damaged
from api.host.tenant import Tenant
from api.ops.lag import index_of, locations_of, names_of
from api.schema.bodies import collector_paused
from api.sql.columns import lag_columns, lag_of, oldest_columns

if TYPE_CHECKING:
    from progress_engine import Frontiers, MovedAt

_STR = pa.string()
_INT = pa.int32()
_LONG = pa.int64()
_TS = pa.timestamp("us", tz="UTC")
_TIME = pa.list_(pa.int64())
_LOCATION = [("dataflow_id", _STR), ("scope", pa.list_(pa.int32())), ("node", _INT), ("port", _INT), ("kind", _STR)]

LIVE: dict[str, pa.Schema] = {
    "live_dataflows": pa.schema([
        ("dataflow_id", _STR), ("name", _STR), ("state", _STR), ("detail", _STR), ("timestamp_arity", _INT),
        ("version", _LONG), ("frontier_version", _LONG), ("engine", _STR), ("shard", _INT), ("created_at", _TS),
        ("last_frontier_change_at", _TS), ("last_batch_at", _TS), ("deleted_at", _TS)]),
    "live_frontiers": pa.schema([*_LOCATION, ("operator", _STR), ("time", _TIME), ("since", _TS)]),
    "live_pointstamps": pa.schema([*_LOCATION, ("operator", _STR), ("time", _TIME), ("count", _LONG),
                                   ("born_at", _TS), ("worker", _STR)]),
    "live_lag": pa.schema([
        *_LOCATION, ("operator", _STR), ("port_name", _STR), ("frontier", pa.list_(_TIME)),
        ("lag_seconds", pa.float64()), ("lag_at_least", pa.bool_()), ("changed_at", _TS), ("oldest_time", _TIME),
        ("oldest_worker", _STR),
        ("oldest_born_at", _TS), ("oldest_age_seconds", pa.float64()), ("oldest_age_at_least", pa.bool_())]),
}
"""The live views' schemas (docs/tables.md, "SQL")."""


def _micros(at: float | None) -> int | None:
    """POSIX seconds in microseconds, rounded as the REST answers' ISO 8601 instants are
    (``datetime.fromtimestamp``: ``round(at * 1e6)`` differed by 1 us for ~12% of instants).

    >>> from datetime import UTC
    >>> at = 1796555945.2706954  # round(at * 1e6) ends in 696
    >>> _micros(at) % 1_000_000, datetime.fromtimestamp(at, UTC).isoformat()[20:26]
    (270695, '270695')
    """
    if at is None:
        return None
    fraction, whole = math.modf(at)  # as CPython rounds: the fraction alone, half to even
    return int(whole) * 1_000_000 + round(fraction * 1_000_000)


def _instant(text: str | None) -> int | None:
    """An ISO 8601 instant (the registration's ``created_at``) in microseconds."""
    if not text:
        return None
    return _micros(datetime.fromisoformat(text).timestamp())


@dataclass
class _Copied:
    """One dataflow's state, copied on the event loop."""

    tenant: Tenant
    summary: dict[str, Any] | None = None
    frontier: Callable[[Any], list[tuple[int, ...]]] | None = None
    moved: Callable[[Any], float] | None = None
    unknown_before: float | None = None
    oldest: dict[Any, tuple[tuple[int, ...], float, str | None]] | None = None
    counts: dict[Any, int] | None = None
    born: Callable[[Any, tuple[int, ...]], tuple[float, str | None] | None] | None = None
    engine: Frontiers | None = None
    """The published frontier in the compiled engine, read a column at a time (``live_lag``)."""
    stamps: MovedAt | None = None
    """When each location last moved, by the compiled engine's index (``live_lag``; ``None``:
    none moved since the dataflow was registered or recovered)."""
    seeded: dict[Any, float] | None = None
    """A location's last move where it has no stamp (a restart's, or else the registration's)."""


def _copy(tenant: Tenant, wanted: set[str], shard: int) -> _Copied:
    copied = _Copied(tenant)
    if "live_dataflows" in wanted:
        lifecycle = tenant.lifecycle()
        copied.summary = {
            "dataflow_id": tenant.id, "name": tenant.name, "state": lifecycle["state"], "detail": None,
            "timestamp_arity": tenant.graph.arity, "version": tenant.live.durable_version,
            "frontier_version": tenant.publication.frontier_version, "engine": tenant.engine_mode, "shard": shard,
            "created_at": _instant(tenant.created_at),
            "last_frontier_change_at": _micros(tenant.publication.last_change_at),
            "last_batch_at": _micros(tenant.live.last_batch_at), "deleted_at": _micros(tenant.deleted_at)}
    index = index_of(tenant)
    if "live_lag" in wanted:
        copied.oldest = tenant.ages.oldest_by_location()
        if index is not None and tenant.hosting is None:  # read a column at a time (see _Places.indices)
            copied.engine = tenant.publication.engine_copy()
            copied.stamps, copied.seeded = tenant.ages.moved_copy()
    if "live_frontiers" in wanted or ("live_lag" in wanted and copied.engine is None):  # a location at a time
        _, copied.frontier = tenant.publication.frontier_reader()
        copied.moved = tenant.ages.moved_all(index)
    if wanted & {"live_frontiers", "live_lag"}:
        copied.unknown_before = tenant.ages.unknown_before
    if "live_pointstamps" in wanted:
        copied.counts = tenant.counts()
        copied.born = tenant.ages.copy(index).born
    return copied


def _damaged_row(damaged: Damaged, shard: int) -> dict[str, Any]:
    return {"dataflow_id": damaged.id, "name": damaged.name, "state": "damaged", "detail": damaged.detail,
            "timestamp_arity": damaged.arity, "version": None, "frontier_version": None, "engine": None,
            "shard": shard, "created_at": _instant(damaged.created_at), "last_frontier_change_at": None,
            "last_batch_at": None, "deleted_at": None}


def read_live(dataflows: Iterable[Tenant], damaged: Iterable[Damaged], wanted: set[str], *,
              only: str | None = None, shard: int = 0, now: float | None = None
              ) -> Callable[[], dict[str, pa.Table]]:
    """The live views named in ``wanted`` over ``dataflows`` (ready ones; only the dataflow
    ``only`` if given), read now, on the event loop; what is returned builds the tables from the
    copies: call it in a worker thread."""
    now = time.time() if now is None else now
    wanted = wanted & set(LIVE)
    copies = [_copy(t, wanted, shard) for t in list(dataflows) if t.ready and (only is None or t.id == only)]
    refused = [_damaged_row(d, shard) for d in list(damaged) if only is None or d.id == only]

    def build() -> dict[str, pa.Table]:
        # The collector off: a pass while a slice's Python rows are alive walks them holding the GIL.
        with collector_paused():
            rows = {name: _Columns(LIVE[name]) for name in wanted}
            for copied in copies:
                _rows(copied, rows, now)
            if "live_dataflows" in rows:
                for row in refused:
                    rows["live_dataflows"].append(**row)
            return {name: columns.table() for name, columns in rows.items()}

    return build


class _Columns:
    """One view's rows, turned into Arrow a slice at a time: at most :data:`SLICE` rows of
    Python objects are alive at once (the lag report is built in slices for the same reason)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self.batches: list[pa.RecordBatch] = []
        self.count = 0

    def append(self, **values: Any) -> None:
        for column, value in values.items():
            self.columns[column].append(value)
        self.count += 1
        if self.count >= SLICE:
            self._flush()

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """Rows already in Arrow (after the rows appended so far)."""
        self._flush()
        self.batches.append(batch)

    def _flush(self) -> None:
        if self.count:
            self.batches.append(pa.record_batch(list(self.columns.values()), schema=self.schema))
            self.columns = {name: [] for name in self.schema.names}
            self.count = 0

    def table(self) -> pa.Table:
        self._flush()
        return pa.Table.from_batches(self.batches, schema=self.schema)


SLICE = 512
"""Rows of a live view built in Python before they are turned into Arrow (one conversion holds
the GIL, and so the event loop: ~0.25 ms for 512 rows of ``live_lag``, 1.1 ms for 2,048)."""
COLUMN_SLICE = 16_384
"""Rows of ``live_lag`` computed at once from the compiled engine's columns (what holds the
GIL there is a few list and buffer conversions of this many elements, well under 1 ms)."""


class _Places:
    """A dataflow's location columns (``dataflow_id``, ``scope``, ``node``, ``port``, ``kind``,
    ``operator``, ``port_name``) in :func:`~api.ops.lag.locations_of` order, as Arrow arrays:
    made once per dataflow (its graph never changes), so that a query builds only what changes.
    Made :data:`SLICE` locations at a time: one conversion of a 100,000-location column held
    the GIL, and so the event loop, 10-20 ms."""

    def __init__(self, tenant: Tenant) -> None:
        names = names_of(tenant)
        self.locations = locations_of(tenant)
        count = len(self.locations)
        self.position = {location: row for row, location in enumerate(self.locations)}
        """Each location's row."""
        index = index_of(tenant)
        # A comprehension, not map(): the interpreter can hand the GIL over between its steps.
        self.indices = None if index is None or tenant.hosting is not None else [
            index(location) for location in self.locations]
        """The compiled engine's index of each location (``None``: a nested dataflow's stand-ins
        or the reference engine, read a location at a time)."""
        parts: dict[str, list[pa.Array]] = {"scope": [], "node": [], "port": [], "kind": [], "operator": [],
                                            "port_name": []}
        for start in range(0, count, SLICE):
            located = self.locations[start:start + SLICE]
            scoped = [names.scoped(location) for location in located]
            parts["scope"].append(pa.array([list(s.scope) for s in scoped], pa.list_(_INT)))
            parts["node"].append(pa.array([s.node for s in scoped], _INT))
            parts["port"].append(pa.array([s.port for s in scoped], _INT))
            parts["kind"].append(pa.array([s.kind for s in scoped], _STR))
            parts["operator"].append(pa.array([names.operator(location) for location in located], _STR))
            parts["port_name"].append(pa.array([names.port(location) for location in located], _STR))
        self.columns = {"dataflow_id": pa.repeat(pa.scalar(tenant.id, _STR), count),
                        **{name: pa.concat_arrays(arrays) if arrays else pa.array([], LIVE["live_lag"].field(name).type)
                           for name, arrays in parts.items()}}


_PLACES: weakref.WeakKeyDictionary[Tenant, _Places] = weakref.WeakKeyDictionary()
_MAKING: weakref.WeakKeyDictionary[Tenant, threading.Lock] = weakref.WeakKeyDictionary()
"""Held while a dataflow's places are made: its first two queries at once make them once."""


def _places_of(tenant: Tenant) -> _Places:
    places = _PLACES.get(tenant)
    if places is None:
        with _MAKING.setdefault(tenant, threading.Lock()):
            places = _PLACES.get(tenant)
            if places is None:
                places = _PLACES[tenant] = _Places(tenant)
    return places


def _rows(copied: _Copied, rows: dict[str, _Columns], now: float) -> None:
    """Append one dataflow's rows to each wanted view's columns."""
    tenant = copied.tenant
    names = names_of(tenant)
    if copied.summary is not None:
        rows["live_dataflows"].append(**copied.summary)

    def where(location: Any) -> tuple[list[int], int, int, str]:
        scoped = names.scoped(location)
        return list(scoped.scope), scoped.node, scoped.port, scoped.kind

    frontiers, lag = rows.get("live_frontiers"), rows.get("live_lag")
    if frontiers is not None or lag is not None:
        places = _places_of(tenant)
        if frontiers is not None:
            assert copied.frontier is not None and copied.moved is not None
            for location in places.locations:
                times, moved = copied.frontier(location), copied.moved(location)
                if times:
                    scope, node, port, kind = where(location)
                    operator = names.operator(location)
                    for time_ in times:
                        frontiers.append(dataflow_id=tenant.id, scope=scope, node=node, port=port, kind=kind,
                                         operator=operator, time=list(time_), since=_micros(moved))
        if lag is not None:
            oldest = oldest_columns(copied.oldest or {}, places.position.get, len(places.locations), now,
                                    copied.unknown_before)
            start = 0
            while start < len(places.locations):
                start += _lag_slice(copied, places, start, now, oldest, lag)
    points = rows.get("live_pointstamps")
    if points is not None and copied.counts is not None and copied.born is not None:
        for (location, time_), count in copied.counts.items():
            scope, node, port, kind = where(location)
            born = copied.born(location, time_)
            points.append(dataflow_id=tenant.id, scope=scope, node=node, port=port, kind=kind,
                          operator=names.operator(location), time=list(time_), count=count,
                          born_at=None if born is None else _micros(born[0]), worker=None if born is None else born[1])


def _lag_slice(copied: _Copied, places: _Places, start: int, now: float, oldest: dict[str, pa.Array],
               lag: _Columns) -> int:
    """The ``live_lag`` rows of the locations from ``start`` as one record batch (how many): from the
    compiled engine's columns (:func:`~api.sql.columns.lag_columns`, :data:`COLUMN_SLICE`
    rows), else read a location at a time (:data:`SLICE` rows: the frontiers and moves turned
    into Arrow in one call each, holding the GIL)."""
    tenant, unknown = copied.tenant, copied.unknown_before
    size = COLUMN_SLICE if copied.engine is not None and places.indices is not None else SLICE
    located = places.locations[start:start + size]
    count = len(located)
    computed: dict[str, pa.Array]
    if copied.engine is not None and places.indices is not None:
        seeded, created = copied.seeded or {}, tenant.ages.created

        def fallback() -> float | list[float]:  # the move of a location never stamped
            return [seeded.get(location, created) for location in located] if seeded else created

        computed = lag_columns(copied.engine, copied.stamps, places.indices[start:start + count], fallback, now,
                               unknown)
    else:
        assert copied.frontier is not None and copied.moved is not None
        times = [copied.frontier(location) for location in located]
        moved = [copied.moved(location) for location in located]
        computed = lag_of(pa.array(times, pa.list_(_TIME)), pa.array(moved, pa.float64()), now, unknown)
    columns: dict[str, Any] = {
        **{name: column.slice(start, count) for name, column in places.columns.items()}, **computed,
        **{name: column.slice(start, count) for name, column in oldest.items()}}
    lag.add_batch(pa.record_batch([columns[name] for name in lag.schema.names], schema=lag.schema))
    return count
