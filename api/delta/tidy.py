"""Tidying of the Delta tables: small files merged (``OPTIMIZE``), unreferenced ones deleted
(``VACUUM``), in small steps so that the flushes sharing the Delta thread keep their pace.

Guarantees: a step never rewrites what a reader of a retained table version needs (files of
superseded versions are kept ``vacuum_hours``, the reach of Delta time travel); the first
``VACUUM`` of each table after a start also looks for files a crash left behind.

With several shards sharing the warehouse, each ``OPTIMIZE`` is scoped to this shard's own
partitions (its dataflows), and only shard 0 runs ``VACUUM``, which lists whole tables: two
shards never tidy the same files, and a ``VACUUM`` keeps files written in the last hour at
least, so that it cannot delete the files of another shard's commit in progress.

Only partitions of more than one file are merged (:meth:`Tidier.next_pass` counts them from the
Delta log): a step costs over a second whatever it finds, and after a burst of 2,500
registrations a pass of one-file partitions kept each shard's Delta thread busy for minutes,
merging nothing.

>>> Tidier(None, None, 24.0).plan(["a", "b"])[:2]
[('optimize', 'progress', ['a', 'b']), ('optimize', 'frontier_changes', ['a', 'b'])]
>>> Tidier(None, None, 24.0, vacuum=False).plan(["a", "b"], {"progress": ["b"]})
[('optimize', 'progress', ['b'])]
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor

import pyarrow as pa

from api.delta.store import Store
from spark_jobs.tables import TABLES

log = logging.getLogger("tracker.tidy")

APPENDED = ("progress", "frontier_changes", "operator_stats", "channel_stats")
"""The tables whose partitions grow by a file per commit (the others are replaced whole)."""
TIDY_SLICE = 8
"""Dataflows whose partitions one ``OPTIMIZE`` step merges: the Delta thread also carries the
flushes, so a pass over every partition at once (tens of thousands of files after ten minutes
of a hundred busy dataflows) held them back for tens of seconds; a busy dataflow adds one file
per flush (60 a minute), so a step merges about 500."""


class Tidier:
    """Plans and runs tidy steps on the Delta thread."""

    def __init__(self, store: Store | None, pool: Executor | None, vacuum_hours: float, *, vacuum: bool = True,
                 shared: bool = False) -> None:
        self.store = store
        self.pool = pool
        self.vacuum_hours = max(vacuum_hours, 1.0) if shared else vacuum_hours
        self.vacuums = vacuum
        self._vacuumed_fully: set[str] = set()  # tables vacuumed in full mode since the start

    def plan(self, dataflow_ids: list[str], crowded: dict[str, list[str]] | None = None
             ) -> list[tuple[str, str, list[str]]]:
        """The steps of one pass, ``(action, table, dataflow ids)``: ``OPTIMIZE`` of the
        append-only tables a slice of dataflows at a time (the tables whose partitions are
        replaced keep one file per partition anyway), then, if this process vacuums,
        ``VACUUM`` of every table. ``crowded``: per table, the dataflows whose partitions have
        more than one file (the others are left out); ``None``: all of them."""
        ids = sorted(dataflow_ids)
        steps = []
        for table in APPENDED:
            chosen = ids if crowded is None else sorted(set(crowded.get(table, [])) & set(ids))
            steps += [("optimize", table, chosen[i:i + TIDY_SLICE]) for i in range(0, len(chosen), TIDY_SLICE)]
        return steps + [("vacuum", table, []) for table in sorted(TABLES) if self.vacuums]

    async def next_pass(self, dataflow_ids: list[str]) -> list[tuple[str, str, list[str]]]:
        """:meth:`plan` of a pass over ``dataflow_ids``, with the crowded partitions read from
        each table's Delta log on the Delta thread (a fraction of a second for 10,000 files)."""
        if self.store is None:
            return self.plan(dataflow_ids)
        loop = asyncio.get_running_loop()
        warehouse = self.store.warehouse
        crowded = {table: await loop.run_in_executor(self.pool, _crowded, warehouse.path(table)) for table in APPENDED}
        return self.plan(dataflow_ids, crowded)

    async def step(self, action: str, table: str, dataflow_ids: list[str]) -> None:
        """Run one step of :meth:`plan`
        (:meth:`~spark_jobs.storage.Warehouse.optimize`, :meth:`~spark_jobs.storage.Warehouse.vacuum`)."""
        if self.store is None:
            return
        loop = asyncio.get_running_loop()
        warehouse = self.store.warehouse
        started = time.perf_counter()
        if action == "optimize":
            files = await loop.run_in_executor(self.pool, warehouse.optimize, table, dataflow_ids)
        else:
            full = table not in self._vacuumed_fully
            deleted = await loop.run_in_executor(self.pool, warehouse.vacuum, table, self.vacuum_hours, full)
            self._vacuumed_fully.add(table)
            files = {"deleted": deleted, "full": full}
        log.info("delta table tidied", extra={"action": action, "table": table, "dataflows": len(dataflow_ids),
                                              **files, "seconds": round(time.perf_counter() - started, 3)})


def _crowded(path: str) -> list[str]:
    """The dataflows whose partitions of the Delta table at ``path`` have more than one file."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(path):
        return []
    files = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    if files.num_rows == 0:
        return []
    counts = files.group_by("partition.dataflow_id").aggregate([("path", "count")])
    ids, files_each = counts.column("partition.dataflow_id").to_pylist(), counts.column("path_count").to_pylist()
    return [i for i, n in zip(ids, files_each, strict=True) if n > 1]
