"""``--engine spark``: frontier maintenance by Spark micro-batches instead of the native tracker.

The request path is unchanged (validation, ``(worker, seq)`` ordering, the write-ahead log,
durable acknowledgements); only occurrence *counts* are kept in Python (:class:`CountsOnly`).
Durable batches queue up per dataflow, and :func:`engine_loop` hands everything queued to
``spark_jobs.incremental.SparkFrontierEngine`` as one micro-batch on the Spark thread. The
changes it returns are published under the micro-batch's last version, so the frontier (and
every stream) trails the acknowledged version by about one micro-batch; versions folded into a
micro-batch simply have no change event of their own, and ``?version=N`` for such an ``N``
answers the frontier of the micro-batch before it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tracker.graph import Graph, Location, Update
from tracker.reachability import FrontierChange
from tracker.timestamp import Timestamp

if TYPE_CHECKING:
    from api.dataflows import Dataflow
    from api.service import Service

log = logging.getLogger("tracker.engine")


class CountsOnly:
    """The part of the :class:`~tracker.reachability.Tracker` interface the service needs when
    Spark computes frontiers: occurrence counts, and no frontier changes of its own."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._counts: dict[tuple[Location, Timestamp], int] = {}

    def apply(self, updates: Iterable[Update], *, validated: bool = False) -> list[FrontierChange]:
        """Fold a batch into the counts; frontier changes come from Spark later."""
        batch = list(updates) if validated else self.graph.check_updates(updates)
        counts = self._counts
        for location, time_, delta in batch:
            key = (location, time_)
            value = counts.get(key, 0) + delta
            if value:
                counts[key] = value
            else:
                counts.pop(key, None)
        return []

    def pointstamps(self) -> dict[tuple[Location, Timestamp], int]:
        """Every non-zero count."""
        return dict(self._counts)

    def frontiers(self) -> dict[Location, list[Timestamp]]:
        """Not known here: Spark publishes them (see the module docstring)."""
        return {loc: [] for loc in self.graph.locations()}


def _apply_in_spark(service: Service, dataflow: Dataflow, updates: list[Update]) -> list[FrontierChange]:
    from spark_jobs.incremental import SparkFrontierEngine

    if dataflow.engine is None:
        dataflow.engine = SparkFrontierEngine(service.spark, dataflow.graph, dataflow.id)
    return dataflow.engine.apply(updates)


async def engine_loop(service: Service, interval: float = 0.05) -> None:
    """Run one micro-batch per dataflow with queued batches, forever."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval)
        if service.spark is None:
            continue
        for dataflow in list(service.dataflows.values()):
            if not dataflow.spark_queue or not dataflow.ready:
                continue
            queued, dataflow.spark_queue = dataflow.spark_queue, []
            version = queued[-1][0]
            updates = [u for _, batch in queued for u in batch]
            started = time.perf_counter()
            try:
                changes = await loop.run_in_executor(service.spark_pool, _apply_in_spark, service, dataflow, updates)
            except Exception:
                dataflow.spark_queue[:0] = queued  # retried next round, still in version order
                service.metrics.delta_errors.inc()
                log.exception("spark micro-batch failed; will retry", extra={"dataflow": dataflow.id})
                await asyncio.sleep(1.0)
                continue
            dataflow.frontier_version = version
            dataflow.record_changes(version, changes)
            service.metrics.frontier_changes.inc(len(changes))
            log.debug("spark micro-batch", extra={"dataflow": dataflow.id, "version": version,
                                                  "batches": len(queued), "changes": len(changes),
                                                  "seconds": round(time.perf_counter() - started, 3)})
