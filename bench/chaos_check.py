"""The chaos suite's checker (:mod:`bench.chaos`): what the service holds against what the
tenants saw acknowledged, and how long the tenants waited.

Per tenant (one dataflow), once every fault healed and every tenant finished, so that each
batch a correct tenant sent was acknowledged (it resends a batch, same seq and updates, until
it is; a batch the service applied but whose answer was lost comes back as a duplicate's ack):

* **REST** (at the dataflow's shard, admin token): its ``version`` equals the number of batches
  acknowledged, ``status.workers`` each worker's last acknowledged seq, ``/pointstamps`` the
  oracle's accumulation of the registration's initial pointstamps and every acknowledged batch
  (:func:`tracker.oracle.accumulate`), ``/frontier`` the oracle's frontiers over those counts
  (:func:`tracker.oracle.frontiers`);
* **per batch** (the Delta ``progress`` table: one row per update of every applied batch, with
  its worker, seq and version, read once the table caught up with the dataflow's version):
  *lost* counts the acknowledged batches not applied as acknowledged (absent, or other updates
  under that seq), *applied twice* the applied batches beyond those: a ``(worker, seq)`` applied
  under two versions, or one applied that its worker never saw acknowledged (a correct worker
  gets every batch it sent acknowledged in the end, so such a batch was applied behind its
  back: twice under two seqs, or after it gave up on it);
* **waits**: each wait for an acknowledgement (:mod:`bench.chaos_tenants`) is *faulted* when it
  overlaps the window of a fault on something the tenant depends on, *healthy* otherwise. A
  tenant depends on its shard (``shard:K``: the hot path, its sync process and, for shard 1,
  the host's network) and, when it posts through the public address, on HAProxy (``proxy``);
  never on the Spark process, its JVM, the front or another tenant's costly batches, which the
  service promises keep away from acknowledgements. A fault's window runs from its injection to
  :data:`SETTLE` seconds after it healed (a killed process replaced and its shard answering, a
  stopped one continued, a rule removed), which covers a client's reconnection backoff (at most
  1 s in the SDK) and HAProxy's health check (one a second).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import httpx
from deltalake import DeltaTable

from bench.nemesis import Fault
from bench.workloads import core_graph
from tracker import oracle
from tracker.graph import Location, Update

SETTLE = 2.0
"""Seconds after a fault healed during which its tenants' waits still count as faulted."""
DELTA_SECONDS = 120.0
"""How long the checker waits for the ``progress`` table to hold every dataflow's last version."""
Key = tuple[int, int, str, tuple[int, ...], int]


def _key(update: dict[str, Any]) -> Key:
    location = update["location"]
    return location["node"], location["port"], location["kind"], tuple(update["time"]), update["delta"]


def _core(batch: list[dict[str, Any]]) -> list[Update]:
    return [(Location(u["location"]["node"], u["location"]["port"], u["location"]["kind"]), tuple(u["time"]),
             u["delta"]) for u in batch]


def _acked(result: dict[str, Any]) -> list[tuple[str, int, list[dict[str, Any]]]]:
    return [(worker, a["seq"], a["updates"]) for worker, h in result["workers"].items() for a in h["acked"]]


