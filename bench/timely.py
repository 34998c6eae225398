"""timely: real timely-dataflow programs attached to the service, against the same programs detached.

The programs are the examples of the connector crate (``connectors/timely/examples``): a loop
with feedback at the root (``collatz``, after timely's ``loopdemo``), BFS in a nested iterative
scope (``bfs``) and differential dataflow's ``iterate`` (``dd_bfs``), each with 4 workers,
built in release mode. Each is run alternately with ``--detached`` (no connector) and attached
to a real service, and with ``--logging-only`` (timely's logging on, as attaching turns it on,
into loggers that do nothing: timely's own share of the cost), several times; the figures are
the medians of the process's wall time
(which includes waiting for the last batches), the slowdown (attached / detached, target at
most 1.1), the program's CPU time (user + system: the connector's cost in the program, not
the service's, whose CPU time during the attached run is given apart: on this machine the
service shares the program's cores) and what the connector carried: the updates timely's progress channels sent per
second of the run, and the updates and batches the service acknowledged; ``drain s`` is the wait
at the end, from the workers' last step to the last acknowledgement (a fixed cost per run, with
the registration). The examples park idle workers (``step_or_park``) rather than spin, so the
comparison is of work, not of who wins the CPU on an oversubscribed machine. A last, progress-heavy
run (``collatz`` with tiny epochs) measures the updates per second the connector sustains; every
attached run must end with its dataflow ``complete`` (checked, or the benchmark raises).

The functions that build and run the examples are shared with ``tests/test_timely_connector.py``.

>>> parse_reports("worker 0: dataflow d (x): registered, 3 batches, 40 updates (90 sent by timely), last version 9")
[{'worker': 0, 'batches': 3, 'updates': 40, 'raw_updates': 90}]
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from api.run.process import ADMIN_TOKEN, ServiceProcess, descendants

CRATE = Path(__file__).resolve().parent.parent / "connectors" / "timely"
"""The connector crate; its target directory (``connectors/timely/target``) is ignored by git."""

EXAMPLES = ("collatz", "bfs", "dd_bfs", "stuck")

_REPORT = re.compile(r"worker (\d+): dataflow .*?, (\d+) batches, (\d+) updates \((\d+) sent by timely\)")


def build(release: bool = False) -> Path:
    """Build the examples and the checker; the directory holding the binaries."""
    command = ["cargo", "build", "--quiet", "--manifest-path", str(CRATE / "Cargo.toml"), "--bins"]
    command += [arg for name in EXAMPLES for arg in ("--example", name)]
    if release:
        command.append("--release")
    subprocess.run(command, check=True, timeout=1800)
    return CRATE / "target" / ("release" if release else "debug")


@dataclass
class Run:
    """One run of an example program."""

    returncode: int
    stdout: str
    stderr: str
    wall_seconds: float
    elapsed_seconds: float | None
    """The program's own figure: from start until every worker finished computing."""
    cpu_seconds: float
    """User and system time of the program's process (the service's is not in it)."""


def run_example(binaries: Path, example: str, args: list[str], *, url: str = "", token: str = ADMIN_TOKEN,
                timeout: float = 600) -> Run:
    """Run ``example`` with ``args`` (timely's, e.g. ``-w 4``, and the example's) against the
    service at ``url``; waits for it to exit."""
    env = {**os.environ, "TRACKER_URL": url, "TRACKER_ADMIN_TOKEN": token}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run([str(binaries / "examples" / example), *args], capture_output=True, text=True,
                            env=env, timeout=timeout)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    match = re.search(r"elapsed_seconds ([0-9.]+)", result.stdout)
    return Run(result.returncode, result.stdout, result.stderr, wall, float(match.group(1)) if match else None, cpu)


