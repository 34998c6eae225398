"""Crash test: concurrent workers, repeated ``kill -9`` and restarts; exactly-once and durability.

Each worker behaves like a real one: it sends batch ``seq`` until it gets an answer (retrying
the same batch after a connection error, since it cannot know whether the batch got in), then
moves on. Afterwards every acknowledged batch must be applied exactly once: the version counts
them, the pointstamps equal their sum, the frontiers equal the brute-force oracle's, and the
Delta ``progress`` table holds each ``(worker, seq)`` once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest

from tests.helpers import (
    ROOT,
    BatchWriter,
    ServiceStarter,
    as_updates,
    core_graph,
    counts_map,
    free_port,
    frontier_map,
    loop_graph,
    register,
    stop_writers,
    update,
)
from tracker import oracle
from tracker.graph import Location

pytestmark = pytest.mark.service

WORKERS = 4
KILLS = 4


class Worker(BatchWriter):
    """Sends random batches with increasing seq; records what was acknowledged."""

    def __init__(self, name: str, url: str, token: str, dataflow_id: str, locations: list[Location]) -> None:
        super().__init__(name, url, token, dataflow_id)
        self.locations = locations
        self.rng = random.Random(name)

    def batch(self) -> list[dict[str, Any]]:
        return [
            update(*self.rng.choice(self.locations), [self.rng.randint(0, 4), self.rng.randint(0, 4)],
                   self.rng.choice([-1, 1, 1, 2]))
            for _ in range(self.rng.randint(1, 4))
        ]


@pytest.mark.parametrize("lane_ms", ["1", "0"], ids=["loop", "lane"])  # "0": every batch after the first in a lane
def test_kill_9_loses_no_acknowledged_batch_and_applies_none_twice(start_service: ServiceStarter, lane_ms: str) -> None:
    service = start_service(TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.5",
                            TRACKER_WAL_SEGMENT_BYTES="30000", TRACKER_LANE_MS=lane_ms)
    body = loop_graph(operators=5, arity=2)
    dataflow_id, token = register(service, body)
    graph, initial = core_graph(body)
    locations = graph.locations()
    workers = [Worker(f"w{i}", service.url, token, dataflow_id, locations) for i in range(WORKERS)]
    rng = random.Random(1)
    try:
        for worker in workers:
            worker.start()
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.6, 1.2))
            service.kill9()
            time.sleep(0.1)
            service.restart()
        time.sleep(0.5)
        errors = stop_writers(workers)
        assert all(not w.is_alive() for w in workers)
        assert errors == []
        acked = {w.name: w.acked for w in workers}
        total = sum(len(b) for b in acked.values())
        assert total > 20, f"too little load got through: {total} batches"

        counts = oracle.accumulate([initial, *(as_updates(b) for bs in acked.values() for b in bs)])
        expected_frontiers = oracle.frontiers(graph, counts)

        def check_state() -> None:
            with service.client(token) as client:
                detail = client.get(f"/v1/dataflows/{dataflow_id}").json()
                assert detail["version"] == total
                assert detail["status"]["workers"] == {name: len(b) - 1 for name, b in acked.items() if b}
                rows = client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json()
                assert counts_map(rows) == counts
                frontier = client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()
                assert frontier["version"] == total
                assert frontier_map(frontier) == expected_frontiers

        check_state()
        service.kill9()  # once more with no load: recovery alone must give the same state
        service.restart()
        check_state()
    finally:
        for worker in workers:
            worker.stop.set()
        service.stop()  # graceful: the final flush writes the Delta tail
    progress = pl.read_delta(str(service.warehouse / "progress")).filter(pl.col("dataflow_id") == dataflow_id)
    batches = progress.filter(pl.col("version") > 0).select("version", "worker", "seq").unique()
    assert batches.height == total
    assert batches.select("worker", "seq").unique().height == total  # no (worker, seq) twice
    assert sorted(batches["version"].to_list()) == list(range(1, total + 1))
    delta_counts = progress.group_by("node", "port", "kind", "time").agg(pl.col("delta").sum())
    from_delta = {(Location(r["node"], r["port"], r["kind"]), tuple(r["time"])): r["delta"]
                  for r in delta_counts.to_dicts() if r["delta"] != 0}
    assert from_delta == counts
    segments = sorted(service.log_directory().glob("wal-*.log"))
    assert segments and int(segments[-1].stem.split("-")[1]) > 1, "the log never rotated"


def test_a_torn_log_tail_is_cut_off_and_logging_continues(start_service: ServiceStarter) -> None:
    """A crash in the middle of writing a record leaves a torn tail; that record was never
    acknowledged, so recovery drops it, keeps everything before, and appends after it."""
    service = start_service(TRACKER_DELTA="0")  # the log alone
    dataflow_id, token = register(service, loop_graph(operators=2))
    url = f"/v1/dataflows/{dataflow_id}/progress"
    with service.client(token) as client:
        for seq in range(3):
            assert client.post(url, json={"worker": "w", "seq": seq,
                                          "updates": [update(1, 0, "target", [seq], 1)]}).status_code == 200
    service.kill9()
    [segment] = sorted(service.log_directory().glob("wal-*.log"))
    intact = segment.stat().st_size
    with open(segment, "ab") as handle:  # a record header promising more bytes than follow
        handle.write(b"\x00\x10\x00\x00\x12\x34\x56\x78{\"t\":\"batch\",\"df\":")
    service.restart()
    assert segment.stat().st_size == intact
    with service.client(token) as client:
        detail = client.get(f"/v1/dataflows/{dataflow_id}").json()
        assert detail["version"] == 3 and detail["status"]["workers"] == {"w": 2}
        assert client.post(url, json={"worker": "w", "seq": 3, "updates": [update(1, 0, "target", [3], 1)]}
                           ).json() == {"applied": True, "duplicate": False, "version": 4}
    service.kill9()
    service.restart()
    with service.client(token) as client:
        rows = client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json()
    assert sorted(r["time"][0] for r in rows if r["location"]["node"] == 1) == [0, 1, 2, 3]


def test_restart_starts_from_the_compacted_snapshot_even_ahead_of_progress(start_service: ServiceStarter) -> None:
    """A restart starts from the counts compaction wrote as of version V and applies only what
    follows. Here ``progress`` is also cut back below V after the crash (as when a crash falls
    between a compaction and the next flush): the log's batches up to V must then be flushed
    again but not applied again, and ``progress`` must still end with every batch exactly once."""
    from deltalake import DeltaTable

    from spark_jobs.storage import POINTSTAMPS_APP

    service = start_service(TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.2")
    body = loop_graph(operators=5, arity=2)
    dataflow_id, token = register(service, body)
    graph, initial = core_graph(body)
    rng = random.Random(5)
    sent: list[list[dict[str, Any]]] = []
    warehouse = service.warehouse

    def send(client: httpx.Client, count: int) -> None:
        for _ in range(count):
            batch = [update(*rng.choice(graph.locations()), [rng.randint(0, 3), rng.randint(0, 3)],
                            rng.choice([-1, 1, 2])) for _ in range(3)]
            answer = client.post(f"/v1/dataflows/{dataflow_id}/progress",
                                 json={"worker": "w", "seq": len(sent), "updates": batch})
            assert answer.status_code == 200, answer.text
            sent.append(batch)

    try:
        with service.client(token) as client:
            send(client, 30)
            deadline = time.monotonic() + 30
            while not ((warehouse / "pointstamps").exists() and (DeltaTable(str(warehouse / "pointstamps"))
                       .transaction_version(POINTSTAMPS_APP + dataflow_id) or 0) >= 30):
                assert time.monotonic() < deadline, "compaction never wrote a snapshot"
                time.sleep(0.05)
            send(client, 10)
        service.kill9()
        DeltaTable(str(warehouse / "progress")).delete(f"dataflow_id = '{dataflow_id}' AND version > 20")
        service.restart()
        recovered = [line for line in service.log_tail(400).splitlines() if '"recovered dataflow"' in line]
        snapshot_at = json.loads(recovered[-1])["snapshot_version"]
        assert 30 <= snapshot_at <= 40

        counts = oracle.accumulate([initial, *(as_updates(b) for b in sent)])
        with service.client(token) as client:
            assert client.get(f"/v1/dataflows/{dataflow_id}").json()["version"] == 40
            rows = client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json()
            assert counts_map(rows) == counts
            frontier = client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()
            assert frontier_map(frontier) == oracle.frontiers(graph, counts)
            # Sequence numbers survived the snapshot: an old batch is a duplicate, a gap is refused.
            old = client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": 3, "updates": []})
            assert old.status_code == 200 and old.json()["duplicate"] is True
            gap = client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": 41, "updates": []})
            assert gap.status_code == 409 and gap.json()["expected"] == 40
    finally:
        service.stop()  # graceful: the final flush writes the Delta tail
    progress = pl.read_delta(str(warehouse / "progress")).filter(pl.col("dataflow_id") == dataflow_id)
    assert sorted(progress.select("version", "seq").unique()["version"].to_list()) == list(range(0, 41))
    per_version = progress.filter(pl.col("version") > 0).group_by("version").agg(pl.len().alias("rows"))
    assert per_version["rows"].to_list() == [3] * 40  # each batch's three updates, once


def _children(pid: int) -> list[int]:
    """Child processes of ``pid``, whichever of its threads started them."""
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":  # exited, waiting for its parent (or init) to reap it
            return True
        time.sleep(0.05)
    return False


def test_the_sync_process_dies_with_the_service_and_its_loss_restarts_the_hot_path(
        start_service: ServiceStarter) -> None:
    """A ``kill -9`` of the log's sync process: nothing more is acknowledged by that hot path
    (it exits as soon as it notices, before answering), the supervisor starts it again, and it
    recovers from the log; the worker resends what was not acknowledged, applied once."""
    service = start_service()
    dataflow_id, token = register(service, loop_graph())
    url = f"/v1/dataflows/{dataflow_id}/progress"
    first = {"worker": "w", "seq": 0, "updates": [update(1, 0, "target", [5], 1)]}
    second = {"worker": "w", "seq": 1, "updates": [update(1, 0, "target", [6], 1)]}
    with service.client(token) as client:
        assert client.post(url, json=first).status_code == 200
        hot = service.pid_of("hot")
        (syncer,) = _children(hot)  # under tracker serve's hot-path process
        os.kill(syncer, signal.SIGKILL)
        # Noticed when its pipe closes, or by a quiet log at its next commit: either way the
        # answer to `second` comes from the restarted process, after its recovery.
        answers: list[str] = []
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, f"never acknowledged after the sync process's loss: {answers[-3:]}"
            try:
                answer = client.post(url, json=second)
            except httpx.HTTPError as error:  # the hot path exited under the request: send it again
                answers.append(repr(error))
                time.sleep(0.05)
                continue
            if answer.status_code == 200:
                break
            answers.append(f"{answer.status_code} {answer.text}")
            assert answer.status_code >= 500, answers[-1]
            time.sleep(0.05)
        assert answer.json()["version"] == 2, answer.text
        assert service.pid_of("hot") != hot, "acknowledged by the hot path that lost its sync process"
        assert client.get("/healthz").status_code == 200
        counts = {(r["location"]["node"], tuple(r["time"])): r["count"]
                  for r in client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json()}
        assert counts[(1, (5,))] == 1 and counts[(1, (6,))] == 1
        assert client.get(f"/v1/dataflows/{dataflow_id}").json()["version"] == 2
    (syncer,) = _children(service.pid_of("hot"))
    service.kill9()
    assert _gone(syncer), "the sync process outlived the service"


def test_a_restart_finishes_what_a_crash_interrupted_and_one_writer_holds_the_warehouse(
        start_service: ServiceStarter) -> None:
    """After ``kill -9``: graph tables the crash left half-written are written again (with the
    registration's own ``created_at``), and changes replayed from the log keep the time their
    batch arrived. While the service runs, nothing else may write its warehouse: a second
    service and the Spark jobs that write refuse to start, with a message naming the holder."""
    import subprocess
    import sys

    from deltalake import DeltaTable

    service = start_service(TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="3600")
    warehouse = service.warehouse
    try:
        dataflow_id, token = register(service, loop_graph(operators=3))
        with service.client(token) as client:
            deadline = time.monotonic() + 30
            while not (info := client.get(f"/v1/dataflows/{dataflow_id}").json())["status"]["graph_stored"]:
                assert time.monotonic() < deadline, "the graph tables were never written"
                time.sleep(0.05)
            for step in range(10):
                answer = client.post(f"/v1/dataflows/{dataflow_id}/progress", json={
                    "worker": "w", "seq": step,
                    "updates": [update(0, 0, "source", [step], -1), update(0, 0, "source", [step + 1], 1)]})
                assert answer.status_code == 200, answer.text

        for argv in (["serve", "--port", str(free_port())], ["jobs", "propagate", "--dataflow", dataflow_id]):
            refused = subprocess.run([sys.executable, "-m", "tracker.cli", *argv, "--warehouse", str(warehouse)],
                                     cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert refused.returncode == 2, refused.stderr
            assert f"tracker serve on port {service.port}" in refused.stderr and "Traceback" not in refused.stderr

        service.kill9()
        # As if the crash had come between the graph's commits: no `dataflows` row, no edges.
        for table in ("dataflows", "edges"):
            DeltaTable(str(warehouse / table)).delete(f"dataflow_id = '{dataflow_id}'")
        restarted_at = time.time()
        service.restart()
        with service.client(token) as client:
            deadline = time.monotonic() + 30
            while not client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]["graph_stored"]:
                assert time.monotonic() < deadline, "the graph tables were not written again"
                time.sleep(0.05)
    finally:
        service.stop()  # graceful: the final compaction appends frontier_changes
    row = pl.read_delta(str(warehouse / "dataflows")).filter(pl.col("dataflow_id") == dataflow_id).to_dicts()
    assert len(row) == 1 and row[0]["created_at"].isoformat() == info["created_at"]
    assert pl.read_delta(str(warehouse / "edges")).filter(pl.col("dataflow_id") == dataflow_id).height == 4
    progress = pl.read_delta(str(warehouse / "progress")).filter(pl.col("dataflow_id") == dataflow_id)
    arrived = dict(progress.group_by("version").agg(pl.col("received_at").first()).iter_rows())
    changes = pl.read_delta(str(warehouse / "frontier_changes")).filter(pl.col("dataflow_id") == dataflow_id)
    assert sorted(set(changes["version"])) == list(range(0, 11))  # version 0: the initial frontier
    for version, at in changes.select("version", "at").iter_rows():
        assert at.timestamp() < restarted_at
        assert at == (row[0]["created_at"] if version == 0 else arrived[version])


@pytest.mark.spark
def test_kill_9_of_the_spark_or_the_hot_path_process_under_load(start_service: ServiceStarter) -> None:
    """The supervisor restarts a killed process in its slot (itself untouched); the hot path
    acknowledges progress while the Spark process is down, loses nothing when it is killed
    itself, and a registration check interrupted by the Spark process's death runs again."""
    service = start_service(spark=True, SPARK_MASTER="local[1]", TRACKER_AUDIT_SECONDS="1",
                            TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.5")
    body = loop_graph(operators=3, arity=2)
    dataflow_id, token = register(service, body)
    graph, initial = core_graph(body)
    workers = [Worker(f"w{i}", service.url, token, dataflow_id, graph.locations()) for i in range(2)]

    def health() -> dict[str, Any]:
        return dict(httpx.get(service.url + "/healthz", timeout=10).json())

    def wait(what: str, ok: Any, timeout: float = 300.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (found := ok()):
            assert time.monotonic() < deadline, f"{what}:\n{service.log_tail()}"
            time.sleep(0.1)
        return found

    assert service.process is not None
    supervisor = service.process.pid
    try:
        for worker in workers:
            worker.start()
        wait("the Spark session", lambda: health()["spark"] == "ready")
        first_spark = service.pid_of("spark")
        checked, checked_token = register(service, loop_graph(operators=2, name="checked-after-a-crash"))
        os.kill(first_spark, signal.SIGKILL)
        wait("the hot path to see the Spark process gone", lambda: health()["spark"] != "ready", 30)
        with service.client() as admin:
            refused = admin.post(f"/v1/dataflows/{dataflow_id}/audit")
        assert refused.status_code in (503, 409), refused.text  # 409: an audit was in flight
        acked_while_down = sum(len(w.acked) for w in workers)
        time.sleep(1.0)
        assert sum(len(w.acked) for w in workers) > acked_while_down, "progress waited for Spark"

        first_hot = service.pid_of("hot")
        os.kill(first_hot, signal.SIGKILL)
        wait("a new hot-path process", lambda: _pid_or_none(service, "hot") not in (None, first_hot), 60)
        wait("the restarted Spark process", lambda: health()["spark"] == "ready")
        assert service.pid_of("spark") != first_spark
        with service.client(checked_token) as client:
            status = wait("the interrupted check", lambda: (s := client.get(f"/v1/dataflows/{checked}").json()[
                "status"])["spark_check"] not in ("pending", "running") and s)
        assert status["spark_check"] == "agreed", status
        time.sleep(0.5)
        errors = stop_writers(workers)
        assert errors == []
        acked = {w.name: w.acked for w in workers}
        total = sum(len(b) for b in acked.values())
        counts = oracle.accumulate([initial, *(as_updates(b) for bs in acked.values() for b in bs)])
        with service.client(token) as client:
            detail = client.get(f"/v1/dataflows/{dataflow_id}").json()
            assert detail["version"] == total
            assert counts_map(client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json()) == counts
            frontier = client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()
            assert frontier["version"] == total and frontier_map(frontier) == oracle.frontiers(graph, counts)
            audit = wait("an audit of the last version", lambda: (a := client.get(f"/v1/dataflows/{dataflow_id}")
                                                                  .json()["status"]["audit"]) and
                         a.get("version") == total and a)
        assert audit["ok"] is True, audit
        assert service.process.poll() is None and service.process.pid == supervisor
    finally:
        for worker in workers:
            worker.stop.set()


def _pid_or_none(service: Any, role: str) -> int | None:
    try:
        return int(service.pid_of(role))
    except (httpx.HTTPError, StopIteration):
        return None
