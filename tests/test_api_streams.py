"""SSE and WebSocket end to end: exact changes, resume by Last-Event-ID, curl -N, slow subscribers."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from tests.helpers import ADMIN_TOKEN, ServiceProcess, as_updates, core_graph, loop_graph, register, update
from tracker.graph import Location
from tracker.reachability import Tracker

pytestmark = pytest.mark.service(TRACKER_HISTORY="20", TRACKER_SUBSCRIBER_QUEUE="8")


def local_tracker(body: dict[str, Any]) -> Tracker:
    graph, initial = core_graph(body)
    tracker = Tracker(graph)
    tracker.apply(initial)
    return tracker


def advance(step: int) -> list[dict[str, Any]]:
    """The input operator moves its capability from ``step`` to ``step + 1``."""
    return [update(0, 0, "source", [step], -1), update(0, 0, "source", [step + 1], 1)]


def as_changes(updates: list[dict[str, Any]], tracker: Tracker) -> set[tuple[Location, tuple[int, ...], int]]:
    changes = tracker.apply(as_updates(updates))
    return {(c.location, c.time, c.diff) for c in changes}


def event_changes(data: dict[str, Any]) -> set[tuple[Location, tuple[int, ...], int]]:
    return {(Location(**c["location"]), tuple(c["time"]), c["diff"]) for c in data["changes"]}


def apply_event(view: dict[Location, set], data: dict[str, Any]) -> None:
    for loc, time_, diff in event_changes(data):
        (view.setdefault(loc, set()).add if diff > 0 else view.setdefault(loc, set()).discard)(time_)


def snapshot_view(data: dict[str, Any]) -> dict[Location, set]:
    return {Location(**row["location"]): {tuple(t) for t in row["frontier"]} for row in data["locations"]}


def rest_view(service: ServiceProcess, dataflow_id: str) -> tuple[int, dict[Location, set]]:
    with service.client() as client:
        data = client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()
    return data["version"], snapshot_view(data)


def test_sse_snapshot_then_exact_changes_and_resume(service: ServiceProcess) -> None:
    body = loop_graph(operators=3)
    dataflow_id, token = register(service, body)
    tracker = local_tracker(body)
    url = f"/v1/dataflows/{dataflow_id}/frontier/stream"
    with service.client(token) as client, service.client(token) as poster:
        with connect_sse(client, "GET", url) as source:
            events = source.iter_sse()
            first = next(events)
            assert first.event == "snapshot" and first.id == "0"
            view = snapshot_view(first.json())
            assert view == {loc: set(ts) for loc, ts in tracker.frontiers().items()}
            for step in range(3):
                batch = advance(step)
                assert poster.post(f"/v1/dataflows/{dataflow_id}/progress",
                                   json={"worker": "w", "seq": step, "updates": batch}).status_code == 200
                event = next(events)
                assert event.event == "changes" and event.id == str(step + 1)
                assert event.json()["version"] == step + 1
                assert event_changes(event.json()) == as_changes(batch, tracker)
                apply_event(view, event.json())
        # Missed while disconnected: versions 4 and 5.
        for step in range(3, 5):
            poster.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": step,
                                                                      "updates": advance(step)})
        with connect_sse(client, "GET", url, headers={"Last-Event-ID": "3"}) as source:
            events = source.iter_sse()
            got = [next(events), next(events)]
        assert [(e.event, e.id) for e in got] == [("changes", "4"), ("changes", "5")]
        for event in got:
            apply_event(view, event.json())
        assert ({k: v for k, v in view.items() if v}, 5) == (
            {k: v for k, v in rest_view(service, dataflow_id)[1].items() if v}, rest_view(service, dataflow_id)[0])
        # Resuming from the current version sends nothing until the next change.
        with connect_sse(client, "GET", url, headers={"Last-Event-ID": "5"}) as source:
            events = source.iter_sse()
            poster.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": 5,
                                                                      "updates": advance(5)})
            event = next(events)
            assert (event.event, event.id) == ("changes", "6")


def test_sse_resume_from_too_old_or_bogus_id_gets_a_snapshot(service: ServiceProcess) -> None:
    body = loop_graph(operators=2)
    dataflow_id, token = register(service, body)
    with service.client(token) as client:
        for step in range(30):  # the module keeps 20 versions of history
            client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": step,
                                                                      "updates": advance(step)})
        for last in ("2", "999", "garbage"):
            with connect_sse(client, "GET", f"/v1/dataflows/{dataflow_id}/frontier/stream",
                             headers={"Last-Event-ID": last}) as source:
                event = next(source.iter_sse())
            assert (event.event, event.id) == ("snapshot", "30"), last
            assert snapshot_view(event.json()) == rest_view(service, dataflow_id)[1]
        # ?version=N needs the same history: too old is a clear 410 naming the oldest, a retained one is exact.
        too_old = client.get(f"/v1/dataflows/{dataflow_id}/frontier", params={"version": 2})
        assert too_old.status_code == 410 and too_old.json()["error"] == "version_too_old"
        assert 2 < too_old.json()["oldest"] <= 25
        assert client.get(f"/v1/dataflows/{dataflow_id}/frontier",
                          params={"version": too_old.json()["oldest"]}).status_code == 200
        recent = client.get(f"/v1/dataflows/{dataflow_id}/frontier", params={"version": 25}).json()
        assert recent["version"] == 25
        assert {r["location"]["node"]: r["frontier"] for r in recent["locations"]
                if r["location"]["kind"] == "source"}[0] == [[25]]


def test_sse_with_curl(service: ServiceProcess) -> None:
    if shutil.which("curl") is None:  # bin/test installs it; a missing curl must not pass silently
        pytest.fail("curl is missing: run bin/test (it installs it) or `apt-get install -y curl`", pytrace=False)
    dataflow_id, token = register(service, loop_graph(operators=2))
    curl = subprocess.Popen(
        ["curl", "-N", "-s", "--max-time", "4", "-H", f"Authorization: Bearer {token}",
         f"{service.url}/v1/dataflows/{dataflow_id}/frontier/stream"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.7)
    with service.client(token) as client:
        client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": 0, "updates": advance(0)})
    out, _ = curl.communicate(timeout=10)
    assert "event: snapshot" in out and "id: 0" in out
    assert "event: changes" in out and "id: 1" in out
    payload = next(line for line in out.splitlines() if line.startswith("data: ") and '"changes"' in line)
    assert json.loads(payload[6:])["version"] == 1


def test_websocket_worker_sends_batches_and_receives_acks_and_changes(service: ServiceProcess) -> None:
    body = loop_graph(operators=3)
    dataflow_id, token = register(service, body)
    tracker = local_tracker(body)
    url = f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws"
    headers = {"Authorization": f"Bearer {token}"}
    with service.client(token) as client, connect_sse(client, "GET", f"/v1/dataflows/{dataflow_id}/frontier/stream"
                                                      ) as other, ws_connect(url, additional_headers=headers) as ws:
        watcher = other.iter_sse()
        assert next(watcher).event == "snapshot"
        snapshot = json.loads(ws.recv(timeout=5))
        assert snapshot["type"] == "snapshot" and snapshot["version"] == 0
        batches = [advance(step) for step in range(5)]
        for seq, batch in enumerate(batches):  # pipelined: no waiting for acks in between
            ws.send(json.dumps({"worker": "ws-worker", "seq": seq, "updates": batch}))
        ws.send(json.dumps({"worker": "ws-worker", "seq": 0, "updates": batches[0]}))  # a retry
        ws.send("{not json")
        ws.send(json.dumps({"worker": "ws-worker", "seq": 9, "updates": []}))
        ws.send(json.dumps({"worker": "ws-worker", "seq": 5, "updates": [update(7, 0, "target", [1], 1)]}))
        ws.send(json.dumps({"worker": "ws-worker", "seq": 5, "updates": []}).encode())  # a binary frame
        acks, changes = [], {}
        while len(acks) < 10 or len(changes) < 5:
            message = json.loads(ws.recv(timeout=10))
            if message["type"] == "changes":
                changes[message["version"]] = message
            else:
                acks.append(message)
        assert [(a["type"], a.get("seq"), a.get("version")) for a in acks[:6]] == [
            ("ack", 0, 1), ("ack", 1, 2), ("ack", 2, 3), ("ack", 3, 4), ("ack", 4, 5), ("ack", 0, 1)]
        assert acks[5]["duplicate"] is True and acks[0]["applied"] is True
        assert (acks[6]["type"], acks[6]["status"], acks[6]["error"]) == ("error", 400, "malformed_json")
        assert (acks[7]["status"], acks[7]["error"], acks[7]["expected"]) == (409, "sequence_gap", 5)
        assert (acks[8]["status"], acks[8]["error"]) == (422, "invalid_update")
        assert (acks[9]["type"], acks[9]["seq"], acks[9]["version"]) == ("ack", 5, 6)
        for version, batch in enumerate(batches, start=1):
            expected = as_changes(batch, tracker)
            assert event_changes(changes[version]) == expected
            seen = next(watcher)  # the other subscriber sees the same, in version order
            assert seen.id == str(version) and event_changes(seen.json()) == expected


def test_websocket_auth_is_checked_at_the_handshake(service: ServiceProcess) -> None:
    dataflow_id, _ = register(service, loop_graph(operators=2))
    _, other_token = register(service, loop_graph(operators=2))
    url = f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws"
    with pytest.raises(InvalidStatus) as missing:
        ws_connect(url)
    assert missing.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as foreign:
        ws_connect(url, additional_headers={"Authorization": f"Bearer {other_token}"})
    assert foreign.value.response.status_code == 403
    with pytest.raises(InvalidStatus) as unknown:
        ws_connect(f"{service.ws_url}/v1/dataflows/nope/ws?token={ADMIN_TOKEN}")
    assert unknown.value.response.status_code == 404
    with pytest.raises(InvalidStatus) as long_foreign:  # any id, however long: tokens reveal nothing
        ws_connect(f"{service.ws_url}/v1/dataflows/{'x' * 100}/ws?token={other_token}")
    assert long_foreign.value.response.status_code == 403
    with pytest.raises(InvalidStatus) as bad_flag:  # a clear 422 with a body, not a bare 403
        ws_connect(f"{url}?token={ADMIN_TOKEN}&subscribe=maybe")
    assert bad_flag.value.response.status_code == 422
    assert json.loads(bad_flag.value.response.body)["error"] == "invalid_request"
    log = service.log_tail(400)  # each refusal logged once, at info, not as a server error
    assert '"websocket refused"' in log and "without completing handshake" not in log
    with ws_connect(f"{url}?token={ADMIN_TOKEN}&subscribe=False") as quiet:  # acks only: no snapshot first
        quiet.send(json.dumps({"worker": "q", "seq": 0, "updates": []}))
        assert json.loads(quiet.recv(timeout=5))["type"] == "ack"
    with ws_connect(f"{url}?token={ADMIN_TOKEN}") as ws:
        assert json.loads(ws.recv(timeout=5))["type"] == "snapshot"
        metrics = httpx.get(service.url + "/metrics").text
        [gauge] = [line for line in metrics.splitlines() if line.startswith('tracker_subscribers{transport="ws"}')]
        assert float(gauge.split()[-1]) >= 1


def test_a_slow_subscriber_is_resynced_and_does_not_slow_progress(service: ServiceProcess) -> None:
    body = loop_graph(operators=100)
    dataflow_id, token = register(service, body)
    # A raw SSE reader with a tiny receive buffer that does not read for a while.
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", service.port))
    slow.sendall(f"GET /v1/dataflows/{dataflow_id}/frontier/stream HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n".encode())
    time.sleep(0.3)
    started = time.perf_counter()
    steps = 200
    with service.client(token) as client:
        for step in range(steps):
            assert client.post(f"/v1/dataflows/{dataflow_id}/progress",
                               json={"worker": "w", "seq": step, "updates": advance(step)}).status_code == 200
    elapsed = time.perf_counter() - started
    assert elapsed < 60, "progress was held up by the slow subscriber"
    # Now read everything the slow subscriber got: a resync, then a snapshot at a later version.
    slow.settimeout(1.0)
    received = b""
    try:
        while True:  # until the stream goes quiet
            chunk = slow.recv(1 << 20)
            if not chunk:
                break
            received += chunk
    except TimeoutError:
        pass
    slow.close()
    text = dechunk(received).decode(errors="replace")
    assert "event: resync" in text, text[:500]
    after_resync = text[text.index("event: resync"):]
    assert "event: snapshot" in after_resync
    # Replaying the stream from the last snapshot gives the final frontier.
    frames = [f for f in after_resync.replace("\r\n", "\n").split("\n\n") if "data: " in f]
    view: dict[Location, set] = {}
    for frame in frames:
        lines = dict(line.split(": ", 1) for line in frame.split("\n") if ": " in line)
        if lines.get("event") == "snapshot":
            view = snapshot_view(json.loads(lines["data"]))
        elif lines.get("event") == "changes":
            apply_event(view, json.loads(lines["data"]))
    assert rest_view(service, dataflow_id) == (steps, view)
    with httpx.Client(base_url=service.url) as plain:
        metrics = plain.get("/metrics").text
    resyncs = [line for line in metrics.splitlines() if line.startswith("tracker_subscriber_resyncs_total")]
    assert resyncs and float(resyncs[0].split()[1]) >= 1


def dechunk(raw: bytes) -> bytes:
    """The body of a raw HTTP/1.1 response with chunked transfer encoding (possibly cut short)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    if b"chunked" not in head.lower():
        return rest
    body = b""
    while rest:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            break
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        body += rest[:size]
        rest = rest[size + 2:]
    return body