def start_example(binaries: Path, example: str, args: list[str], *, url: str,
                  token: str = ADMIN_TOKEN) -> subprocess.Popen[str]:
    """Start ``example`` in the background (the caller waits for it or kills it)."""
    env = {**os.environ, "TRACKER_URL": url, "TRACKER_ADMIN_TOKEN": token}
    return subprocess.Popen([str(binaries / "examples" / example), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def parse_reports(stderr: str) -> list[dict[str, int]]:
    """Each worker's line of the connector's final report."""
    return [{"worker": int(w), "batches": int(b), "updates": int(u), "raw_updates": int(r)}
            for w, b, u, r in _REPORT.findall(stderr)]


def registered_id(journal: Path) -> str:
    """The service id worker 0 registered, from its journal."""
    with open(journal / "w0.jsonl") as lines:
        for line in lines:
            record = json.loads(line)
            if "registered" in record:
                return str(record["registered"]["id"])
    raise AssertionError(f"worker 0 registered nothing (journal {journal})")


def _frontier_state(locations: list[dict[str, Any]]) -> dict[str, set[str]]:
    return {json.dumps(e["location"], sort_keys=True): {json.dumps(t) for t in e["frontier"]} for e in locations}


def fetch_history(client: httpx.Client, dataflow_id: str, *, quiet_seconds: float = 3.0) -> dict[str, Any]:
    """Every version's frontier as the service published it: the snapshot of version 0 and the
    ``changes`` events of the SSE stream resumed from version 0 (``Last-Event-ID: 0``; the
    service must keep enough history and subscriber queue for all of them).

    Reads until the frontier they add up to equals the current one and the stream stays quiet
    for ``quiet_seconds``; raises if they never add up (history lost)."""
    snapshot = client.get(f"/v1/dataflows/{dataflow_id}/frontier", params={"version": 0}).json()
    final = _frontier_state(client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()["locations"])
    state = _frontier_state(snapshot["locations"])
    changes: list[dict[str, Any]] = []
    timeout = httpx.Timeout(30.0, read=quiet_seconds)
    try:
        with client.stream("GET", f"/v1/dataflows/{dataflow_id}/frontier/stream", headers={"Last-Event-ID": "0"},
                           timeout=timeout) as stream:
            event, data = "", []
            for line in stream.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and event:
                    body = json.loads("".join(data))
                    if event == "snapshot":
                        raise AssertionError(f"the service resent a snapshot (version {body['version']}): "
                                             "its history or subscriber queue is too short")
                    if event == "changes":
                        changes.append(body)
                        for change in body["changes"]:
                            times = state.setdefault(json.dumps(change["location"], sort_keys=True), set())
                            (times.add if change["diff"] > 0 else times.discard)(json.dumps(change["time"]))
                    event, data = "", []
    except httpx.ReadTimeout:
        pass
    state = {k: v for k, v in state.items() if v}
    if state != {k: v for k, v in final.items() if v}:
        raise AssertionError("the stream's changes do not add up to the current frontier")
    return {"id": dataflow_id, "snapshot": snapshot, "changes": changes}


def check(binaries: Path, journal: Path, history: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run ``timely-progress-check`` on a journal and a history; its JSON report plus ``exit``."""
    path = workdir / f"history-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(history))
    result = subprocess.run([str(binaries / "timely-progress-check"), "--journal", str(journal), "--history",
                             str(path)], capture_output=True, text=True, timeout=600)
    if not result.stdout.strip():
        raise AssertionError(f"the checker printed nothing: {result.stderr}")
    report: dict[str, Any] = json.loads(result.stdout)
    report["exit"] = result.returncode
    return report


WORKLOADS = {
    "collatz": (["--rounds", "300", "--records", "1000"], ["--rounds", "100", "--records", "1000"]),
    "bfs": (["--rounds", "40", "--nodes", "50000", "--edges", "200000"],
            ["--rounds", "10", "--nodes", "50000", "--edges", "200000"]),
    "dd_bfs": (["--rounds", "20", "--nodes", "100000", "--edges", "400000", "--changes", "1000"],
               ["--rounds", "5", "--nodes", "100000", "--edges", "400000", "--changes", "1000"]),
}
STRESS = (["--rounds", "3000", "--records", "8"], ["--rounds", "1000", "--records", "8"])


def _service_cpu(service: ServiceProcess) -> float:
    """CPU seconds the service's processes (the supervisor and every process below it: the hot
    path, its log's sync process, the Spark process and its JVM) have used so far."""
    assert service.process is not None
    ticks = 0
    for pid in (service.process.pid, *descendants(service.process.pid)):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _attached_run(binaries: Path, service: ServiceProcess, example: str, args: list[str]) -> tuple[Run, dict[str, Any]]:
    name = f"bench-{example}-{uuid.uuid4().hex[:8]}"
    service_before = _service_cpu(service)
    run = run_example(binaries, example, ["-w", "4", "--name", name, *args], url=service.url)
    service_seconds = _service_cpu(service) - service_before
    if run.returncode != 0:
        raise RuntimeError(f"{example} failed: {run.stderr[-2000:]}")
    with service.client() as client:
        listed = client.get("/v1/dataflows", params={"name": name}).json()
        state = client.get(f"/v1/dataflows/{listed[-1]['id']}").json()["status"]["state"]
    if state != "complete":
        raise RuntimeError(f"{example}: the service says {state}, not complete")
    reports = parse_reports(run.stderr)
    totals: dict[str, Any] = {key: sum(r[key] for r in reports) for key in ("batches", "updates", "raw_updates")}
    totals["service_cpu_s"] = service_seconds
    return run, totals


def run(quick: bool) -> dict[str, Any]:
    """Measure, print a table, return the figures."""
    repetitions = 1 if quick else 3
    which = 1 if quick else 0
    print("building the examples (release) ...", flush=True)
    binaries = build(release=True)
    warehouse = Path(tempfile.mkdtemp(prefix="bench-timely-")) / "warehouse"
    service = ServiceProcess(warehouse, env={"TRACKER_LOG_LEVEL": "warning"})
    figures: dict[str, Any] = {"load_average_before": os.getloadavg()[0]}
    rows: list[tuple[str, str, float, float, float, float, float, dict[str, float], dict[str, Any]]] = []
    try:
        service.start()
        for example, workloads in WORKLOADS.items():
            args = workloads[which]
            detached: list[float] = []
            logging: list[float] = []
            attached: list[float] = []
            cpu: dict[str, list[float]] = {"detached": [], "logging": [], "attached": []}
            drains: list[float] = []
            totals: dict[str, Any] = {}
            for _ in range(repetitions):
                plain = run_example(binaries, example, ["-w", "4", "--detached", *args])
                if plain.returncode != 0:
                    raise RuntimeError(f"{example} failed: {plain.stderr[-2000:]}")
                detached.append(plain.wall_seconds)
                cpu["detached"].append(plain.cpu_seconds)
                logged = run_example(binaries, example, ["-w", "4", "--logging-only", *args])
                if logged.returncode != 0:
                    raise RuntimeError(f"{example} failed: {logged.stderr[-2000:]}")
                logging.append(logged.wall_seconds)
                cpu["logging"].append(logged.cpu_seconds)
                connected, totals = _attached_run(binaries, service, example, args)
                attached.append(connected.wall_seconds)
                cpu["attached"].append(connected.cpu_seconds)
                drains.append(connected.wall_seconds - (connected.elapsed_seconds or connected.wall_seconds))
            d, a, g = statistics.median(detached), statistics.median(attached), statistics.median(logging)
            drain = statistics.median(drains)
            c = {key: statistics.median(values) for key, values in cpu.items()}
            figures[example] = {"detached_s": d, "logging_only_s": g, "attached_s": a, "slowdown": a / d,
                                "drain_s": drain, "raw_updates_per_s": totals["raw_updates"] / a,
                                "cpu_detached_s": c["detached"], "cpu_logging_only_s": c["logging"],
                                "cpu_attached_s": c["attached"], "cpu_ratio": c["attached"] / c["detached"], **totals}
            rows.append((example, " ".join(args), d, g, a, a / d, drain, c, totals))
        stress_run, stress = _attached_run(binaries, service, "collatz", STRESS[which])
        seconds = stress_run.elapsed_seconds or stress_run.wall_seconds
        figures["sustained"] = {"raw_updates_per_s": stress["raw_updates"] / seconds,
                                "service_updates_per_s": stress["updates"] / stress_run.wall_seconds,
                                "batches_per_s": stress["batches"] / stress_run.wall_seconds,
                                "drain_s": stress_run.wall_seconds - seconds, **stress}
    finally:
        service.stop()
    figures["load_average_after"] = os.getloadavg()[0]
    print(f"timely benchmark ({'quick' if quick else 'full'}): 4 workers, release build, median of {repetitions}; "
          f"load average {figures['load_average_before']:.1f} before, {figures['load_average_after']:.1f} after "
          "(shared machine: noisy)")
    print("wall s: the process, median; cpu s: the program's user + system time (the service's not included)")
    print(f"{'example':8} {'workload':56} {'detached':>8} {'logging':>8} {'attached':>8} {'slowdown':>8} "
          f"{'drain':>6} {'cpu det.':>8} {'cpu log.':>8} {'cpu att.':>8} {'cpu x':>6} {'service cpu':>11} "
          f"{'timely upd.':>11} {'sent':>7} {'batches':>7}")
    for example, workload, d, g, a, ratio, drain, c, totals in rows:
        print(f"{example:8} {workload:56} {d:8.2f} {g:8.2f} {a:8.2f} {ratio:8.3f} {drain:6.2f} {c['detached']:8.2f} "
              f"{c['logging']:8.2f} {c['attached']:8.2f} {c['attached'] / c['detached']:6.2f} "
              f"{totals['service_cpu_s']:11.2f} {totals['raw_updates']:11} {totals['updates']:7} {totals['batches']:7}")
    s = figures["sustained"]
    print(f"sustained (collatz {' '.join(STRESS[which])}): {s['raw_updates_per_s']:,.0f} timely updates/s captured, "
          f"{s['service_updates_per_s']:,.0f} updates/s and {s['batches_per_s']:,.0f} batches/s acknowledged, "
          f"{s['drain_s']:.2f} s to drain after the workers finished")
    return {"name": "timely", "figures": figures, "targets": {"slowdown": 1.1}}
