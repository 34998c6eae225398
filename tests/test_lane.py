"""A costly dataflow's lane: its batches propagate off the event loop, and stay exact.

The service runs with ``TRACKER_LANE_MS=0``: every batch after a dataflow's first propagates in
its lane, so everything below goes through it: pipelined WebSocket workers, concurrent readers
of the engine (pointstamps, explain, status), subscribers, duplicates and a kill -9 (in
``test_api_crash``).
"""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from tests.helpers import (
    ServiceProcess,
    ServiceStarter,
    as_updates,
    core_graph,
    counts_map,
    frontier_map,
    loop_graph,
    register,
    update,
)
from tracker import oracle
from tracker.graph import Location

pytestmark = pytest.mark.service(TRACKER_LANE_MS="0")

WORKERS = 3
BATCHES = 40


def worker_batches(name: str, locations: list[Location]) -> list[list[dict[str, Any]]]:
    rng = random.Random(name)
    return [[update(*rng.choice(locations), [rng.randint(0, 4), rng.randint(0, 4)], rng.choice([-1, 1, 1, 2]))
             for _ in range(rng.randint(1, 6))] for _ in range(BATCHES)]


def test_batches_in_the_lane_match_the_oracle_at_every_version_while_readers_read(service: ServiceProcess) -> None:
    body = loop_graph(operators=6, arity=2)
    dataflow_id, token = register(service, body)
    graph, initial = core_graph(body)
    locations = graph.locations()
    headers = {"Authorization": f"Bearer {token}"}
    url = f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws"
    sent = {f"w{i}": worker_batches(f"w{i}", locations) for i in range(WORKERS)}
    by_version: dict[int, list[dict[str, Any]]] = {}
    events: dict[int, dict[str, Any]] = {}
    stop, read_errors, reads = threading.Event(), [], [0]

    def work(name: str) -> None:
        # Pipelined: every batch sent, then the acks read.
        with ws_connect(f"{url}?subscribe=false", additional_headers=headers) as ws:
            for seq, batch in enumerate(sent[name]):
                ws.send(json.dumps({"worker": name, "seq": seq, "updates": batch}))
            ws.send(json.dumps({"worker": name, "seq": 3, "updates": sent[name][3]}))  # a retry
            acks = [json.loads(ws.recv(timeout=60)) for _ in range(BATCHES + 1)]
        assert [a.get("seq") for a in acks] == [*range(BATCHES), 3], [a for a in acks if "seq" not in a][:3]
        assert all(a["applied"] for a in acks[:-1]) and acks[-1]["duplicate"]
        assert acks[-1]["version"] == acks[3]["version"]  # the duplicate names the version that applied it
        for ack, batch in zip(acks, sent[name], strict=False):
            by_version[ack["version"]] = batch

    def read() -> None:
        paths = ["/pointstamps", "/frontier", "", "/frontier/explain?node=1&port=0&kind=target&time=3,3", "/lag"]
        try:
            with httpx.Client(base_url=service.url, headers=headers, timeout=30) as client:
                while not stop.is_set() or not reads[0]:
                    for path in paths:
                        answer = client.get(f"/v1/dataflows/{dataflow_id}{path}")
                        if answer.status_code != 200:
                            read_errors.append(f"{path}: {answer.status_code} {answer.text[:200]}")
                        reads[0] += 1
        except Exception as error:  # said in the assertion below, not lost in the thread
            read_errors.append(repr(error))

    with ws_connect(f"{url}?subscribe=true", additional_headers=headers) as watcher:
        assert json.loads(watcher.recv(timeout=10))["type"] == "snapshot"
        reader = threading.Thread(target=read)
        reader.start()
        workers = [threading.Thread(target=work, args=(name,)) for name in sent]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join(120)
        stop.set()
        reader.join(60)
        # Every batch is acknowledged, so every change event is on its way (a version that moved
        # no frontier has none): read until the stream is quiet.
        while True:
            try:
                message = json.loads(watcher.recv(timeout=3))
            except TimeoutError:
                break
            assert message["type"] == "changes", message["type"]
            events[message["version"]] = message
    assert read_errors == [] and reads[0] > 0
    total = WORKERS * BATCHES
    assert sorted(by_version) == list(range(1, total + 1))

    # Every version's published changes, folded in version order, give the oracle's frontiers.
    batches = [initial, *(as_updates(by_version[v]) for v in range(1, total + 1))]
    view: dict[Location, set[tuple[int, ...]]] = {loc: set(ts) for loc, ts in
                                                  oracle.frontiers(graph, oracle.accumulate(batches[:1])).items()}
    assert list(events) == sorted(events), "changes were published out of version order"
    for version in range(1, total + 1):
        for change in events.get(version, {"changes": []})["changes"]:
            times = view.setdefault(Location(**change["location"]), set())
            (times.add if change["diff"] > 0 else times.discard)(tuple(change["time"]))
        expected = oracle.frontiers(graph, oracle.accumulate(batches[:version + 1]))
        assert {loc: ts for loc, ts in view.items() if ts} == {loc: set(ts) for loc, ts in expected.items() if ts}, (
            version)

    counts = oracle.accumulate(batches)
    with httpx.Client(base_url=service.url, headers=headers, timeout=30) as client:
        assert counts_map(client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json()) == counts
        frontier = client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()
        assert frontier["version"] == total and frontier_map(frontier) == oracle.frontiers(graph, counts)
        past = client.get(f"/v1/dataflows/{dataflow_id}/frontier", params={"version": total // 2}).json()
        assert frontier_map(past) == oracle.frontiers(graph, oracle.accumulate(batches[:total // 2 + 1]))
    assert "propagate in a thread of its own" in service.log_tail(400)


def test_a_costly_dataflow_enters_its_lane_once_and_stays_while_a_cheap_one_never_does(
        start_service: ServiceStarter) -> None:
    # 50 us: a batch moving a 2,000-operator chain's input (4,000 frontier changes) takes more,
    # in the lane too, so it must stay there; leaving would need a batch under 12.5 us.
    service = start_service(TRACKER_LANE_MS="0.05", TRACKER_DELTA="0")
    chain = {"name": "chain", "nodes": [{"id": 0, "inputs": 0, "outputs": 1}]
             + [{"id": i, "inputs": 1, "outputs": 1} for i in range(1, 2000)],
             "edges": [{"source": {"node": i, "port": 0}, "target": {"node": i + 1, "port": 0}} for i in range(1999)]}
    dataflow_id, token = register(service, chain)
    with service.client(token) as client:
        for seq in range(30):
            moved = [update(0, 0, "source", [seq], -1), update(0, 0, "source", [seq + 1], 1)]
            answer = client.post(f"/v1/dataflows/{dataflow_id}/progress",
                                 json={"worker": "w", "seq": seq, "updates": moved})
            assert answer.json()["version"] == seq + 1
        frontier = client.get(f"/v1/dataflows/{dataflow_id}/frontier", params={"node": 1999, "kind": "target"})
        assert frontier.json()["locations"][0]["frontier"] == [[30]]
    entered = [json.loads(line) for line in service.log_path.read_text().splitlines() if "thread of its own" in line]
    assert [line["dataflow"] for line in entered] == [dataflow_id], entered
    with service.client() as client:  # deleted with its lane: its thread ends, the service goes on
        assert client.delete(f"/v1/dataflows/{dataflow_id}").status_code == 204
        late = client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": 30, "updates": []})
        assert late.status_code == 410
        assert client.get("/healthz").json()["status"] == "ok"


def test_a_failed_preparation_leaves_the_propagated_batch_standing() -> None:
    """What ``then`` prepares on the lane's thread is optional: if it raises, the batch is still
    propagated and its result returned (the publication then folds it as usual)."""
    from api.live.lane import Lane

    lane = Lane(lambda updates: (f"changes of {updates}", []), 0)

    def fails(result: object) -> None:
        raise RuntimeError("preparation failed")

    assert lane.submit(1, "batch 1", fails).result() == ("changes of batch 1", [])
    assert lane.applied_through == 1 and lane.queued == 0
