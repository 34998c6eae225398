"""The dashboard's two routes against the real service, without a browser: a frame is one
version throughout (checked against the frontier rewound to that version while progress flows),
and the history joins the Delta tables with the service's memory up to a version after which
the stream resumes with no gap and no duplicate. After a restart from a compacted snapshot,
ages and lags say they are lower bounds."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from spark_jobs.storage import Warehouse
from tests.helpers import ServiceProcess, loop_graph, register, update
from tests.helpers import ServiceStarter as Starter

ENV = {"TRACKER_FLUSH_SECONDS": "0.2", "TRACKER_COMPACT_SECONDS": "0.3"}
pytestmark = pytest.mark.service(**ENV)


class Feeder(threading.Thread):
    """Advances the input of a loop dataflow every ``period`` seconds until stopped."""

    def __init__(self, service: ServiceProcess, dataflow: str, token: str, period: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.service, self.dataflow, self.token, self.period = service, dataflow, token, period
        self.stop = threading.Event()
        self.epoch = 0
        self.failure: str | None = None

    def advance(self, client: httpx.Client) -> None:
        answer = client.post(f"/v1/dataflows/{self.dataflow}/progress", json={"worker": "input", "seq": self.epoch,
            "updates": [update(0, 0, "source", [self.epoch], -1), update(0, 0, "source", [self.epoch + 1], 1)]})
        if answer.status_code != 200:
            self.failure = answer.text
        self.epoch += 1

    def run(self) -> None:
        with self.service.client(self.token) as client:
            while not self.stop.is_set() and self.failure is None:
                self.advance(client)
                time.sleep(self.period)


def frontiers(rows: list[dict[str, Any]]) -> dict[str, list[list[int]]]:
    return {json.dumps(r["location"], sort_keys=True): r["frontier"] for r in rows}


def test_a_frame_is_one_version_while_progress_flows(service: ServiceProcess) -> None:
    dataflow, token = register(service, loop_graph(3, name="framed"))
    feeder = Feeder(service, dataflow, token)
    feeder.start()
    try:
        seen = set()
        with service.client(token) as client:
            for _ in range(12):
                frame = client.get(f"/dashboard/api/dataflows/{dataflow}/frame",
                                   params={"node": 3, "port": 0, "kind": "target"}).json()
                version = frame["version"]
                seen.add(version)
                assert (frame["status"]["frontier_version"] == frame["lag"]["version"] == frame["estimate"]["version"]
                        == version)
                # Every frontier of the frame is the frontier of that version (rewound there now).
                rewound = client.get(f"/v1/dataflows/{dataflow}/frontier", params={"version": version}).json()
                assert frontiers(frame["lag"]["locations"]) == frontiers(rewound["locations"])
                by_location = frontiers(frame["lag"]["locations"])
                for held in frame["held"]:
                    assert held["frontier"] == by_location[json.dumps(held["location"], sort_keys=True)]
                    assert held["time"] == held["frontier"][0] and held["blocker_count"] >= 1
                explained = frame["explained"]
                assert explained["version"] == version
                assert explained["frontier"] == by_location[json.dumps({"node": 3, "port": 0, "kind": "target"},
                                                                       sort_keys=True)]
                assert {"node": 0} in explained["operators"]  # the input's capability holds everything
                time.sleep(0.05)
    finally:
        feeder.stop.set()
        feeder.join()
    assert feeder.failure is None and len(seen) >= 3  # the versions did move under the frames


def test_the_history_joins_delta_and_memory_and_the_stream_resumes_after_it(service: ServiceProcess) -> None:
    dataflow, token = register(service, loop_graph(3, name="history"))
    feeder = Feeder(service, dataflow, token, period=0.05)
    feeder.start()
    time.sleep(2.0)  # compaction runs every 0.3 s: Delta holds the older versions, memory the newest
    wanted = "2:0:target,3:0:target"
    with service.client(token) as client:
        history = client.get(f"/dashboard/api/dataflows/{dataflow}/history", params={"locations": wanted}).json()
        version = history["version"]
        with client.stream("GET", f"/v1/dataflows/{dataflow}/frontier/stream", params={"locations": wanted},
                           headers={"Last-Event-ID": str(version)}) as stream:
            first = _first_event(stream)
        feeder.stop.set()
        feeder.join()
        rewound = client.get(f"/v1/dataflows/{dataflow}/frontier", params={"version": version}).json()
        later = client.get(f"/dashboard/api/dataflows/{dataflow}/history").json()
    assert feeder.failure is None and version >= 10
    rows, base = history["frontier_changes"], history["base"]
    # Every input advance moves op2's input frontier: every version after the base is there, once.
    assert sorted({r["version"] for r in rows}) == list(range(base["version"] + 1, version + 1))
    assert base["version"] <= 0  # from the registration on: Delta's rows, then memory's
    assert {json.dumps(r["location"], sort_keys=True) for r in rows} <= {
        json.dumps({"node": n, "port": 0, "kind": "target"}, sort_keys=True) for n in (2, 3)}
    replayed = {json.dumps(row["location"], sort_keys=True): {tuple(t) for t in row["frontier"]}
                for row in base["locations"]}
    for row in rows:
        times = replayed.setdefault(json.dumps(row["location"], sort_keys=True), set())
        (times.add if row["diff"] > 0 else times.discard)(tuple(row["time"]))
    expected = {json.dumps(r["location"], sort_keys=True): {tuple(t) for t in r["frontier"]}
                for r in rewound["locations"] if r["location"]["node"] in (2, 3) and r["location"]["kind"] == "target"}
    assert replayed == expected
    assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)
    # The stream goes on right after the history's version: changes, not a snapshot.
    assert first[0] == "changes" and first[1] == version + 1
    # The throughput of Delta's seconds and memory's together counts every batch once.
    assert sum(r["batches"] for r in later["throughput"]) == feeder.epoch


def _first_event(stream: httpx.Response) -> tuple[str, int]:
    """The first event of an SSE response: ``(event, id)``."""
    event, ident = "message", -1
    for line in stream.iter_lines():
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("id:"):
            ident = int(line.split(":", 1)[1])
        elif not line and ident >= 0:
            return event, ident
    raise AssertionError("the stream ended without an event")


def test_bad_dashboard_requests_are_refused(service: ServiceProcess) -> None:
    dataflow, token = register(service, loop_graph(2, name="refusals"))
    with service.client(token) as client:
        route = f"/dashboard/api/dataflows/{dataflow}"
        assert client.get(route + "/history", params={"locations": "1:0:sideways"}).status_code == 422
        assert client.get(route + "/history", params={"locations": "9:0:target"}).json()["error"] == "unknown_location"
        assert client.get(route + "/frame", params={"node": 1}).json()["error"] == "invalid_request"
        assert client.get(route + "/frame", params={"node": 9, "port": 0, "kind": "target"}).status_code == 422
        assert client.get(route + "/frame", params={"node": 1, "port": 0, "kind": "target", "scope": "4"}
                          ).json()["error"] == "unknown_scope"
        assert client.get(route + "/frame", params={"throughput_after": -1}).status_code == 422
    assert httpx.get(f"{service.url}/dashboard/api/dataflows/{dataflow}/frame").status_code == 401


def test_ages_survive_a_restart_from_a_snapshot(start_service: Starter) -> None:
    """The snapshot keeps when each pointstamp was first seen and each frontier last moved:
    after a restart, lag and ages go on from where they were (plus the downtime), exact, with
    the workers that reported them."""
    service = start_service(**ENV)
    dataflow, token = register(service, loop_graph(3, name="restarted"))
    feeder = Feeder(service, dataflow, token)
    warehouse = Warehouse(service.warehouse)
    with service.client(token) as client:
        for _ in range(3):
            feeder.advance(client)
        deadline = time.monotonic() + 15
        while warehouse.pointstamps_version(dataflow) != 3:
            assert time.monotonic() < deadline, "version 3 was not compacted into Delta"
            time.sleep(0.1)
        time.sleep(1.0)  # a second of lag and age before the restart
        before = client.get(f"/v1/dataflows/{dataflow}/lag").json()
    assert not before["max_lag_at_least"] and not any(r["lag_at_least"] for r in before["locations"])
    service.stop()
    time.sleep(2.0)  # downtime
    service.restart()
    with service.client(token) as client:
        after = client.get(f"/v1/dataflows/{dataflow}/lag").json()
        blockers = client.get(f"/v1/dataflows/{dataflow}/frontier/explain",
                              params={"node": 3, "port": 0, "kind": "target", "time": "3"}).json()["blockers"]
        elapsed = after["at"] - before["at"]
        assert elapsed > 2.0
        assert not after["max_lag_at_least"]
        assert abs(after["max_lag_seconds"] - (before["max_lag_seconds"] + elapsed)) < 0.01, (before, after)
        for old, new in zip(before["locations"], after["locations"], strict=True):
            assert new["location"] == old["location"] and new["frontier"] == old["frontier"]
            assert new["changed_at"] == old["changed_at"] and not new["lag_at_least"], (old, new)
            if old["lag_seconds"] is not None:
                assert abs(new["lag_seconds"] - (old["lag_seconds"] + elapsed)) < 0.01, (old, new)
        held = next(r for r in after["locations"] if r["location"] == {"node": 0, "port": 0, "kind": "source"})
        oldest = held["oldest_pointstamp"]
        was = next(r for r in before["locations"] if r["location"] == held["location"])["oldest_pointstamp"]
        assert oldest["worker"] == "input" and not oldest["age_at_least"] and oldest["time"] == [3]
        assert abs(oldest["age_seconds"] - (was["age_seconds"] + elapsed)) < 0.01, (was, oldest)
        assert [(b["worker"], b["age_at_least"]) for b in blockers] == [("input", False)]
        feeder.advance(client)  # a new batch: what it moves and what it makes live is known exactly
        moved = client.get(f"/v1/dataflows/{dataflow}/lag").json()
        history = client.get(f"/dashboard/api/dataflows/{dataflow}/history").json()
    op3 = next(r for r in moved["locations"] if r["location"] == {"node": 3, "port": 0, "kind": "target"})
    assert not op3["lag_at_least"] and op3["lag_seconds"] < 5
    # Delta's seconds from before the restart and memory's after it: every batch once.
    assert sum(r["batches"] for r in history["throughput"]) == 4
