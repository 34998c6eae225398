"""chaos: tenants of every kind on two shards (one on another host) under random faults; what held.

``python -m bench chaos [--quick] [--seed N] [--minutes M]``, as root (it makes a network
namespace). The service as a user runs it across two machines: ``tracker serve`` here with
shard 0, the front, HAProxy and Spark (``local[1]`` at nice 10), and shard 1 on another host
(:class:`bench.hosts.Host`, a network namespace) listed in ``--shard-hosts``, both on one
warehouse. On each shard, five tenants (:mod:`bench.chaos_tenants`): a raw sender posting
through the public address (HAProxy), a raw WebSocket sender, two SDK workers over WebSockets,
two over POST + SSE (these four at the shard's endpoint, as the SDK connects), and a costly
tenant. For ``--minutes`` (10; with ``--quick`` 0: one fault of each kind, about a minute), and
at least until every fault kind was injected once, the nemesis (:mod:`bench.nemesis`) injects
one random fault after another, each held a random while and then healed: ``kill -9`` and
SIGSTOP of every process kind, the other host's packets dropped either way, its link down,
bursts of costly batches. Then everything is healed, the tenants finish (every batch sent gets
acknowledged, the SDK dataflows complete), and the checker (:mod:`bench.chaos_check`) compares
what the service holds with the oracle over what the tenants saw acknowledged.

The report, like Jepsen's: each fault kind and how often it was injected, then per tenant the
batches acknowledged, lost (acknowledged, not applied as acknowledged), applied twice, the REST
comparisons with the oracle, and the longest wait for an acknowledgement, healthy (no fault on
anything the tenant depends on during the wait) or faulted. Targets: nothing lost, nothing
applied twice, every frontier equal to the oracle's, and the healthy tenants' longest wait at
most 1 s. The seed is printed; ``--seed`` repeats a run's choices (not the machine's timing).
Everything the run makes (namespace, link, rules, processes) is removed at its end, failed or
not. ``TRACKER_CHAOS_PLANT=skip-resend`` plants a bug in one tenant (:mod:`bench.chaos_tenants`)
to show that the checker catches it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import httpx

from api.run.process import SOURCE_ROOT, ServiceProcess
from bench.chaos_check import check
from bench.chaos_tenants import PLANT_ENV, PLANTED_TENANT, planted, sdk_dataflow
from bench.hosts import Host, free_subnet, missing
from bench.nemesis import KINDS, Durations, Nemesis, describe
from bench.workloads import loop_graph

TENANT_KINDS = ("post", "ws", "sdk-ws", "sdk-sse", "costly")
TIMEOUT = 2.0
"""Seconds a raw tenant waits for an answer before it takes the attempt as failed and resends."""
QUICK = Durations(stop=(0.5, 1.5), network=(3.0, 3.5), pause=(0.2, 0.5))
FULL = Durations(stop=(1.0, 8.0), network=(3.0, 10.0), pause=(1.0, 4.0))
SERVICE_ENV = {"SPARK_MASTER": "local[1]", "TRACKER_SPARK_NICE": "10"}


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _until(what: str, probe: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"chaos: {what} not within {timeout:.0f} s")
        time.sleep(0.2)


def _body(kind: str, name: str, quick: bool) -> dict[str, Any]:
    if kind in ("sdk-ws", "sdk-sse"):
        return sdk_dataflow(name).registration(2)
    if kind == "costly":  # a chain of arity 2, along which the costly batches move wide antichains
        length = 60 if quick else 100
        nodes = [{"id": i, "inputs": min(i, 1), "outputs": 1} for i in range(length)]
        edges = [{"source": {"node": i, "port": 0}, "target": {"node": i + 1, "port": 0}} for i in range(length - 1)]
        return {"name": name, "timestamp_arity": 2, "nodes": nodes, "edges": edges}
    return loop_graph(operators=3, name=name)


def _register(service: ServiceProcess, endpoints: dict[int, str], quick: bool) -> list[dict[str, Any]]:
    """Each tenant's dataflow, registered at its shard (so that each shard has one of each kind)."""
    specs = []
    for shard, endpoint in endpoints.items():
        for kind in TENANT_KINDS:
            name = f"s{shard}-{kind}"
            body = _body(kind, name, quick)
            answer = httpx.post(endpoint + "/v1/dataflows", json=body, headers=service.admin_headers, timeout=60)
            if answer.status_code != 201:
                raise RuntimeError(f"chaos: registering {name} at {endpoint}: {answer.status_code} {answer.text}")
            via = "proxy" if kind == "post" else "endpoint"
            specs.append({"name": name, "kind": kind, "shard": shard, "via": via, "endpoint": endpoint,
                          "base": service.url if via == "proxy" else endpoint, "dataflow": answer.json()["id"],
                          "token": answer.json()["token"], "body": body})
    return specs


