"""The service's Delta upkeep with many dataflows: shared commits, small files merged, old files
deleted, and nothing lost or doubled by any of it (read back by independent readers)."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable

from api.config import Settings
from tests.helpers import ServiceProcess, ServiceStarter, core_graph, frontier_map, loop_graph, register, update
from tracker import oracle
from tracker.graph import Location

pytestmark = pytest.mark.service

DATAFLOWS = 12
BATCHES = 15


def _tidied(service: ServiceProcess, table: str, action: str) -> list[dict]:
    lines = [json.loads(line) for line in service.log_tail(4000).splitlines() if '"delta table tidied"' in line]
    return [line for line in lines if line["table"] == table and line["action"] == action]


def test_many_dataflows_share_commits_and_tidying_keeps_every_row(start_service: ServiceStarter) -> None:
    service = start_service(TRACKER_FLUSH_SECONDS="0.1", TRACKER_COMPACT_SECONDS="0.3", TRACKER_TIDY_SECONDS="0.5",
                            TRACKER_VACUUM_HOURS="0")
    warehouse = service.warehouse
    body = loop_graph(operators=4)
    graph, _ = core_graph(body)
    try:
        with ThreadPoolExecutor(DATAFLOWS) as pool:  # a burst of registrations
            registered = list(pool.map(lambda i: register(service, {**body, "name": f"df{i}"}), range(DATAFLOWS)))
        for dataflow_id, token in registered:
            with service.client(token) as client:
                for seq in range(BATCHES):
                    answer = client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": seq,
                                         "updates": [update(0, 0, "source", [seq], -1),
                                                     update(0, 0, "source", [seq + 1], 1)]})
                    assert answer.status_code == 200, answer.text
        # The graphs of the burst went into shared commits, not five commits each.
        assert DeltaTable(str(warehouse / "nodes")).version() + 1 < DATAFLOWS / 2
        assert pl.read_delta(str(warehouse / "nodes"))["dataflow_id"].n_unique() == DATAFLOWS
        # Wait until `progress` holds everything and was tidied after that.
        deadline = time.monotonic() + 60
        with service.client() as admin:
            while any(admin.get(f"/v1/dataflows/{i}").json()["status"]["delta_version"] < BATCHES
                      for i, _ in registered):
                assert time.monotonic() < deadline, "progress never caught up"
                time.sleep(0.1)
        # A pass's vacuum of `progress` comes after its optimize steps: two more vacuums mean one
        # whole pass that started after the last append.
        seen = len(_tidied(service, "progress", "vacuum"))
        while len(_tidied(service, "progress", "vacuum")) < seen + 2:
            assert time.monotonic() < deadline, "progress was never tidied"
            time.sleep(0.1)
        merged = _tidied(service, "progress", "optimize")
        vacuumed = _tidied(service, "progress", "vacuum")
        # A file a crashed write left behind, never committed: the first vacuum after the
        # restart (full mode) deletes it too.
        orphan = warehouse / "progress" / f"dataflow_id={registered[0][0]}" / "part-00000-orphan.parquet"
        service.kill9()
        orphan.write_bytes(b"PAR1 never committed")
        os.utime(orphan, (time.time() - 7200, time.time() - 7200))
        service.restart()
        while not any(t["full"] for t in _tidied(service, "progress", "vacuum")[len(vacuumed):]):
            assert time.monotonic() < deadline, "progress was never vacuumed after the restart"
            time.sleep(0.1)
        assert not orphan.exists()
        for dataflow_id, token in registered:  # recovery reads the merged files
            with service.client(token) as client:
                assert client.get(f"/v1/dataflows/{dataflow_id}").json()["version"] == BATCHES
                frontier = client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()
                assert frontier_map(frontier) == oracle.frontiers(graph, {(Location.source(0, 0), (BATCHES,)): 1})
    finally:
        service.stop()
    progress = DeltaTable(str(warehouse / "progress"))
    # Merged down to one file per dataflow, and the replaced files are gone from the disk.
    assert sum(t["removed"] for t in merged) > sum(t["added"] for t in merged) > 0
    assert sum(t["deleted"] for t in vacuumed) >= sum(t["removed"] for t in merged)
    referenced = {Path(uri.removeprefix("file://")).resolve() for uri in progress.file_uris()}
    on_disk = {p.resolve() for p in (warehouse / "progress").rglob("*.parquet")}
    assert len(referenced) == DATAFLOWS and on_disk == referenced
    rows = pl.read_delta(str(warehouse / "progress"))
    for dataflow_id, _ in registered:
        mine = rows.filter(pl.col("dataflow_id") == dataflow_id)
        assert sorted(mine["version"].to_list()) == [0, *sorted(list(range(1, BATCHES + 1)) * 2)]


def test_a_failed_graph_table_write_is_retried_without_a_restart(start_service: ServiceStarter) -> None:
    """The graph tables' first write fails (a file stands where the ``nodes`` table goes): it
    was not tried again until a restart; now it is, and lands once the obstacle is gone."""
    service = start_service(TRACKER_FLUSH_SECONDS="0.2")
    blocker = service.warehouse / "nodes"
    blocker.write_text("not a table")
    dataflow_id, token = register(service, loop_graph(operators=2))
    with service.client(token) as client:
        time.sleep(2.0)  # a first attempt and a retry, both failing
        assert client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]["graph_stored"] is False
        blocker.unlink()
        deadline = time.monotonic() + 20
        while not client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]["graph_stored"]:
            assert time.monotonic() < deadline, "the graph tables were never written again"
            time.sleep(0.2)
    nodes = pl.read_delta(str(service.warehouse / "nodes")).filter(pl.col("dataflow_id") == dataflow_id)
    assert nodes.height == 3  # written once: the input and the two operators


def test_the_delta_thread_runs_below_the_event_loop_and_tidies_only_crowded_partitions(
        start_service: ServiceStarter) -> None:
    """The Delta thread runs at niceness +19 (the event loop at the process's own), so that on
    short cores requests and a restarting shard's recovery go before Delta's catch-up; and a
    tidy pass merges nothing where each partition is one file (registrations without batches),
    where it used to spend a step of a second or more per eight dataflows finding that out."""
    default = Settings().delta_nice  # what `tracker serve` runs with (the suite's services run at 0)
    service = start_service(TRACKER_FLUSH_SECONDS="0.1", TRACKER_TIDY_SECONDS="0.3", TRACKER_VACUUM_HOURS="0",
                            TRACKER_DELTA_NICE=str(default))
    for i in range(3):
        register(service, {**loop_graph(operators=3), "name": f"quiet-{i}"})
    pid = service.pid_of("hot", shard=0)
    deadline = time.monotonic() + 60
    while len(_tidied(service, "progress", "vacuum")) < 2:  # a whole pass after the registrations' flush
        assert time.monotonic() < deadline, "progress was never tidied"
        time.sleep(0.1)
    assert _tidied(service, "progress", "optimize") == [] and _tidied(service, "frontier_changes", "optimize") == []
    niceness = {}  # thread id -> niceness (Python's threads have no names in /proc)
    for task in Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().strip() == "python":
            niceness[int(task.name)] = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])  # field 19
    own = niceness.pop(pid)  # the main thread, which runs the event loop
    assert default == 19
    assert sorted(set(niceness.values())) == [own, min(own + default, 19)], niceness  # the Delta thread, the others
