"""Shards: ``tracker serve --shards 2`` behind HAProxy, with a third shard said to run on a host
that is gone. Real processes throughout: the supervisor, two hot-path processes, the front,
HAProxy; requests go through the public address as a user's would.

What is checked: every kind of dataflow route (REST, ``?version=``, SSE, WebSocket, DELETE, the
dashboard's) reaches the dataflow's own shard through the proxy and the same answer comes from
that shard's ``endpoint`` directly, while the other shard does not know the dataflow; a dataflow's
token reaches nothing on another shard; the lists, ``/metrics`` and ``/healthz`` answer for every
shard; a dataflow of the unreachable shard answers 503 ``shard_unavailable`` naming it; and a
``kill -9`` of one shard under load is restarted by the supervisor, its dataflows exact
afterwards (exactly once, frontiers equal to the oracle's) while the other shard's dataflow
keeps answering and taking batches throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from api.run.process import ServiceProcess, alive, descendants, free_port
from tests.helpers import (
    BatchWriter,
    ServiceStarter,
    as_updates,
    core_graph,
    counts_map,
    frontier_map,
    loop_graph,
    program_token,
    stop_writers,
    update,
    wait_for,
)
from tracker import oracle
from tracker.graph import Location
from tracker.worker.client import Admin

pytestmark = pytest.mark.service

GONE = 2
"""The shard said to run on a host that does not answer (``--shard-hosts``)."""


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Any:
    starter = ServiceStarter(tmp_path_factory.mktemp("shards"))
    try:
        yield starter(shards=2, shard_hosts=f"{GONE}=http://127.0.0.1:{free_port()}")
    finally:
        starter.stop_all()


def _register(service: ServiceProcess, name: str) -> dict[str, Any]:
    with service.client() as client:
        answer = client.post("/v1/dataflows", json=loop_graph(operators=3, name=name))
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _progress(url: str, token: str, dataflow_id: str, seq: int) -> httpx.Response:
    return httpx.post(f"{url}/v1/dataflows/{dataflow_id}/progress", headers={"Authorization": f"Bearer {token}"},
                      json={"worker": "w", "seq": seq, "updates": [update(0, 0, "source", [seq + 1], 1)]})


def test_every_route_kind_reaches_the_dataflows_shard_through_the_proxy(sharded: ServiceProcess) -> None:
    service = sharded
    endpoints = {k: service.endpoint(k) for k in (0, 1)}
    made = [_register(service, f"routed-{i}") for i in range(4)]
    # Least loaded first: the two shards take turns (the unreachable one takes none).
    assert sorted(m["id"].startswith("s1-") for m in made) == [False, False, True, True]
    for m in made:
        shard = 1 if m["id"].startswith("s1-") else 0
        assert m["endpoint"] == endpoints[shard]
        other = endpoints[1 - shard]
        auth = {"Authorization": f"Bearer {m['token']}"}
        dataflow = f"/v1/dataflows/{m['id']}"
        assert httpx.get(other + dataflow, headers=service.admin_headers).status_code == 404
        detail = httpx.get(service.url + dataflow, headers=auth).json()
        assert detail["endpoint"] == m["endpoint"] and detail["version"] == 0
        # REST through the proxy: the owning shard applies it, as its endpoint shows directly.
        assert _progress(service.url, m["token"], m["id"], 0).json()["version"] == 1
        assert httpx.get(m["endpoint"] + dataflow, headers=auth).json()["version"] == 1
        assert _progress(m["endpoint"], m["token"], m["id"], 1).json()["version"] == 2
        assert httpx.get(service.url + dataflow + "/frontier?version=1", headers=auth).json()["version"] == 1
        assert httpx.get(service.url + dataflow + "/frontier", headers=auth).json()["version"] == 2
        frame = httpx.get(f"{service.url}/dashboard/api/dataflows/{m['id']}/frame", headers=auth)
        assert frame.status_code == 200 and frame.json()["version"] == 2
        # SSE through the proxy: the stream opens with the shard's current frontier.
        with httpx.stream("GET", service.url + dataflow + "/frontier/stream", headers=auth, timeout=10) as stream:
            data = next(line for line in stream.iter_lines() if line.startswith("data:"))
            assert json.loads(data.removeprefix("data:"))["version"] == 2
        # WebSocket through the proxy: a snapshot, then a batch acknowledged at the next version.
        assert asyncio.run(_websocket(service.url, m["token"], m["id"], seq=2)) == 3
        assert httpx.get(m["endpoint"] + dataflow, headers=auth).json()["version"] == 3
    # DELETE through the proxy, then the shard says deleted, directly and through the proxy.
    victim = made[-1]
    assert httpx.delete(f"{service.url}/v1/dataflows/{victim['id']}", headers=service.admin_headers).status_code == 204
    for base in (service.url, victim["endpoint"]):
        answer = httpx.get(f"{base}/v1/dataflows/{victim['id']}", headers=service.admin_headers).json()
        assert answer["status"]["state"] == "deleted"
    # The front answers for every shard: the list, metrics with a shard label, health.
    with service.client() as client:
        listed = {d["id"] for d in client.get("/v1/dataflows").json()}
        assert listed == {m["id"] for m in made[:-1]}
        assert client.get("/v1/dataflows", headers={"Authorization": f"Bearer {made[1]['token']}"}).json()[0][
            "id"] == made[1]["id"]
        metrics = client.get("/metrics").text
        assert 'shard="0"' in metrics and 'shard="1"' in metrics and f'tracker_shard_up{{shard="{GONE}"}} 0' in metrics
        health = client.get("/healthz").json()
        assert health["status"] == "degraded"
        assert [s["status"] for s in health["shards"]] == ["ok", "ok", "unavailable"]
        assert client.get("/dashboard").status_code == 200


async def _websocket(url: str, token: str, dataflow_id: str, seq: int) -> int:
    async with websockets.connect(f"{url.replace('http', 'ws', 1)}/v1/dataflows/{dataflow_id}/ws",
                                  additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        first = json.loads(await ws.recv())
        assert first["type"] == "snapshot", first
        await ws.send(json.dumps({"worker": "w", "seq": seq,
                                  "updates": [update(0, 0, "source", [seq + 1], 1)]}))
        while True:
            message = json.loads(await ws.recv())
            if message["type"] == "ack":
                return int(message["version"])


def test_a_token_reaches_no_other_shards_dataflow(sharded: ServiceProcess) -> None:
    service = sharded
    mine = _register(service, "mine")
    other = next(o for o in (_register(service, f"other-{i}") for i in range(4))
                 if o["endpoint"] != mine["endpoint"])  # the least loaded shard: another one within two
    auth = {"Authorization": f"Bearer {mine['token']}"}
    for base in (service.url, other["endpoint"]):
        for path in ("", "/frontier", "/pointstamps"):
            assert httpx.get(f"{base}/v1/dataflows/{other['id']}{path}", headers=auth).status_code == 401
        assert _progress(base, mine["token"], other["id"], 0).status_code == 401
    assert httpx.delete(f"{service.url}/v1/dataflows/{other['id']}", headers=auth).status_code == 401
    assert httpx.get(f"{service.url}/v1/dataflows/{other['id']}", headers=service.admin_headers).json()["version"] == 0


def test_the_program_token_registers_and_reports_through_the_front_and_nothing_else(sharded: ServiceProcess
                                                                                      ) -> None:
    """Every shard takes the one program token (generated once into the shared warehouse): it
    registers through the front on whichever shard is least loaded, reports progress through the
    proxy and at the dataflow's endpoint, lists only its own dataflows across the shards, and
    gets 403 for another dataflow, a deletion and the admin routes, through the front too."""
    service = sharded
    token = program_token(service)
    auth = {"Authorization": f"Bearer {token}"}
    admins = _register(service, "admins-own")
    made = []
    for i in range(4):
        answer = httpx.post(f"{service.url}/v1/dataflows", headers=auth, json=loop_graph(operators=3,
                                                                                         name=f"program-{i}"))
        assert answer.status_code == 201, answer.text
        made.append(answer.json())
    assert {m["id"].startswith("s1-") for m in made} == {True, False}, made  # both shards took the token
    for m in made:
        assert _progress(service.url, token, m["id"], 0).json()["version"] == 1
        assert _progress(m["endpoint"], token, m["id"], 1).json()["version"] == 2
        assert _progress(service.url, m["token"], m["id"], 2).json()["version"] == 3
    listed = httpx.get(f"{service.url}/v1/dataflows", headers=auth).json()
    assert sorted(d["id"] for d in listed) == sorted(m["id"] for m in made)
    for base in (service.url, admins["endpoint"]):
        assert httpx.get(f"{base}/v1/dataflows/{admins['id']}", headers=auth).status_code == 403
        assert _progress(base, token, admins["id"], 0).status_code == 403
    assert httpx.delete(f"{service.url}/v1/dataflows/{made[0]['id']}", headers=auth).status_code == 403
    assert httpx.post(f"{service.url}/v1/dataflows/{made[0]['id']}/audit", headers=auth).status_code == 403
    assert httpx.get(f"{service.url}/v1/processes", headers=auth).status_code == 403
    assert httpx.get(f"{service.url}/v1/dataflows/{made[0]['id']}", headers=service.admin_headers).status_code == 200


def test_a_dataflow_of_an_unreachable_shard_answers_503_naming_it(sharded: ServiceProcess) -> None:
    service = sharded
    missing = f"s{GONE}-" + "ab" * 14
    for method, path in (("GET", ""), ("GET", "/frontier"), ("POST", "/progress"), ("DELETE", "")):
        answer = httpx.request(method, f"{service.url}/v1/dataflows/{missing}{path}", headers=service.admin_headers,
                               json={"worker": "w", "seq": 0, "updates": []} if method == "POST" else None)
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == "shard_unavailable" and answer.json()["shard"] == GONE
    made = _register(service, "still-served")  # everything else works
    assert _progress(service.url, made["token"], made["id"], 0).status_code == 200
    # An id of no shard at all is unknown (404), not unavailable.
    assert httpx.get(f"{service.url}/v1/dataflows/s7-{'cd' * 14}", headers=service.admin_headers).status_code == 404


def test_the_worker_sdk_connects_to_the_dataflows_shard(sharded: ServiceProcess) -> None:
    from tracker.worker.cluster import launch

    registered = Admin(sharded.url, "test-admin-token").enrol(loop_graph(operators=2, name="sdk"))
    assert registered.endpoint in {sharded.endpoint(0), sharded.endpoint(1)}
    result = launch("wordcount", {"epochs": 2}, sharded.url, "test-admin-token", workers=2, timeout=60)
    detail = httpx.get(f"{sharded.url}/v1/dataflows/{result['dataflow']}", headers=sharded.admin_headers).json()
    assert detail["status"]["state"] == "complete"
    assert set(detail["status"]["workers"]) == {"w0", "w1"}


def test_without_the_proxy_the_front_sends_a_dataflows_requests_to_its_shard(start_service: ServiceStarter) -> None:
    service = start_service(shards=2, proxy="none", TRACKER_DELTA="0")
    made = [_register(service, f"unproxied-{i}") for i in range(2)]
    assert {m["endpoint"] for m in made} == {service.endpoint(0), service.endpoint(1)}
    for m in made:
        dataflow = f"{service.url}/v1/dataflows/{m['id']}"
        moved = httpx.get(dataflow + "/frontier?version=0", headers=service.admin_headers)
        assert moved.status_code == 307
        assert moved.headers["location"] == f"{m['endpoint']}/v1/dataflows/{m['id']}/frontier?version=0"
        posted = _progress(service.url, m["token"], m["id"], 0)
        # A client drops the token on a redirect to another origin (port): it resends it itself.
        assert posted.status_code == 307
        assert posted.headers["location"] == f"{m['endpoint']}/v1/dataflows/{m['id']}/progress"
        assert _progress(m["endpoint"], m["token"], m["id"], 0).json()["version"] == 1
    with service.client() as client:
        assert {d["version"] for d in client.get("/v1/dataflows").json()} == {1}
        assert client.get("/v1/dataflows/s5-" + "ef" * 14).status_code == 404


def _hot_pid(service: ServiceProcess, shard: int) -> int | None:
    """The shard's hot-path process, or ``None`` while the front lists none for it (restarting)."""
    try:
        return service.pid_of("hot", shard=shard)
    except StopIteration:
        return None


