"""Tidying of the Delta tables: small files merged (``OPTIMIZE``), unreferenced ones deleted
(``VACUUM``), in small steps so that the flushes sharing the Delta thread keep their pace.

Guarantees: a step never rewrites what a reader of a retained table version needs (files of
superseded versions are kept ``vacuum_hours``, the reach of Delta time travel); the first
``VACUUM`` of each table after a start also looks for files a crash left behind.

With several shards sharing the warehouse, each ``OPTIMIZE`` is scoped to this shard's own
partitions (its dataflows), and only shard 0 runs ``VACUUM``, which lists whole tables: two
shards never tidy the same files, and a ``VACUUM`` keeps files written in the last hour at
least, so that it cannot delete the files of another shard's commit in progress.

>>> Tidier(None, None, 24.0).plan(["a", "b"])[:2]
[('optimize', 'progress', ['a', 'b']), ('optimize', 'frontier_changes', ['a', 'b'])]
>>> Tidier(None, None, 24.0, vacuum=False).plan(["a"])[-1]
('optimize', 'frontier_changes', ['a'])
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor

from api.delta.store import Store
from spark_jobs.tables import TABLES

log = logging.getLogger("tracker.tidy")

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

    def plan(self, dataflow_ids: list[str]) -> list[tuple[str, str, list[str]]]:
        """The steps of one pass, ``(action, table, dataflow ids)``: ``OPTIMIZE`` of the
        append-only tables a slice of dataflows at a time (the tables whose partitions are
        replaced keep one file per partition anyway), then, if this process vacuums,
        ``VACUUM`` of every table."""
        ids = sorted(dataflow_ids)
        steps = [("optimize", table, ids[i:i + TIDY_SLICE])
                 for table in ("progress", "frontier_changes") for i in range(0, len(ids), TIDY_SLICE)]
        return steps + [("vacuum", table, []) for table in sorted(TABLES) if self.vacuums]

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