def rest(spec: dict[str, Any], result: dict[str, Any], headers: dict[str, str]) -> tuple[list[str], int | None]:
    """The REST comparisons' problems (empty: every one held) and the dataflow's version."""
    acked = _acked(result)
    problems: list[str] = []
    for worker, history in result["workers"].items():
        seqs = [a["seq"] for a in history["acked"]]
        if seqs != list(range(len(seqs))):
            problems.append(f"{worker} saw seqs acknowledged out of order or twice")
    graph, initial = core_graph(spec["body"])
    counts = oracle.accumulate([initial, *(_core(b) for _, _, b in acked)])
    base = f"{spec['endpoint']}/v1/dataflows/{spec['dataflow']}"
    try:
        with httpx.Client(headers=headers, timeout=30.0) as client:
            detail = client.get(base).json()
            held = {(Location(**r["location"]), tuple(r["time"])): r["count"]
                    for r in client.get(f"{base}/pointstamps").json()}
            frontier = {Location(**r["location"]): [tuple(t) for t in r["frontier"]]
                        for r in client.get(f"{base}/frontier").json()["locations"]}
    except (httpx.HTTPError, ValueError, KeyError) as error:
        return [*problems, f"its shard did not answer: {error}"], None
    if detail["version"] != len(acked):
        problems.append(f"version {detail['version']} for {len(acked)} batches acknowledged")
    last = {w: max((a["seq"] for a in h["acked"]), default=None) for w, h in result["workers"].items()}
    seen = {w: s for w, s in (detail["status"].get("workers") or {}).items()}
    if {w: s for w, s in last.items() if s is not None} != seen:
        problems.append(f"last seq per worker {seen}, acknowledged {last}")
    if held != counts:
        wrong = sum(1 for k in set(held) | set(counts) if held.get(k) != counts.get(k))
        problems.append(f"pointstamps differ from the oracle's at {wrong} (location, time)s")
    expected = oracle.frontiers(graph, counts)
    if frontier != expected:
        wrong = sum(1 for k in set(frontier) | set(expected) if frontier.get(k, []) != expected.get(k, []))
        problems.append(f"frontiers differ from the oracle's at {wrong} locations")
    return problems, int(detail["version"])


def wait_for_delta(specs: list[dict[str, Any]], versions: dict[str, int], headers: dict[str, str]) -> bool:
    """Whether every dataflow's ``delta_version`` reaches its version within :data:`DELTA_SECONDS`."""
    deadline = time.monotonic() + DELTA_SECONDS
    pending = [s for s in specs if s["dataflow"] in versions]
    while pending and time.monotonic() < deadline:
        still = []
        for spec in pending:
            try:
                status = httpx.get(f"{spec['endpoint']}/v1/dataflows/{spec['dataflow']}", headers=headers,
                                   timeout=10).json()["status"]
                if (status.get("delta_version") or 0) < versions[spec["dataflow"]]:
                    still.append(spec)
            except (httpx.HTTPError, ValueError, KeyError):
                still.append(spec)
        pending = still
        if pending:
            time.sleep(0.5)
    return not pending


def per_batch(warehouse: str, spec: dict[str, Any], result: dict[str, Any]) -> tuple[int, int]:
    """``(lost, applied twice)`` of one dataflow from the ``progress`` table."""
    table = DeltaTable(f"{warehouse}/progress").to_pyarrow_table(
        partitions=[("dataflow_id", "=", spec["dataflow"])],
        columns=["version", "worker", "seq", "node", "port", "kind", "time", "delta"]).to_pylist()
    applied: dict[tuple[str, int], Counter[Key]] = {}
    versions: dict[tuple[str, int], set[int]] = {}
    for row in table:
        if row["version"] == 0:  # the registration's initial pointstamps
            continue
        key = (row["worker"], row["seq"])
        versions.setdefault(key, set()).add(row["version"])
        found = applied.setdefault(key, Counter())
        if row["delta"]:
            found[(row["node"], row["port"], row["kind"], tuple(row["time"]), row["delta"])] += 1
    acked = {(w, s): Counter(_key(u) for u in updates) for w, s, updates in _acked(result)}
    lost = sum(1 for key, updates in acked.items() if applied.get(key) != updates)
    twice = sum(len(v) - 1 for v in versions.values()) + sum(1 for key in applied if key not in acked)
    return lost, twice


