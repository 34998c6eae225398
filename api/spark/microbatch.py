"""``--engine spark``: frontier maintenance by Spark micro-batches instead of the native tracker.

The request path is unchanged (validation, ``(worker, seq)`` ordering, the write-ahead log,
durable acknowledgements); only occurrence counts are kept in Python (:mod:`api.live.counts`).
Durable batches queue up per dataflow (:attr:`api.spark.session.SparkState.queue`), and
:func:`microbatch_loop` hands everything queued to
``spark_jobs.incremental.SparkFrontierEngine`` as one micro-batch on the spark thread.

Guarantees: the changes Spark returns are published under the micro-batch's last version, in
version order, so the frontier (and every stream) trails the acknowledged version by about one
micro-batch; micro-batches take their dataflow's turn at Spark (:mod:`api.spark.turns`), with no
time limit (the frontier depends on them); versions folded into a micro-batch have no change event of their own, and
``?version=N`` for such an ``N`` answers the frontier of the micro-batch before it. A failed
micro-batch is retried with its batches still in order (the engine applies a micro-batch
entirely or not at all).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from api.metrics import Metrics
from api.spark.session import Hosted, Spark
from api.spark.turns import SparkQueue
from tracker.graph import Update
from tracker.reachability import FrontierChange

log = logging.getLogger("tracker.microbatch")


def _apply_in_spark(spark: Spark, dataflow: Hosted, updates: list[Update]) -> list[FrontierChange]:
    from spark_jobs.incremental import SparkFrontierEngine

    state = dataflow.spark
    if state.engine is None:
        state.engine = SparkFrontierEngine(spark.session, dataflow.graph, dataflow.id)
    changes: list[FrontierChange] = state.engine.apply(updates)
    return changes


async def microbatch_loop(spark: Spark, turns: SparkQueue, metrics: Metrics, dataflows: Mapping[str, Hosted],
                          interval: float = 0.05) -> None:
    """Run one micro-batch per dataflow with queued batches, forever."""
    while True:
        await asyncio.sleep(interval)
        if spark.session is None:
            continue
        for dataflow in list(dataflows.values()):
            state = dataflow.spark
            if not state.queue or not dataflow.ready:
                continue
            # The batches stay queued until their changes are published: until then the
            # compacted snapshot's counts (Tenant.counts) must still leave them out.
            queued = list(state.queue)
            version = queued[-1][0]
            updates = [u for _, batch in queued for u in batch]
            started = time.perf_counter()
            try:
                async with turns.turn(dataflow.id):
                    changes = await spark.run(f"micro-batch of {dataflow.id}", _apply_in_spark, spark, dataflow,
                                              updates, limit=0)
            except Exception:  # still queued: retried next round, in version order
                metrics.delta_errors.inc()
                log.exception("spark micro-batch failed; will retry", extra={"dataflow": dataflow.id})
                await asyncio.sleep(1.0)
                continue
            del state.queue[:len(queued)]
            dataflow.publication.publish(version, changes)
            metrics.frontier_changes.inc(len(changes))
            log.debug("spark micro-batch", extra={"dataflow": dataflow.id, "version": version,
                                                  "batches": len(queued), "changes": len(changes),
                                                  "seconds": round(time.perf_counter() - started, 3)})
