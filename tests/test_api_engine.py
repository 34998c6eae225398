"""``--engine native`` (the compiled engine) against ``--engine reference`` (the Python tracker):
identical answers and events, the engine named in ``/healthz``, ``/metrics`` and the log,
location selections on the streams, and registration limits that follow the engine."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from httpx_sse import connect_sse
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from api.streams.publish import Publication
from api.streams.subscribers import Subscriber
from tests.helpers import ServiceProcess, ServiceStarter, core_graph, loop_graph, register, update
from tests.test_api_rest import _two_summary_chain
from tracker.compiled import CompiledTracker
from tracker.graph import Location

ROOT = Path(__file__).resolve().parent.parent


def advance(step: int) -> list[dict[str, Any]]:
    """The input moves its capability from ``step`` to ``step + 1``."""
    return [update(0, 0, "source", [step], -1), update(0, 0, "source", [step + 1], 1)]


def batches() -> list[list[dict[str, Any]]]:
    """Capability moves, messages in flight at several places, a transiently negative count, an
    empty batch: every kind of change the service publishes."""
    out = [advance(0), [update(2, 0, "target", [1], 1), update(3, 0, "target", [2], 1)], advance(1),
           [update(2, 0, "target", [1], -1), update(4, 0, "target", [5], -1)], [],
           [update(4, 0, "target", [5], 1), update(3, 0, "target", [2], -1)], advance(2), advance(3)]
    return out


def exchange(service: ServiceProcess, body: dict[str, Any], query: str = "") -> dict[str, Any]:
    """Register ``body``, subscribe (with ``query``), send :func:`batches` on another socket and
    collect everything both sides and the REST routes answer, as JSON text."""
    dataflow, token = register(service, body)
    url = f"{service.ws_url}/v1/dataflows/{dataflow}/ws"
    headers = {"Authorization": f"Bearer {token}"}
    sent = batches()
    with ws_connect(url + query, additional_headers=headers) as watcher, \
            ws_connect(url + "?subscribe=false", additional_headers=headers) as sender:
        events = [watcher.recv(timeout=10)]
        acks = []
        for seq, updates in enumerate(sent):
            sender.send(json.dumps({"worker": "w", "seq": seq, "updates": updates}))
            acks.append(sender.recv(timeout=10))
        while True:  # every version is published before its ack; the events follow within moments
            try:
                events.append(watcher.recv(timeout=1.5))
            except TimeoutError:
                break
        last = max(json.loads(e)["version"] for e in events)
        with service.client(token) as client:
            frontier = client.get(f"/v1/dataflows/{dataflow}/frontier").text
            past = [client.get(f"/v1/dataflows/{dataflow}/frontier", params={"version": v}).text
                    for v in range(len(sent) + 1)]
            answers = {
                "frontier": frontier,
                "pointstamps": client.get(f"/v1/dataflows/{dataflow}/pointstamps").text,
                "explain": client.get(f"/v1/dataflows/{dataflow}/frontier/explain",
                                      params={"node": 1, "port": 0, "kind": "target", "time": "3"}).text,
                "versions": past,
            }
            with connect_sse(client, "GET", f"/v1/dataflows/{dataflow}/frontier/stream" + query,
                             headers={"Last-Event-ID": "2"}) as sse:
                resumed = []
                for event in sse.iter_sse():
                    resumed.append((event.event, event.id, event.data))
                    if event.event == "snapshot" or int(event.id) >= last:
                        break
    return {"events": events, "acks": acks, "sse_resumed": resumed, **answers}


@pytest.fixture
def pair(start_service: ServiceStarter) -> tuple[ServiceProcess, ServiceProcess]:
    return start_service(engine="native"), start_service(engine="reference")


def test_native_and_reference_answer_the_same_json(pair: tuple[ServiceProcess, ServiceProcess]) -> None:
    native, reference = pair
    body = loop_graph(operators=6, name="ring")
    assert exchange(native, body) == exchange(reference, body)
    selective = "?locations=" + ",".join(["1:0:target", "3:0:source", "4:0:target"])
    assert exchange(native, body, selective) == exchange(reference, body, selective)


def test_healthz_metrics_and_log_name_the_engine(pair: tuple[ServiceProcess, ServiceProcess]) -> None:
    for service, name in zip(pair, ("native (compiled)", "reference (Python)"), strict=True):
        with service.client() as client:
            assert client.get("/healthz").json()["engine"] == name
            assert f'tracker_engine_info{{engine="{name}"}} 1.0' in client.get("/metrics").text


def test_native_refuses_to_start_without_the_compiled_engine(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "progress_engine.py").write_text("raise ImportError('progress_engine is not built')\n")
    env = {**os.environ, "PYTHONPATH": f"{shadow}{os.pathsep}{ROOT}", "TRACKER_SPARK": "0"}
    command = [sys.executable, "-c", "import sys; from tracker.cli import main; sys.exit(main())", "serve",
               "--warehouse", str(tmp_path / "wh"), "--port", "1"]
    result = subprocess.run([*command, "--engine", "native"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--engine reference" in lines[0] and "progress_engine" in lines[0], result.stderr


async def _ring_in_process(warehouse: Path) -> tuple[Any, Any]:
    """A service in this process (no Delta, no Spark) over ``warehouse``, and a 6-operator ring
    registered on it: ``(service, tenant)``; close ``service.wal`` when done."""
    from api.config import Settings
    from api.host.service import Service
    from api.schema.models import RegisterRequest

    service = Service(Settings(warehouse=warehouse, delta=False, spark=False), "admin")
    service.recover()
    ring = RegisterRequest.model_validate(loop_graph(operators=6, name="ring"))
    return service, (await service.register(ring)).tenant


async def _submit_batches(service: Any, tenant: Any) -> None:
    """Each of :func:`batches` from worker ``w``, acknowledged one after the other."""
    import api.host.ingest

    for seq, updates in enumerate(batches()):
        body = json.dumps({"worker": "w", "seq": seq, "updates": updates}).encode()
        await api.host.ingest.submit(tenant, body, service.wal, service.metrics)


def test_payloads_encoded_while_the_log_syncs_are_the_ones_encoded_on_publishing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A big version's payload is encoded by a thread of the engine from when it is applied
    (:data:`api.host.ingest.PREPARE_JSON_MIN`); the history and subscribers get the same text."""
    import api.host.ingest

    async def published(prepare_from: int, warehouse: Path) -> list[tuple[int, int, str]]:
        monkeypatch.setattr(api.host.ingest, "PREPARE_JSON_MIN", prepare_from)
        service, tenant = await _ring_in_process(warehouse)
        try:
            subscriber = Subscriber(100)
            tenant.publication.subscribers.add(subscriber)
            await _submit_batches(service, tenant)
            events = [subscriber.queue.get_nowait() for _ in range(subscriber.queue.qsize())]
            assert [(v, text) for v, _, text in tenant.publication.history] == events
            return list(tenant.publication.history)
        finally:
            service.wal.close()

    every = asyncio.run(published(1, tmp_path / "every"))  # every version with a change prepared
    assert len(every) == 5  # the versions that moved a frontier
    assert every == asyncio.run(published(10**9, tmp_path / "none"))


