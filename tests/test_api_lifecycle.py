"""A dataflow's lifecycle against the real service: the ``state`` of its status (running,
complete, stalled, violation, deleted), ``DELETE`` (progress refused with 410 on POST and
WebSocket, streams ended, Delta rows kept with ``deleted_at``, still deleted after a restart),
and the listing's ``state`` and ``name`` filters."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from httpx_sse import connect_sse
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from tests.helpers import ServiceProcess, ServiceStarter, register, update

STALL, QUIET = 1.5, 5.5
pytestmark = pytest.mark.service(TRACKER_DELTA="0", TRACKER_STALL_SECONDS=str(STALL))


def pair(name: str) -> dict[str, Any]:
    """An input (node 0) feeding an operator (node 1): one capability at (0,) to start with."""
    return {"name": name, "nodes": [{"id": 0, "inputs": 0, "outputs": 1}, {"id": 1, "inputs": 1, "outputs": 0}],
            "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}}]}


def post(service: ServiceProcess, dataflow: str, seq: int, updates: list[dict[str, Any]], worker: str = "w"
         ) -> Any:
    with service.client() as client:
        return client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": worker, "seq": seq,
                                                                       "updates": updates})


def status(service: ServiceProcess, dataflow: str) -> dict[str, Any]:
    with service.client() as client:
        answer = client.get(f"/v1/dataflows/{dataflow}")
    assert answer.status_code == 200, answer.text
    return answer.json()["status"]


def wait_for_state(service: ServiceProcess, dataflow: str, state: str, within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        now = status(service, dataflow)
        if now["state"] == state or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


def test_running_then_complete_when_every_frontier_is_empty(service: ServiceProcess) -> None:
    dataflow, _ = register(service, pair("finishing"))
    assert status(service, dataflow)["state"] == "running"
    assert post(service, dataflow, 0, [update(0, 0, "source", [0], 1), update(0, 0, "source", [1], 1),
                                       update(0, 0, "source", [0], -2)]).status_code == 200
    assert status(service, dataflow)["state"] == "running"  # the capability moved to (1,)
    assert post(service, dataflow, 1, [update(0, 0, "source", [1], -1)]).status_code == 200
    finished = status(service, dataflow)
    assert finished["state"] == "complete" and finished["violations"] == []
    assert finished["last_batch_at"] is not None


def test_stalled_while_live_pointstamps_do_not_move_and_running_again_when_they_do(service: ServiceProcess
                                                                                  ) -> None:
    dataflow, _ = register(service, pair("stuck"))
    started = time.monotonic()
    stalled = wait_for_state(service, dataflow, "stalled", within=STALL + 10)
    assert stalled["state"] == "stalled" and time.monotonic() - started >= STALL - 0.2
    # The frontier moves: running again, and stalled only after another quiet period.
    assert post(service, dataflow, 0, [update(0, 0, "source", [1], 1), update(0, 0, "source", [0], -1)]
                ).status_code == 200
    assert status(service, dataflow)["state"] == "running"
    assert wait_for_state(service, dataflow, "stalled", within=STALL + 10)["state"] == "stalled"


def test_a_negative_count_is_a_violation_once_nothing_live_explains_it(service: ServiceProcess) -> None:
    """-5 at the operator's input at time 0 while the input still holds its capability at 0: a
    live pointstamp explains it (the sender's +5 may be deferred, as timely's Demand mode does),
    so it is no violation however long no batch comes; the dataflow stalls instead. Once the
    input's capability moves to 3, nothing live can produce a message at 0 any more: the same
    count is a violation at once, named; a +5 arriving after that moves a frontier backwards,
    so the state stays."""
    dataflow, _ = register(service, pair("negative"))
    assert post(service, dataflow, 0, [update(1, 0, "target", [0], -5)]).status_code == 200
    assert status(service, dataflow)["state"] == "running"
    held = wait_for_state(service, dataflow, "stalled", within=STALL + 10)
    assert held["state"] == "stalled" and held["violations"] == [] and held["violation_count"] == 0, held
    time.sleep(max(0.0, QUIET - STALL))  # longer without a batch than the old rule's 5 s allowed
    assert status(service, dataflow)["state"] == "stalled"
    assert post(service, dataflow, 1, [update(0, 0, "source", [3], 1), update(0, 0, "source", [0], -1)]
                ).status_code == 200
    found = status(service, dataflow)
    assert found["state"] == "violation" and found["violation_count"] == 1, found
    assert found["violations"] == [{"location": {"node": 1, "port": 0, "kind": "target"}, "time": [0], "count": -5}]
    assert post(service, dataflow, 0, [update(1, 0, "target", [0], 5)], worker="late").status_code == 200
    late = status(service, dataflow)
    assert late["state"] == "violation" and late["violations"] == [] and late["regression_count"] == 1, late


def test_a_frontier_moved_backwards_is_a_violation_at_once_naming_the_update(start_service: ServiceStarter) -> None:
    """+1 at time 1 after the input's capability moved to 5: nothing held could produce it (the
    frontier there had passed 5). It was applied with no signal, while a negative count became a
    violation; it is applied still (the protocol's own batches never do it), and the state says
    so at once, naming it; a pointstamp the frontier allows is not one. Both engines."""
    for engine in ("native", "reference"):
        service = start_service(engine=engine, TRACKER_DELTA="0")
        dataflow, _ = register(service, pair("backwards"))
        assert post(service, dataflow, 0, [update(0, 0, "source", [0], -1), update(0, 0, "source", [5], 1)]
                    ).status_code == 200
        assert post(service, dataflow, 1, [update(1, 0, "target", [6], 1)]).status_code == 200  # allowed: 6 >= 5
        assert status(service, dataflow)["state"] == "running" and status(service, dataflow)["regression_count"] == 0
        assert post(service, dataflow, 2, [update(1, 0, "target", [6], -1), update(1, 0, "target", [1], 1)]
                    ).status_code == 200
        found = status(service, dataflow)
        assert found["state"] == "violation" and found["regression_count"] == 1, (engine, found)
        assert found["regressions"] == [{"location": {"node": 1, "port": 0, "kind": "target"}, "time": [1],
                                         "version": 3}], engine
        assert "moved a frontier backwards" in service.log_path.read_text()
        service.stop()


def test_list_filters_by_state_and_name(service: ServiceProcess) -> None:
    done, _ = register(service, pair("filtered"))
    live, _ = register(service, pair("filtered"))
    assert post(service, done, 0, [update(0, 0, "source", [0], -1)]).status_code == 200
    with service.client() as client:
        named = client.get("/v1/dataflows", params={"name": "filtered"}).json()
        complete = client.get("/v1/dataflows", params={"name": "filtered", "state": "complete"}).json()
        bad = client.get("/v1/dataflows", params={"state": "finished"})
    assert [d["id"] for d in named] == [done, live]  # oldest first
    assert {d["id"]: d["state"] for d in named} == {done: "complete", live: "running"}
    assert [d["id"] for d in complete] == [done]
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"


def test_delete_refuses_progress_ends_streams_and_keeps_reads(service: ServiceProcess) -> None:
    dataflow, token = register(service, pair("doomed"))
    assert post(service, dataflow, 0, [update(0, 0, "source", [1], 1), update(0, 0, "source", [0], -1)]
                ).status_code == 200
    url = f"{service.ws_url}/v1/dataflows/{dataflow}/ws"
    events: list[str] = []

    def listen() -> None:
        with service.client(token, timeout=15) as client, connect_sse(
                client, "GET", f"/v1/dataflows/{dataflow}/frontier/stream") as source:
            events.extend(event.event for event in source.iter_sse())  # returns when the server ends it

    with ws_connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as socket, \
            ws_connect(f"{url}?subscribe=false&token={token}") as quiet:
        assert json.loads(socket.recv(timeout=5))["type"] == "snapshot"
        listener = threading.Thread(target=listen)
        listener.start()
        deadline = time.monotonic() + 10
        while not events and time.monotonic() < deadline:  # the SSE snapshot: subscribed
            time.sleep(0.05)
        with service.client(token) as client:  # a dataflow token may not delete
            assert client.delete(f"/v1/dataflows/{dataflow}").status_code == 403
        with service.client() as client:
            answer = client.delete(f"/v1/dataflows/{dataflow}")
        assert answer.status_code == 204 and answer.content == b""
        listener.join(15)
        assert not listener.is_alive() and events == ["snapshot", "deleted"]
        for closed in (socket, quiet):
            with pytest.raises(ConnectionClosed) as ended:
                while True:
                    closed.recv(timeout=5)
            assert ended.value.rcvd is not None and ended.value.rcvd.code == 4410
            assert ended.value.rcvd.reason == "dataflow_deleted"
    refused = post(service, dataflow, 1, [update(0, 0, "source", [1], -1)])
    assert refused.status_code == 410 and refused.json()["error"] == "dataflow_deleted"
    with pytest.raises(InvalidStatus) as handshake:
        ws_connect(f"{url}?token={token}")
    assert handshake.value.response.status_code == 410
    with service.client() as client:
        assert client.get(f"/v1/dataflows/{dataflow}/frontier/stream").status_code == 410
        assert client.delete(f"/v1/dataflows/{dataflow}").status_code == 410
        frontier = client.get(f"/v1/dataflows/{dataflow}/frontier").json()  # reads still answer
        listed = [d["id"] for d in client.get("/v1/dataflows").json()]
        deleted = [d["id"] for d in client.get("/v1/dataflows", params={"state": "deleted"}).json()]
    assert frontier["version"] == 1 and {"location": {"node": 1, "port": 0, "kind": "target"},
                                         "frontier": [[1]]} in frontier["locations"]
    assert dataflow not in listed and deleted == [dataflow]
    after = status(service, dataflow)
    assert after["state"] == "deleted" and after["deleted_at"] is not None
    assert after["durable_version"] == 1  # the refused batch changed nothing


def test_deleted_stays_deleted_after_a_restart_and_in_delta(start_service: ServiceStarter) -> None:
    from spark_jobs.storage import Warehouse

    service = start_service(TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.5")
    kept, _ = register(service, pair("kept"))
    gone, _ = register(service, pair("gone"))
    with service.client() as client:
        assert client.delete(f"/v1/dataflows/{gone}").status_code == 204
    warehouse = Warehouse(service.warehouse)
    deadline = time.monotonic() + 30
    rows: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if warehouse.exists("dataflows"):
            rows = {r["dataflow_id"]: r for r in warehouse.read("dataflows").to_pylist()}
            if rows.get(gone, {}).get("deleted_at") is not None and kept in rows:
                break
        time.sleep(0.2)
    assert rows[gone]["deleted_at"] is not None and rows[kept]["deleted_at"] is None
    service.kill9()
    service.restart()
    assert post(service, gone, 0, [update(0, 0, "source", [0], -1)]).status_code == 410
    assert post(service, kept, 0, [update(0, 0, "source", [0], -1)]).status_code == 200
    assert status(service, gone)["state"] == "deleted"
    assert status(service, kept)["state"] == "complete"
    with service.client() as client:
        assert client.get(f"/v1/dataflows/{gone}/frontier/stream").status_code == 410
