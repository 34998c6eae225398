"""Delta sync in process: flush and compaction against a real Delta directory, read back by
delta-rs through polars (not through the service's store)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from api.delta.columns import RawBatch
from api.delta.store import Store
from api.delta.sync import DeltaLag, Syncer
from api.durability.records import Register
from api.durability.wal import WriteAheadLog
from api.host.tenant import Tenant
from api.live.state import LiveState, Pending
from api.metrics import Metrics
from api.streams.publish import Publication
from tracker.graph import Edge, Graph, Location, Node
from tracker.reachability import Tracker

GRAPH = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
SOURCE, TARGET = Location.source(0, 0), Location.target(1, 0)


def _tenant(dataflow_id: str) -> Tenant:
    record = Register(name=dataflow_id, arity=1, nodes=[], edges=[], initial=None, df=dataflow_id, token="t",
                      created_at="2026-01-01T00:00:00+00:00")
    tracker = Tracker(GRAPH)
    tracker.apply([(SOURCE, (0,), 1)])
    lag = DeltaLag()
    tenant = Tenant(record, GRAPH, LiveState(tracker), Publication(GRAPH, 100, lag.changes_published), lag)
    tenant.reset_published()
    lag.batch_durable(0, "_initial", 0, [(SOURCE, (0,), 1)], 0.0)
    return tenant


def _advance(tenant: Tenant, worker: str, seq: int, time: int) -> None:
    """One batch moving the source's pointstamp to ``time``, as the ingest path records it."""
    body = (b'{"worker":"%s","seq":%d,"updates":[{"location":{"node":0,"port":0,"kind":"source"},"time":[%d],'
            b'"delta":-1},{"location":{"node":0,"port":0,"kind":"source"},"time":[%d],"delta":1}]}'
            % (worker.encode(), seq, time - 1, time))
    version = tenant.live.admit(worker, seq)
    assert version is not None
    changes = tenant.live.apply(Pending(version, worker, seq, [(SOURCE, (time - 1,), -1), (SOURCE, (time,), 1)],
                                        float(version)))
    tenant.live.made_durable(version)
    tenant.lag.batch_durable(version, worker, seq, RawBatch(body, 2), float(version))
    tenant.publication.publish(version, changes, notify=False, at=float(version))


def _syncer(root: Path, dataflows: dict[str, Tenant], store: Store | None = None) -> Syncer:
    return Syncer(store or Store(root), ThreadPoolExecutor(1), WriteAheadLog(root / "_wal"), Metrics(), dataflows,
                  list, segment_bytes=1 << 30)


def _rows(root: Path, table: str) -> list[dict[str, object]]:
    return pl.read_delta(str(root / table)).to_dicts()


def test_flush_appends_every_durable_batch_once(tmp_path: Path) -> None:
    dataflows = {d: _tenant(d) for d in ("a", "b")}
    for time in range(1, 4):
        _advance(dataflows["a"], "w", time - 1, time)
    _advance(dataflows["b"], "v", 0, 1)
    syncer = _syncer(tmp_path, dataflows)
    asyncio.run(syncer.flush())
    asyncio.run(syncer.flush())  # nothing new: nothing appended again
    rows = _rows(tmp_path, "progress")
    got = sorted((r["dataflow_id"], r["version"], r["worker"], r["seq"], r["time"][0], r["delta"]) for r in rows)
    expected = [("a", 0, "_initial", 0, 0, 1), ("b", 0, "_initial", 0, 0, 1), ("b", 1, "v", 0, 0, -1),
                ("b", 1, "v", 0, 1, 1)]
    expected += [("a", t, "w", t - 1, t - 1, -1) for t in range(1, 4)] + [("a", t, "w", t - 1, t, 1)
                                                                          for t in range(1, 4)]
    assert got == sorted(expected)
    assert (dataflows["a"].lag.delta_version, dataflows["b"].lag.delta_version) == (3, 1)
    assert dataflows["a"].lag.unflushed == []


