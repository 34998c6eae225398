"""The per-unit costs ``tracker plan`` turns into shards, hosts and disk, measured on one shard
(the ``costs`` part of ``python -m bench shards``; ``api/ops/capacity.py`` holds the figures).

One shard (``tracker serve --shards 1``, Spark off, Delta on, the tidy pass off so the tables
hold the bytes as written, one log segment so nothing rotates away, ``TRACKER_HISTORY=1000`` so
one run's dataflows do not carry gigabytes of history into the next) takes :data:`DATAFLOWS`
100-operator rings fed at once by two pipelined WebSocket workers each
(:func:`bench.service._throughput_work`: every batch moves the worker's pointstamps one epoch
on). Runs, each on fresh dataflows, twice round (once with ``--quick``), interleaved:

* batches of 16, 128 and 512 updates, each moving every location's frontier (202 frontier
  changes a batch): a least-squares line over the sizes gives the CPU per batch and per update;
* 128 updates with the input's capability held at epoch 0, so no frontier moves: the CPU per
  frontier change is the difference, over 202;
* 128 updates with :data:`SUBSCRIBERS` stream readers per dataflow: the CPU per subscriber and
  batch;
* 128 updates moved to random locations of the ring: the Delta rows' bytes (the other runs'
  rows repeat more, and compress further).

CPU is the CPU time of the shard's processes (the hot path with its threads, the log's sync
process; ``/proc``) less their idle rate, and of the event loop's thread alone (what bounds a
shard: one loop, one core). CPU time, unlike wall time, moves little with the machine's load.
Bytes: the log's growth per batch (fitted over the sizes like the CPU); ``progress`` and
``frontier_changes`` (files and Delta log) per row once they hold every version; a file of a
partition written with one row (8 dataflows, one batch of one update each: what a flush writes
for a quiet dataflow); the current ``pointstamps`` and ``frontiers`` files of one dataflow (what
every compaction writes again for each dataflow that changed), per location. Memory: the
history's bytes per frontier change, in fresh processes (:func:`history_bytes`: a ring's
engine and publication filled to the history's cap, against one keeping a single version),
since a shard's resident memory moves with Delta's buffers by more than the history's size.

>>> fit([(16, 1.0), (128, 8.0), (512, 32.0)])
(0.0, 0.0625)
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
from deltalake import DeltaTable
from websockets.asyncio.client import connect

from api.run.process import ServiceProcess, descendants

DATAFLOWS = 4
"""Dataflows fed at once (as in the ingest part)."""
BATCHES_PER_WORKER = {16: 1600, 128: 800, 512: 200}
"""Batches each worker sends, per batch size (a quarter with ``--quick``)."""
TRICKLE = 8
"""Dataflows sent one batch of one update each, to measure a flush's file of one row."""
SUBSCRIBERS = 8
"""Stream readers per dataflow in the subscribers' run."""
Run = dict[str, float]
Updates = list[dict[str, Any]]
"""A batch's updates (or initial pointstamps), as JSON."""


def register_ring(service: ServiceProcess, name: str, initial: Updates | None = None) -> dict[str, Any]:
    """Register a ring of :data:`bench.service.OPERATORS` operators (the benchmarks' dataflow)
    through the service's public address; the registration's answer."""
    from bench.service import OPERATORS
    from bench.workloads import loop_graph

    body = {**loop_graph(operators=OPERATORS, name=name), **({"initial": initial} if initial else {})}
    answer = httpx.post(service.url + "/v1/dataflows", json=body, headers=service.admin_headers, timeout=60)
    answer.raise_for_status()
    found: dict[str, Any] = answer.json()
    return found


def ring_locations() -> list[tuple[int, int, str]]:
    """Every location of that ring, as ``(node, port, kind)``."""
    from bench.service import OPERATORS
    from bench.workloads import loop_graph

    body = loop_graph(operators=OPERATORS)
    return [(n["id"], p, kind) for n in body["nodes"]
            for kind, count in (("source", n["outputs"]), ("target", n["inputs"])) for p in range(count)]


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The least-squares line ``y = a + b x`` through ``points``: ``(a, b)``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, b


