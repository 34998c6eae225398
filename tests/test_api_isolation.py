"""One tenant cannot stall or bloat another: bounded resumes, sliced rewinds, sliced fan-out."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from itertools import accumulate
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect as ws_connect

from api.config import Settings
from api.host.ingest import submit
from api.host.service import Service
from api.schema.bodies import detail_json, graph_json
from api.schema.models import DataflowDetail, RegisterRequest
from api.schema.spec import registration_record
from api.streams.rewind import REWIND_CHANGES, _oldest, frontier_as_of
from tests.helpers import ServiceProcess, loop_graph, register
from tests.strategies import nested_bodies

pytestmark = pytest.mark.service(TRACKER_SUBSCRIBER_QUEUE="16")


def _advance(seq: int) -> str:
    return json.dumps({"worker": "w", "seq": seq, "updates": [
        {"location": {"node": 0, "port": 0, "kind": "source"}, "time": [seq], "delta": -1},
        {"location": {"node": 0, "port": 0, "kind": "source"}, "time": [seq + 1], "delta": 1}]})


def _post_many(service: ServiceProcess, dataflow_id: str, token: str, first: int, count: int) -> None:
    """``count`` batches over a WebSocket, pipelined 256 at a time."""
    url = f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws?subscribe=false"
    with ws_connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None) as ws:
        seq = first
        while seq < first + count:
            window = min(256, first + count - seq)
            for i in range(window):
                ws.send(_advance(seq + i))
            for _ in range(window):
                assert '"ack"' in str(ws.recv())[:24]
            seq += window


def _first_event(service: ServiceProcess, dataflow_id: str, token: str, last_event_id: str) -> tuple[str, str]:
    headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": last_event_id}
    with httpx.stream("GET", f"{service.url}/v1/dataflows/{dataflow_id}/frontier/stream", headers=headers,
                      timeout=10) as answer:
        event = ident = ""
        for line in answer.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("id: "):
                ident = line[4:]
            elif not line and event:
                return event, ident
    raise AssertionError("no event")


def test_a_resume_further_back_than_the_subscriber_bound_gets_a_snapshot(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph(3))
    _post_many(service, dataflow_id, token, 0, 40)
    # 16 versions back fit the subscriber's bound (TRACKER_SUBSCRIBER_QUEUE=16): the backlog.
    assert _first_event(service, dataflow_id, token, "24") == ("changes", "25")
    # 39 versions back do not: a fresh snapshot instead of a backlog the client may never read.
    assert _first_event(service, dataflow_id, token, "1") == ("snapshot", "40")


def test_a_far_rewind_is_sliced_and_bounded(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph(100))  # each batch changes 202 frontier entries
    _post_many(service, dataflow_id, token, 0, 1200)
    probe_id, probe_token = register(service, loop_graph(3, name="probe"))
    with service.client(token) as client:
        too_old = client.get(f"/v1/dataflows/{dataflow_id}/frontier", params={"version": 1})
        assert too_old.status_code == 410 and too_old.json()["error"] == "version_too_old"
        oldest = too_old.json()["oldest"]
        assert 1 < oldest < 1200
        waits: list[float] = []
        done = threading.Event()

        def probe() -> None:
            url = f"{service.ws_url}/v1/dataflows/{probe_id}/ws?subscribe=false"
            with ws_connect(url, additional_headers={"Authorization": f"Bearer {probe_token}"}) as ws:
                seq = 0
                while not done.is_set():
                    started = time.perf_counter()
                    ws.send(_advance(seq))
                    ws.recv()
                    waits.append(time.perf_counter() - started)
                    seq += 1
                    time.sleep(0.005)

        thread = threading.Thread(target=probe)
        thread.start()
        time.sleep(0.3)
        try:
            started = time.perf_counter()
            answer = client.get(f"/v1/dataflows/{dataflow_id}/frontier", params={"version": oldest})
            took = time.perf_counter() - started
        finally:
            done.set()
            thread.join()
        assert answer.status_code == 200 and answer.json()["version"] == oldest
        # The input's capability at `oldest` is the time it had moved to: exact, not current.
        rows = {(r["location"]["node"], r["location"]["kind"]): r["frontier"] for r in answer.json()["locations"]}
        assert rows[(1, "target")] == [[oldest]]
        # The rewind of ~200,000 changes took a while, but others' acks went on meanwhile
        # (undone in one go it held the loop for all of `took`).
        during = waits[len(waits) // 4:]
        assert took > 0 and len(waits) > 5 and max(during) < max(0.5, took / 2), (took, max(during))


def test_fan_out_to_many_subscribers_is_complete_and_in_order(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph(3))
    subscribers = 40  # more than one slice of the fan-out

    async def main() -> list[list[str]]:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=service.url, headers=headers, timeout=20) as client:
            ready = asyncio.Semaphore(0)

            async def listen() -> list[str]:
                seen: list[str] = []
                async with client.stream("GET", f"/v1/dataflows/{dataflow_id}/frontier/stream") as answer:
                    ready.release()
                    async for line in answer.aiter_lines():
                        if line.startswith("id: "):
                            seen.append(line[4:])
                            if line == "id: 6":
                                return seen
                return seen

            tasks = [asyncio.create_task(listen()) for _ in range(subscribers)]
            for _ in range(subscribers):
                await ready.acquire()
            await asyncio.sleep(0.5)
            for seq in range(6):
                answer = await client.post(f"/v1/dataflows/{dataflow_id}/progress", content=_advance(seq))
                assert answer.status_code == 200
            return await asyncio.wait_for(asyncio.gather(*tasks), 30)

    got: list[Any] = asyncio.run(main())
    assert all(seen == ["0", "1", "2", "3", "4", "5", "6"] for seen in got), got


def _edge(src: tuple[int, int], dst: tuple[int, int]) -> dict[str, Any]:
    return {"source": {"node": src[0], "port": src[1]}, "target": {"node": dst[0], "port": dst[1]}}


NESTED = {"name": "nested", "nodes": [
    {"id": 0, "inputs": 0, "outputs": 1},
    {"id": 1, "inputs": 1, "outputs": 1, "scope": {"kind": "iterative", "nodes": [
        {"id": 1, "inputs": 2, "outputs": 1},
        {"id": 2, "inputs": 1, "outputs": 1, "connections": [{"input": 0, "output": 0, "summaries": [[0, 1]]}]}],
        "edges": [_edge((0, 0), (1, 0)), _edge((1, 0), (2, 0)), _edge((2, 0), (1, 1)), _edge((1, 0), (0, 0))]}},
    {"id": 2, "inputs": 1, "outputs": 0}], "edges": [_edge((0, 0), (1, 0)), _edge((1, 0), (2, 0))]}


def test_the_sliced_rewind_equals_the_whole_undo_flat_and_nested(tmp_path: Path) -> None:
    async def main() -> int:
        service = Service(Settings(warehouse=tmp_path, delta=False, spark=False), "admin")
        service.recover()
        checked = 0
        try:
            for body in (loop_graph(5), NESTED):
                tenant = (await service.register(RegisterRequest.model_validate(body))).tenant
                for seq in range(30):
                    await submit(tenant, _advance(seq).encode(), service.wal, service.metrics)
                publication = tenant.publication
                for version in range(31):
                    assert await frontier_as_of(publication, version) == publication.frontier_at(version)
                    checked += 1
                # Rewinds under way at once take turns (one slice at a time) and each is still exact.
                versions = list(range(0, 31, 3))
                answers = await asyncio.gather(*(frontier_as_of(publication, v) for v in versions))
                assert answers == [publication.frontier_at(v) for v in versions]
        finally:
            service.wal.close()
        return checked

    assert asyncio.run(main()) == 62


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 120_000), min_size=1, max_size=12), st.integers(0, 5))
def test_the_oldest_answerable_version_is_found_from_running_totals(counts: list[int], dropped: int) -> None:
    # Against the definition: the oldest retained version whose undo is at most REWIND_CHANGES
    # (entries dropped from the front as the history's bound does; the floor is the last dropped).
    history = [(2 * i + 1, count, "") for i, count in enumerate(counts)]
    totals = list(accumulate(counts))
    history, totals = history[min(dropped, len(history) - 1):], totals[min(dropped, len(totals) - 1):]
    floor = 0 if history[0][0] == 1 else history[0][0] - 2
    candidates = [floor] + [version for version, _, _ in history]
    undo = {version: sum(count for v, count, _ in history if v > version) for version in candidates}
    expected = min(version for version in candidates if undo[version] <= REWIND_CHANGES)
    assert _oldest(history, totals, floor) == expected


@settings(max_examples=60, deadline=None)
@given(nested_bodies())
def test_a_dataflow_is_served_back_in_slices_as_its_response_model_would(drawn: tuple[int, dict[str, Any]]) -> None:
    arity, body = drawn
    spec = registration_record(RegisterRequest.model_validate({"name": "n", "timestamp_arity": arity, **body}))
    detail = {"id": "d", "name": spec.name, "timestamp_arity": arity, "version": 3, "created_at": "t",
              "state": "running", "nodes": spec.nodes * 40, "edges": spec.edges * 40,  # several slices
              "endpoint": "http://127.0.0.1:8101",
              "status": {"state": "running", "spark_check": "skipped", "workers": {"w": 2}}}
    whole = DataflowDetail.model_validate(detail).model_dump(mode="json", by_alias=True)
    graph = graph_json(detail.pop("nodes"), detail.pop("edges"))
    assert b"".join(detail_json(detail, graph)) == json.dumps(whole, ensure_ascii=False, separators=(",", ":")).encode()


def test_accepted_connections_get_the_bounded_send_buffer() -> None:
    """A client that does not read pushes back after about ``send_buffer`` bytes: every accepted
    connection has that kernel send buffer (Linux reports it doubled), not the autotuned one."""
    import socket

    from api.run.server import listen

    listener = listen("127.0.0.1", 0, send_buffer=65536)
    with listener, socket.create_connection(listener.getsockname()):
        accepted, _ = listener.accept()
        with accepted:
            assert 65536 <= accepted.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * 65536


def _rss_mb(service: ServiceProcess) -> float:
    assert service.process is not None
    status = Path(f"/proc/{service.process.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def test_a_graph_too_costly_to_track_is_refused_with_its_estimate_whatever_its_size(service: ServiceProcess) -> None:
    """Chains of k diamonds (arity 2, branches [1, 0] and [0, 1]: k + 1 summaries at the end).
    k = 400 and 700 were accepted before (the check was skipped past a budget): one batch then
    took seconds of the event loop and k = 700 grew the service by 800 MB at registration. Every
    size is now judged (a cheap bound, then the exact search where the bound is too high), and
    refused with what it found; a smaller chain within the engine's budget is served."""
    from bench.workloads import diamonds_graph

    before = _rss_mb(service)
    with service.client() as client:
        for k in (200, 400, 700):
            answer = client.post("/v1/dataflows", json=diamonds_graph(k))
            assert answer.status_code == 422, (k, answer.text[:300])
            detail = answer.json()["detail"]
            assert "more than 64 incomparable minimal path summaries (65)" in detail, detail
            assert f"the estimate: up to {k + 1} at" in detail, detail
    assert _rss_mb(service) < before + 150
    dataflow, token = register(service, diamonds_graph(20, name="twenty-diamonds"))
    with service.client(token) as client:
        moved = client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": "w", "seq": 0, "updates": [
            {"location": {"node": 0, "port": 0, "kind": "source"}, "time": [0, 0], "delta": -1},
            {"location": {"node": 0, "port": 0, "kind": "source"}, "time": [1, 0], "delta": 1}]})
        assert moved.status_code == 200
        end = client.get(f"/v1/dataflows/{dataflow}/frontier", params={"node": 60, "port": 0, "kind": "source"})
        assert sorted(end.json()["locations"][0]["frontier"]) == [[1 + a, 20 - a] for a in range(21)]