def test_versions_published_from_a_lane_answer_as_those_published_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch in its lane, each version prepared there (the engine's frontiers copied, the
    text made only for a subscriber, :data:`api.host.ingest.PREPARE_IN_LANE_MIN`): the history's
    texts, a late reader's changes and the frontier equal those of versions published on the loop,
    and a subscriber gets every version's text as the history has it."""
    import api.host.ingest
    import api.live.state

    async def published(lane: bool, subscribed: bool, warehouse: Path) -> tuple[list[tuple[int, str]], str, list[Any]]:
        monkeypatch.setattr(api.host.ingest, "PREPARE_JSON_MIN", 1 if lane else 10**9)
        monkeypatch.setattr(api.host.ingest, "PREPARE_IN_LANE_MIN", 1 if lane else 10**9)
        monkeypatch.setattr(api.live.state, "LANE_UNITS", -1.0 if lane else 1e18)
        service, tenant = await _ring_in_process(warehouse)
        try:
            subscriber = Subscriber(100)
            if subscribed:
                tenant.publication.subscribers.add(subscriber)
            await _submit_batches(service, tenant)
            publication = tenant.publication
            assert tenant.live.lane_batches == (len(batches()) if lane else 0)
            texts = [text for _, _, text in publication.history]
            assert (None in texts) == (lane and not subscribed)  # made only for a subscriber
            events = [subscriber.queue.get_nowait() for _ in range(subscriber.queue.qsize())]
            if subscribed:
                assert events == [(v, publication.text(v, text)) for v, _, text in publication.history]
            changes = publication.changes_since(0)
            assert changes is not None
            return changes, publication.frontier_json(), [publication.frontier_at(v)[1] for v in range(4)]
        finally:
            service.wal.close()

    on_the_loop = asyncio.run(published(False, False, tmp_path / "loop"))
    assert len(on_the_loop[0]) == 5
    for subscribed in (False, True):
        assert asyncio.run(published(True, subscribed, tmp_path / f"lane-{subscribed}")) == on_the_loop


