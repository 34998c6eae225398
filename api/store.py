"""The service's view of the Delta warehouse (``spark_jobs.storage.Warehouse``, delta-rs writes).

Everything here is blocking and runs on the service's single ``delta`` thread, never on the
event loop; one thread also serialises the commits of one table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracker.graph import Graph, Location, Update
from tracker.reachability import FrontierChange
from tracker.timestamp import Timestamp

log = logging.getLogger("tracker.store")


class Store:
    """Reads and writes of the tables the service owns (DESIGN.md section 4)."""

    def __init__(self, root: Path) -> None:
        from spark_jobs.storage import Warehouse

        self.warehouse = Warehouse(root)

    # -- recovery -------------------------------------------------------------------------

    def progress(self, dataflow_id: str) -> dict[int, tuple[str, int, list[Update]]]:
        """Every batch of the ``progress`` table, by version: ``(worker, seq, updates)``."""
        data = self.warehouse.read("progress", dataflow_id)
        batches: dict[int, tuple[str, int, list[Update]]] = {}
        columns = [data.column(n).to_pylist() for n in ("version", "worker", "seq", "node", "port", "kind", "time",
                                                         "delta")]
        for version, worker, seq, node, port, kind, time, delta in zip(*columns, strict=True):
            entry = batches.setdefault(version, (worker, seq, []))
            entry[2].append((Location(node, port, kind), tuple(time), delta))
        return batches

    def max_progress_version(self, dataflow_id: str) -> int:
        """The highest version in ``progress`` for this dataflow (-1 if none)."""
        versions = self.warehouse.read("progress", dataflow_id).column("version").to_pylist()
        return max(versions) if versions else -1

    def max_change_version(self, dataflow_id: str) -> int:
        """The highest version in ``frontier_changes`` for this dataflow (-1 if none)."""
        data = self.warehouse.read("frontier_changes", dataflow_id)
        versions = data.column("version").to_pylist()
        return max(versions) if versions else -1

    # -- writes ---------------------------------------------------------------------------

    def write_dataflow(self, dataflow_id: str, name: str, graph: Graph) -> None:
        """The graph tables (``dataflows`` last)."""
        self.warehouse.write_dataflow(dataflow_id, name, graph)

    def append_progress(self, batches: Iterable[tuple[str, Graph, int, str, int, list[Update], float]]) -> int:
        """One commit with the rows of many batches of many dataflows.

        A batch with no updates is stored as one no-op row (delta 0 at the graph's first
        location) so that its version and seq survive in the table recovery reads.
        """
        columns: dict[str, list[Any]] = {name: [] for name in (
            "dataflow_id", "version", "worker", "seq", "node", "port", "kind", "time", "delta", "received_at")}
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
            for loc, time, delta in updates:  # columns, not dicts: this runs on every flush
                nodes.append(loc.node)
                ports.append(loc.port)
                kinds.append(loc.kind)
                times.append(time)
                deltas.append(delta)
        if not ids:
            return -1
        from spark_jobs.storage import TABLES

        schema = TABLES["progress"]
        table = pa.Table.from_arrays([pa.array(columns[f.name], type=f.type) for f in schema], schema=schema)
        return self.warehouse.append("progress", table)

    def write_state(self, dataflow_id: str, counts: dict[tuple[Location, Timestamp], int],
                    frontiers: dict[Location, Iterable[Timestamp]], version: int) -> None:
        """Replace the dataflow's ``pointstamps`` and ``frontiers`` partitions, both as of
        ``version`` (recorded with the pointstamps, so the incremental Spark job resumes there)."""
        self.warehouse.write_pointstamps(dataflow_id, counts, as_of_version=version)
        self.warehouse.write_frontiers(dataflow_id, frontiers)

    def append_changes(self, batches: Iterable[tuple[str, int, list[FrontierChange], float]]) -> int:
        """Append frontier changes of many dataflows in one commit.

        Built as columns, not row dicts: a batch that moves every frontier of a large dataflow
        yields thousands of rows, and this thread shares the GIL with the event loop.
        """
        from spark_jobs.storage import TABLES

        ids: list[str] = []
        versions: list[int] = []
        ats: list[datetime] = []
        changes: list[FrontierChange] = []
        for dataflow_id, version, items, at in batches:
            count = len(items)
            ids.extend([dataflow_id] * count)
            versions.extend([version] * count)
            ats.extend([datetime.fromtimestamp(at, UTC)] * count)
            changes.extend(items)
        if not changes:
            return -1
        locations = [c.location for c in changes]
        columns = {
            "dataflow_id": ids, "version": versions, "node": [loc.node for loc in locations],
            "port": [loc.port for loc in locations], "kind": [loc.kind for loc in locations],
            "time": [c.time for c in changes], "diff": [c.diff for c in changes], "at": ats,
        }
        schema = TABLES["frontier_changes"]
        return self.warehouse.append("frontier_changes", _chunked_table(columns, schema, len(changes)))

    def write_summaries(self, dataflow_id: str, psi: Any) -> None:
        """Replace the dataflow's ``summaries``."""
        self.warehouse.write_summaries(dataflow_id, psi)




_CHUNK = 4096


def _chunked_table(columns: dict[str, list[Any]], schema: pa.Schema, rows: int) -> pa.Table:
    """A table built chunk by chunk: one ``pa.array`` call over a long list holds the GIL
    throughout, and this runs in a thread beside the event loop."""
    arrays = [
        pa.chunked_array([pa.array(columns[f.name][i:i + _CHUNK], type=f.type) for i in range(0, rows, _CHUNK)],
                         type=f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)