def waits(spec: dict[str, Any], result: dict[str, Any], faults: list[Fault], began: float, ended: float
          ) -> dict[str, Any]:
    """The tenant's longest healthy and faulted waits (seconds) among those that ended after
    ``began`` (the first fault: not the tenants' start-up), when the longest healthy one began
    (seconds after ``began``), its longest *quiet* wait (no fault on any shard, nor on HAProxy:
    only faults of what the service keeps away from acknowledgements, the Spark process, its
    JVM, the front, costly batches), and the p50 and p99 of every wait."""
    def windows(depends: set[str]) -> list[tuple[float, float]]:
        return [(f.start, (f.healed or ended) + SETTLE) for f in faults if f.component in depends and not f.skipped]

    own = windows({f"shard:{spec['shard']}", *(("proxy",) if spec["via"] == "proxy" else ())})
    anywhere = windows({"shard:0", "shard:1", "proxy"})
    healthy, quiet, faulted, worst_at = 0.0, 0.0, 0.0, None
    every: list[float] = []
    for history in result["workers"].values():
        every += history["waits"]
        small = max((w for w in history["waits"] if w < 0.05), default=0.0)  # never overlaps a fault that counts
        healthy, quiet = max(healthy, small), max(quiet, small)
        spans = [tuple(k) for k in history["kept"]] + ([tuple(history["open"])] if history["open"] else [])
        for start, end in spans:
            if end < began:
                continue
            if any(start <= w_end and end >= w_start for w_start, w_end in own):
                faulted = max(faulted, end - start)
                continue
            if end - start > healthy:
                healthy, worst_at = end - start, round(start - began, 1)
            if not any(start <= w_end and end >= w_start for w_start, w_end in anywhere):
                quiet = max(quiet, end - start)
    every.sort()
    pick = (lambda q: round(every[min(len(every) - 1, int(q * len(every)))], 4)) if every else (lambda q: None)
    return {"longest_healthy_s": round(healthy, 3), "longest_faulted_s": round(faulted, 3),
            "longest_healthy_at": worst_at, "longest_quiet_s": round(quiet, 3), "wait_p50_s": pick(0.5),
            "wait_p99_s": pick(0.99)}


def check(specs: list[dict[str, Any]], results: dict[str, Any], faults: list[Fault], headers: dict[str, str],
          warehouse: str, began: float, ended: float) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """Every tenant's verdict: acknowledged batches, lost, applied twice (``None`` when the Delta
    table did not catch up within :data:`DELTA_SECONDS`: not checked), REST problems, the
    tenant's own errors, and its waits; and the seconds each part of the check took."""
    took = {"start": time.monotonic()}
    verdicts: dict[str, dict[str, Any]] = {}
    versions: dict[str, int] = {}
    for spec in specs:
        result = results.get(spec["name"], {"workers": {}, "errors": ["no result"]})
        problems, version = rest(spec, result, headers)
        if version is not None:
            versions[spec["dataflow"]] = version
        verdicts[spec["name"]] = {"kind": spec["kind"], "shard": spec["shard"], "via": spec["via"],
                                  "acked": len(_acked(result)), "problems": problems,
                                  "errors": result.get("errors", []), "planted": result.get("planted", False),
                                  **waits(spec, result, faults, began, ended)}
    took["rest_and_oracle"] = time.monotonic()
    caught_up = wait_for_delta(specs, versions, headers)
    took["delta_catching_up"] = time.monotonic()
    for spec in specs:
        verdict = verdicts[spec["name"]]
        if caught_up:
            verdict["lost"], verdict["applied_twice"] = per_batch(warehouse, spec, results.get(spec["name"], {
                "workers": {}}))
        else:
            verdict["lost"] = verdict["applied_twice"] = None  # reported as not checked, not as held
        verdict["holds"] = not verdict["problems"] and not verdict["errors"] and not verdict["lost"] \
            and not verdict["applied_twice"]
    took["per_batch"] = time.monotonic()
    marks = list(took.values())
    return verdicts, {name: round(marks[i + 1] - marks[i], 1) for i, name in enumerate(list(took)[1:])}