class _LostAnswer(Store):
    """A store whose first progress commit lands but reports a failure (its outcome unknown)."""

    failed = False

    def append_progress(self, batches: Any) -> int:
        version = super().append_progress(batches)
        if not self.failed:
            self.failed = True
            raise OSError("connection reset after the commit")
        return version


def test_a_commit_of_unknown_outcome_is_not_appended_twice(tmp_path: Path) -> None:
    dataflows = {"a": _tenant("a")}
    _advance(dataflows["a"], "w", 0, 1)
    syncer = _syncer(tmp_path, dataflows, _LostAnswer(tmp_path))
    with pytest.raises(OSError):
        asyncio.run(syncer.flush())
    assert [item[0] for item in dataflows["a"].lag.unflushed] == [0, 1]  # queued again, in order
    _advance(dataflows["a"], "w", 1, 2)
    asyncio.run(syncer.flush())
    versions = sorted(r["version"] for r in _rows(tmp_path, "progress"))
    assert versions == [0, 1, 1, 2, 2]  # version 0 is one row, the others two: none twice
    assert dataflows["a"].lag.delta_version == 2


def test_compaction_writes_changes_then_the_state_as_of_the_published_version(tmp_path: Path) -> None:
    dataflows = {"a": _tenant("a")}
    for time in range(1, 4):
        _advance(dataflows["a"], "w", time - 1, time)
    syncer = _syncer(tmp_path, dataflows)
    asyncio.run(syncer.compact())
    changes = sorted((r["version"], r["node"], r["kind"], r["time"][0], r["diff"])
                     for r in _rows(tmp_path, "frontier_changes"))
    assert changes == sorted([(v, 0, "source", v - 1, -1) for v in range(1, 4)] +
                             [(v, 0, "source", v, 1) for v in range(1, 4)] +
                             [(v, 1, "target", v - 1, -1) for v in range(1, 4)] +
                             [(v, 1, "target", v, 1) for v in range(1, 4)])
    assert [(r["node"], r["kind"], r["time"], r["count"]) for r in _rows(tmp_path, "pointstamps")] == [
        (0, "source", [3], 1)]
    assert sorted((r["node"], r["time"]) for r in _rows(tmp_path, "frontiers")) == [(0, [3]), (1, [3])]
    lag = dataflows["a"].lag
    assert (lag.compacted_version, lag.compacted_state, lag.uncompacted) == (3, 3, [])
    assert Store(tmp_path).snapshots(["a"]) == {"a": (3, {(SOURCE, (3,)): 1})}


def test_without_delta_nothing_queues_for_delta(tmp_path: Path) -> None:
    # Nothing drains DeltaLag without a store: a queue there grew with every published version.
    from api.config import Settings
    from api.host.ingest import submit
    from api.host.service import Service
    from api.schema.models import RegisterRequest

    async def main() -> tuple[int, int]:
        service = Service(Settings(warehouse=tmp_path, delta=False, spark=False), "admin")
        service.recover()
        body = {"name": "pair", "nodes": [{"id": 0, "inputs": 0, "outputs": 1}, {"id": 1, "inputs": 1, "outputs": 0}],
                "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}}],
                "initial": [{"location": {"node": 0, "port": 0, "kind": "source"}, "time": [0], "delta": 1}]}
        tenant = (await service.register(RegisterRequest.model_validate(body))).tenant
        for seq in range(50):
            await submit(tenant, (b'{"worker":"w","seq":%d,"updates":[{"location":{"node":0,"port":0,"kind":"source"},'
                                  b'"time":[%d],"delta":-1},{"location":{"node":0,"port":0,"kind":"source"},'
                                  b'"time":[%d],"delta":1}]}') % (seq, seq, seq + 1), service.wal, service.metrics)
        service.wal.close()
        return tenant.publication.frontier_version, len(tenant.lag.uncompacted)

    assert asyncio.run(main()) == (50, 0)