def test_two_subscribers_with_one_selection_share_one_encoding() -> None:
    graph, initial = core_graph(loop_graph(operators=4, name="ring"))
    tracker = CompiledTracker(graph)
    tracker.apply(initial)
    publication = Publication(graph, native=tracker.engine)
    publication.reset(tracker.frontiers(), 0)
    wanted = [Location.target(1, 0), Location.source(2, 0)]
    first, second, everything, other = (Subscriber(100) for _ in range(4))
    first.selection = publication.select(wanted)
    second.selection = publication.select(list(reversed(wanted)))
    other.selection = publication.select([Location.target(3, 0)])
    assert first.selection is second.selection
    publication.subscribers.update((first, second, everything, other))

    async def publish() -> None:
        for step in range(3):
            source = Location.source(0, 0)
            batch = tracker.engine.apply([(source, (step,), -1), (source, (step + 1,), 1)])
            publication.publish(step + 1, batch)

    asyncio.run(publish())
    assert publication.selected_encodings == 2 * 3  # one per distinct selection per version
    got = [[first.queue.get_nowait() for _ in range(3)], [second.queue.get_nowait() for _ in range(3)]]
    assert all(a[1] is b[1] for a, b in zip(*got, strict=True))  # the very same string
    every = [everything.queue.get_nowait() for _ in range(3)]
    for (version, selected), (same_version, full) in zip(got[0], every, strict=True):
        assert version == same_version
        assert json.loads(selected) == [c for c in json.loads(full)
                                        if Location(**c["location"]) in set(wanted)]
    resumed = publication.changes_since(1, first.selection)
    assert resumed == [(v, text) for v, text in got[0] if v > 1]
    snapshot = json.loads(publication.snapshot_json(first.selection)[1])
    assert [Location(**row["location"]) for row in snapshot["locations"]] == sorted(wanted)


def test_a_selective_subscriber_sees_only_its_locations_without_gaps(start_service: ServiceStarter) -> None:
    service = start_service()
    dataflow, token = register(service, loop_graph(operators=6, name="ring"))
    url = f"{service.ws_url}/v1/dataflows/{dataflow}/ws"
    headers = {"Authorization": f"Bearer {token}"}
    mine = {Location.target(2, 0), Location.target(5, 0)}
    with ws_connect(url + '?locations=[{"node":2,"port":0,"kind":"target"},{"node":5,"port":0,"kind":"target"}]',
                    additional_headers=headers) as worker, ws_connect(url, additional_headers=headers) as full:
        snapshot = json.loads(worker.recv(timeout=10))
        json.loads(full.recv(timeout=10))
        assert {Location(**row["location"]) for row in snapshot["locations"]} == mine
        for seq in range(20):
            full.send(json.dumps({"worker": "w", "seq": seq, "updates": advance(seq)}))
        everything = []
        while len([e for e in everything if e["type"] == "ack"]) < 20 or everything[-1].get("version", 0) < 20:
            everything.append(json.loads(full.recv(timeout=10)))
        expected = [(e["version"], [c for c in e["changes"] if Location(**c["location"]) in mine])
                    for e in everything if e["type"] == "changes"]
        expected = [(v, changes) for v, changes in expected if changes]
        seen = [json.loads(worker.recv(timeout=10)) for _ in expected]
        assert [(e["version"], e["changes"]) for e in seen] == expected
        assert [v for v, _ in expected] == list(range(1, 21))  # every version moves these frontiers: no gap
    with pytest.raises(InvalidStatus, match="422"), ws_connect(url + "?locations=9:0:target",
                                                                 additional_headers=headers):
        pass
    with service.client(token) as client:
        bad = client.get(f"/v1/dataflows/{dataflow}/frontier/stream", params={"locations": "1:0:sideways"})
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"


def _with_tail(body: dict[str, Any], operators: int) -> dict[str, Any]:
    """``body`` (a :func:`_two_summary_chain`) with its sink replaced by ``operators`` plain
    operators in a row and a sink: every one of them holds the chain's widest frontier."""
    sink = len(body["nodes"]) - 1
    nodes = body["nodes"][:-1] + [{"id": sink + i, "inputs": 1, "outputs": 1} for i in range(operators)]
    nodes.append({"id": sink + operators, "inputs": 1, "outputs": 0})
    edges = body["edges"] + [{"source": {"node": sink + i, "port": 0}, "target": {"node": sink + i + 1, "port": 0}}
                             for i in range(operators)]
    return {**body, "nodes": nodes, "edges": edges}


def test_the_compiled_engine_accepts_a_graph_the_reference_refuses(start_service: ServiceStarter) -> None:
    body = _two_summary_chain(40)  # 41 summaries at its end, widths growing all along: seconds per batch before
    native, reference = start_service(engine="native"), start_service(engine="reference")
    with reference.client() as client:
        refused = client.post("/v1/dataflows", json=body)
        assert refused.status_code == 422 and refused.json()["error"] == "invalid_graph"
    dataflow, token = register(native, body)
    with native.client(token) as client:
        moved = client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [0, 0], -1), update(0, 0, "source", [1, 0], 1)]})
        assert moved.status_code == 200 and moved.json()["version"] == 1
        frontier = client.get(f"/v1/dataflows/{dataflow}/frontier", params={"node": 41, "port": 0}).json()
        assert len(frontier["locations"][0]["frontier"]) == 41
    # 63 of them (64 summaries) and 1,000 operators after them, each holding those 64: a
    # pointstamp costs the compiled engine ~6 ms, more than it may (63 alone cost ~0.7 ms).
    with native.client() as client:
        refused = client.post("/v1/dataflows", json=_with_tail(_two_summary_chain(63), 1000))
        assert refused.status_code == 422 and "of CPU per batch (the limit is 1.0 ms)" in refused.json()["detail"]