class _Writer(BatchWriter):
    """Random batches over a dataflow's locations."""

    def __init__(self, name: str, url: str, token: str, dataflow_id: str, locations: list[Location]) -> None:
        super().__init__(name, url, token, dataflow_id)
        self.locations, self.rng = locations, random.Random(name)

    def batch(self) -> list[dict[str, Any]]:
        return [update(*self.rng.choice(self.locations), [self.rng.randint(0, 4)], self.rng.choice([-1, 1, 1, 2]))
                for _ in range(self.rng.randint(1, 3))]


def test_kill_9_of_one_shard_under_load_leaves_the_other_serving_and_loses_nothing(
        start_service: ServiceStarter) -> None:
    service = start_service(shards=2, TRACKER_FLUSH_SECONDS="0.2")
    body = loop_graph(operators=4)
    graph, initial = core_graph(body)
    with service.client() as client:  # the least loaded shard takes each: one on each within a few
        found = {}
        for i in range(4):
            answer = client.post("/v1/dataflows", json={**body, "name": f"load-{i}"})
            assert answer.status_code == 201
            found.setdefault(answer.json()["id"].startswith("s1-"), answer.json())
    killed, spared = found[True], found[False]  # shard 1's dataflow, shard 0's
    made = [killed, spared]
    writers = {m["id"]: [_Writer(f"w{i}", service.url, m["token"], m["id"], graph.locations()) for i in range(2)]
               for m in made}
    probes: list[int] = []
    stop = threading.Event()

    def probe() -> None:  # the spared shard's dataflow, read through the proxy all along
        with httpx.Client(headers={"Authorization": f"Bearer {spared['token']}"}, timeout=5) as client:
            while not stop.is_set():
                probes.append(client.get(f"{service.url}/v1/dataflows/{spared['id']}/frontier").status_code)
                time.sleep(0.01)

    reader = threading.Thread(target=probe, daemon=True)
    every = [w for ws in writers.values() for w in ws]
    try:
        for writer in every:
            writer.start()
        reader.start()
        for _ in range(2):
            time.sleep(1.0)
            pid = service.pid_of("hot", shard=1)
            before = sum(len(w.acked) for w in writers[spared["id"]])
            os.kill(pid, signal.SIGKILL)
            wait_for("the killed shard to be gone", lambda p=pid: not alive(p), 10, interval=0.02)  # type: ignore[misc]
            new = wait_for("the shard's restart", lambda p=pid: (q := _hot_pid(service, 1)) != p and q,  # type: ignore[misc]
                           30, interval=0.1, service=service)
            assert new != pid
            assert sum(len(w.acked) for w in writers[spared["id"]]) > before  # the other shard kept taking batches
        time.sleep(0.5)
        assert stop_writers(every) == []
        stop.set()
        reader.join(10)
        assert probes and set(probes) == {200}, f"the spared shard's reads: {sorted(set(probes))}"
        for m in made:
            acked = [b for w in writers[m["id"]] for b in w.acked]
            assert len(acked) > 10, f"too little load got through: {len(acked)} batches"
            counts = oracle.accumulate([initial, *(as_updates(b) for b in acked)])
            with service.client(m["token"]) as client:
                detail = client.get(f"/v1/dataflows/{m['id']}").json()
                assert detail["version"] == len(acked)  # each acknowledged batch applied once, none lost
                assert counts_map(client.get(f"/v1/dataflows/{m['id']}/pointstamps").json()) == counts
                frontier = client.get(f"/v1/dataflows/{m['id']}/frontier").json()
                assert frontier_map(frontier) == oracle.frontiers(graph, counts)
    finally:
        stop.set()
        for writer in every:
            writer.stop.set()


