"""A costly batch is known before it runs and never runs on the event loop: many incomparable
times moved at once along a 200-operator chain (arity 2), after a cheap batch that took the
dataflow out of its lane, propagate in the dataflow's own thread while a probe tenant on the
same shard keeps its acknowledgements fast, and no process is killed; the frontier is exact.
While such a dataflow's lane is busy, reads of it answer at once (from what was published), and
a backlog beyond ``TRACKER_LANE_BACKLOG`` is refused 429 ``dataflow_busy``, nothing applied."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests.helpers import ServiceStarter, loop_graph, register, update, wait_for

WIDTH = 1_000
"""Incomparable times moved at once: ``[i, WIDTH - i]``."""
CHAIN = 200


def chain(length: int) -> dict[str, Any]:
    nodes = [{"id": 0, "inputs": 0, "outputs": 1}] + [{"id": i, "inputs": 1, "outputs": 1} for i in range(1, length)]
    edges = [{"source": {"node": i, "port": 0}, "target": {"node": i + 1, "port": 0}} for i in range(length - 1)]
    return {"name": "wide", "timestamp_arity": 2, "nodes": nodes, "edges": edges}


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


@pytest.mark.service
def test_wide_antichains_moved_at_once_never_stall_another_tenant(start_service: ServiceStarter) -> None:
    service = start_service(TRACKER_LANE_BACKLOG="1")
    hot = service.pid_of("hot")
    probe_id, probe_token = register(service, loop_graph(5, name="probe"))
    wide, token = register(service, chain(CHAIN))
    probe = Probe(service.url, probe_id, probe_token)
    first = [(i, WIDTH - i) for i in range(WIDTH + 1)]
    shifted = [(i + 1, WIDTH - i) for i in range(WIDTH + 1)]
    batches = [
        [update(0, 0, "source", [0, 0], -1), *(update(0, 0, "source", list(t), 1) for t in first)],
        [],  # cheap: takes the dataflow out of its lane, as before the estimate it would have been
        [*(update(0, 0, "source", list(t), -1) for t in first), *(update(0, 0, "source", list(t), 1) for t in shifted)],
    ]
    probe.start()
    busy: dict[str, Any] = {}
    try:
        time.sleep(0.5)
        with service.client(token, timeout=600) as client:
            for seq, batch in enumerate(batches[:2]):
                answer = client.post(f"/v1/dataflows/{wide}/progress", json={"worker": "w", "seq": seq,
                                                                              "updates": batch})
                assert answer.status_code == 200, answer.text
            costly = threading.Thread(target=lambda: busy.update(answer=client.post(
                f"/v1/dataflows/{wide}/progress", json={"worker": "w", "seq": 2, "updates": batches[2]})))
            costly.start()
            with service.client(token) as reader:
                status = wait_for("the costly batch in its lane", lambda: (s := reader.get(
                    f"/v1/dataflows/{wide}").json()["status"])["lane"]["queued"] and s, 60, interval=0.02)
                assert status["lane"]["in_lane"], status
                # While it propagates: reads answer from what was published, and the backlog is full.
                for route in ("lag", "frontier", "pointstamps", "frontier/explain?node=1&port=0&kind=target&time=0,0"):
                    assert reader.get(f"/v1/dataflows/{wide}/{route}").status_code == 200, route
                refused = reader.post(f"/v1/dataflows/{wide}/progress", json={"worker": "x", "seq": 0, "updates": []})
                if costly.is_alive():
                    assert refused.status_code == 429 and refused.json()["error"] == "dataflow_busy", refused.text
            costly.join(600)
        assert busy["answer"].status_code == 200, busy["answer"].text
        time.sleep(0.5)
    finally:
        probe.done.set()
        probe.join(60)
    assert probe.errors == [] and len(probe.latencies) > 20
    # Off the event loop, the probe waits for nothing of it: its slowest answers are the machine's
    # (the figure under a quiet machine is `python -m bench isolation`'s row "wide_antichains").
    assert max(probe.latencies) < 2.0, sorted(probe.latencies)[-5:]
    assert service.pid_of("hot") == hot  # nobody was killed for it
    with service.client(token) as client:
        last = client.get(f"/v1/dataflows/{wide}/frontier",
                          params={"node": CHAIN - 1, "port": 0, "kind": "target"}).json()["locations"]
    assert [tuple(t) for t in last[0]["frontier"]] == sorted(shifted)
