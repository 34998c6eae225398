"""timely: real timely-dataflow programs attached to the service, against the same programs detached.

The programs are the examples of the connector crate (``connectors/timely/examples``): a loop
with feedback at the root (``collatz``, after timely's ``loopdemo``), BFS in a nested iterative
scope (``bfs``) and differential dataflow's ``iterate`` (``dd_bfs``), each with 4 workers,
built in release mode with the crate's feature ``bench``. The full workloads run for several
seconds detached, so that the fixed costs (attaching, registering, the last batch) weigh as in
real programs; ``--quick`` runs sub-second ones.

Each example runs in six variants side by side, in a rotating order, several times (medians):
``--detached`` (no connector); ``--logging-only`` (timely's logging on, as attaching turns it on,
into loggers that do nothing: timely's own share); ``--without-service`` (the whole connector,
capture, consolidation, mapping and the batches' bodies, each request answered at once: adds the
connector's own work in the program); attached to a real service (adds the requests and the
service's CPU, which on this 2-core machine runs on the program's cores); the last two again with
the statistics on (``--statistics-ms 1000``). The table gives each variant's wall time (the
process's, which includes waiting for the last batches), the slowdown (attached / detached, target
at most 1.1), the program's CPU time (user + system), the service's CPU time during the attached
run (and, in brackets, during a detached one: its idle cost), ``drain`` (from the workers' last
step to the last acknowledgement) and what the connector carried; a line per example splits the
slowdown into those three parts, and one gives the connector's own cost with the statistics off and
on (``--without-service`` over ``--logging-only``, target at most 1.05) and the service's CPU per
batch. A last, progress-heavy run (``collatz`` with tiny epochs) measures the updates per second
the connector sustains. Every attached run must end with its dataflow ``complete`` (checked, or the
benchmark raises). The examples park idle workers (``step_or_park``) rather than spin, so the
comparison is of work, not of who wins the CPU on an oversubscribed machine. (The functions that
build and run the examples are shared with the tests.)

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

from api.run.process import ServiceProcess, descendants
from bench.workloads import program_token

CRATE = Path(__file__).resolve().parent.parent / "connectors" / "timely"
"""The connector crate; its target directory (``connectors/timely/target``, or ``CARGO_TARGET_DIR``) is
ignored by git."""

EXAMPLES = ("collatz", "bfs", "dd_bfs", "stuck", "slow")

_REPORT = re.compile(r"worker (\d+): dataflow .*?, (\d+) batches, (\d+) updates \((\d+) sent by timely\)")


def build(release: bool = False, features: tuple[str, ...] = ()) -> Path:
    """Build the examples and the checker (with the crate's ``features``); the directory holding
    the binaries."""
    command = ["cargo", "build", "--quiet", "--manifest-path", str(CRATE / "Cargo.toml"), "--bins"]
    if features:
        command += ["--features", ",".join(features)]
    command += [arg for name in EXAMPLES for arg in ("--example", name)]
    if release:
        command.append("--release")
    subprocess.run(command, check=True, timeout=1800)
    return target_dir() / ("release" if release else "debug")


def target_dir() -> Path:
    """Where cargo puts the crate's builds: ``CARGO_TARGET_DIR`` if set (cargo honours it too),
    else the crate's own ``target``."""
    configured = os.environ.get("CARGO_TARGET_DIR")
    return Path(configured) if configured else CRATE / "target"


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


def run_example(binaries: Path, example: str, args: list[str], *, url: str = "", token: str = "",
                timeout: float = 600) -> Run:
    """Run ``example`` with ``args`` (timely's, e.g. ``-w 4``, and the example's) against the
    service at ``url`` with the program ``token`` (``TRACKER_PROGRAM_TOKEN``; the admin token is
    kept out of the program's environment); waits for it to exit."""
    env = _program_env(url, token)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run([str(binaries / "examples" / example), *args], capture_output=True, text=True,
                            env=env, timeout=timeout)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    match = re.search(r"elapsed_seconds ([0-9.]+)", result.stdout)
    return Run(result.returncode, result.stdout, result.stderr, wall, float(match.group(1)) if match else None, cpu)


def start_example(binaries: Path, example: str, args: list[str], *, url: str, token: str) -> subprocess.Popen[str]:
    """Start ``example`` in the background with the program ``token`` (the caller waits for it or
    kills it)."""
    env = _program_env(url, token)
    return subprocess.Popen([str(binaries / "examples" / example), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _program_env(url: str, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRACKER_ADMIN_TOKEN"}
    return {**env, "TRACKER_URL": url, "TRACKER_PROGRAM_TOKEN": token}


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
    # Full: several seconds each detached on a quiet 2-core machine, so that the fixed costs
    # (attaching, registering, the last batch) weigh as little as they do in real programs.
    "collatz": (["--rounds", "1500", "--records", "1000"], ["--rounds", "300", "--records", "1000"]),
    "bfs": (["--rounds", "200", "--nodes", "50000", "--edges", "200000"],
            ["--rounds", "40", "--nodes", "50000", "--edges", "200000"]),
    "dd_bfs": (["--rounds", "100", "--nodes", "100000", "--edges", "400000", "--changes", "1000"],
               ["--rounds", "20", "--nodes", "100000", "--edges", "400000", "--changes", "1000"]),
}
STRESS = (["--rounds", "3000", "--records", "8"], ["--rounds", "1000", "--records", "8"])

STATISTICS = ["--statistics-ms", "1000"]
VARIANTS = {
    "detached": ["--detached"],
    "logging": ["--logging-only"],  # timely's logging on, into loggers that do nothing
    "connector": ["--without-service"],  # the connector, every request answered at once
    "connector_stats": ["--without-service", *STATISTICS],  # the same with statistics every second
    "attached": [],
    "attached_stats": STATISTICS,
}
"""Each run of an example, side by side: what each adds over the previous one is timely's
logging, the connector's work in the program, then the requests and the service's CPU; the
``_stats`` variants are the same with the statistics on (``Attach::statistics``, every second)."""


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


def _one_run(binaries: Path, service: ServiceProcess, example: str, variant: str,
             args: list[str]) -> tuple[Run, float, dict[str, Any]]:
    """One run of ``example`` as ``variant``; the run, the service's CPU seconds meanwhile (its
    idle cost in the detached runs) and, attached, what the connector carried."""
    name = f"bench-{example}-{uuid.uuid4().hex[:8]}"
    before = _service_cpu(service)
    run = run_example(binaries, example, ["-w", "4", "--name", name, *VARIANTS[variant], *args], url=service.url,
                      token=program_token(service))
    service_seconds = _service_cpu(service) - before
    if run.returncode != 0:
        raise RuntimeError(f"{example} ({variant}) failed: {run.stderr[-2000:]}")
    totals: dict[str, Any] = {}
    if variant.startswith("attached"):
        with service.client() as client:
            listed = client.get("/v1/dataflows", params={"name": name}).json()
            state = client.get(f"/v1/dataflows/{listed[-1]['id']}").json()["status"]["state"]
        if state != "complete":
            raise RuntimeError(f"{example}: the service says {state}, not complete")
        reports = parse_reports(run.stderr)
        totals = {key: sum(r[key] for r in reports) for key in ("batches", "updates", "raw_updates")}
        totals["statistics_reports"] = sum(int(n) for n in re.findall(r"(\d+) statistics reports", run.stderr))
        if (totals["statistics_reports"] > 0) != (variant == "attached_stats"):  # on means sent, off nothing
            raise RuntimeError(f"{example} ({variant}): {totals['statistics_reports']} statistics reports")
    return run, service_seconds, totals


def breakdown(figures: dict[str, float]) -> dict[str, float]:
    """The slowdown's parts, in wall time over the detached run's: timely's logging (logging
    only over detached), the connector in the program (without the service over logging only)
    and the requests with the service's CPU on the same cores (attached over without the
    service); they add up to ``slowdown - 1``.

    >>> parts = breakdown({"detached_s": 2.0, "logging_only_s": 2.2, "connector_s": 2.3, "attached_s": 2.6})
    >>> {k: round(v, 2) for k, v in parts.items()}
    {'timely_logging': 0.1, 'connector': 0.05, 'service': 0.15}
    """
    d = figures["detached_s"]
    return {"timely_logging": (figures["logging_only_s"] - d) / d,
            "connector": (figures["connector_s"] - figures["logging_only_s"]) / d,
            "service": (figures["attached_s"] - figures["connector_s"]) / d}


def statistics_figures(wall: dict[str, float], cpu: dict[str, float], service_cpu: dict[str, float],
                       totals: dict[str, Any], stats_totals: dict[str, Any]) -> dict[str, Any]:
    """The connector's own cost (no service / logging only, wall and CPU), statistics off and on;
    timely's logging (logging only / detached); the service's CPU per batch, statistics off and on.

    >>> wall = {"detached": 10, "logging": 12, "connector": 12.3, "connector_stats": 12.4, "attached_stats": 13}
    >>> f = statistics_figures(wall, {**wall, "logging": 1.0}, {"attached": 1.0, "attached_stats": 1.1},
    ...                        {"batches": 400}, {"batches": 400, "statistics_reports": 40})
    >>> round(f["connector_ratio"], 3), round(f["connector_stats_ratio"], 3), f["service_ms_per_batch"]
    (1.025, 1.033, 2.5)
    """
    return {"connector_stats_s": wall["connector_stats"], "attached_stats_s": wall["attached_stats"],
            "timely_logging_ratio": wall["logging"] / wall["detached"], "connector_ratio": wall["connector"] /
            wall["logging"], "connector_stats_ratio": wall["connector_stats"] / wall["logging"],
            "cpu_connector_ratio": cpu["connector"] / cpu["logging"],
            "cpu_connector_stats_ratio": cpu["connector_stats"] / cpu["logging"],
            "service_cpu_stats_s": service_cpu["attached_stats"],
            "service_ms_per_batch": 1000 * service_cpu["attached"] / max(totals["batches"], 1),
            "service_ms_per_batch_stats": 1000 * service_cpu["attached_stats"] / max(stats_totals["batches"], 1),
            "statistics_reports": stats_totals["statistics_reports"]}


def run(quick: bool) -> dict[str, Any]:
    """Measure, print a table, return the figures."""
    repetitions = 3 if quick else 5
    which = 1 if quick else 0
    print("building the examples (release, feature bench) ...", flush=True)
    binaries = build(release=True, features=("bench",))
    warehouse = Path(tempfile.mkdtemp(prefix="bench-timely-")) / "warehouse"
    service = ServiceProcess(warehouse, env={"TRACKER_LOG_LEVEL": "warning"})
    figures: dict[str, Any] = {"load_average_before": os.getloadavg()[0]}
    try:
        service.start()
        for example, workloads in WORKLOADS.items():
            args = workloads[which]
            load = os.getloadavg()[0]
            wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
            cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
            service_cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
            drains: list[float] = []
            totals, stats_totals = dict[str, Any](), dict[str, Any]()
            order = list(VARIANTS)
            for repetition in range(repetitions):
                # Rotated, so that no variant always runs first (or after the same one).
                for variant in order[repetition % len(order):] + order[:repetition % len(order)]:
                    one, service_seconds, carried = _one_run(binaries, service, example, variant, args)
                    wall[variant].append(one.wall_seconds)
                    cpu[variant].append(one.cpu_seconds)
                    service_cpu[variant].append(service_seconds)
                    if variant == "attached":
                        totals = carried
                        drains.append(one.wall_seconds - (one.elapsed_seconds or one.wall_seconds))
                    stats_totals = carried if variant == "attached_stats" else stats_totals
            m = {v: statistics.median(wall[v]) for v in VARIANTS}
            c = {v: statistics.median(cpu[v]) for v in VARIANTS}
            sc = {v: statistics.median(service_cpu[v]) for v in VARIANTS}
            row: dict[str, Any] = {
                "workload": " ".join(args), "load_average": load,
                "detached_s": m["detached"], "logging_only_s": m["logging"], "connector_s": m["connector"],
                "attached_s": m["attached"], "slowdown": m["attached"] / m["detached"],
                "drain_s": statistics.median(drains),
                "cpu_detached_s": c["detached"], "cpu_logging_only_s": c["logging"],
                "cpu_connector_s": c["connector"], "cpu_attached_s": c["attached"],
                "service_cpu_s": sc["attached"], "service_cpu_idle_s": sc["detached"],
                "raw_updates_per_s": totals["raw_updates"] / m["attached"], **totals,
                **statistics_figures(m, c, sc, totals, stats_totals)}
            row["breakdown"] = breakdown(row)
            figures[example] = row
        stress_run, _, stress = _one_run(binaries, service, "collatz", "attached", STRESS[which])
        seconds = stress_run.elapsed_seconds or stress_run.wall_seconds
        figures["sustained"] = {"raw_updates_per_s": stress["raw_updates"] / seconds,
                                "service_updates_per_s": stress["updates"] / stress_run.wall_seconds,
                                "batches_per_s": stress["batches"] / stress_run.wall_seconds,
                                "drain_s": stress_run.wall_seconds - seconds, **stress}
    finally:
        service.stop()
    figures["load_average_after"] = os.getloadavg()[0]
    _print(figures, quick, repetitions)
    return {"name": "timely", "figures": figures, "targets": {"slowdown": 1.1, "connector_ratio": 1.05}}


def _print(figures: dict[str, Any], quick: bool, repetitions: int) -> None:
    print(f"timely benchmark ({'quick' if quick else 'full'}): 4 workers, release build, median of {repetitions} "
          f"runs of each variant side by side; load average {figures['load_average_before']:.1f} before, "
          f"{figures['load_average_after']:.1f} after (2 shared cores: the service runs on the program's cores)")
    print("wall s of the process: detached, timely's logging only, the connector without the service, attached; "
          "cpu s: the program's user + system; service cpu s: during the attached run (during a detached one)")
    print(f"{'example':8} {'load':>5} {'detached':>8} {'logging':>8} {'no svc':>8} {'attached':>8} {'slowdown':>8} "
          f"{'drain':>6} {'cpu det.':>8} {'cpu log.':>8} {'cpu conn.':>9} {'cpu att.':>8} {'service cpu':>13} "
          f"{'timely upd.':>11} {'sent':>7} {'batches':>7}")
    for example in WORKLOADS:
        r = figures[example]
        print(f"{example:8} {r['load_average']:5.1f} {r['detached_s']:8.2f} {r['logging_only_s']:8.2f} "
              f"{r['connector_s']:8.2f} {r['attached_s']:8.2f} {r['slowdown']:8.3f} {r['drain_s']:6.2f} "
              f"{r['cpu_detached_s']:8.2f} {r['cpu_logging_only_s']:8.2f} {r['cpu_connector_s']:9.2f} "
              f"{r['cpu_attached_s']:8.2f} {r['service_cpu_s']:5.2f} ({r['service_cpu_idle_s']:4.2f}) "
              f"{r['raw_updates']:11} {r['updates']:7} {r['batches']:7}")
    for example in WORKLOADS:
        r = figures[example]
        parts, total = r["breakdown"], r["slowdown"] - 1
        shares = "; ".join(f"{label} {parts[key]:+.1%} of the detached time"
                           + (f" ({parts[key] / total:.0%} of it)" if total > 0.01 else "")
                           for key, label in (("timely_logging", "timely's own logging"),
                                              ("connector", "the connector in the program"),
                                              ("service", "the requests and the service's CPU on the same cores")))
        print(f"{example}: slowdown {r['slowdown']:.2f}x ({r['workload']}): {shares}")
    print("the connector's own cost (no service / logging only; target at most 1.05), statistics off and on; "
          "timely's logging (logging only / detached); the service's CPU per batch attached, off and on:")
    for example in WORKLOADS:
        r = figures[example]
        print(f"{example:8} wall {r['connector_ratio']:.3f} / {r['connector_stats_ratio']:.3f} "
              f"(cpu {r['cpu_connector_ratio']:.3f} / {r['cpu_connector_stats_ratio']:.3f}); "
              f"no service with statistics {r['connector_stats_s']:.2f} s, attached with statistics "
              f"{r['attached_stats_s']:.2f} s; timely's logging {r['timely_logging_ratio']:.3f}; service "
              f"{r['service_ms_per_batch']:.2f} / {r['service_ms_per_batch_stats']:.2f} ms cpu per batch "
              f"({r['service_cpu_s']:.2f} / {r['service_cpu_stats_s']:.2f} s, {r['statistics_reports']} "
              "statistics reports)")
    s = figures["sustained"]
    print(f"sustained (collatz {' '.join(STRESS[0 if not quick else 1])}): {s['raw_updates_per_s']:,.0f} timely "
          f"updates/s captured, {s['service_updates_per_s']:,.0f} updates/s and {s['batches_per_s']:,.0f} batches/s "
          f"acknowledged, {s['drain_s']:.2f} s to drain after the workers finished")
