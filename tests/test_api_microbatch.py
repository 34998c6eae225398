"""``--engine spark`` on the hot path's side (:class:`api.background.spark.SparkLink`): what it
asks of the Spark process, the counts the compacted snapshot reads while a micro-batch is in
flight, a failed micro-batch retried as a reset, and a restarted Spark process's reset
publishing only the difference. The Spark process is stood in for by the reference tracker
computing the same answers (the real process is tested in ``test_api_engine_spark``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api.background import spark as link_module
from api.background.spark import SparkLink
from api.channel.messages import Applied, Know, MicroBatch, Status, ToSpark, change_row, from_change_row
from api.config import Settings
from api.durability.records import Register
from api.host.tenant import Tenant
from api.live.counts import CountsOnly
from api.live.state import LiveState, Pending
from api.metrics import Metrics
from api.streams.publish import Publication
from tracker.graph import Edge, Graph, Location, Node, Update
from tracker.reachability import Tracker

GRAPH = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
SOURCE = Location.source(0, 0)
TARGET = Location.target(1, 0)


class _Client:
    """The channel, connected: records what is offered."""

    connected = True
    connects = 1

    def __init__(self) -> None:
        self.sent: list[ToSpark] = []

    def offer(self, message: ToSpark) -> bool:
        self.sent.append(message)
        return True


class _SparkStandIn:
    """Answers micro-batches as the Spark process would, with the reference tracker."""

    def __init__(self) -> None:
        self.engine: Tracker | None = None

    def answer(self, batch: MicroBatch, fail: bool = False) -> Applied:
        if fail:
            return Applied(df=batch.df, version=batch.version, changes=[], reset=batch.reset, error="RuntimeError: x")
        if batch.reset:
            self.engine = Tracker(GRAPH)
        assert self.engine is not None
        changes = self.engine.apply([from_change_row(r) for r in batch.updates])
        return Applied(df=batch.df, version=batch.version, reset=batch.reset,
                       changes=[change_row(c.location, c.time, c.diff) for c in changes])


def _spark_tenant() -> Tenant:
    record = Register(name="s", arity=1, nodes=[], edges=[], initial=None, df="s", token="t",
                      created_at="2026-01-01T00:00:00+00:00")
    tracker = CountsOnly(GRAPH)
    tracker.apply([(SOURCE, (0,), 1)])
    tenant = Tenant(record, GRAPH, LiveState(tracker), Publication(GRAPH, 100), engine_mode="spark", ready=True)
    tenant.reset_published()  # queues the initial counts: Spark's first micro-batch
    return tenant


def _advance(tenant: Tenant, time: int) -> None:
    """One durable batch moving the source's pointstamp to ``time``, queued as ingest does."""
    updates: list[Update] = [(SOURCE, (time - 1,), -1), (SOURCE, (time,), 1)]
    version = tenant.live.admit("w", time - 1)
    assert version is not None
    tenant.live.apply(Pending(version, "w", time - 1, updates, 0.0))
    tenant.live.made_durable(version)
    tenant.spark.queue.append((version, updates))


def _sent_batch(client: _Client) -> MicroBatch:
    batches = [m for m in client.sent if isinstance(m, MicroBatch)]
    assert len(batches) == 1, client.sent
    client.sent.clear()
    return batches[0]


def _frontier(tenant: Tenant) -> dict[Location, list[Any]]:
    return {loc: sorted(ts) for loc, ts in tenant.publication.published.items() if ts}


def test_micro_batches_resets_and_a_restarted_spark_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link_module, "RETRY_SECONDS", 0.0)
    asyncio.run(_scenario())  # publishing needs the event loop


async def _scenario() -> None:
    tenant = _spark_tenant()
    link = SparkLink(Settings(spark=True, engine="spark"), Metrics(), {"s": tenant}, lambda _: None)
    client = _Client()
    link.client = client  # type: ignore[assignment]
    link.status = Status(pid=1, state="ready")
    spark = _SparkStandIn()
    link.registered(tenant)

    link.send_microbatches()  # the first: a reset holding the whole counts, after the graph
    assert isinstance(client.sent[0], Know) and client.sent[0].df == "s"
    first = _sent_batch(client)
    assert first.reset and first.version == 0 and first.updates == [(0, 0, "source", (0,), 1)]
    _advance(tenant, 1)
    _advance(tenant, 2)  # while version 0's micro-batch is in flight
    link.send_microbatches()
    assert client.sent == [], "a second micro-batch while one is in flight"
    assert tenant.counts() == {} and tenant.publication.frontier_version == -1  # as of the published version
    link._land(spark.answer(first))
    assert tenant.publication.frontier_version == 0 and _frontier(tenant) == {SOURCE: [(0,)], TARGET: [(0,)]}
    assert tenant.counts() == {(SOURCE, (0,)): 1}

    link.send_microbatches()  # versions 1-2 together; it fails, and is retried as a reset
    second = _sent_batch(client)
    assert not second.reset and second.version == 2 and len(second.updates) == 4
    link._land(spark.answer(second, fail=True))
    assert tenant.publication.frontier_version == 0 and len(tenant.spark.queue) == 2
    link.send_microbatches()
    retried = _sent_batch(client)
    assert retried.reset and retried.updates == [(0, 0, "source", (2,), 1)]
    link._land(spark.answer(retried))
    assert tenant.publication.frontier_version == 2 and tenant.spark.queue == []
    assert _frontier(tenant) == {SOURCE: [(2,)], TARGET: [(2,)]}
    assert tenant.counts() == {(SOURCE, (2,)): 1}

    # The Spark process restarts: a reset at the same version publishes nothing (same frontier).
    link._lost()
    assert link._replay()[0].__class__.__name__ == "Hello"
    link.send_microbatches()
    again = _sent_batch(client)
    assert again.reset and again.version == 2
    link._land(spark.answer(again))
    assert tenant.publication.frontier_version == 2 and _frontier(tenant) == {SOURCE: [(2,)], TARGET: [(2,)]}
