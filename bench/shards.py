"""shards: ingest with 1, 2 and 4 shards, the proxy's hop, and one shard's load seen from another.

Everything in one run on this machine (``--parts`` picks some of :data:`PARTS`), each service
started by ``tracker serve --shards N`` (Spark off, Delta on) on loopback behind HAProxy:

* **Costs**: what ``tracker plan`` counts per unit, on one shard (:mod:`bench.unit_costs`).

* **Ingest**: :data:`DATAFLOWS` dataflows (100-operator rings) registered through the front, so
  spread over the shards; two pipelined WebSocket workers each (8 batches of 128 updates in
  flight) connected at the dataflow's ``endpoint`` (its shard, no hop), all at once: updates per
  second with N shards against one shard. On a machine with fewer cores than shards the shards
  share the cores, and the ratio says what that costs. Beside it, ``tracker plan``'s event
  loop and CPU per batch for that load against the measured ones (:mod:`bench.plan_check`).
* **The proxy's hop**: a worker's WebSocket batch to its acknowledgement, one at a time,
  through HAProxy (the public address) and direct to the shard (``endpoint``), in alternating
  rounds on the same dataflow: the p50 and p99 the hop adds (target: <= 0.1 ms at p50).
* **Many dataflows**: :data:`MANY` dataflows of 100 operators registered through the front
  over 4 shards (8 at a time): the registration rate, each shard's resident memory after half
  of them and after all (beside ``tracker plan``'s), and, after
  a ``kill -9`` of one shard, the seconds until every one of its dataflows answers again
  (target: <= 10 s).
* **Isolation**: a probe's batches (one every 5 ms, timed to their ack) on one shard while the
  other shard's dataflows take the ingest load above, against the probe alone, in three
  alternating rounds: p50 and p99 ratios (target: p99 <= 1.2x). On two cores the shards share
  the cores, so this measures the machine as much as the service.

>>> _pct([4.0, 1.0, 3.0, 2.0], 0.5)
3.0
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from websockets.asyncio.client import connect

from api.run.process import ServiceProcess
from api.shards.ids import shard_of
from bench import plan_check, unit_costs
from bench.service import BATCH, OPERATORS, _ingest, _throughput_work
from bench.unit_costs import register_ring as _register
from bench.unit_costs import ring_locations as _locations
from bench.workloads import loop_graph, update

DATAFLOWS = 4
"""Dataflows fed at once in the ingest part (spread over the shards by the front)."""
WINDOW = 8
"""Batches in flight per ingest worker."""
MANY = 10_000
"""Dataflows registered over 4 shards (a tenth with ``--quick``)."""
PROBE_PERIOD = 0.005
"""Seconds between two of the isolation probe's batches."""


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ingest_rate(service: ServiceProcess, per_worker: int, only_shard: int | None = None,
                 usage: dict[str, float] | None = None) -> tuple[float, dict[int, int]]:
    """Updates per second for :data:`DATAFLOWS` dataflows of two workers each (on ``only_shard``
    if given: the others are registered elsewhere and left idle), and the dataflows per shard;
    ``usage``, if given, gets the cores the shards' processes and their event loops used during
    the ingest and the cores this process's clients used."""
    initial, work = _throughput_work(2, per_worker, _locations())
    made = [_register(service, f"ingest-{i}", initial) for i in range(DATAFLOWS)]
    per_shard: dict[int, int] = {}
    for m in made:
        shard = shard_of(m["id"]) or 0
        per_shard[shard] = per_shard.get(shard, 0) + 1
    fed = [m for m in made if only_shard is None or m["endpoint"] == service.endpoint(only_shard)]

    async def all_at_once() -> float:
        runs = [_ingest(m["endpoint"].replace("http", "ws", 1) + f"/v1/dataflows/{m['id']}/ws?subscribe=false",
                        m["token"], work, WINDOW) for m in fed]
        started = time.perf_counter()
        await asyncio.gather(*runs)
        return time.perf_counter() - started

    pids = [service.pid_of("hot", shard=k) for k in range(service.shards)]
    if usage is not None:  # the registrations' Delta writes done first
        unit_costs.quiet(service)
        idle = unit_costs.settle(pids)
    cpu_before, client_before, started = unit_costs.cpu_of(pids), time.process_time(), time.perf_counter()
    seconds = asyncio.run(all_at_once())
    batches = len(fed) * 2 * per_worker
    if usage is not None:
        loop = unit_costs.cpu_of(pids)[1] - cpu_before[1] - idle[1] * seconds
        client = time.process_time() - client_before
        unit_costs.quiet(service)  # the batches' Delta writes, included in their cost
        time.sleep(6.0)
        unit_costs.settle(pids)
        spent = unit_costs.cpu_of(pids)[0] - cpu_before[0] - idle[0] * (time.perf_counter() - started)
        usage |= {"loop_ms_per_batch": loop / batches * 1e3, "cpu_ms_per_batch": spent / batches * 1e3,
                  "loop_cores": loop / seconds, "client_cores": client / seconds}
    return batches * BATCH / seconds, per_shard


