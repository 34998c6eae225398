"""recovery: restart time after kill -9, from the compacted snapshot vs. replaying all history.

One run, one warehouse: a 100-operator ring receives ``N`` batches (each moves the input
capability, so each changes every frontier) over a WebSocket; once compaction has written the
``pointstamps`` snapshot the service is killed with SIGKILL and restarted, which recovers from
the snapshot plus the tail. Then it is killed again, the ``pointstamps`` table is removed (as if
compaction had never run) and restarted, which replays the whole ``progress`` history. Both
restarts must give the same version and frontier; the figures are the service's own
``recovered`` time and the wall time until ``/healthz`` answers.

The service's own figure is read from its JSON log:

>>> _recovered('{"msg": "recovered", "seconds": 0.4, "dataflows": 1}')
{'msg': 'recovered', 'seconds': 0.4, 'dataflows': 1}
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from deltalake import DeltaTable
from websockets.asyncio.client import connect

from api.run.process import ADMIN_TOKEN, ServiceProcess
from bench.workloads import loop_graph, register, update
from spark_jobs.storage import POINTSTAMPS_APP

OPERATORS = 100
WINDOW = 64


async def _send(service: ServiceProcess, dataflow_id: str, token: str, batches: int) -> None:
    url = f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws?subscribe=false"
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, compression=None) as ws:
        sent = acked = 0
        while acked < batches:
            while sent < batches and sent - acked < WINDOW:
                await ws.send(json.dumps({"worker": "w", "seq": sent, "updates": [
                    update(0, 0, "source", [sent], -1), update(0, 0, "source", [sent + 1], 1)]}))
                sent += 1
            if json.loads(await ws.recv()).get("type") == "ack":
                acked += 1


def _restart(service: ServiceProcess) -> tuple[float, float, dict[str, Any]]:
    """Kill, restart; (wall seconds to healthy, the service's own recovery seconds, its log line)."""
    service.kill9()
    started = time.perf_counter()
    service.restart()
    wall = time.perf_counter() - started
    line = _recovered(service.log_tail(400))
    return wall, float(line["seconds"]), line


def _recovered(log: str) -> dict[str, Any]:
    """The last ``recovered`` line of the service's JSON log."""
    lines: list[dict[str, Any]] = [json.loads(line) for line in log.splitlines() if '"msg": "recovered"' in line]
    return lines[-1]


def _state(service: ServiceProcess, dataflow_id: str) -> Any:
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60) as client:
        return client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()


def _snapshot_version(table: Path, dataflow_id: str) -> int:
    """The version of the dataflow's newest compacted snapshot (0 before the first compaction
    created the table)."""
    if not (table / "_delta_log").is_dir():
        return 0
    return DeltaTable(str(table)).transaction_version(POINTSTAMPS_APP + dataflow_id) or 0


def run(quick: bool) -> dict[str, Any]:
    """Measure, print a table, return the figures."""
    batches = 3_000 if quick else 20_000
    root = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    service = ServiceProcess(root / "warehouse", env={"TRACKER_LOG_LEVEL": "info", "TRACKER_FLUSH_SECONDS": "0.5",
                                                      "TRACKER_COMPACT_SECONDS": "1"})
    try:
        service.start()
        dataflow_id, token = register(service, loop_graph(operators=OPERATORS, name="bench-recovery"))
        asyncio.run(_send(service, dataflow_id, token, batches))
        table = root / "warehouse" / "pointstamps"
        deadline = time.monotonic() + 120
        while _snapshot_version(table, dataflow_id) < batches:
            if time.monotonic() > deadline:
                raise RuntimeError("compaction did not catch up")
            time.sleep(0.2)
        before = _state(service, dataflow_id)
        snap_wall, snap_seconds, _ = _restart(service)
        from_snapshot = _state(service, dataflow_id)
        shutil.rmtree(table)
        full_wall, full_seconds, _ = _restart(service)
        from_history = _state(service, dataflow_id)
    finally:
        service.stop()
        shutil.rmtree(root, ignore_errors=True)
    if not (before == from_snapshot == from_history):
        raise RuntimeError("the two recoveries disagree with the state before the crash")
    print(f"recovery benchmark: ring of {OPERATORS} operators, {batches} batches of 2 updates, each moving "
          f"every frontier ({before['version']} versions)")
    print(f"{'restart':24} {'recovery':>10} {'to healthy':>11}")
    print(f"{'from the snapshot':24} {snap_seconds:9.2f}s {snap_wall:10.2f}s")
    print(f"{'replaying all history':24} {full_seconds:9.2f}s {full_wall:10.2f}s")
    print(f"speed-up of the recovery itself: {full_seconds / max(snap_seconds, 1e-3):.1f}x")
    figures = {"batches": batches, "version": before["version"], "snapshot_recovery_seconds": snap_seconds,
               "snapshot_restart_seconds": snap_wall, "full_recovery_seconds": full_seconds,
               "full_restart_seconds": full_wall, "recovery_speedup": full_seconds / max(snap_seconds, 1e-3)}
    return {"name": "recovery", "figures": figures, "targets": {}}
