"""A costly batch is known before it runs and never runs on the event loop: 1,001 incomparable
times moved at once along a 200-operator chain (arity 2), right after a cheap batch that took the
dataflow out of its lane, propagate in the dataflow's own thread while a probe tenant on the
same shard keeps being acknowledged, and no process is killed; the frontier is exact. While a
dataflow's lane is busy (a longer move: a 1,000-operator chain, 2,001 times), reads of it answer
at once from what was published, and a backlog at ``TRACKER_LANE_BACKLOG`` is refused 429
``dataflow_busy`` with nothing applied."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests.helpers import ServiceStarter, loop_graph, register, update, wait_for

pytestmark = pytest.mark.service


def chain(length: int, name: str) -> dict[str, Any]:
    nodes = [{"id": 0, "inputs": 0, "outputs": 1}] + [{"id": i, "inputs": 1, "outputs": 1} for i in range(1, length)]
    edges = [{"source": {"node": i, "port": 0}, "target": {"node": i + 1, "port": 0}} for i in range(length - 1)]
    return {"name": name, "timestamp_arity": 2, "nodes": nodes, "edges": edges}


def moves(width: int) -> tuple[list[list[dict[str, Any]]], list[tuple[int, int]]]:
    """Three batches (the capability at [0, 0] moved to ``width + 1`` incomparable times; an empty
    one; all of them moved by one at once) and the times held at the end."""
    first = [(i, width - i) for i in range(width + 1)]
    shifted = [(i + 1, width - i) for i in range(width + 1)]
    return [[update(0, 0, "source", [0, 0], -1), *(update(0, 0, "source", list(t), 1) for t in first)], [],
            [*(update(0, 0, "source", list(t), -1) for t in first), *(update(0, 0, "source", list(t), 1)
                                                                      for t in shifted)]], shifted


class Probe(threading.Thread):
    """A small tenant advancing its input every 5 ms, timing each acknowledgement."""

    def __init__(self, url: str, dataflow: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.dataflow, self.token = url, dataflow, token
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60) as client:
            seq = 0
            while not self.done.is_set():
                began = time.perf_counter()
                moved = [update(0, 0, "source", [seq], -1), update(0, 0, "source", [seq + 1], 1)]
                answer = client.post(f"/v1/dataflows/{self.dataflow}/progress",
                                     json={"worker": "p", "seq": seq, "updates": moved})
                self.latencies.append(time.perf_counter() - began)
                if answer.status_code != 200:
                    self.errors.append(answer.text)
                seq += 1
                time.sleep(0.005)


def _post(client: httpx.Client, dataflow: str, worker: str, seq: int, updates: list[dict[str, Any]]
          ) -> httpx.Response:
    return client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": worker, "seq": seq, "updates": updates})


def test_wide_antichains_moved_at_once_never_stall_another_tenant(start_service: ServiceStarter) -> None:
    service = start_service(TRACKER_LANE_BACKLOG="1")
    hot = service.pid_of("hot")
    probe_id, probe_token = register(service, loop_graph(5, name="probe"))
    wide, token = register(service, chain(200, "wide"))
    batches, held = moves(1_000)
    probe = Probe(service.url, probe_id, probe_token)
    probe.start()
    try:
        with service.client(token, timeout=600) as client:
            for seq, batch in enumerate(batches):
                lane = client.get(f"/v1/dataflows/{wide}").json()["status"]["lane"]
                assert _post(client, wide, "w", seq, batch).status_code == 200
                if seq == 2:  # the costly move, right after a cheap one (which left the lane idle and cheap)
                    after = client.get(f"/v1/dataflows/{wide}").json()["status"]["lane"]
                    assert after["batches"] == lane["batches"] + 1, (lane, after)
            last = client.get(f"/v1/dataflows/{wide}/frontier",
                              params={"node": 199, "port": 0, "kind": "target"}).json()["locations"]
        assert [tuple(t) for t in last[0]["frontier"]] == sorted(held)
    finally:
        probe.done.set()
        probe.join(60)
    assert probe.errors == [] and len(probe.latencies) > 10
    # Off the event loop, the probe waits for nothing of it: its slowest answers are the machine's
    # (the figure on a quiet machine is `python -m bench isolation`'s row "wide_antichains").
    assert max(probe.latencies) < 2.0, sorted(probe.latencies)[-5:]
    assert service.pid_of("hot") == hot  # nobody was killed for it

    long, long_token = register(service, chain(1_000, "long"))
    batches, _ = moves(2_000)
    outcome: dict[str, httpx.Response] = {}
    with service.client(long_token, timeout=600) as client, service.client(long_token) as reader:
        for seq, batch in enumerate(batches[:2]):
            assert _post(client, long, "w", seq, batch).status_code == 200
        costly = threading.Thread(target=lambda: outcome.update(answer=_post(client, long, "w", 2, batches[2])))
        costly.start()
        status = wait_for("the costly batch in its lane", lambda: (s := reader.get(
            f"/v1/dataflows/{long}").json()["status"])["lane"]["queued"] and s, 60, interval=0.01)
        assert status["lane"]["in_lane"], status
        for route in ("lag", "frontier", "pointstamps", "frontier/explain?node=1&port=0&kind=target&time=0,0"):
            assert reader.get(f"/v1/dataflows/{long}/{route}").status_code == 200, route  # answered while busy
        refused = _post(reader, long, "x", 0, [])
        busy_still = costly.is_alive()
        costly.join(600)
        assert outcome["answer"].status_code == 200, outcome["answer"].text
        if busy_still:
            assert refused.status_code == 429 and refused.json()["error"] == "dataflow_busy", refused.text
            assert "x" not in client.get(f"/v1/dataflows/{long}").json()["status"]["workers"]  # nothing applied