async def _acks(base: str, dataflow_id: str, token: str, seq0: int, n: int, period: float = 0.0) -> list[float]:
    """Seconds from sending each of ``n`` batches (one at a time) to its ack."""
    url = base.replace("http", "ws", 1) + f"/v1/dataflows/{dataflow_id}/ws?subscribe=false"
    samples = []
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, compression=None) as ws:
        for i in range(n):
            seq = seq0 + i
            text = json.dumps({"worker": "probe", "seq": seq, "updates": [
                update(0, 0, "source", [seq], -1), update(0, 0, "source", [seq + 1], 1)]})
            started = time.perf_counter()
            await ws.send(text)
            reply = await ws.recv()
            samples.append(time.perf_counter() - started)
            if '"ack"' not in str(reply)[:24]:
                raise RuntimeError(f"batch refused: {reply!r:.200}")
            if period:
                await asyncio.sleep(period)
    return samples


def _hop(service: ServiceProcess, n: int, rounds: int) -> dict[str, list[float]]:
    made = _register(service, "hop")
    found: dict[str, list[float]] = {"proxy": [], "direct": []}
    seq = 0
    for _ in range(rounds):
        for way, base in (("proxy", service.url), ("direct", made["endpoint"])):
            found[way] += asyncio.run(_acks(base, made["id"], made["token"], seq, n))[5:]  # after the connection warms
            seq += n
    return found


