"""``tracker serve`` as a supervisor (:mod:`api.run.supervisor`): a child that cannot boot stops
the service at once with its one-line reason (it is not restarted forever), and a hot-path
process killed while idle is replaced in its slot on the same port, the supervisor untouched.
(Killing processes under load, and the Spark process, is in ``tests/test_api_crash.py``.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from api.durability.segments import segment_name
from api.run.process import alive, descendants, free_port
from api.shards.layout import wal_directory
from tests.helpers import ROOT, ServiceStarter, loop_graph, register, update

pytestmark = pytest.mark.service


@pytest.mark.parametrize("command", [["serve"], ["shard", "1"]])
def test_a_hot_path_that_cannot_boot_stops_the_service_with_its_reason(tmp_path: Path, command: list[str]) -> None:
    warehouse = tmp_path / "wh"
    logs = warehouse / "_wal" if command == ["serve"] else wal_directory(warehouse, 1)
    logs.mkdir(parents=True)
    (logs / segment_name(1)).write_bytes(os.urandom(4096))  # nobody's bytes: recovery refuses
    env = {**os.environ, "TRACKER_ADMIN_TOKEN": "x", "TRACKER_SPARK": "0"}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "tracker.cli", *command, "--port", str(free_port()),
                          "--warehouse", str(warehouse)], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert run.returncode == 2, run.stderr[-3000:]
    last = run.stderr.decode().strip().splitlines()[-1]
    assert last.startswith(f"tracker {command[0]}: error: UnreadableLog: write-ahead log segment "), last
    assert "is unreadable from byte 0" in last
    assert run.stderr.count(b'"msg": "started"') == 1, "the hot path was started again"
    assert time.monotonic() - started < 60


def test_a_killed_hot_path_is_replaced_on_the_same_port(start_service: ServiceStarter) -> None:
    service = start_service()
    dataflow_id, token = register(service, loop_graph(operators=2))
    assert service.process is not None
    hot = service.pid_of("hot")
    (syncer,) = [p for p in descendants(hot)]
    os.kill(hot, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        try:
            if service.pid_of("hot") != hot:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, service.log_tail()
        time.sleep(0.05)
    assert not alive(syncer), "the log's sync process outlived its hot-path process"
    with service.client(token) as client:
        answer = client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [0], -1), update(0, 0, "source", [1], 1)]})
        assert answer.status_code == 200 and answer.json()["version"] == 1, answer.text
    assert service.process.poll() is None
    assert '"msg": "a process died; restarting it"' in service.log_path.read_text()


@pytest.mark.parametrize("mode", ["owner", "group"])
def test_the_warehouse_and_the_log_are_private_by_default(start_service: ServiceStarter, mode: str) -> None:
    """``owner`` (the default): no other user reads the warehouse, its tables or the log;
    ``group``: the group reads them, nobody else."""
    service = start_service(**({} if mode == "owner" else {"TRACKER_FILE_MODE": "group"}),
                            TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.3")
    dataflow, token = register(service, loop_graph(2, name="private"))
    with service.client(token) as client:
        assert client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [0], -1), update(0, 0, "source", [1], 1)]}).status_code == 200
    deadline = time.monotonic() + 60
    while not list((service.warehouse / "pointstamps").glob("dataflow_id=*/*.parquet")):
        assert time.monotonic() < deadline, "no compaction"
        time.sleep(0.1)
    service.stop()
    assert (service.warehouse.stat().st_mode & 0o777) == (0o700 if mode == "owner" else 0o750)
    paths = [p for p in service.warehouse.rglob("*") if not p.is_symlink()]
    assert any(p.suffix == ".parquet" for p in paths) and any(p.name.startswith("wal-") for p in paths)
    others = [p for p in paths if p.stat().st_mode & 0o007]
    assert others == [], others[:5]
    if mode == "owner":
        group = [p for p in paths if p.stat().st_mode & 0o070]
        assert group == [], group[:5]


def test_a_bad_file_mode_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "TRACKER_ADMIN_TOKEN": "x", "TRACKER_SPARK": "0", "TRACKER_FILE_MODE": "everyone"}
    run = subprocess.run([sys.executable, "-m", "tracker.cli", "serve", "--port", str(free_port()),
                          "--warehouse", str(tmp_path / "wh")], cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert run.returncode == 2 and run.stderr.decode().strip() == (
        "tracker serve: error: TRACKER_FILE_MODE must be owner or group, got 'everyone'"), run.stderr
    assert not (tmp_path / "wh").exists()