def _tenants(root: Path, specs: list[dict[str, Any]], seed: int, minutes: float, quick: bool
             ) -> subprocess.Popen[bytes]:
    config = {"seed": seed, "pace": 0.05, "timeout": TIMEOUT, "costly_timeout": 60.0,
              "costly_width": 100 if quick else 150, "finish_seconds": 120.0,
              "worker_timeout": minutes * 60 + 900, "tenants": specs}
    (root / "tenants.json").write_text(json.dumps(config))
    with open(root / "tenants.log", "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "bench.chaos_tenants", str(root / "tenants.json"),
                                    str(root / "results.json")], cwd=SOURCE_ROOT, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=log)
    assert process.stdout is not None
    if process.stdout.readline().strip() != b"ready":
        raise RuntimeError(f"chaos: the tenants did not start; see {root / 'tenants.log'}")
    return process


def _spark(endpoint: str, headers: dict[str, str]) -> str:
    """Shard 0's word on its Spark process (``ready``, ``starting``, ``down``...)."""
    try:
        return str(httpx.get(endpoint + "/healthz", headers=headers, timeout=10).json().get("spark"))
    except (httpx.HTTPError, ValueError):
        return "unknown: shard 0 did not answer"


def _terminated(number: int, frame: object) -> None:
    raise SystemExit(128 + number)


def _say(stdin: IO[bytes] | None, line: str) -> None:
    if stdin is not None:
        stdin.write(line.encode() + b"\n")
        stdin.flush()