def _isolation(service: ServiceProcess, n: int, per_worker: int, rounds: int) -> dict[str, list[float]]:
    """The probe's ack times alone and with the other shard loaded, in alternating rounds (so
    that a drift of the machine falls on both), each round's first batches left out."""
    probe = _register(service, "probe")
    other = 1 if probe["endpoint"] == service.endpoint(0) else 0

    async def together(seq: int) -> list[float]:
        loaded = asyncio.create_task(asyncio.to_thread(_ingest_rate, service, per_worker, other))
        await asyncio.sleep(2.0)  # registrations done, the load running
        samples = await _acks(probe["endpoint"], probe["id"], probe["token"], seq, n, PROBE_PERIOD)
        await loaded
        return samples

    found: dict[str, list[float]] = {"alone": [], "loaded": []}
    seq = 0
    for _ in range(rounds):
        found["alone"] += asyncio.run(_acks(probe["endpoint"], probe["id"], probe["token"], seq, n, PROBE_PERIOD))[5:]
        found["loaded"] += asyncio.run(together(seq + n))[5:]
        seq += 2 * n
    return found


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _many(service: ServiceProcess, count: int) -> dict[str, Any]:
    """Register ``count`` dataflows (8 at a time), reading each shard's RSS after half of them and
    after all, then kill shard 1 and time until all its dataflows answer at its endpoint."""
    body = loop_graph(operators=OPERATORS, name="many")

    async def register_all(count: int) -> list[dict[str, Any]]:
        made: list[dict[str, Any]] = []
        async with httpx.AsyncClient(base_url=service.url, headers=service.admin_headers, timeout=120) as client:
            async def one() -> None:
                while len(made) + pending[0] < count:
                    pending[0] += 1
                    answer = await client.post("/v1/dataflows", json=body)
                    pending[0] -= 1
                    answer.raise_for_status()
                    made.append(answer.json())

            pending = [0]
            await asyncio.gather(*(one() for _ in range(8)))
        return made

    started = time.perf_counter()
    made = asyncio.run(register_all(count // 2))
    seconds = time.perf_counter() - started
    half = {k: round(_rss_mb(service.pid_of("hot", shard=k))) for k in range(service.shards)}
    started = time.perf_counter()
    made += asyncio.run(register_all(count - len(made)))
    rate = len(made) / (seconds + time.perf_counter() - started)
    rss = {k: round(_rss_mb(service.pid_of("hot", shard=k))) for k in range(service.shards)}
    victims = [m for m in made if shard_of(m["id"]) == 1]
    os.kill(service.pid_of("hot", shard=1), signal.SIGKILL)
    killed = time.perf_counter()

    async def all_answer() -> None:
        # 8 readers at once, like the registrations. With aiohttp, not httpx: httpx spent ~1.3 ms
        # of the bench's CPU per GET (3.2 s for 2,500 frontiers of a settled shard, which served
        # them in 1.8 s of its own CPU), so the reader, not the shard, set the figure.
        pending = list(victims)
        async with aiohttp.ClientSession(headers=service.admin_headers) as client:
            async def reader() -> None:
                while pending:
                    m = pending.pop()
                    while True:
                        try:
                            async with client.get(f"{m['endpoint']}/v1/dataflows/{m['id']}/frontier") as answer:
                                await answer.read()
                                if answer.status == 200:
                                    first.append(time.perf_counter())
                                    break
                        except aiohttp.ClientError:
                            pass
                        await asyncio.sleep(0.01)

            await asyncio.gather(*(reader() for _ in range(8)))

    first: list[float] = []
    asyncio.run(all_answer())
    return {"registered": len(made), "registrations_per_s": round(rate, 1), "rss_mb_per_shard": rss,
            "rss_mb_per_shard_at_half": half,
            "restart_dataflows": len(victims), "restart_seconds": round(time.perf_counter() - killed, 2),
            "restart_first_answer_seconds": round(min(first) - killed, 2)}


PARTS = ("costs", "ingest", "many", "hop", "isolation")
"""The parts, in the order they run (``--parts`` picks some)."""


def run(quick: bool, parts: list[str] | None = None) -> dict[str, Any]:
    """Measure, print a table, return the figures."""
    chosen = list(parts or PARTS)
    unknown = [p for p in chosen if p not in PARTS]
    if unknown:
        raise SystemExit(f"unknown part(s) {', '.join(unknown)}; the parts are {', '.join(PARTS)}")
    per_worker = 40 if quick else 200
    root = Path(tempfile.mkdtemp(prefix="bench-shards-"))
    env = {"TRACKER_SPARK": "0", "TRACKER_REGISTER_RATE": "0"}
    figures: dict[str, Any] = {"cores": os.cpu_count()}
    print(f"shards benchmark: parts {', '.join(chosen)}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"at the start, {os.cpu_count()} cores")
    if "costs" in chosen:
        print("-- costs: one shard's CPU, log, Delta and memory per unit (what tracker plan uses)")
        figures["costs"] = unit_costs.measure(root, quick)
    if "ingest" in chosen:
        rates: dict[int, float] = {}
        spread: dict[int, dict[int, int]] = {}
        usage: dict[int, dict[str, float]] = {}
        for shards in (1, 2, 4):
            service = ServiceProcess(root / f"warehouse-{shards}", env=env, shards=shards).start()
            try:
                usage[shards] = {}
                rates[shards], spread[shards] = _ingest_rate(service, per_worker, usage=usage[shards])
            finally:
                service.stop()
        figures |= {**{f"ingest_updates_per_s_{k}": round(v) for k, v in rates.items()},
                    **{f"ingest_ratio_{k}_vs_1": round(v / rates[1], 2) for k, v in rates.items()},
                    "dataflows_per_shard": {str(k): v for k, v in spread.items()}}
        print(f"-- ingest: {DATAFLOWS} dataflows of {OPERATORS} operators, 2 pipelined WebSocket workers each at "
              "their endpoint")
        print(f"{'shards':>6} {'updates/s':>12} {'vs 1 shard':>10}  dataflows per shard")
        for k, v in rates.items():
            print(f"{k:>6} {v:>12,.0f} {v / rates[1]:>9.2f}x  {spread[k]}")
        figures["plan_ingest"] = plan_check.compare_ingest(rates, usage)
    if "many" in chosen:
        service = ServiceProcess(root / "warehouse-many", env={**env, "TRACKER_MAX_DATAFLOWS": "0"}, shards=4).start()
        try:
            many = _many(service, MANY // 10 if quick else MANY)
        finally:
            service.stop()
        figures |= {f"many_{k}": v for k, v in many.items()}
        print(f"-- many: {many['registered']:,} dataflows of {OPERATORS} operators over 4 shards: "
              f"{many['registrations_per_s']:.0f} registrations/s; RSS per shard (MB) {many['rss_mb_per_shard']}; "
              f"shard 1 killed: its {many['restart_dataflows']} dataflows all answer again after "
              f"{many['restart_seconds']:.2f} s (the first after {many['restart_first_answer_seconds']:.2f} s)")
        figures["plan_memory"] = plan_check.compare_memory(many["registered"] // 4, many["rss_mb_per_shard"],
                                                           many["rss_mb_per_shard_at_half"])
    if "hop" in chosen or "isolation" in chosen:
        service = ServiceProcess(root / "warehouse-hop", env=env, shards=2).start()
        try:
            if "hop" in chosen:
                hop = _hop(service, 100 if quick else 500, 3 if quick else 5)
                figures |= {
                    "hop_p50_added_ms": round((_pct(hop["proxy"], 0.5) - _pct(hop["direct"], 0.5)) * 1e3, 3),
                    "hop_p99_added_ms": round((_pct(hop["proxy"], 0.99) - _pct(hop["direct"], 0.99)) * 1e3, 3),
                    **{f"ack_{way}_p{q}_ms": round(_pct(s, q / 100) * 1e3, 3) for way, s in hop.items()
                       for q in (50, 99)}}
                print(f"-- hop: WebSocket batch to ack: through HAProxy p50 {figures['ack_proxy_p50_ms']:.3f} ms p99 "
                      f"{figures['ack_proxy_p99_ms']:.3f} ms; direct p50 {figures['ack_direct_p50_ms']:.3f} ms p99 "
                      f"{figures['ack_direct_p99_ms']:.3f} ms; the hop adds {figures['hop_p50_added_ms']:.3f} ms "
                      "at p50")
            if "isolation" in chosen:
                isolation = _isolation(service, 200 if quick else 1000, per_worker * (3 if quick else 2),
                                       1 if quick else 3)
                figures |= {**{f"probe_{what}_p{q}_ms": round(_pct(s, q / 100) * 1e3, 3)
                               for what, s in isolation.items() for q in (50, 99)},
                            "probe_p99_ratio": round(_pct(isolation["loaded"], 0.99)
                                                     / _pct(isolation["alone"], 0.99), 2)}
                print(f"-- isolation: probe on one shard: alone p50 {figures['probe_alone_p50_ms']:.3f} "
                      f"p99 {figures['probe_alone_p99_ms']:.3f} ms; the other shard loaded "
                      f"p50 {figures['probe_loaded_p50_ms']:.3f} p99 {figures['probe_loaded_p99_ms']:.3f} ms "
                      f"({figures['probe_p99_ratio']:.2f}x at p99)")
        finally:
            service.stop()
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    return {"name": "shards", "figures": figures,
            "targets": {"hop_p50_added_ms": "<= 0.1", "probe_p99_ratio": "<= 1.2", "many_restart_seconds": "<= 10",
                        "plan_ingest": "measured within the plan's stated tolerance",
                        "plan_memory": "measured within the plan's stated tolerance"}}