def _child(service: ServiceProcess, marker: bytes) -> int:
    """The pid of the service's process whose command line holds ``marker``."""
    assert service.process is not None
    for pid in descendants(service.process.pid):
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError(f"no process running {marker!r}")


@pytest.mark.parametrize("marker", [b"api.run.front", b"haproxy"])
def test_the_front_and_the_proxy_killed_are_restarted_and_route_again(sharded: ServiceProcess, marker: bytes) -> None:
    service = sharded
    made = _register(service, f"before-{marker.decode()}")
    killed = _child(service, marker)
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:  # the supervisor starts it again on the same address
        with contextlib.suppress(httpx.HTTPError, AssertionError):
            if _child(service, marker) != killed and httpx.get(service.url + "/healthz", timeout=5).status_code in (
                    200, 503):
                break
        assert time.monotonic() < deadline, f"{marker!r} not restarted:\n{service.log_tail()}"
        time.sleep(0.1)
    # Routing works again: a dataflow's route through the proxy, and registration through the front.
    answer = httpx.get(f"{service.url}/v1/dataflows/{made['id']}/frontier", headers=service.admin_headers, timeout=10)
    assert answer.status_code == 200, answer.text
    again = _register(service, f"after-{marker.decode()}")
    assert _progress(service.url, again["token"], again["id"], 0).status_code == 200


