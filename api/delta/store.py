"""The service's view of the Delta warehouse (``spark_jobs.storage.Warehouse``, delta-rs writes).

Guarantees: each write is one Delta commit (so a reader sees all of it or none of it), and the
``progress`` rows are exactly the updates the tracker applied: a request body Arrow reads
differently from :func:`api.schema.parsing.parse_progress` is decoded by that parser instead (the
progress body is also the log's batch format, and that parser is its one decoder).

A nested dataflow's locations are stand-ins in the service (:mod:`api.live.scopes`); here they
become real ``scope, node, port, kind`` rows and back, through its :class:`~api.live.scopes.Hosting`.

Everything here is blocking and runs on the service's single ``delta`` thread, never on the
event loop; one thread also serialises the commits of one table.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from api.delta.columns import ChangeItem, RawBatch, changes_table, progress_table
from api.delta.files import app_versions, read_files
from api.live.scopes import Hosting
from api.schema.parsing import parse_progress
from spark_jobs.tables import TABLES
from tracker.graph import Graph, Location, Update
from tracker.scope import NestedGraph, ScopedLocation, ScopePath
from tracker.timestamp import Timestamp

if TYPE_CHECKING:
    pass

Layout = Graph | Hosting
"""How a dataflow's locations are written: a flat graph's as they are (the root scope), a
nested dataflow's stand-ins mapped to their scopes."""

log = logging.getLogger("tracker.store")


@dataclass
class Survey:
    """What recovery reads of the tables in bulk (:meth:`Store.survey`): the dataflows whose
    graph tables are complete, the compacted snapshots, the highest version of each dataflow in
    ``progress`` and in ``frontier_changes``, and the damaged tables with what is wrong."""

    registered: set[str] = field(default_factory=set)
    snapshots: dict[str, tuple[int, dict[tuple[Location | ScopedLocation, Timestamp], int]]] = field(
        default_factory=dict)
    births: dict[str, dict[tuple[Location | ScopedLocation, Timestamp], tuple[float, str | None]]] = field(
        default_factory=dict)
    """The births kept with each snapshot's pointstamps (those known)."""
    since: dict[str, dict[Location | ScopedLocation, float]] = field(default_factory=dict)
    """When each location's frontier last moved, kept with the snapshot's frontiers (those known)."""
    in_delta: dict[str, int] = field(default_factory=dict)
    compacted: dict[str, int] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)