def run(quick: bool, seed: int | None = None, minutes: float | None = None) -> dict[str, Any]:
    """Run the suite, print the report, return the figures."""
    reason = missing(firewall=True)
    if reason:
        raise SystemExit(f"chaos: error: {reason}")
    planted(PLANTED_TENANT)  # an unknown TRACKER_CHAOS_PLANT: one line, before anything starts
    seed = random.randrange(1 << 20) if seed is None else seed
    minutes = minutes if minutes is not None else (0.0 if quick else 10.0)
    rng = random.Random(seed)
    before = os.getloadavg()
    print(f"chaos: seed {seed}; {minutes:g} minutes of faults, and at least one of each of {len(KINDS)} kinds; "
          f"load average {before[0]:.1f} {before[1]:.1f} {before[2]:.1f} on {os.cpu_count()} cores", flush=True)
    root = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    phases: dict[str, float] = {"start": time.monotonic()}
    print(f"chaos: logs in {root} (the warehouse is removed at the end)", flush=True)
    previous = signal.signal(signal.SIGTERM, _terminated)  # so that a SIGTERM still cleans up
    host: Host | None = None
    service: ServiceProcess | None = None
    tenants: subprocess.Popen[bytes] | None = None
    nemesis: Nemesis | None = None
    try:
        host = Host(1, root / "warehouse", root / "shard-1.log", subnet=free_subnet(200 + os.getpid() % 50))
        service = ServiceProcess(root / "warehouse", spark=True, shards=1, shard_hosts=f"1={host.url}",
                                 env=SERVICE_ENV).start(timeout=90)  # meanwhile shard 1 starts too
        _until(f"shard 1 at {host.url}", lambda: _answers(host.url), 90)
        _until("both shards up at the front", lambda: httpx.get(service.url + "/healthz", timeout=5)
               .json()["status"] == "ok", 60)
        endpoints = {0: service.endpoint(0), 1: host.url}
        specs = _register(service, endpoints, quick)
        tenants = _tenants(root, specs, seed, minutes, quick)
        nemesis = Nemesis(service, host, lambda shard: _say(tenants.stdin if tenants else None,
                                                               f"costly s{shard}-costly"),
                          rng, QUICK if quick else FULL, lambda line: print(line, flush=True))
        time.sleep(3.0)  # every tenant connected and acknowledged before the first fault
        phases["set_up"] = time.monotonic()
        nemesis.run(minutes * 60, lambda: tenants is not None and tenants.poll() is None)
        phases["faults"] = time.monotonic()
        fault_seconds = phases["faults"] - nemesis.started
        nemesis.heal_all()
        healthy = nemesis.wait_healthy()
        spark = _spark(endpoints[0], service.admin_headers)
        _say(tenants.stdin, "stop")
        assert tenants.stdout is not None
        finished = tenants.stdout.readline().strip() == b"done"
        tenants.wait(60)
        ended = phases["tenants_finished"] = time.monotonic()
        if not finished:
            raise RuntimeError(f"chaos: the tenants did not finish; see {root / 'tenants.log'}")
        results = json.loads((root / "results.json").read_text())
        verdicts, check_seconds = check(specs, results, nemesis.faults, service.admin_headers, str(root / "warehouse"),
                         nemesis.started, ended)
        phases["checked"] = time.monotonic()
    finally:
        if nemesis is not None:
            nemesis.heal_all()
        if tenants is not None and tenants.poll() is None:
            tenants.kill()
            tenants.wait(10)
        if service is not None:
            service.stop()
        if host is not None:
            host.remove()
        shutil.rmtree(root / "warehouse", ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
    assert nemesis is not None
    marks = list(phases.items())
    walls = {name: round(at - marks[i][1], 1) for i, (name, at) in enumerate(marks[1:])}
    walls.update({f"checked_{name}": seconds for name, seconds in check_seconds.items()})
    return _report(seed, minutes, fault_seconds, before, nemesis, verdicts, {"healthy_at_the_end": healthy,
                                                                           "spark_at_the_end": spark}, walls)


def _report(seed: int, minutes: float, fault_seconds: float, before: tuple[float, float, float], nemesis: Nemesis,
            verdicts: dict[str, dict[str, Any]], end: dict[str, Any], walls: dict[str, float]) -> dict[str, Any]:
    load = os.getloadavg()
    injected = {k: sum(1 for f in nemesis.faults if f.kind == k and not f.skipped) for k in KINDS}
    skipped = {k: n for k in KINDS if (n := sum(1 for f in nemesis.faults if f.kind == k and f.skipped))}
    not_back = [f"{f.kind} at {f.start - nemesis.started:.1f} s" for f in nemesis.faults if "NOT BACK" in f.detail]
    print(f"\nfaults in {fault_seconds:.0f} s (load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end; "
          f"the machine is shared, so waits include other work's)")
    for kind in KINDS:
        longest = max((f.healed - f.start for f in nemesis.faults if f.kind == kind and f.healed and not f.skipped),
                      default=0.0)
        print(f"  {describe(kind):52} {injected[kind]:3} x  longest {longest:5.1f} s"
              + (f"  ({skipped[kind]} skipped: no such process then)" if kind in skipped else ""))
    print(f"\n{'tenant':12} {'kind':8} {'via':8} {'acked':>7} {'lost':>5} {'twice':>5}  {'REST':4} "
          f"{'wait p50':>9} {'p99':>7}  longest wait: {'healthy':>8} {'quiet':>7} {'faulted':>8}")
    for name, v in verdicts.items():
        print(f"{name:12} {v['kind']:8} {v['via']:8} {v['acked']:7} {_n(v['lost']):>5} {_n(v['applied_twice']):>5}  "
              f"{'ok' if not v['problems'] else 'BAD':4} {_ms(v['wait_p50_s']):>9} {_ms(v['wait_p99_s']):>7} "
              f"{v['longest_healthy_s']:22.3f}s {v['longest_quiet_s']:6.3f}s {v['longest_faulted_s']:7.2f}s"
              + (" (planted bug)" if v["planted"] else ""))
        for line in v["problems"] + v["errors"]:
            print(f"    {line}")
    cheap = {n: v for n, v in verdicts.items() if v["kind"] != "costly"}
    worst = max(cheap, key=lambda n: cheap[n]["longest_healthy_s"])
    worst_at = cheap[worst]["longest_healthy_at"]
    near = [] if worst_at is None else _beside(nemesis, worst_at, cheap[worst]["longest_healthy_s"])
    violations = {n: v["problems"] + v["errors"] + [f"{v[k]} {k.replace('_', ' ')}" for k in ("lost", "applied_twice")
                                                   if v[k]] for n, v in verdicts.items() if not v["holds"]}
    figures: dict[str, Any] = {
        "seed": seed, "minutes": minutes, "fault_seconds": round(fault_seconds, 1), "cores": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in before], "load_average": [round(x, 2) for x in load],
        "wall_seconds": walls, "plant": os.environ.get(PLANT_ENV) or None, "faults": injected,
        "faults_skipped": skipped, "faults_not_healed": not_back, **end,
        "acked": sum(v["acked"] for v in verdicts.values()),
        "lost": sum(v["lost"] or 0 for v in verdicts.values()),
        "applied_twice": sum(v["applied_twice"] or 0 for v in verdicts.values()),
        "per_batch_checked": all(v["lost"] is not None for v in verdicts.values()),
        "rest_problems": sum(len(v["problems"]) for v in verdicts.values()),
        "valid": not violations, "violations": violations,
        "longest_gap_healthy_s": cheap[worst]["longest_healthy_s"], "longest_gap_healthy_tenant": worst,
        "longest_gap_healthy_at_s": worst_at, "longest_gap_healthy_beside": near,
        "longest_gap_quiet_s": max(v["longest_quiet_s"] for v in cheap.values()),
        "longest_gap_faulted_s": max(v["longest_faulted_s"] for v in cheap.values()),
        "costly_longest_wait_s": max(max(v["longest_healthy_s"], v["longest_faulted_s"])
                                     for v in verdicts.values() if v["kind"] == "costly"),
        "tenants": verdicts,
    }
    print(f"\n{'HOLDS' if not violations else 'VIOLATED'}: {figures['acked']:,} batches acknowledged; "
          f"{figures['lost']} lost, {figures['applied_twice']} applied twice"
          f"{'' if figures['per_batch_checked'] else ' (the Delta table was behind: not every dataflow checked)'}; "
          f"{figures['rest_problems']} REST differences from the oracle"
          + "".join(f"\n  {n}: {'; '.join(p)}" for n, p in violations.items()))
    print(f"healthy tenants' longest wait for an ack: {figures['longest_gap_healthy_s']:.3f} s ({worst}"
          + (f", at {worst_at} s, beside: {', '.join(near) or 'no fault'}" if worst_at is not None else "")
          + f"; target <= 1 s); with no fault on any shard nor HAProxy: {figures['longest_gap_quiet_s']:.3f} s; "
            f"faulted: {figures['longest_gap_faulted_s']:.1f} s; costly tenants' own batches: "
            f"{figures['costly_longest_wait_s']:.1f} s")
    print("wall time: " + ", ".join(f"{k.replace('_', ' ')} {v:.0f} s" for k, v in walls.items()))
    return {"name": "chaos", "figures": figures,
            "targets": {"lost": "== 0", "applied_twice": "== 0", "rest_problems": "== 0",
                        "longest_gap_healthy_s": "<= 1"}}


def _beside(nemesis: Nemesis, at: float, seconds: float) -> list[str]:
    """The faults under way during a wait from ``at`` (seconds after the first fault) for
    ``seconds``, or healed less than 10 s before it began: what else the machine was doing."""
    return [f"{f.kind} at {f.start - nemesis.started:.1f} s" for f in nemesis.faults if not f.skipped
            and f.start - nemesis.started <= at + seconds and (f.healed or f.start) - nemesis.started + 10 >= at]


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}ms"
