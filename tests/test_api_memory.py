"""Memory per hosted dataflow, in a real service process (Delta on, Spark off): many dataflows
of 100 operators registered, their graph tables written, the hot path's resident memory grown
by at most :data:`KB_PER_DATAFLOW` each (it was ~8 MB when each registration's ``summaries``
rows were built as Python dicts on the Delta thread)."""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl

from api.schema.models import RegisterRequest
from api.schema.registration import build_graph
from api.schema.spec import registration_record
from tests.helpers import ServiceStarter, loop_graph
from tracker.graph import Graph
from tracker.structure import path_summaries

DATAFLOWS = 120
KB_PER_DATAFLOW = 1500
"""The bound on resident memory grown per registered dataflow (measured ~0.5-0.7 MB here on a
loaded 2-core machine; generous, so that it fails on a regression of the kind above, not on
noise)."""


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _stored(client: object, ids: list[str], timeout: float = 240.0) -> None:
    """Wait until every dataflow of ``ids`` has its graph tables (``summaries`` included) in Delta."""
    deadline = time.monotonic() + timeout
    waiting = list(ids)
    while waiting:
        assert time.monotonic() < deadline, f"graph tables of {len(waiting)} dataflows not written"
        answer = client.get(f"/v1/dataflows/{waiting[0]}")  # type: ignore[attr-defined]
        if answer.json()["status"]["graph_stored"]:
            waiting.pop(0)
        else:
            time.sleep(0.2)


def build(body: dict[str, object]) -> Graph:
    """The graph the service builds from a registration body."""
    return build_graph(registration_record(RegisterRequest.model_validate(body)), compiled=True)[0]


def test_rss_per_registered_dataflow_is_bounded(start_service: ServiceStarter) -> None:
    service = start_service(TRACKER_REGISTER_RATE="0", TRACKER_MAX_DATAFLOWS="0")
    body = loop_graph(operators=100, name="many")
    with service.client(timeout=120) as client:
        warm = [client.post("/v1/dataflows", json=body).json()["id"] for _ in range(5)]
        _stored(client, warm)  # the Delta tables, the writer's first batch and caches exist
        pid = service.pid_of("hot")
        before = _rss_kb(pid)
        ids = []
        for _ in range(DATAFLOWS):
            answer = client.post("/v1/dataflows", json=body)
            assert answer.status_code == 201, answer.text
            ids.append(answer.json()["id"])
        _stored(client, ids)
        grown = (_rss_kb(pid) - before) / DATAFLOWS
        print(f"resident memory per registered dataflow of 100 operators: {grown:.0f} KB")
        assert grown <= KB_PER_DATAFLOW, f"{grown:.0f} KB per dataflow (bound {KB_PER_DATAFLOW})"
    # Every dataflow has its own Psi rows (those of one graph shape, computed once), read back
    # by an independent reader: a ring's every location reaches every other.
    counts = pl.read_delta(str(service.warehouse / "summaries")).group_by("dataflow_id").len()
    per = dict(zip(counts["dataflow_id"].to_list(), counts["len"].to_list(), strict=True))
    assert {per.get(i) for i in warm + ids} == {len(path_summaries(build(body)))}