class Store:
    """Reads and writes of the tables the service owns (``spark_jobs.tables.TABLES``)."""

    def __init__(self, root: Path) -> None:
        from spark_jobs.storage import Warehouse

        self.warehouse = Warehouse(root)

    # -- recovery -------------------------------------------------------------------------

    def survey(self, dataflow_ids: Iterable[str]) -> Survey:
        """Everything recovery reads of the tables in bulk, each table on its own: a table whose
        Delta log cannot be read, or whose current version lists a data file that is missing,
        or whose files cannot be read, is named in :attr:`Survey.problems` (and logged) and
        counts as absent where recovery would read its rows (``pointstamps``: no snapshot, so
        the log and ``progress`` supply every batch; ``dataflows``: the graph tables are
        written again). The statistics of ``progress`` and ``frontier_changes`` come from their
        Delta logs, which a missing file does not change: a dataflow that then needs the
        missing rows is refused alone when it reads them. One damaged table never stops the
        start."""
        ids = list(dataflow_ids)
        survey = Survey()
        for table in ("dataflows", "pointstamps", "progress", "frontier_changes"):
            try:
                missing = self.missing_files(table)
            except Exception as error:  # the Delta log itself
                survey.problems[table] = f"its Delta log cannot be read: {type(error).__name__}: {error}"[:500]
                continue
            if missing:
                survey.problems[table] = (f"{len(missing)} data file(s) its Delta log lists are missing, e.g. "
                                          f"{missing[0]}: their rows are lost")
        if "dataflows" not in survey.problems:  # else every dataflow's graph tables are written again
            survey.registered = self._surveyed(survey, "dataflows", self.registered, set())
        if "pointstamps" not in survey.problems:
            survey.snapshots = self._surveyed(survey, "pointstamps", lambda: self.snapshots(ids, survey.births), {})
        if survey.snapshots:  # the ages of the frontiers the snapshots left: lag goes on across a restart
            survey.since = self._surveyed(survey, "frontiers", lambda: self.since(survey.snapshots), {})
        if "progress" not in survey.problems or "missing" in survey.problems["progress"]:
            survey.in_delta = self._surveyed(survey, "progress", lambda: self.max_versions("progress"), {})
        if "frontier_changes" not in survey.problems or "missing" in survey.problems["frontier_changes"]:
            survey.compacted = self._surveyed(survey, "frontier_changes",
                                              lambda: self.max_versions("frontier_changes"), {})
        for table, problem in survey.problems.items():
            log.error("a Delta table is damaged: recovery goes on without what it cannot read",
                      extra={"table": table, "problem": problem})
        return survey

    @staticmethod
    def _surveyed(survey: Survey, table: str, read: Callable[[], Any], absent: Any) -> Any:
        try:
            return read()
        except Exception as error:
            survey.problems.setdefault(table, f"cannot be read: {type(error).__name__}: {error}"[:500])
            return absent

    def missing_files(self, table: str) -> list[str]:
        """The data files ``table``'s current version lists that do not exist (relative paths).

        Raises:
            Exception: the table's Delta log cannot be read.
        """
        from deltalake import DeltaTable

        path = self.warehouse.path(table)
        if not DeltaTable.is_deltatable(path):
            return []
        files = pa.table(DeltaTable(path).get_add_actions(flatten=True))
        if files.num_rows == 0:
            return []
        return [p for p in files.column("path").to_pylist() if not os.path.exists(os.path.join(path, unquote(p)))]

    def progress(self, dataflow_id: str, after: int = -1, hosting: Hosting | None = None
                 ) -> dict[int, tuple[str, int, list[Update], float]]:
        """The batches of the ``progress`` table with a version above ``after``, by version:
        ``(worker, seq, updates, received_at as a POSIX time)``; a nested dataflow's updates on
        its ``hosting`` 's stand-ins."""
        names = ["version", "worker", "seq", "scope", "node", "port", "kind", "time", "delta", "received_at"]
        data = self.warehouse.columns("progress", dataflow_id, names, after_version=after if after >= 0 else None)
        batches: dict[int, tuple[str, int, list[Update], float]] = {}
        columns = [data.column(n).to_pylist() for n in names]
        for version, worker, seq, scope, node, port, kind, time, delta, received in zip(*columns, strict=True):
            entry = batches.get(version)
            if entry is None:
                entry = batches[version] = (worker, seq, [], received.timestamp())
            location = (Location(node, port, kind) if hosting is None
                        else hosting.flat(ScopedLocation(tuple(scope), node, port, kind)))
            entry[2].append((location, tuple(time), delta))
        return batches

    def registered(self) -> set[str]:
        """The dataflows whose graph tables are complete (their ``dataflows`` row is written
        last), from the partitions of the table's files (the Delta log alone: no file is read)."""
        from deltalake import DeltaTable

        path = self.warehouse.path("dataflows")
        if not DeltaTable.is_deltatable(path):
            return set()
        files = pa.table(DeltaTable(path).get_add_actions(flatten=True))
        if files.num_rows == 0:
            return set()
        files = files.filter(pc.greater(files.column("num_records"), 0))
        return set(files.column("partition.dataflow_id").to_pylist())

    def max_progress_version(self, dataflow_id: str) -> int:
        """The highest version in ``progress`` for this dataflow (-1 if none)."""
        found = self.warehouse.max_of("progress", dataflow_id, "version")
        return -1 if found is None else found

    def snapshots(self, dataflow_ids: Iterable[str], births: dict[str, dict[Any, tuple[float, str | None]]]
                  | None = None) -> dict[str, tuple[int, dict[tuple[Location | ScopedLocation, Timestamp], int]]]:
        """The compacted counts of many dataflows and the version each is exact for (only those
        compaction wrote), from one read of the ``pointstamps`` table (one table version, so each
        dataflow's counts and version belong together); the pointstamps' known births go to
        ``births`` (by dataflow), if given."""
        from deltalake import DeltaTable

        from spark_jobs.storage import POINTSTAMPS_APP

        path = self.warehouse.path("pointstamps")
        if not DeltaTable.is_deltatable(path):
            return {}
        delta = DeltaTable(path)
        ids = list(dataflow_ids)
        try:
            marks = app_versions(delta, path)
        except (OSError, ValueError, KeyError, RuntimeError):
            log.warning("reading the pointstamps watermarks from the Delta log failed; asking app by app",
                        exc_info=True)
            marks = {POINTSTAMPS_APP + i: v for i in ids if (v := delta.transaction_version(POINTSTAMPS_APP + i))
                     is not None}
        found: dict[str, tuple[int, dict[tuple[Location | ScopedLocation, Timestamp], int]]] = {}
        for dataflow_id in ids:
            mark = marks.get(POINTSTAMPS_APP + dataflow_id)
            if mark is not None:
                found[dataflow_id] = (mark, {})
        names = ["dataflow_id", "scope", "node", "port", "kind", "time", "count", "born_at", "worker"]
        data = read_files(delta, path, names)
        columns = [data.column(n).to_pylist() for n in names[:-2]]
        born = pc.divide(data.column("born_at").cast(pa.int64()), 1_000_000.0).to_pylist()
        for dataflow_id, scope, node, port, kind, time, count, at, worker in zip(
                *columns, born, data.column("worker").to_pylist(), strict=True):
            if dataflow_id in found:
                counts = found[dataflow_id][1]
                # A nested scope's row keeps its scope path: recovery maps it to its stand-in.
                location = ScopedLocation(tuple(scope), node, port, kind) if scope else Location(node, port, kind)
                key = (location, tuple(time))
                counts[key] = counts.get(key, 0) + count
                if births is not None and at is not None:
                    births.setdefault(dataflow_id, {})[key] = (at, worker)
        return {i: (mark, {k: c for k, c in counts.items() if c != 0}) for i, (mark, counts) in found.items()}

    def since(self, dataflow_ids: Iterable[str]) -> dict[str, dict[Location | ScopedLocation, float]]:
        """When each location's frontier last moved (POSIX seconds), as kept with the
        ``frontiers`` of these dataflows (rows written before it was kept have none)."""
        from deltalake import DeltaTable

        path = self.warehouse.path("frontiers")
        if not DeltaTable.is_deltatable(path):
            return {}
        wanted = set(dataflow_ids)
        names = ["dataflow_id", "scope", "node", "port", "kind"]
        data = read_files(DeltaTable(path), path, [*names, "since"])
        moved = pc.divide(data.column("since").cast(pa.int64()), 1_000_000.0).to_pylist()
        found: dict[str, dict[Location | ScopedLocation, float]] = {}
        for dataflow_id, scope, node, port, kind, at in zip(*(data.column(n).to_pylist() for n in names), moved,
                                                             strict=True):
            if dataflow_id in wanted and at is not None:
                location = ScopedLocation(tuple(scope), node, port, kind) if scope else Location(node, port, kind)
                found.setdefault(dataflow_id, {})[location] = at
        return found

    def max_versions(self, table: str) -> dict[str, int]:
        """The highest ``version`` of every dataflow in ``table`` (``progress`` or
        ``frontier_changes``), from the file statistics in the Delta log: no data file is read,
        unless a file has no statistics (then that table's two columns are)."""
        from deltalake import DeltaTable

        path = self.warehouse.path(table)
        if not DeltaTable.is_deltatable(path):
            return {}
        delta = DeltaTable(path)
        files = pa.table(delta.get_add_actions(flatten=True))
        if "max.version" in files.column_names and files.column("max.version").null_count == 0:
            keys, values = files.column("partition.dataflow_id"), files.column("max.version")
        else:
            files = delta.to_pyarrow_table(columns=["dataflow_id", "version"])
            keys, values = files.column("dataflow_id"), files.column("version")
        if len(keys) == 0:
            return {}
        best = pa.table({"d": keys, "v": values}).group_by("d").aggregate([("v", "max")])
        return dict(zip(best.column("d").to_pylist(), best.column("v_max").to_pylist(), strict=True))

    def write_dataflows(self, graphs: Sequence[tuple[str, str, Graph | NestedGraph, str]],
                        summaries: Iterable[pa.Table] = ()) -> None:
        """The graph tables of ``(dataflow_id, name, graph, created_at)`` and the ``summaries``
        rows given (Arrow tables of that table's schema, a commit each), ``dataflows`` last, one
        commit per other table; ``created_at`` is the registration's ISO time."""
        self.warehouse.write_dataflows([(i, name, graph, datetime.fromisoformat(created))
                                        for i, name, graph, created in graphs], summaries=summaries)

    def mark_deleted(self, deleted: Mapping[str, float]) -> None:
        """Set ``dataflows.deleted_at`` of each ``dataflow_id -> POSIX time`` in one commit."""
        self.warehouse.mark_deleted({i: datetime.fromtimestamp(at, UTC) for i, at in deleted.items()})

    def append_progress(self, batches: Iterable[tuple[str, Layout, int, str, int, list[Update] | RawBatch, float]]
                        ) -> int:
        """One commit with the rows of many batches of many dataflows.

        Raw request bodies are decoded by Arrow off the GIL (see :mod:`api.delta.columns`); decoded
        updates (the initial pointstamps, recovered batches, or a body Arrow reads differently)
        are built as columns here. A batch with no updates is stored as one no-op row (delta 0
        at the graph's first location) so that its version and seq survive in the table
        recovery reads.
        """
        batches = list(batches)
        raw = [(d, v, w, s, u, at) for d, _, v, w, s, u, at in batches if isinstance(u, RawBatch)]
        decoded = progress_table(raw) if raw else None
        tables = [] if decoded is None else [decoded]
        if decoded is None:  # Arrow in doubt (or nothing raw): every body through the parser
            batches = [(d, g, v, w, s, _parse(u.body, g) if isinstance(u, RawBatch) else u, at)
                       for d, g, v, w, s, u, at in batches]
        rest = [(d, g, v, w, s, u, at) for d, g, v, w, s, u, at in batches if not isinstance(u, RawBatch)]
        if rest:
            tables.append(_progress_rows(rest))
        if not tables:
            return -1
        return self.warehouse.append("progress", pa.concat_tables(tables) if len(tables) > 1 else tables[0])

    def write_states(self, states: Mapping[str, tuple[int, Mapping[tuple[Any, Timestamp], int],
                                                     Mapping[Any, Iterable[Timestamp]]]],
                     ages: Mapping[str, tuple[Mapping[tuple[Any, Timestamp], tuple[float, str | None]],
                                              Mapping[Any, float]]] | None = None) -> None:
        """Replace the ``pointstamps`` and ``frontiers`` partitions of many dataflows, each
        ``dataflow_id -> (version, counts, frontiers)`` as of its ``version`` (recorded with the
        pointstamps, so recovery and the incremental Spark job resume there). Two commits in all,
        however many dataflows: one commit per dataflow and table left the tables minutes behind
        with a hundred busy dataflows. Locations are root ``Location`` s or ``ScopedLocation`` s
        (see :meth:`api.live.scopes.Hosting.scoped_counts`); ``ages`` (by dataflow: the births of
        its pointstamps and when each frontier last moved) go with them."""
        if states:
            self.warehouse.write_states(states, ages)

    def append_changes(self, batches: Sequence[ChangeItem]) -> int:
        """Append frontier changes of many dataflows in one commit; each item carries a version's
        change list as encoded for the streams, which Arrow decodes off the GIL."""
        if not batches:
            return -1
        return self.warehouse.append("frontier_changes", changes_table(batches))

    def write_summaries(self, psis: Mapping[str, Mapping[ScopePath, Any]]) -> None:
        """Replace the ``summaries`` of several dataflows (``dataflow_id -> scope -> Psi`` within
        that scope; a flat dataflow's one scope is ``()``) in one commit."""
        self.warehouse.write_scoped_summaries(psis)



