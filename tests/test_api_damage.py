"""The real service against a damaged log and lost Delta tables: nothing acknowledged is lost in
silence, and one damaged dataflow does not take the others down.

* Seeded corruptions of the log (the service killed with ``kill -9`` first): a damaged batch
  record refuses its dataflow alone (503 ``dataflow_damaged``, listed by ``/healthz``, counted by
  ``tracker_dataflows_damaged``) and keeps the bytes; a damaged header byte loses nothing; every
  other dataflow comes back exactly as acknowledged.
* Each Delta table deleted in turn, under load, then ``kill -9``: every dataflow comes back with
  exactly the acknowledged batches and its workers' sequence numbers (a resent old batch is a
  duplicate, not applied again).
* The Delta log made unwritable: ``tracker_delta_lag_versions`` keeps counting and ``/healthz``
  says ``degraded``, then recovers.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from api.durability.marks import read_block
from api.durability.records import Batch, decode
from api.durability.segments import HEADER_SIZE, scan
from tests.helpers import (
    ADMIN_TOKEN,
    ROOT,
    BatchWriter,
    ServiceProcess,
    ServiceStarter,
    as_updates,
    core_graph,
    counts_map,
    free_port,
    frontier_map,
    loop_graph,
    stop_writers,
    update,
)
from tracker import oracle

pytestmark = pytest.mark.service


def _send(client: httpx.Client, dataflow_id: str, worker: str, seq: int, updates: list[dict[str, Any]]) -> int:
    answer = client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": worker, "seq": seq,
                                                                         "updates": updates})
    assert answer.status_code == 200, answer.text
    return int(answer.json()["version"])


def _state(client: httpx.Client, dataflow_id: str) -> tuple[int, dict[str, int], dict[Any, int]]:
    detail = client.get(f"/v1/dataflows/{dataflow_id}")
    assert detail.status_code == 200, detail.text
    rows = client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json()
    return detail.json()["version"], detail.json()["status"]["workers"], counts_map(rows)


def _metric(service: ServiceProcess, name: str) -> float:
    text = httpx.get(service.url + "/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_a_damaged_record_refuses_its_dataflow_alone_and_nothing_is_cut(start_service: ServiceStarter) -> None:
    service = start_service(TRACKER_DELTA="0")  # the log alone holds every batch
    body = loop_graph(operators=2)
    graph, initial = core_graph(body)
    flows = [register_flow(service, body) for _ in range(4)]
    sent: dict[str, list[list[dict[str, Any]]]] = {d: [] for d, _ in flows}
    with service.client() as client:
        for step in range(3):
            for dataflow_id, _ in flows:
                updates = [update(1, 0, "target", [step], 1)]
                _send(client, dataflow_id, "w", step, updates)
                sent[dataflow_id].append(updates)
    service.kill9()
    [segment] = sorted(service.log_directory().glob("wal-*.log"))
    original = segment.read_bytes()
    frames = scan(original, read_block(original).size).payloads  # the frames follow the mark block
    batches = [(offset, decode(payload)) for offset, payload in frames if isinstance(decode(payload), Batch)]
    middle_offset, middle = batches[len(batches) // 2]
    last_offset, last = batches[-1]
    trials = [
        ("a byte in the middle of a batch's payload", middle_offset + HEADER_SIZE + 12, middle.df),
        ("byte 20 of the first record's first header copy", frames[0][0] + 20, None),
        ("a byte in the complete last record", last_offset + HEADER_SIZE + 50, last.df),
    ]
    for what, offset, refused in trials:
        damaged = bytearray(original)
        damaged[offset] ^= 0x5A
        segment.write_bytes(bytes(damaged))
        service.restart()
        assert segment.read_bytes() == bytes(damaged), f"{what}: the log's bytes changed"
        health = httpx.get(service.url + "/healthz").json()
        with service.client() as client:
            for dataflow_id, token in flows:
                if dataflow_id == refused:
                    with service.client(token) as own:  # its own token still authenticates: 503, not 401
                        answer = own.get(f"/v1/dataflows/{dataflow_id}/frontier")
                    assert answer.status_code == 503, (what, answer.text)
                    assert answer.json()["error"] == "dataflow_damaged" and "version" in answer.json()["detail"]
                    continue
                counts = oracle.accumulate([initial, *(as_updates(b) for b in sent[dataflow_id])])
                assert _state(client, dataflow_id) == (3, {"w": 2}, counts), what
            listing = client.get("/v1/dataflows").json()
            only_damaged = client.get("/v1/dataflows", params={"state": "damaged"}).json()
        assert {d["id"] for d in listing if d["state"] != "damaged"} == {d for d, _ in flows} - {refused}, what
        damaged = [d for d in listing if d["state"] == "damaged"]
        assert damaged == only_damaged and [d["id"] for d in damaged] == ([] if refused is None else [refused]), what
        if refused is not None:  # in plain sight, with its name and why
            assert damaged[0]["name"] == body["name"] and damaged[0]["timestamp_arity"] == 1, damaged
            assert damaged[0]["version"] is None and "version" in damaged[0]["detail"], damaged
            shown = subprocess.run([sys.executable, "-m", "tracker.cli", "dataflows", "--url", service.url, "--token",
                                    ADMIN_TOKEN], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert shown.returncode == 0, shown.stderr
            row = next(line.split() for line in shown.stdout.splitlines() if refused in line)
            assert row[2:] == ["damaged", "-"], shown.stdout
            assert f"damaged {refused} ({body['name']}): {damaged[0]['detail']}" in shown.stdout, shown.stdout
            own_token = dict(flows)[refused]
            with service.client(own_token) as own:  # its own token lists it too
                assert [d["id"] for d in own.get("/v1/dataflows").json()] == [refused]
        if refused is None:
            assert health["status"] == "ok" and _metric(service, "tracker_dataflows_damaged") == 0, what
        else:
            assert health == {**health, "status": "degraded", "damaged_count": 1} and "damaged" not in health, what
            admin = httpx.get(service.url + "/healthz", headers=service.admin_headers).json()
            assert [d["id"] for d in admin["damaged"]] == [refused] and "byte" in admin["damaged"][0]["detail"], what
            assert _metric(service, "tracker_dataflows_damaged") == 1, what
        service.kill9()
    segment.write_bytes(original)
    service.restart()
    with service.client() as client:  # the undamaged log: every dataflow, and it goes on
        for dataflow_id, _ in flows:
            assert _state(client, dataflow_id)[0] == 3
        assert _send(client, flows[0][0], "w", 3, []) == 4
        frontier = client.get(f"/v1/dataflows/{flows[1][0]}/frontier").json()
    counts = oracle.accumulate([initial, *(as_updates(b) for b in sent[flows[1][0]])])
    assert frontier_map(frontier) == oracle.frontiers(graph, counts)


def register_flow(service: ServiceProcess, body: dict[str, Any]) -> tuple[str, str]:
    with service.client() as client:
        answer = client.post("/v1/dataflows", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"], answer.json()["token"]


class _Worker(BatchWriter):
    """Sends one-update batches with increasing seq, resending one until it is answered (across restarts)."""

    def __init__(self, service: ServiceProcess, dataflow_id: str, name: str) -> None:
        super().__init__(name, service.url, ADMIN_TOKEN, dataflow_id)
        self.rng = random.Random(name)

    def batch(self) -> list[dict[str, Any]]:
        return [update(1, 0, "target", [self.rng.randint(0, 5)], self.rng.choice([1, 1, -1]))]


def test_each_delta_table_lost_in_turn_under_load_then_kill_9_keeps_exactly_once(
        start_service: ServiceStarter) -> None:
    service = start_service(TRACKER_FLUSH_SECONDS="0.1", TRACKER_COMPACT_SECONDS="0.2",
                            TRACKER_WAL_SEGMENT_BYTES="6000")
    body = loop_graph(operators=2)
    _, initial = core_graph(body)
    busy = [register_flow(service, body)[0] for _ in range(2)]
    idle = register_flow(service, body)[0]  # two batches, then silence: after rotations only a checkpoint has it
    with service.client() as client:
        idle_batches = [[update(1, 0, "target", [s], 1)] for s in range(2)]
        for seq, batch in enumerate(idle_batches):
            _send(client, idle, "w0", seq, batch)
    workers = [_Worker(service, dataflow_id, f"w{i}") for i, dataflow_id in enumerate(busy)]
    warehouse = service.warehouse
    rounds = [["pointstamps"], ["frontier_changes", "frontiers", "dataflows", "nodes", "connections", "edges",
                               "summaries"], ["progress"]]
    try:
        for worker in workers:
            worker.start()
        for tables in rounds:
            time.sleep(0.6)
            for table in tables:
                shutil.rmtree(warehouse / table, ignore_errors=True)
            time.sleep(0.3)
            service.kill9()
            service.restart()
        time.sleep(0.5)
        assert stop_writers(workers) == []
        assert len(list(service.log_directory().glob("wal-*.log"))) >= 1
        with service.client() as client:
            for worker in workers:
                counts = oracle.accumulate([initial, *(as_updates(b) for b in worker.acked)])
                assert len(worker.acked) > 5
                assert _state(client, worker.dataflow_id) == (len(worker.acked), {worker.name: len(worker.acked) - 1},
                                                               counts)
            counts = oracle.accumulate([initial, *(as_updates(b) for b in idle_batches)])
            assert _state(client, idle) == (2, {"w0": 1}, counts)
            again = client.post(f"/v1/dataflows/{idle}/progress",
                                json={"worker": "w0", "seq": 0, "updates": idle_batches[0]})
            assert again.status_code == 200 and again.json()["duplicate"] is True  # not applied twice
            assert _send(client, idle, "w0", 2, []) == 3
            assert httpx.get(service.url + "/healthz").json()["status"] in ("ok", "degraded")
            assert "damaged" not in httpx.get(service.url + "/healthz").json()
        rotated = max(int(p.stem.split("-")[1]) for p in service.log_directory().glob("wal-*.log"))
        assert rotated > 1, "the log never rotated: the checkpoints were not exercised"
    finally:
        for worker in workers:
            worker.stop.set()
        service.stop()


def test_unwritable_delta_keeps_the_lag_counted_and_health_degraded(start_service: ServiceStarter) -> None:
    service = start_service(TRACKER_FLUSH_SECONDS="0.1", TRACKER_COMPACT_SECONDS="0.2")
    dataflow_id, _ = register_flow(service, loop_graph(operators=2))
    with service.client() as client:
        _send(client, dataflow_id, "w", 0, [update(1, 0, "target", [0], 1)])
        deadline = time.monotonic() + 30
        while client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]["delta_version"] < 1:
            assert time.monotonic() < deadline, "the first flush never came"
            time.sleep(0.05)
        log = service.warehouse / "progress" / "_delta_log"
        aside = log.with_name("_delta_log.aside")
        log.rename(aside)
        log.write_text("not a directory: every commit fails")
        try:
            for seq in range(1, 6):
                _send(client, dataflow_id, "w", seq, [update(1, 0, "target", [seq], 1)])
            # The lag counts the 5 unflushed versions as soon as they are acknowledged; the
            # health says "degraded" once a flush has failed, which may come a period later.
            deadline = time.monotonic() + 30
            while (_metric(service, "tracker_delta_lag_versions") != 5
                   or client.get("/healthz").json()["status"] != "degraded"):
                assert time.monotonic() < deadline, (_metric(service, "tracker_delta_lag_versions"),
                                                     client.get("/healthz").json())
                time.sleep(0.05)
            health = httpx.get(service.url + "/healthz")  # no token: the error itself is not shown
            assert health.status_code == 200 and health.json()["status"] == "degraded"
            assert health.json()["delta_failing"]["lag_versions"] == 5 and "error" not in health.json()["delta_failing"]
            assert httpx.get(service.url + "/healthz", headers=service.admin_headers).json()["delta_failing"]["error"]
        finally:
            log.unlink()
            aside.rename(log)
        deadline = time.monotonic() + 30
        while client.get("/healthz").json()["status"] != "ok":
            assert time.monotonic() < deadline, "the flush never recovered"
            time.sleep(0.05)
        assert _metric(service, "tracker_delta_lag_versions") == 0


def test_a_damaged_or_missing_delta_file_is_reported_and_the_service_starts_from_what_it_can_read(
        start_service: ServiceStarter) -> None:
    """A missing or damaged data file of a table recovery reads stopped the start with a stack
    trace, and a missing file of ``progress`` was not noticed at all. Each in turn now: the
    service starts, every dataflow comes back exactly (the log still holds its batches), and
    ``/healthz`` names the table (what is wrong: for the admin token)."""
    service = start_service(TRACKER_FLUSH_SECONDS="0.1", TRACKER_COMPACT_SECONDS="0.2")
    body = loop_graph(operators=2)
    _, initial = core_graph(body)
    flows = [register_flow(service, body)[0] for _ in range(2)]
    sent = [[update(1, 0, "target", [seq], 1)] for seq in range(4)]
    with service.client() as client:
        for dataflow_id in flows:
            for seq, batch in enumerate(sent):
                _send(client, dataflow_id, "w", seq, batch)
        deadline = time.monotonic() + 30
        while any(client.get(f"/v1/dataflows/{d}").json()["status"]["delta_version"] < 4 for d in flows) \
                or not list((service.warehouse / "pointstamps").rglob("*.parquet")):
            assert time.monotonic() < deadline, "never flushed and compacted"
            time.sleep(0.1)
    service.kill9()
    pristine = service.warehouse.parent / "pristine"
    shutil.copytree(service.warehouse, pristine)
    counts = oracle.accumulate([initial, *(as_updates(b) for b in sent)])
    for table, damage in (("pointstamps", "missing"), ("pointstamps", "garbage"), ("progress", "missing"),
                          ("dataflows", "missing")):
        from deltalake import DeltaTable

        listed = DeltaTable(str(service.warehouse / table)).get_add_actions(flatten=True).column("path").to_pylist()
        victim = service.warehouse / table / unquote(sorted(listed)[-1])  # a file the current version reads
        if damage == "missing":
            victim.unlink()
        else:
            victim.write_bytes(b"not parquet")
        service.restart()
        health = httpx.get(service.url + "/healthz").json()
        assert health["status"] == "degraded" and health["delta_damaged"] == [table], (table, damage, health)
        detail = httpx.get(service.url + "/healthz", headers=service.admin_headers).json()["delta_damaged_detail"]
        assert list(detail) == [table] and detail[table].startswith(
            "1 data file(s) its Delta log lists are missing" if damage == "missing" else "cannot be read"), detail
        with service.client() as client:
            for dataflow_id in flows:
                assert _state(client, dataflow_id) == (4, {"w": 3}, counts), (table, damage)
        service.kill9()
        shutil.rmtree(service.warehouse)
        shutil.copytree(pristine, service.warehouse)


def test_with_the_log_down_registration_is_503_and_an_unacknowledged_seq_is_not_used(tmp_path: Path) -> None:
    """The app served by uvicorn alone (``app_from_env``, no supervisor to restart it), its log
    failed: its sync process killed (under ``tracker serve`` the hot path would exit there and be
    restarted, ``tests/test_api_crash.py``; a failed write or ``fdatasync`` fails the log alike)."""
    import os
    import signal

    port = free_port()
    env = {**os.environ, "TRACKER_ADMIN_TOKEN": ADMIN_TOKEN, "TRACKER_WAREHOUSE": str(tmp_path / "warehouse"),
           "TRACKER_PORT": str(port), "TRACKER_SPARK": "0", "TRACKER_DELTA": "0", "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "uvicorn.log", "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "api.run.server:app_from_env",
                                    "--host", "127.0.0.1", "--port", str(port)], cwd=ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "uvicorn.log").read_text()
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        admin = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
        answer = admin.post("/v1/dataflows", json=loop_graph(operators=2))
        assert answer.status_code == 201, answer.text
        dataflow_id, token = answer.json()["id"], answer.json()["token"]
        url = f"/v1/dataflows/{dataflow_id}/progress"
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
            assert client.post(url, json={"worker": "w", "seq": 0, "updates": []}).status_code == 200
            [syncer] = [int(c) for task in Path(f"/proc/{process.pid}/task").iterdir()
                        for c in (task / "children").read_text().split()]
            os.kill(syncer, signal.SIGKILL)
            # The loss is noticed when the sync process's pipe closes; until then a quiet log may
            # still commit on the event loop (its own fdatasync: durable, so acknowledged).
            deadline = time.monotonic() + 10
            while client.get("/healthz").status_code != 503:
                assert time.monotonic() < deadline, "the sync process's loss was never noticed"
                time.sleep(0.05)
            refused = client.post(url, json={"worker": "w", "seq": 1, "updates": []})
            assert refused.status_code == 503 and refused.json()["error"] == "log_failed"
            assert client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]["workers"] == {"w": 0}
        registered = admin.post("/v1/dataflows", json=loop_graph(operators=2))
        assert registered.status_code == 503 and registered.json()["error"] == "log_failed", registered.text
        assert [d["id"] for d in admin.get("/v1/dataflows").json()] == [dataflow_id]
        admin.close()
        assert process.poll() is None  # nobody would restart it: it stays, refusing writes
    finally:
        process.kill()
        process.wait(10)