def _ticks(stat: Path) -> int:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU time of ``pid`` with its descendants (the log's sync process), and of its main
    thread alone (the hot path's event loop)."""
    total = 0
    for p in (pid, *descendants(pid)):
        try:
            total += _ticks(Path(f"/proc/{p}/stat"))
        except FileNotFoundError:
            continue
    hz = os.sysconf("SC_CLK_TCK")
    return total / hz, _ticks(Path(f"/proc/{pid}/task/{pid}/stat")) / hz


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def metric(service: ServiceProcess, name: str) -> float:
    text = httpx.get(service.url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")))


async def feed(endpoint: str, dataflow: str, token: str, batches: list[list[dict[str, Any]]], worker: int,
               subscribe: bool, window: int = 8) -> None:
    """One pipelined worker: every batch acknowledged (changes and snapshots read and dropped)."""
    url = endpoint.replace("http", "ws", 1) + f"/v1/dataflows/{dataflow}/ws" + ("" if subscribe else "?subscribe=false")
    texts = [json.dumps({"worker": f"w{worker}", "seq": s, "updates": b}) for s, b in enumerate(batches)]
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None,
                       compression=None) as ws:
        sent = acked = 0
        while acked < len(texts):
            while sent < len(texts) and sent - acked < window:
                await ws.send(texts[sent])
                sent += 1
            reply = await ws.recv()
            head = reply[:40] if isinstance(reply, str) else ""
            if '"ack"' in head:
                acked += 1
            elif '"error"' in head:
                raise RuntimeError(f"batch refused: {reply!r:.200}")


def quiet(service: ServiceProcess, timeout: float = 600) -> None:
    """Wait until Delta holds every durable version (the gauge is set by each flush pass, so
    one pass is awaited first)."""
    time.sleep(2.5)
    deadline = time.monotonic() + timeout
    while metric(service, "tracker_delta_lag_versions") > 0:
        if time.monotonic() > deadline:
            raise RuntimeError("Delta did not catch up")
        time.sleep(0.2)


def cpu_of(pids: list[int]) -> tuple[float, float]:
    """:func:`cpu_seconds` summed over several shards' hot-path processes."""
    found = [cpu_seconds(pid) for pid in pids]
    return sum(f[0] for f in found), sum(f[1] for f in found)


def settle(pids: list[int], timeout: float = 180) -> tuple[float, float]:
    """Wait until the shards are idle (under 3% of a core each over 2 s: the registrations' graph
    tables, a compaction, Delta's catch-up done); their idle CPU rate, in all and of the loops."""
    deadline = time.monotonic() + timeout
    while True:
        then, at = cpu_of(pids), time.perf_counter()
        time.sleep(2.0)
        now, elapsed = cpu_of(pids), time.perf_counter() - at
        rates = (now[0] - then[0]) / elapsed, (now[1] - then[1]) / elapsed
        if rates[0] < 0.03 * len(pids) or time.monotonic() > deadline:
            return rates


def _workload(size: int, per_worker: int, spread: bool) -> tuple[Updates, list[list[Updates]]]:
    """Two workers' initial pointstamps and batches: each holds ``size / 2`` pointstamps and
    moves them one epoch on per batch, at the same locations (the ingest part's workload), or,
    ``spread``, each to a random location of the ring (rows that repeat less)."""
    from bench.service import _throughput_work
    from bench.workloads import update

    if not spread:
        return _throughput_work(2, per_worker, ring_locations(), batch=size)
    places = ring_locations()
    chosen = random.Random(size)
    initial, work = [], []
    for _ in range(2):
        held = [chosen.choice(places) for _ in range(size // 2)]
        initial += [update(n, p, kind, [0], 1) for n, p, kind in held]
        batches = []
        for k in range(per_worker):
            moved = [chosen.choice(places) for _ in held]
            batches.append([update(n, p, kind, [k + 1], 1) for n, p, kind in moved]
                           + [update(n, p, kind, [k], -1) for n, p, kind in held])
            held = moved
        work.append(batches)
    return initial, work


async def read(endpoint: str, dataflow: str, token: str) -> None:
    """A stream subscriber on the dataflow's WebSocket, reading (and dropping) every event until
    cancelled."""
    url = endpoint.replace("http", "ws", 1) + f"/v1/dataflows/{dataflow}/ws"
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None,
                       compression=None) as ws:
        while True:
            await ws.recv()


def _run(service: ServiceProcess, size: int, per_worker: int, *, subscribers: int = 0, hold: bool = False,
         spread: bool = False) -> Run:
    """Register :data:`DATAFLOWS` rings, feed them (with ``subscribers`` stream readers each),
    wait for Delta and for the shard to be idle again; the shard's costs."""
    from bench.service import OPERATORS
    from bench.workloads import update

    initial, work = _workload(size, per_worker, spread)
    if hold:  # the input's capability at epoch 0, never moved: no frontier moves
        initial = [*initial, update(0, 0, "source", [0], 1)]
    made = [register_ring(service, f"cost-{size}-{subscribers}-{hold}-{spread}-{i}", initial) for i in range(DATAFLOWS)]
    pid = service.pid_of("hot", shard=0)
    quiet(service)
    idle = settle([pid])
    wh = service.warehouse
    cpu_before = cpu_seconds(pid)
    before = {"wal": tree_bytes(service.log_directory(0)), "progress": tree_bytes(wh / "progress"),
              "frontier_changes": tree_bytes(wh / "frontier_changes"),
              "changes": metric(service, "tracker_frontier_changes_total"),
              "updates": metric(service, "tracker_updates_total"), "rss": rss_mb(pid)}
    started = time.perf_counter()

    async def everyone() -> None:
        readers = [asyncio.create_task(read(m["endpoint"], m["id"], m["token"])) for m in made
                   for _ in range(subscribers)]
        await asyncio.sleep(0.5 if readers else 0)  # connected, snapshots sent
        await asyncio.gather(*(feed(m["endpoint"], m["id"], m["token"], batches, w, subscribe=False)
                               for m in made for w, batches in enumerate(work)))
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

    asyncio.run(everyone())
    wall = time.perf_counter() - started
    during = cpu_seconds(pid)[0] - cpu_before[0] - idle[0] * wall
    quiet(service)
    time.sleep(6.0)  # a compaction pass after the last batch: frontier_changes holds every version
    settle([pid])
    after, elapsed = cpu_seconds(pid), time.perf_counter() - started
    spent = [a - b - r * elapsed for a, b, r in zip(after, cpu_before, idle, strict=True)]
    batches = DATAFLOWS * 2 * per_worker
    updates = metric(service, "tracker_updates_total") - before["updates"]
    changes = metric(service, "tracker_frontier_changes_total") - before["changes"]
    snapshot = 0
    for table in ("pointstamps", "frontiers"):
        files = pa.table(DeltaTable(str(wh / table)).get_add_actions(flatten=True)).to_pylist()
        snapshot += sum(int(f["size_bytes"]) for f in files if f["partition.dataflow_id"] == made[0]["id"])
    return {"size": size, "subscribers": subscribers, "changes_per_batch": changes / batches,
            "batches": batches, "updates": updates, "changes": changes, "wall_s": wall,
            "cpu_ms_per_batch": spent[0] / batches * 1e3, "loop_ms_per_batch": spent[1] / batches * 1e3,
            "shard_cores": during / wall,
            "wal_bytes_per_batch": (tree_bytes(service.log_directory(0)) - before["wal"]) / batches,
            "progress_bytes_per_row": (tree_bytes(wh / "progress") - before["progress"]) / updates,
            "frontier_changes_bytes_per_row": (tree_bytes(wh / "frontier_changes") - before["frontier_changes"])
            / max(changes, 1),
            "snapshot_bytes_per_location": snapshot / (2 * OPERATORS + 2),
            "rss_before_mb": before["rss"], "rss_mb": rss_mb(pid)}


def _one_row_file(service: ServiceProcess) -> float:
    """Bytes a flush adds to ``progress`` for a dataflow that sent one batch of one update: its
    file and its share of the commit."""
    from bench.workloads import update

    made = [register_ring(service, f"trickle-{i}") for i in range(TRICKLE)]
    quiet(service)
    before = tree_bytes(service.warehouse / "progress")
    for m in made:
        answer = httpx.post(f"{m['endpoint']}/v1/dataflows/{m['id']}/progress", timeout=30,
                            headers={"Authorization": f"Bearer {m['token']}"},
                            json={"worker": "w", "seq": 0, "updates": [update(0, 0, "source", [0], -1)]})
        answer.raise_for_status()
    quiet(service)
    return (tree_bytes(service.warehouse / "progress") - before) / TRICKLE


def history_bytes(limit: int, versions: int) -> tuple[int, int]:
    """In this process: a ring's compiled engine and its :class:`~api.streams.publish.Publication`
    (keeping ``limit`` versions, as ``TRACKER_HISTORY``), ``versions`` batches of the ingest
    workload published into it; the resident memory it grew by and the changes its history holds."""
    import gc

    from api.streams.publish import Publication
    from bench.workloads import ring
    from tracker.compiled import engine_for

    graph = ring(100)
    engine, order = engine_for(graph)
    spots = [(j * 13) % len(order) for j in range(64)]
    engine.apply([(order[i], (0,), 1) for i in spots])
    publication = Publication(graph, limit, None, None, native=engine, copy_at=None)
    gc.collect()
    before = rss_mb(os.getpid())
    for k in range(versions):
        batch = engine.apply_indexed(spots + spots, [k + 1] * len(spots) + [k] * len(spots),
                                     [1] * len(spots) + [-1] * len(spots))
        publication.publish(k + 1, batch, notify=False)
    gc.collect()
    return round((rss_mb(os.getpid()) - before) * 2**20), publication.history_changes()


def _history_per_change() -> tuple[float, int]:
    """Bytes per frontier change the history holds: a history of the default size filled (it
    keeps at most ten changes per version it may keep) against one keeping a single version,
    each in a fresh process."""
    import subprocess
    import sys

    grown = {}
    for limit in (100_000, 1):
        out = subprocess.run([sys.executable, "-c", f"from bench.unit_costs import history_bytes; "
                              f"print(*history_bytes({limit}, 5000))"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent.parent, timeout=600).stdout.split()
        grown[limit] = (int(out[0]), int(out[1]))
    held = grown[100_000][1] - grown[1][1]
    return (grown[100_000][0] - grown[1][0]) / held, grown[100_000][1]


def measure(root: Path, quick: bool) -> dict[str, Any]:
    """Every per-unit cost above, printed and returned (the fitted figures and each run's). The
    runs go round twice (once with ``--quick``), interleaved, and each figure is their mean."""
    env = {"TRACKER_SPARK": "0", "TRACKER_REGISTER_RATE": "0", "TRACKER_TIDY_SECONDS": "0",
           "TRACKER_WAL_SEGMENT_BYTES": str(1 << 30),
           # A busy dataflow's history at its steady state is trimmed on every publication, as
           # here; a shorter one keeps the runs' dataflows from holding gigabytes between runs.
           "TRACKER_HISTORY": "1000"}
    per_worker = {size: n // (4 if quick else 1) for size, n in BATCHES_PER_WORKER.items()}
    configurations: dict[str, dict[str, Any]] = {
        **{f"size_{s}": {"size": s} for s in sorted(per_worker)},
        "held": {"size": 128, "hold": True}, "subscribed": {"size": 128, "subscribers": SUBSCRIBERS},
        "spread": {"size": 128, "spread": True}}
    rounds: dict[str, list[Run]] = {name: [] for name in configurations}
    service = ServiceProcess(root / "costs", env=env, shards=1).start()
    try:
        for _ in range(1 if quick else 2):
            for name, options in configurations.items():
                rounds[name].append(_run(service, per_worker=per_worker[options["size"]], **options))
        one_row = _one_row_file(service)
    finally:
        service.stop()
    runs = {name: {k: sum(r[k] for r in found) / len(found) for k in found[0]} for name, found in rounds.items()}
    per_change_bytes, history_changes = _history_per_change()
    plain = {int(r["size"]): r for name, r in runs.items() if name.startswith("size_")}
    moved = plain[128]["changes_per_batch"]
    figures: dict[str, Any] = {}
    for what in ("cpu", "loop"):
        fixed, per_update = fit([(s, r[f"{what}_ms_per_batch"]) for s, r in plain.items()])
        per_change = (plain[128][f"{what}_ms_per_batch"] - runs["held"][f"{what}_ms_per_batch"]) / moved
        figures |= {f"{what}_ms_per_batch": round(fixed - per_change * moved, 4),
                    f"{what}_us_per_update": round(per_update * 1e3, 3),
                    f"{what}_us_per_change": round(per_change * 1e3, 3),
                    f"{what}_us_per_subscriber_batch": round(
                        (runs["subscribed"][f"{what}_ms_per_batch"] - plain[128][f"{what}_ms_per_batch"])
                        / SUBSCRIBERS * 1e3, 2)}
    wal_fixed, wal_per_update = fit([(s, r["wal_bytes_per_batch"]) for s, r in plain.items()])
    figures |= {
        "wal_bytes_per_batch": round(wal_fixed, 1), "wal_bytes_per_update": round(wal_per_update, 2),
        "progress_bytes_per_row": round(runs["spread"]["progress_bytes_per_row"], 2),
        "frontier_changes_bytes_per_row": round(runs["spread"]["frontier_changes_bytes_per_row"], 2),
        "one_row_file_bytes": round(one_row),
        "snapshot_bytes_per_location": round(plain[128]["snapshot_bytes_per_location"], 1),
        "base_rss_mb": round(rounds["size_16"][0]["rss_before_mb"]),
        "history_bytes_per_change": round(per_change_bytes, 1), "history_changes_held": history_changes,
        "runs": {name: {k: round(v, 4) for k, v in r.items()} for name, r in runs.items()},
        "spread_of_rounds": {name: [round(r["cpu_ms_per_batch"], 4) for r in found] for name, found in rounds.items()},
    }
    print(f"{'run':>10} {'changes/batch':>13} {'batches':>8} {'wall s':>7} {'CPU ms/batch':>12} "
          f"{'loop ms/batch':>13} {'shard cores':>11} {'log B/batch':>11} {'progress B/row':>14} "
          f"{'changes B/row':>13}")
    for name, r in figures["runs"].items():
        print(f"{name:>10} {r['changes_per_batch']:>13.1f} {r['batches']:>8.0f} {r['wall_s']:>7.2f} "
              f"{r['cpu_ms_per_batch']:>12.4f} {r['loop_ms_per_batch']:>13.4f} {r['shard_cores']:>11.2f} "
              f"{r['wal_bytes_per_batch']:>11.0f} {r['progress_bytes_per_row']:>14.2f} "
              f"{r['frontier_changes_bytes_per_row']:>13.2f}")
    print("CPU ms per batch in each round: " + "; ".join(f"{k} {v}" for k, v in figures["spread_of_rounds"].items()))
    print("fitted: " + ", ".join(f"{k} {v}" for k, v in figures.items() if k not in ("runs", "spread_of_rounds")))
    return figures