def _parse(body: bytes, layout: Layout) -> list[Update]:
    return parse_progress(body, layout)[2] if isinstance(layout, Graph) else layout.parse(body)[2]


def _progress_rows(batches: list[tuple[str, Layout, int, str, int, list[Update], float]]) -> pa.Table:
    """``progress`` rows built from decoded updates, as columns rather than row dicts."""
    columns: dict[str, list[Any]] = {name: [] for name in TABLES["progress"].names}
    ids, versions, workers, seqs = (columns[n] for n in ("dataflow_id", "version", "worker", "seq"))
    scopes, nodes, ports, kinds, times, deltas, ats = (columns[n] for n in ("scope", "node", "port", "kind", "time",
                                                                            "delta", "received_at"))
    for dataflow_id, layout, version, worker, seq, updates, received in batches:
        at = datetime.fromtimestamp(received, UTC)
        scoped = None if isinstance(layout, Graph) else layout.scoped
        if not updates:
            graph = layout if isinstance(layout, Graph) else layout.root
            updates = [(graph.locations()[0], (0,) * graph.arity, 0)]
            scoped = None  # a root location of the root graph, not a stand-in
        count = len(updates)
        ids.extend([dataflow_id] * count)
        versions.extend([version] * count)
        workers.extend([worker] * count)
        seqs.extend([seq] * count)
        ats.extend([at] * count)
        for loc, time, delta in updates:
            if scoped is None:
                scopes.append(())
                nodes.append(loc.node)
                ports.append(loc.port)
                kinds.append(loc.kind)
            else:
                real = scoped(loc)
                scopes.append(real.scope)
                nodes.append(real.node)
                ports.append(real.port)
                kinds.append(real.kind)
            times.append(time)
            deltas.append(delta)
    schema = TABLES["progress"]
    return pa.Table.from_arrays([pa.array(columns[f.name], type=f.type) for f in schema], schema=schema)
