"""Spark inside the service, bounded: a busy port fails before Spark starts, SIGINT stops the
service within 2 s during a slow Spark check (no error logged, no JVM left), a check over the
time limit is cancelled, recorded as ``timed_out`` and not run again after a restart, graphs
over the size limit are not sent to Spark, and ``kill -9`` leaves no JVM behind.

The slow check is a real one: Spark's all-pairs ``Psi`` of a 500-operator ring (about a million
pairs) takes far longer than the time limit used here, four times what a 2-operator loop's check
took on the same service (at least 10 s; the machine's load scales both).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.run.process import alive, descendants
from tests.helpers import ROOT, ServiceProcess, ServiceStarter, loop_graph, register, update, wait_for

pytestmark = [pytest.mark.service, pytest.mark.spark]


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _java_descendants(pid: int) -> list[int]:
    return [child for child in descendants(pid) if b"java" in _cmdline(child)]


def _ctrl_c(pid: int) -> None:
    """SIGINT to ``pid`` and every process under it in its process group, as a terminal's Ctrl-C does."""
    group = os.getpgid(pid)
    for child in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(child) == group:
                os.kill(child, signal.SIGINT)


def _status(service: ServiceProcess, dataflow_id: str) -> dict[str, Any]:
    with service.client() as client:
        status: dict[str, Any] = client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]
    return status


def test_a_busy_port_fails_at_once_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "TRACKER_ADMIN_TOKEN": "x", "TRACKER_SPARK": "1"}
        run = subprocess.run([sys.executable, "-m", "tracker.cli", "serve", "--port", str(port),
                              "--warehouse", str(tmp_path / "wh")],
                             cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert run.returncode == 2
    assert run.stdout == b""
    assert run.stderr.decode().splitlines() == [
        f"tracker serve: error: cannot listen on 127.0.0.1:{port}: the port is busy (another process listens on it)"]
    assert not (tmp_path / "wh").exists(), "the service got as far as its warehouse before noticing the port"


def _concluded(service: ServiceProcess, dataflow_id: str, timeout: float = 600.0) -> dict[str, Any]:
    return wait_for("a Spark check", lambda: (s := _status(service, dataflow_id))["spark_check"] not in (
        "pending", "running") and s, timeout, interval=0.1, service=service)


def test_sigint_during_a_slow_check_then_the_time_limit(start_service: ServiceStarter) -> None:
    # The DataFrame path: its all-pairs Psi of the ring iterates for minutes, round after round
    # (the GraphX helper computes it in one task, in about the fixed cost of a small check).
    service = start_service(spark=True, SPARK_MASTER="local[1]", TRACKER_AUDIT_SECONDS="0",
                            TRACKER_SPARK_MAX_LOCATIONS="1200", TRACKER_SPARK_TIMEOUT="0",
                            TRACKER_GRAPH_ENGINE="dataframe")
    # A small check first: how long one takes on this machine now sets the time limit below.
    first, _ = register(service, loop_graph(operators=2, name="first"))
    status = _concluded(service, first)
    assert status["spark_check"] == "agreed", status
    small_seconds = float(status["spark_detail"].split("(")[1].split(" s,")[0])
    slow, _ = register(service, loop_graph(operators=500, name="slow"))  # 1002 locations
    huge, _ = register(service, loop_graph(operators=700, name="huge"))  # 1402 locations
    status = _status(service, huge)
    assert status["spark_check"] == "skipped" and status["spark_detail"].startswith("too large: 1402 locations")

    wait_for("the slow check to run", lambda: _status(service, slow)["spark_check"] == "running",
            600.0, interval=0.1, service=service)
    time.sleep(1.0)  # well inside Spark's job
    assert service.process is not None
    jvms = _java_descendants(service.process.pid)
    assert jvms, "no Spark JVM under the service"
    spark_pid = service.pid_of("spark")
    assert set(jvms) <= set(descendants(spark_pid)), "the JVM is not the Spark process's"
    logged = service.log_path.stat().st_size
    _ctrl_c(service.process.pid)  # the log's sync process gets it too
    sent = time.monotonic()
    service.process.wait(10)
    stopped = time.monotonic() - sent
    assert stopped < 2.0, f"SIGINT took {stopped:.2f} s:\n{service.log_tail()}"
    assert service.process.returncode == 130
    wait_for("the JVM to exit", lambda: not any(alive(p) for p in jvms), 5.0, interval=0.1,
            service=service)
    stop_log = service.log_path.read_bytes()[logged:].decode(errors="replace")
    assert "Shutting down" in stop_log
    for bad in ('"level": "error"', '"level": "critical"', "Event loop is closed", "Traceback"):
        assert bad not in stop_log, f"{bad} logged by a clean stop:\n{stop_log[-3000:]}"

    # Restarted with a short limit: the interrupted check runs again, is cancelled and marked
    # timed_out; a dataflow registered meanwhile is still served and checked after it.
    limit = max(10, round(4 * small_seconds))
    service.extra_env["TRACKER_SPARK_TIMEOUT"] = str(limit)
    service.restart()
    wait_for("the slow check to run again", lambda: _status(service, slow)["spark_check"] == "running",
            600.0, interval=0.1, service=service)
    small, token = register(service, loop_graph(operators=2, name="small"))
    with service.client(token) as client:
        answer = client.post(f"/v1/dataflows/{small}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [0], -1), update(0, 0, "source", [1], 1)]})
        assert answer.json()["version"] == 1
    status = _concluded(service, slow, timeout=limit + 300)
    assert status["spark_check"] == "timed_out" and f"ran over {limit} s" in status["spark_detail"], status
    status = _concluded(service, small, timeout=2 * limit + 300)
    assert status["spark_check"] == "agreed", f"{status}\n{service.log_tail()}"
    metrics = httpx.get(service.url + "/metrics").text
    assert 'tracker_spark_registration_checks_total{result="timed_out"} 1.0' in metrics

    # kill -9: the JVM goes too; after the restart the timeout is reported, not run again.
    jvms = _java_descendants(service.process.pid)
    assert jvms
    service.kill9()
    killed = time.monotonic()
    wait_for("the JVM to exit after kill -9", lambda: not any(alive(p) for p in jvms), 5.0, interval=0.1,
            service=service)
    assert time.monotonic() - killed < 5.0
    service.restart()
    status = _status(service, slow)
    assert status["spark_check"] == "timed_out", status
    assert httpx.get(service.url + "/healthz").json()["spark"] != "ready", "Spark was ready: proves nothing"
    assert _status(service, huge)["spark_check"] == "skipped"
