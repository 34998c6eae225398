"""``tracker serve --engine spark``: frontiers maintained by Spark micro-batches, end to end."""

from __future__ import annotations

import time
from typing import Any

import pytest
from httpx_sse import connect_sse

from tests.helpers import (
    ServiceProcess,
    ServiceStarter,
    as_updates,
    core_graph,
    frontier_map,
    loop_graph,
    register,
    update,
)
from tracker import oracle
from tracker.graph import Location

pytestmark = [pytest.mark.service, pytest.mark.spark]


def frontier_when_caught_up(service: ServiceProcess, dataflow_id: str, version: int,
                            timeout: float = 240.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with service.client() as client:
        while time.monotonic() < deadline:
            answer = client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()
            if answer["version"] == version:
                return answer
            time.sleep(0.3)
    raise AssertionError(f"Spark did not reach version {version}:\n{service.log_tail()}")


def test_spark_engine_frontiers_streams_and_recovery(start_service: ServiceStarter) -> None:
    service = start_service(spark=True, engine="spark", SPARK_MASTER="local[1]", TRACKER_AUDIT_SECONDS="0",
                            TRACKER_SPARK_CHECK="0")
    body = loop_graph(operators=3, arity=2)
    dataflow_id, token = register(service, body)
    graph, initial = core_graph(body)
    first = frontier_when_caught_up(service, dataflow_id, 0)
    assert frontier_map(first) == oracle.frontiers(graph, oracle.accumulate([initial]))
    batches = [
        [update(0, 0, "source", [0, 0], -1), update(0, 0, "source", [1, 0], 1), update(2, 0, "target", [0, 3], 1)],
        [update(2, 0, "target", [0, 3], -1), update(3, 0, "source", [1, 1], 1)],
        [update(1, 0, "target", [2, 0], 2)],
    ]
    with service.client(token) as client, connect_sse(client, "GET",
                                                      f"/v1/dataflows/{dataflow_id}/frontier/stream") as source:
        events = source.iter_sse()
        snapshot = next(events)
        assert snapshot.event == "snapshot" and snapshot.id == "0"
        view = {Location(**r["location"]): {tuple(t) for t in r["frontier"]} for r in snapshot.json()["locations"]}
        for seq, batch in enumerate(batches):
            answer = client.post(f"/v1/dataflows/{dataflow_id}/progress",
                                 json={"worker": "w", "seq": seq, "updates": batch})
            assert answer.json() == {"applied": True, "duplicate": False, "version": seq + 1}
        converted = [as_updates(b) for b in batches]
        expected = oracle.frontiers(graph, oracle.accumulate([initial, *converted]))
        caught_up = frontier_when_caught_up(service, dataflow_id, len(batches))
        assert frontier_map(caught_up) == expected
        last = 0
        while last < len(batches):  # the stream's changes, in version order, end at the same frontier
            event = next(events)
            if event.event != "changes" and not event.data:
                continue  # a keep-alive (every 15 s) while the Spark process, at nice 10, works
            assert event.event == "changes" and int(event.id) > last
            last = int(event.id)
            for change in event.json()["changes"]:
                times = view.setdefault(Location(**change["location"]), set())
                (times.add if change["diff"] > 0 else times.discard)(tuple(change["time"]))
        assert {k: sorted(v) for k, v in view.items()} == expected
        status = client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]
        assert status["engine"] == "spark" and status["frontier_version"] == len(batches)
    service.kill9()
    service.restart()
    assert frontier_map(frontier_when_caught_up(service, dataflow_id, len(batches))) == expected
