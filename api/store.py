"""The service's view of the Delta warehouse (``spark_jobs.storage.Warehouse``, delta-rs writes).

Guarantees: each write is one Delta commit (so a reader sees all of it or none of it), and the
``progress`` rows are exactly the updates the tracker applied: a request body Arrow reads
differently from :func:`api.parsing.parse_progress` is decoded by that parser instead (the
progress body is also the log's batch format, and that parser is its one decoder).

Everything here is blocking and runs on the service's single ``delta`` thread, never on the
event loop; one thread also serialises the commits of one table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from api.columns import ChangeItem, RawBatch, changes_table, progress_table
from api.parsing import parse_progress
from spark_jobs.tables import TABLES
from tracker.graph import Graph, Location, Update
from tracker.timestamp import Timestamp

log = logging.getLogger("tracker.store")


class Store:
    """Reads and writes of the tables the service owns (``spark_jobs.tables.TABLES``)."""

    def __init__(self, root: Path) -> None:
        from spark_jobs.storage import Warehouse

        self.warehouse = Warehouse(root)

    # -- recovery -------------------------------------------------------------------------

    def progress(self, dataflow_id: str, after: int = -1) -> dict[int, tuple[str, int, list[Update], float]]:
        """The batches of the ``progress`` table with a version above ``after``, by version:
        ``(worker, seq, updates, received_at as a POSIX time)``."""
        names = ["version", "worker", "seq", "node", "port", "kind", "time", "delta", "received_at"]
        data = self.warehouse.columns("progress", dataflow_id, names, after_version=after if after >= 0 else None)
        batches: dict[int, tuple[str, int, list[Update], float]] = {}
        columns = [data.column(n).to_pylist() for n in names]
        for version, worker, seq, node, port, kind, time, delta, received in zip(*columns, strict=True):
            entry = batches.get(version)
            if entry is None:
                entry = batches[version] = (worker, seq, [], received.timestamp())
            entry[2].append((Location(node, port, kind), tuple(time), delta))
        return batches

    def registered(self) -> set[str]:
        """The dataflows whose graph tables are complete (their ``dataflows`` row is written last)."""
        return set(self.warehouse.dataflow_ids())

    def worker_positions(self, dataflow_id: str) -> dict[str, tuple[int, int]]:
        """Every worker's last ``(seq, version)`` in the ``progress`` table (computed by Arrow)."""
        data = self.warehouse.columns("progress", dataflow_id, ["worker", "seq", "version"])
        data = data.filter(pc.greater(data.column("version"), 0))  # version 0: the registration's initial counts
        if data.num_rows == 0:
            return {}
        last = data.group_by("worker").aggregate([("seq", "max"), ("version", "max")])
        # A worker's seqs and versions grow together, so the two maxima belong to one batch.
        return {w: (s, v) for w, s, v in zip(last.column("worker").to_pylist(), last.column("seq_max").to_pylist(),
                                             last.column("version_max").to_pylist(), strict=True)}

    def snapshot(self, dataflow_id: str) -> tuple[int, dict[tuple[Location, Timestamp], int]] | None:
        """The compacted counts and the version they are exact for, if compaction wrote any."""
        return self.warehouse.pointstamps_snapshot(dataflow_id)

    def max_progress_version(self, dataflow_id: str) -> int:
        """The highest version in ``progress`` for this dataflow (-1 if none)."""
        found = self.warehouse.max_of("progress", dataflow_id, "version")
        return -1 if found is None else found

    def max_change_version(self, dataflow_id: str) -> int:
        """The highest version in ``frontier_changes`` for this dataflow (-1 if none)."""
        found = self.warehouse.max_of("frontier_changes", dataflow_id, "version")
        return -1 if found is None else found

    # -- writes ---------------------------------------------------------------------------

    def write_dataflows(self, graphs: Sequence[tuple[str, str, Graph, str]]) -> None:
        """The graph tables of ``(dataflow_id, name, graph, created_at)``, ``dataflows`` last,
        one commit per table; ``created_at`` is the registration's ISO time."""
        self.warehouse.write_dataflows([(i, name, graph, datetime.fromisoformat(created))
                                        for i, name, graph, created in graphs])

    def mark_deleted(self, deleted: Mapping[str, float]) -> None:
        """Set ``dataflows.deleted_at`` of each ``dataflow_id -> POSIX time`` in one commit."""
        self.warehouse.mark_deleted({i: datetime.fromtimestamp(at, UTC) for i, at in deleted.items()})

    def append_progress(self, batches: Iterable[tuple[str, Graph, int, str, int, list[Update] | RawBatch, float]]
                        ) -> int:
        """One commit with the rows of many batches of many dataflows.

        Raw request bodies are decoded by Arrow off the GIL (see :mod:`api.columns`); decoded
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
            batches = [(d, g, v, w, s, parse_progress(u.body, g)[2] if isinstance(u, RawBatch) else u, at)
                       for d, g, v, w, s, u, at in batches]
        rest = [(d, g, v, w, s, u, at) for d, g, v, w, s, u, at in batches if not isinstance(u, RawBatch)]
        if rest:
            tables.append(_progress_rows(rest))
        if not tables:
            return -1
        return self.warehouse.append("progress", pa.concat_tables(tables) if len(tables) > 1 else tables[0])

    def write_states(self, states: Mapping[str, tuple[int, Mapping[tuple[Location, Timestamp], int],
                                                     Mapping[Location, Iterable[Timestamp]]]]) -> None:
        """Replace the ``pointstamps`` and ``frontiers`` partitions of many dataflows, each
        ``dataflow_id -> (version, counts, frontiers)`` as of its ``version`` (recorded with the
        pointstamps, so recovery and the incremental Spark job resume there). Two commits in all,
        however many dataflows: one commit per dataflow and table left the tables minutes behind
        with a hundred busy dataflows."""
        if states:
            self.warehouse.write_states(states)

    def append_changes(self, batches: Sequence[ChangeItem]) -> int:
        """Append frontier changes of many dataflows in one commit; each item carries a version's
        change list as encoded for the streams, which Arrow decodes off the GIL."""
        if not batches:
            return -1
        return self.warehouse.append("frontier_changes", changes_table(batches))

    def write_summaries(self, psis: dict[str, Any]) -> None:
        """Replace the ``summaries`` of several dataflows (``dataflow_id -> Psi``) in one commit."""
        self.warehouse.write_many_summaries(psis)



def _progress_rows(batches: list[tuple[str, Graph, int, str, int, list[Update], float]]) -> pa.Table:
    """``progress`` rows built from decoded updates, as columns rather than row dicts."""
    columns: dict[str, list[Any]] = {name: [] for name in TABLES["progress"].names}
    ids, versions, workers, seqs = (columns[n] for n in ("dataflow_id", "version", "worker", "seq"))
    nodes, ports, kinds, times, deltas, ats = (columns[n] for n in ("node", "port", "kind", "time", "delta",
                                                                    "received_at"))
    for dataflow_id, graph, version, worker, seq, updates, received in batches:
        at = datetime.fromtimestamp(received, UTC)
        if not updates:
            updates = [(graph.locations()[0], (0,) * graph.arity, 0)]
        count = len(updates)
        ids.extend([dataflow_id] * count)
        versions.extend([version] * count)
        workers.extend([worker] * count)
        seqs.extend([seq] * count)
        ats.extend([at] * count)
        for loc, time, delta in updates:
            nodes.append(loc.node)
            ports.append(loc.port)
            kinds.append(loc.kind)
            times.append(time)
            deltas.append(delta)
    schema = TABLES["progress"]
    return pa.Table.from_arrays([pa.array(columns[f.name], type=f.type) for f in schema], schema=schema)
