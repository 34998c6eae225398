"""``--engine spark`` in the Spark process: each dataflow's ``SparkFrontierEngine`` and its
micro-batches.

Guarantees: a micro-batch is applied entirely or not at all (the engine's own guarantee); a
reset starts a new engine from the dataflow's whole counts, so its changes are the frontier
itself (from the empty one): after a restart of this process the hot path sends a reset and
publishes only the difference with what it published. Micro-batches take their dataflow's turn
at Spark (:mod:`api.spark.turns`) with no time limit (the frontier depends on them).
"""

from __future__ import annotations

from api.spark.known import Known
from api.spark.session import Spark
from api.spark.turns import SparkQueue
from tracker.graph import Update
from tracker.reachability import FrontierChange


def _apply(spark: Spark, dataflow: Known, updates: list[Update], reset: bool) -> list[FrontierChange]:
    from spark_jobs.incremental import SparkFrontierEngine

    if not reset and dataflow.engine is None:
        raise RuntimeError("no engine for this dataflow here: the hot path must send a reset")
    if reset:
        dataflow.engine = None  # a failed reset must not leave the old engine to be applied to
        engine = SparkFrontierEngine(spark.session, dataflow.graph, dataflow.id)
        changes: list[FrontierChange] = engine.apply(updates)
        dataflow.engine = engine
        return changes
    changes = dataflow.engine.apply(updates)
    return changes


async def microbatch(spark: Spark, turns: SparkQueue, dataflow: Known, updates: list[Update],
                     reset: bool) -> list[FrontierChange]:
    """Apply one micro-batch (or a reset) at ``dataflow``'s turn; its frontier changes."""
    async with turns.turn(dataflow.id):
        return await spark.run(f"micro-batch of {dataflow.id}", _apply, spark, dataflow, updates, reset, limit=0)