def test_a_dataflow_token_on_an_admin_route_through_the_front_is_403(sharded: ServiceProcess) -> None:
    made = _register(sharded, "not-an-admin")
    answer = httpx.get(sharded.url + "/v1/processes", headers={"Authorization": f"Bearer {made['token']}"})
    assert answer.status_code == 403, answer.text
    unknown = httpx.get(sharded.url + "/v1/processes", headers={"Authorization": "Bearer nobody's"})
    assert unknown.status_code == 401


def test_a_stopped_shard_costs_registrations_and_lists_seconds_and_registers_nothing_twice(
        start_service: ServiceStarter) -> None:
    """A shard stopped (SIGSTOP) for under the supervisor's 30 s: registrations go to the other
    shard within a few seconds (the front's deadline, not its old 30 s wait), the lists and
    ``/healthz`` answer within a few seconds naming the stopped one, and once it runs again
    nothing sent to it while it was stopped is registered there as well."""
    service = start_service(shards=2)
    stopped = service.pid_of("hot", shard=1)
    os.kill(stopped, signal.SIGSTOP)
    names = [f"while-stopped-{i}" for i in range(6)]
    try:
        for name in names:
            began = time.monotonic()
            made = _register(service, name)
            assert time.monotonic() - began < 6, f"{name} took {time.monotonic() - began:.1f} s"
            assert made["id"].startswith("s1-") is False, made  # shard 0's ids have no prefix
        began = time.monotonic()
        listed = httpx.get(service.url + "/v1/dataflows", headers=service.admin_headers, timeout=30)
        assert time.monotonic() - began < 6 and listed.headers["x-tracker-shards-unavailable"] == "1"
        health = httpx.get(service.url + "/healthz", timeout=30).json()
        assert health["status"] == "degraded" and health["shards"][1]["status"] == "unavailable", health
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait_for("shard 1 back", lambda: httpx.get(service.url + "/healthz").json()["status"] == "ok", 30,
             interval=0.2)
    time.sleep(1.0)  # whatever shard 1 had queued while stopped is done by now
    listed = [d["name"] for d in httpx.get(service.url + "/v1/dataflows", headers=service.admin_headers).json()]
    assert sorted(listed) == sorted(names), listed
    assert _register(service, "after")["id"].startswith("s1-")  # the least loaded again
