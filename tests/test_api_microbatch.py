"""``--engine spark``'s micro-batch loop: what it hands to Spark, and the counts the compacted
snapshot reads while a micro-batch runs. Spark itself is replaced by a stand-in that records the
updates it is given (the real engine is tested in ``test_api_engine_spark`` and the Spark tests)."""

from __future__ import annotations

import asyncio
from typing import Any

from api.durability.records import Register
from api.host.tenant import Tenant
from api.live.counts import CountsOnly
from api.live.state import LiveState, Pending
from api.metrics import Metrics
from api.spark.microbatch import microbatch_loop
from api.spark.turns import SparkQueue
from api.streams.publish import Publication
from tracker.graph import Edge, Graph, Location, Node, Update

GRAPH = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
SOURCE = Location.source(0, 0)


class _Spark:
    """Runs nothing: records each micro-batch's updates, fails the first ``failures`` of them,
    and holds each one until :attr:`release` is set."""

    def __init__(self, failures: int) -> None:
        self.session = object()
        self.failures = failures
        self.applied: list[list[Update]] = []
        self.running = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self, label: str, fn: Any, spark: Any, dataflow: Any, updates: list[Update],
                  limit: float | None = None) -> list[Any]:
        self.running.set()
        await self.release.wait()
        self.release.clear()
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the micro-batch failed")
        self.applied.append(updates)
        return []


def _spark_tenant() -> Tenant:
    record = Register(name="s", arity=1, nodes=[], edges=[], initial=None, df="s", token="t",
                      created_at="2026-01-01T00:00:00+00:00")
    tracker = CountsOnly(GRAPH)
    tracker.apply([(SOURCE, (0,), 1)])
    tenant = Tenant(record, GRAPH, LiveState(tracker), Publication(GRAPH, 100), engine_mode="spark", ready=True)
    tenant.reset_published()  # queues the initial counts as version 0's micro-batch
    return tenant


def _advance(tenant: Tenant, time: int) -> None:
    """One durable batch moving the source's pointstamp to ``time``, queued as ingest does."""
    updates: list[Update] = [(SOURCE, (time - 1,), -1), (SOURCE, (time,), 1)]
    version = tenant.live.admit("w", time - 1)
    assert version is not None
    tenant.live.apply(Pending(version, "w", time - 1, updates, 0.0))
    tenant.live.made_durable(version)
    tenant.spark.queue.append((version, updates))


def test_a_running_micro_batch_stays_out_of_the_counts_and_a_failed_one_is_applied_once() -> None:
    async def scenario() -> None:
        tenant = _spark_tenant()
        spark = _Spark(failures=1)
        loop = asyncio.create_task(microbatch_loop(spark, SparkQueue(), Metrics(), {"s": tenant},  # type: ignore[arg-type]
                                                   interval=0.001))
        for attempt in range(3):  # version 0 fails once, then runs; then versions 1-2
            await spark.running.wait()
            spark.running.clear()
            if attempt == 1:
                _advance(tenant, 1)
                _advance(tenant, 2)  # while version 0's micro-batch runs: the next one takes both
            # What compaction reads while Spark runs: counts as of the published version.
            published = tenant.publication.frontier_version
            assert tenant.counts() == ({} if published < 0 else {(SOURCE, (0,)): 1})
            assert published == (-1 if attempt < 2 else 0)
            spark.release.set()
            await asyncio.sleep(0.05)
        loop.cancel()
        assert tenant.publication.frontier_version == 2 and tenant.spark.queue == []
        assert spark.applied == [[(SOURCE, (0,), 1)], [(SOURCE, (0,), -1), (SOURCE, (1,), 1),
                                                        (SOURCE, (1,), -1), (SOURCE, (2,), 1)]]
        assert tenant.counts() == {(SOURCE, (2,)): 1}

    asyncio.run(scenario())
