"""service: end-to-end frontier latency and ingest throughput of the real service vs. floors.

Everything is measured in one run on this machine, with the service started on a loopback port
(``tracker serve``; Spark off in the first parts):

* **Latency**: a worker sends a batch (on a WebSocket, or by ``POST``) that moves the input
  capability of a 100-operator ring with a feedback loop from ``t`` to ``t + 1``, which moves the
  frontier at every location; another subscriber (a WebSocket) times until it receives that
  version's ``changes`` (in its own process, :mod:`bench.watcher`, as a real subscriber would
  be). p50 and p99 are compared with the *physical floor* measured in the same
  run: a round trip to a trivial uvicorn endpoint over the same transport that makes each
  message durable (one ``fdatasync`` of it on the warehouse's disk) before it answers, one
  message at a time as the service is timed. Beside it, the older floor: the p50 of a bare
  round trip plus the p50 of back-to-back ``fdatasync`` s, which is optimistic: on this
  machine an ``fdatasync`` after an idle moment takes ~2.5x a back-to-back one.
* **Throughput**: updates per second ingested through the service (several WebSocket workers,
  pipelined batches of 128, and of 512, updates) against the transport floor: a trivial uvicorn
  WebSocket endpoint receiving the very same batches and acknowledging each.

Both run against a service on ``--engine native`` (the compiled engine) and then, side by side,
``--engine reference`` (the Python tracker).

* **As a user runs it**: ``tracker serve`` with its defaults (as ``bin/serve`` starts it), the
  ring's batches sent alone by a WebSocket (``?subscribe=false``) or POST sender and timed to
  their ``changes`` event at an SSE or WebSocket subscriber in another process, against the
  **same-shape floor** (:mod:`bench.shape_floor`: a trivial FastAPI app, its own process, that
  takes the same batch on the same transport, appends and ``fdatasync`` s one record and pushes
  the same bytes as the service's ``changes`` event to the same subscriber client), service and
  floor in alternating rounds. Three ways (:data:`MODES`): Spark off; Spark and Delta off (what
  Delta flushing costs the tail); Spark on and busy (an audit of the ring asked every second
  through ``POST .../audit``, the periodic ones off, so that a Spark job runs against the same
  warehouse during the run).
  Targets: p50 <= 1.5x and p99 <= 2x the same-shape floor's with Spark busy, and p99 with Spark
  busy <= 1.2x p99 with Spark off; the bare floor's ratios are printed beside.

The subscriber must see every version in order (a gap or a reordering raises). Percentiles are
nearest-rank, and the throughput work moves pointstamps forward so that frontiers really move:

Long because: one benchmark of several phases (floors, latency per transport, ingest, the
service as a user runs it) whose figures are printed side by side from one run.

>>> _pct([4.0, 1.0, 3.0, 2.0], 0.5), _pct([4.0, 1.0, 3.0, 2.0], 0.99)
(3.0, 4.0)
>>> initial, work = _throughput_work(1, 2, [(1, 0, "target"), (2, 0, "target")], batch=4)
>>> len(initial), [len(batch) for batch in work[0]], work[0][1][0]["time"], work[0][1][-1]["time"]
(2, [4, 4], [2], [1])
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import httpx
from websockets.asyncio.client import connect

from api.config import Settings
from api.run.process import ADMIN_TOKEN, ServiceProcess, free_port
from bench.workloads import core_graph, loop_graph, register, update

OPERATORS = 100
BATCH = 128
Batch = list[dict[str, Any]]
"""One progress batch's ``updates``, as JSON."""

if TYPE_CHECKING:
    from fastapi import FastAPI

floor_app: FastAPI | None
try:  # the trivial endpoint of the floor (imported by uvicorn in a subprocess)
    from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect

    floor_app = FastAPI()

    @floor_app.post("/echo")
    async def _echo(body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    @floor_app.websocket("/ingest")
    async def _ingest_floor(websocket: WebSocket) -> None:
        """The transport floor of ingest: receive each batch and acknowledge it, nothing else."""
        await websocket.accept()
        try:
            while True:
                await websocket.receive_text()
                await websocket.send_text('{"type":"ack"}')
        except WebSocketDisconnect:
            return

    @floor_app.websocket("/ws")
    async def _ws(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                await websocket.send_text(await websocket.receive_text())
        except WebSocketDisconnect:  # the benchmark closing its connection is the normal end
            return

    _LOG: list[int] = []

    def _durably(data: bytes) -> None:
        """Append ``data`` to a log on the warehouse's disk and ``fdatasync`` it, on the loop."""
        if not _LOG:
            _LOG.append(os.open(Path(os.environ["BENCH_FLOOR_LOG"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        os.write(_LOG[0], data)
        os.fdatasync(_LOG[0])

    @floor_app.post("/echo-durable")
    async def _echo_durable(request: Request) -> dict[str, Any]:
        _durably(await request.body())
        return {"ok": True}

    @floor_app.websocket("/ws-durable")
    async def _ws_durable(websocket: WebSocket) -> None:
        """The latency floor as one unit: each message made durable (one ``fdatasync``), then
        echoed. Timed as the service is (one message at a time, the disk idle in between);
        ``fdatasync`` after an idle moment takes ~2.5x what back-to-back ones do here."""
        await websocket.accept()
        try:
            while True:
                text = await websocket.receive_text()
                _durably(text.encode())
                await websocket.send_text(text)
        except WebSocketDisconnect:
            return
except ImportError:  # pragma: no cover
    pass


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _fsync_samples(directory: Path, n: int) -> list[float]:
    path = directory / "fsync-probe.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    out = []
    try:
        for _ in range(n):
            started = time.perf_counter()
            os.write(fd, b"x" * 200)
            os.fdatasync(fd)
            out.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return out


async def _floor_rtts(port: int, n: int) -> dict[str, list[float]]:
    post: list[float] = []
    ws_rtts: list[float] = []
    body = {"worker": "w", "seq": 0, "updates": [update(0, 0, "source", [0], -1), update(0, 0, "source", [1], 1)]}
    post_durable: list[float] = []
    ws_durable: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        for _ in range(n):
            for path, samples in (("/echo", post), ("/echo-durable", post_durable)):
                started = time.perf_counter()
                (await client.post(path, json=body)).raise_for_status()
                samples.append(time.perf_counter() - started)
    text = json.dumps(body)
    for path, samples in (("/ws", ws_rtts), ("/ws-durable", ws_durable)):
        async with connect(f"ws://127.0.0.1:{port}{path}", compression=None) as ws:
            for _ in range(n):
                started = time.perf_counter()
                await ws.send(text)
                await ws.recv()
                samples.append(time.perf_counter() - started)
    return {"post": post, "ws": ws_rtts, "post_durable": post_durable, "ws_durable": ws_durable}


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` and its children (the log's sync process), so
    far: the service's own work, which the machine's load does not inflate as it does latency."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # a process that ended meanwhile
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):  # fields[1]: the parent's pid
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _settled(service: ServiceProcess, dataflow_id: str) -> None:
    """Wait until the registration's background work (graph tables, native Psi) is done, so
    that the figures measure steady-state traffic rather than a one-off side task."""
    deadline = time.monotonic() + 120
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        while not client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]["graph_stored"]:
            if time.monotonic() > deadline:
                raise RuntimeError("registration background work did not finish")
            time.sleep(0.05)


class Endpoint(NamedTuple):
    """Where batches go: a service, or the same-shape floor (:mod:`bench.shape_floor`)."""

    url: str
    ws_url: str


async def _latency(service: ServiceProcess | Endpoint, dataflow_id: str, token: str, transport: str, n: int,
                   start_step: int, seq0: int, subscriber: str = "ws", worker: str | None = None) -> list[float]:
    """Send ``n`` batches one at a time; each sample is the time from sending a batch to its
    ``changes`` event arriving at a subscriber in another process (:mod:`bench.watcher`), on a
    WebSocket or (``subscriber="sse"``) on the SSE stream."""
    headers = {"Authorization": f"Bearer {token}"}
    url = f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws"
    watched = [url] if subscriber == "ws" else [f"{service.url}/v1/dataflows/{dataflow_id}/frontier/stream"]
    watcher = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.watcher", *watched, token,
                                                   *([] if subscriber == "ws" else ["--sse"]),
                                                   stdout=asyncio.subprocess.PIPE,
                                                   cwd=Path(__file__).resolve().parent.parent)
    assert watcher.stdout is not None
    samples = []
    try:
        async with connect(url + "?subscribe=false", additional_headers=headers, compression=None) as sender, \
                httpx.AsyncClient(base_url=service.url, headers=headers) as client:
            version = int(await watcher.stdout.readline())
            for i in range(n):
                step = start_step + i
                body = {"worker": worker or f"lat-{transport}", "seq": seq0 + i,
                        "updates": [update(0, 0, "source", [step], -1), update(0, 0, "source", [step + 1], 1)]}
                text = json.dumps(body)
                started = time.perf_counter()
                if transport == "ws":
                    await sender.send(text)
                else:
                    post = asyncio.ensure_future(client.post(f"/v1/dataflows/{dataflow_id}/progress", content=text,
                                                             headers={"Content-Type": "application/json"}))
                version += 1
                seen, at = (await watcher.stdout.readline()).decode().split()
                if int(seen) != version:
                    raise RuntimeError(f"the subscriber saw version {seen}, expected {version}")
                samples.append(float(at) - started)
                if transport == "ws":
                    await sender.recv()  # the ack
                else:
                    (await post).raise_for_status()
    finally:
        watcher.terminate()
        await watcher.wait()
    return samples


def _throughput_work(workers: int, per_worker: int, locations: list[tuple[int, int, str]], batch: int = BATCH
                     ) -> tuple[list[dict[str, Any]], list[list[Batch]]]:
    """Initial pointstamps and, per worker, batches of BATCH updates: each worker holds BATCH/2
    pointstamps spread over the ring and moves them all from ``k`` to ``k + 1`` per batch, so
    frontiers really move (nothing else holds them back) and the tracker does real work."""
    initial, out = [], []
    for w in range(workers):
        spots = [locations[(w * 7 + j * 13) % len(locations)] for j in range(batch // 2)]
        initial += [update(n, p, kind, [0], 1) for n, p, kind in spots]
        out.append([[update(n, p, kind, [k + 1], 1) for n, p, kind in spots]
                    + [update(n, p, kind, [k], -1) for n, p, kind in spots] for k in range(per_worker)])
    return initial, out


async def _ingest(url: str, token: str, work: list[list[Batch]], window: int) -> float:
    """Seconds for pipelined WebSocket workers (``window`` batches in flight each) to have every
    batch of ``work`` acknowledged at ``url`` (the service, or the floor's trivial endpoint)."""
    headers = {"Authorization": f"Bearer {token}"}

    async def worker(w: int, batches: list[Batch]) -> None:
        async with connect(url, additional_headers=headers, max_size=None, compression=None) as ws:
            texts = [json.dumps({"worker": f"tp{w}", "seq": s, "updates": b}) for s, b in enumerate(batches)]
            sent = acked = 0
            while acked < len(texts):
                while sent < len(texts) and sent - acked < window:
                    await ws.send(texts[sent])
                    sent += 1
                reply = json.loads(await ws.recv())
                if reply.get("type") != "ack":
                    raise RuntimeError(f"unexpected reply {reply}")
                acked += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(w, b) for w, b in enumerate(work)))
    return time.perf_counter() - started


def _apply_samples(body: dict[str, Any], n: int, engine: str) -> list[float]:
    """The engine's own time for the latency batches (moving the input capability): the compiled
    engine through its low-level API (as the service drives it) or the reference tracker."""
    from tracker.graph import Location
    from tracker.reachability import Tracker

    graph, initial = core_graph(body)
    samples = []
    if engine == "native":
        from tracker.compiled import engine_for

        compiled, order = engine_for(graph)
        compiled.apply(initial)
        source = order.index(Location.source(0, 0))
        for step in range(n):
            started = time.perf_counter()
            compiled.apply_indexed([source, source], [step, step + 1], [-1, 1]).to_json(compact=True)
            samples.append(time.perf_counter() - started)
        return samples
    tracker = Tracker(graph)
    tracker.apply(initial)
    for step in range(n):
        batch = [(Location.source(0, 0), (step,), -1), (Location.source(0, 0), (step + 1,), 1)]
        started = time.perf_counter()
        tracker.apply(batch)
        samples.append(time.perf_counter() - started)
    return samples


def _ingest_best_of_3(service: ServiceProcess, floor_port: int, body: dict[str, Any],
                      locations: list[tuple[int, int, str]], workers: int, per_worker: int, batch: int
                      ) -> tuple[int, list[float], list[float]]:
    """Updates, service seconds and transport-floor seconds of three interleaved runs (the
    machine is shared and noisy, so the best of three is compared for both sides)."""
    initial, work = _throughput_work(workers, per_worker, locations, batch)
    tp_body = {**body, "name": f"bench-ingest-{batch}", "initial": initial}
    service_runs, floor_runs = [], []
    for _ in range(3):
        tp_id, tp_token = register(service, tp_body)
        _settled(service, tp_id)
        url = f"{service.ws_url}/v1/dataflows/{tp_id}/ws?subscribe=false"
        service_runs.append(asyncio.run(_ingest(url, tp_token, work, window=8)))
        floor_runs.append(asyncio.run(_ingest(f"ws://127.0.0.1:{floor_port}/ingest", "-", work, window=8)))
    return sum(len(b) for batches in work for b in batches), service_runs, floor_runs


def _measure(engine: str, root: Path, floor_port: int, n: int, workers: int, per_worker: int
             ) -> dict[str, Any]:
    """Latency (ws, post) and ingest through a service running ``engine``."""
    service = ServiceProcess(root / f"warehouse-{engine}", env={"TRACKER_LOG_LEVEL": "warning"}, engine=engine)
    try:
        service.start()
        body = loop_graph(operators=OPERATORS, name="bench-ring")
        dataflow_id, token = register(service, body)
        _settled(service, dataflow_id)
        hot = service.pid_of("hot")  # the hot-path process, under tracker serve
        cpu = _cpu_seconds(hot)
        lat_ws = asyncio.run(_latency(service, dataflow_id, token, "ws", n, 0, 0))
        cpu = _cpu_seconds(hot) - cpu
        lat_post = asyncio.run(_latency(service, dataflow_id, token, "post", n, n, 0))
        with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
            locations = [(r["location"]["node"], r["location"]["port"], r["location"]["kind"])
                         for r in client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()["locations"]]
        ingest = {size: _ingest_best_of_3(service, floor_port, body, locations, workers, per_worker * BATCH // size,
                                          size)
                  for size in (BATCH, 4 * BATCH)}
    finally:
        service.stop()
    return {"ws": lat_ws, "post": lat_post, "ingest": ingest, "applies": _apply_samples(body, n, engine),
            "locations": locations, "ws_cpu_per_batch": cpu / n}


MODES = ("spark_off", "delta_off", "spark_busy")
"""The service as a user runs it (``bin/serve``'s defaults), three ways: Spark off; Spark off
and Delta off (``TRACKER_DELTA=0``: what Delta flushing costs the tail, beside ``spark_off``);
Spark on and busy (at ``tracker serve``'s default niceness; an audit of the ring asked every
second through ``POST .../audit``, the periodic ones off so that these run back to back, as
when audits, checks or ``tracker jobs`` run)."""
COMBOS = (("ws", "sse"), ("ws", "ws"), ("post", "sse"), ("post", "ws"))
"""(sender, subscriber): a WebSocket (``?subscribe=false``) or POST sender; an SSE or
WebSocket subscriber in another process."""


class _Audits(threading.Thread):
    """Keeps Spark busy: asks for an audit of the dataflow every second (409 while one is in
    flight); counts the answers by status code."""

    def __init__(self, service: ServiceProcess, dataflow_id: str) -> None:
        super().__init__(daemon=True)
        self.service, self.dataflow_id = service, dataflow_id
        self.stop = threading.Event()
        self.answers: dict[int, int] = {}

    def run(self) -> None:
        with httpx.Client(base_url=self.service.url, headers=self.service.admin_headers, timeout=10) as client:
            while not self.stop.wait(1.0):
                code = client.post(f"/v1/dataflows/{self.dataflow_id}/audit").status_code
                self.answers[code] = self.answers.get(code, 0) + 1


def _status(service: ServiceProcess, dataflow_id: str) -> dict[str, Any]:
    with httpx.Client(base_url=service.url, headers=service.admin_headers) as client:
        status: dict[str, Any] = client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]
    return status


async def _capture(service: ServiceProcess, dataflow_id: str, token: str) -> str:
    """The changes array of the service's ``changes`` event for one latency batch (step 0)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with connect(f"{service.ws_url}/v1/dataflows/{dataflow_id}/ws", additional_headers=headers,
                       max_size=None, compression=None) as ws, httpx.AsyncClient(base_url=service.url) as client:
        await ws.recv()  # the snapshot
        body = {"worker": "lat-user", "seq": 0,
                "updates": [update(0, 0, "source", [0], -1), update(0, 0, "source", [1], 1)]}
        (await client.post(f"/v1/dataflows/{dataflow_id}/progress", json=body, headers=headers)).raise_for_status()
        while True:
            text = str(await ws.recv())
            if text.startswith('{"type":"changes"'):
                return text[text.index('"changes":') + len('"changes":'):-1]


def _as_user(root: Path, shape_floor: Endpoint, n: int, rounds: int) -> dict[str, Any]:
    """Per mode (:data:`MODES`) and (sender, subscriber) (:data:`COMBOS`): latency samples of the
    service and of the same-shape floor, in alternating rounds, and what ran meanwhile."""
    results: dict[str, Any] = {}
    per_round = max(1, n // rounds)
    spark_share = 0.0
    for mode in MODES:
        env = {"TRACKER_LOG_LEVEL": "warning", **({"TRACKER_DELTA": "0"} if mode == "delta_off" else {})}
        if mode == "spark_busy":  # tracker serve's own priority for Spark; audits on demand only, back to back
            env.update({"TRACKER_SPARK_NICE": str(Settings().spark_nice), "TRACKER_AUDIT_SECONDS": "0"})
        service = ServiceProcess(root / f"warehouse-{mode}", spark=mode == "spark_busy", env=env)
        audits = None
        samples: dict[str, dict[str, list[float]]] = {f"{s}_{b}": {"service": [], "floor": []} for s, b in COMBOS}
        try:
            service.start(timeout=300)
            dataflow_id, token = register(service, loop_graph(operators=OPERATORS, name="bench-ring-user"))
            if mode != "delta_off":
                _settled(service, dataflow_id)
            if mode == "spark_busy":
                deadline = time.monotonic() + 900
                while _status(service, dataflow_id)["spark_check"] in ("pending", "running"):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the Spark check did not conclude")
                    time.sleep(1)
            template = asyncio.run(_capture(service, dataflow_id, token))
            httpx.post(shape_floor.url + "/template", content=template).raise_for_status()
            if mode == "spark_busy":
                audits = _Audits(service, dataflow_id)
                audits.start()
                spark_pid = service.pid_of("spark")
                spark_cpu = _cpu_seconds(spark_pid)
                began = time.monotonic()
            step = 1
            for _ in range(rounds):
                for sender, subscriber in COMBOS:
                    pair = samples[f"{sender}_{subscriber}"]
                    pair["service"] += asyncio.run(_latency(service, dataflow_id, token, sender, per_round, step, step,
                                                            subscriber=subscriber, worker="lat-user"))
                    step += per_round
                    pair["floor"] += asyncio.run(_latency(shape_floor, "x", "-", sender, per_round, 0, 0,
                                                          subscriber=subscriber, worker="floor"))
            audited = _status(service, dataflow_id)["audit"]
            if mode == "spark_busy":  # the Spark process's and its JVM's CPU time while measured
                spark_share = (_cpu_seconds(spark_pid) - spark_cpu) / (time.monotonic() - began)
        finally:
            if audits is not None:
                audits.stop.set()
                audits.join(15)
            service.stop()
        results[mode] = {"samples": samples, "template_bytes": len(template), "last_audit": audited,
                         "audit_answers": audits.answers if audits is not None else {},
                         "spark_cpu_share": spark_share if mode == "spark_busy" else 0.0}
    return results


def _print_as_user(as_user: dict[str, Any], rtts: dict[str, list[float]], figures: dict[str, Any],
                   targets: dict[str, Any]) -> None:
    busy = as_user["spark_busy"]
    print(f"as a user runs it (bin/serve's defaults; spark_busy: Spark on, local[{max(1, (os.cpu_count() or 1) - 1)}] "
          f"at nice 10, audits of the ring asked every second, answered {busy['audit_answers']}; the Spark process "
          f"and its JVM used {busy['spark_cpu_share']:.2f} cores meanwhile): each batch sent alone, "
          f"timed to its changes event ({busy['template_bytes']:,} bytes) at a subscriber in another process; "
          "shape floor = the same batch, transport and event bytes through a trivial FastAPI app "
          "(bench/shape_floor.py) that appends and fdatasyncs one record, measured in alternating rounds")
    print(f"{'mode':11} {'sender':6} {'subscr':6} {'p50':>8} {'p99':>8} {'shape p50':>10} {'shape p99':>10} "
          f"{'p50/shape':>10} {'p99/shape':>10} {'p50/bare':>9} {'p99/off':>8}")
    for mode in MODES:
        for key, pair in as_user[mode]["samples"].items():
            sender, subscriber = key.split("_")
            lat, floor = pair["service"], pair["floor"]
            p50, p99, f50, f99 = statistics.median(lat), _pct(lat, 0.99), statistics.median(floor), _pct(floor, 0.99)
            bare = statistics.median(rtts[f"{sender}_durable"])
            off99 = _pct(as_user["spark_off"]["samples"][key]["service"], 0.99)
            name = f"user_{mode}_{key}"
            figures.update({f"{name}_p50_ms": p50 * 1e3, f"{name}_p99_ms": p99 * 1e3,
                            f"{name}_shape_floor_p50_ms": f50 * 1e3, f"{name}_shape_floor_p99_ms": f99 * 1e3,
                            f"{name}_p50_over_shape_floor": p50 / f50, f"{name}_p99_over_shape_floor": p99 / f99,
                            f"{name}_p50_over_bare_floor": p50 / bare, f"{name}_p99_over_bare_floor": p99 / bare,
                            f"{name}_p99_over_spark_off_p99": p99 / off99, f"{name}_samples": len(lat)})
            if mode == "spark_busy":
                targets.update({f"{name}_p50_over_shape_floor": {"max": 1.5},
                                f"{name}_p99_over_shape_floor": {"max": 2.0},
                                f"{name}_p99_over_spark_off_p99": {"max": 1.2}})
            print(f"{mode:11} {sender:6} {subscriber:6} {p50 * 1e3:7.2f}ms {p99 * 1e3:7.2f}ms {f50 * 1e3:9.2f}ms "
                  f"{f99 * 1e3:9.2f}ms {p50 / f50:9.2f}x {p99 / f99:9.2f}x {p50 / bare:8.2f}x {p99 / off99:7.2f}x")
    figures.update({"user_last_audit": busy["last_audit"], "user_spark_cpu_share": busy["spark_cpu_share"],
                    "user_audit_answers": busy["audit_answers"]})
    delta = [_pct(as_user["spark_off"]["samples"][k]["service"], 0.99) /
             _pct(as_user["delta_off"]["samples"][k]["service"], 0.99) for k in as_user["spark_off"]["samples"]]
    figures["user_delta_on_over_off_p99"] = delta
    print("Delta flushing's cost to the tail: p99 with Delta on over p99 with TRACKER_DELTA=0 (Spark off), per "
          "(sender, subscriber): " + ", ".join(f"{d:.2f}x" for d in delta))


def run(quick: bool) -> dict[str, Any]:
    """Measure, print a table, return the figures (``--engine native``; the reference engine's
    side by side under ``reference_``)."""
    n = 60 if quick else 300
    per_worker = 15 if quick else 60
    workers = 4
    root = Path(tempfile.mkdtemp(prefix="bench-service-"))
    floor_port = free_port()
    (root / "warehouse").mkdir(parents=True)
    floor = subprocess.Popen([sys.executable, "-m", "uvicorn", "bench.service:floor_app", "--port", str(floor_port),
                              "--log-level", "warning"], cwd=Path(__file__).resolve().parent.parent,
                             env={**os.environ, "BENCH_FLOOR_LOG": str(root / "warehouse" / "floor.log")})
    shape_port = free_port()
    shape = subprocess.Popen([sys.executable, "-m", "uvicorn", "bench.shape_floor:app", "--port", str(shape_port),
                              "--log-level", "warning"], cwd=Path(__file__).resolve().parent.parent,
                             env={**os.environ, "BENCH_FLOOR_LOG": str(root / "warehouse" / "shape-floor.log")})
    try:
        for port in (floor_port, shape_port):
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/docs", timeout=1)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        rtts = asyncio.run(_floor_rtts(floor_port, n))
        fsyncs = _fsync_samples(root / "warehouse", n)
        measured = {engine: _measure(engine, root, floor_port, n, workers, per_worker)
                    for engine in ("native", "reference")}
        as_user = _as_user(root, Endpoint(f"http://127.0.0.1:{shape_port}", f"ws://127.0.0.1:{shape_port}"),
                           120 if quick else 600, 2 if quick else 3)
    finally:
        for process in (floor, shape):
            process.terminate()
            process.wait(10)
    load = os.getloadavg()
    fsync_p50 = statistics.median(fsyncs)
    figures: dict[str, Any] = {"operators": OPERATORS, "locations": len(measured["native"]["locations"]),
                               "samples": n, "fsync_p50_ms": fsync_p50 * 1e3, "fsync_p99_ms": _pct(fsyncs, 0.99) * 1e3,
                               "load_average": [round(x, 2) for x in load], "ingest_workers": workers}
    print(f"service benchmark: ring of {OPERATORS} operators with a feedback loop, {figures['locations']} locations; "
          f"each latency batch moves the frontier at every location; load average {load[0]:.1f} {load[1]:.1f} "
          f"{load[2]:.1f} on {os.cpu_count()} cores")
    print("floor = a trivial uvicorn endpoint that makes each message durable (one fdatasync) and answers it, timed "
          "one message at a time as the service is; beside it the older floor, the sum of a bare round trip's p50 "
          "and of back-to-back fdatasyncs' p50")
    print(f"{'engine':10} {'transport':10} {'floor p50':>10} {'floor p99':>10} {'e2e p50':>9} {'e2e p99':>9} "
          f"{'p50/floor':>10} {'p99/floor':>10} {'sum floor':>10} {'p50/sum':>8}")
    for engine, m in measured.items():
        prefix = "" if engine == "native" else "reference_"
        apply_p50 = statistics.median(m["applies"])
        figures[f"{prefix}engine_apply_p50_ms"] = apply_p50 * 1e3
        for name in ("ws", "post"):
            lat = m[name]
            durable = rtts[f"{name}_durable"]
            floor_p50, floor_p99 = statistics.median(durable), _pct(durable, 0.99)
            sum_p50 = statistics.median(rtts[name]) + fsync_p50
            p50, p99 = statistics.median(lat), _pct(lat, 0.99)
            figures.update({f"{name}_floor_p50_ms": floor_p50 * 1e3, f"{name}_floor_p99_ms": floor_p99 * 1e3,
                            f"{name}_sum_floor_p50_ms": sum_p50 * 1e3,
                            f"{prefix}{name}_e2e_p50_ms": p50 * 1e3, f"{prefix}{name}_e2e_p99_ms": p99 * 1e3,
                            f"{prefix}{name}_p50_over_floor": p50 / floor_p50,
                            f"{prefix}{name}_p99_over_floor": p99 / floor_p50,
                            f"{prefix}{name}_p99_over_floor_p99": p99 / floor_p99,
                            f"{prefix}{name}_p50_over_sum_floor": p50 / sum_p50})
            print(f"{engine:10} {name:10} {floor_p50 * 1e3:9.2f}ms {floor_p99 * 1e3:9.2f}ms {p50 * 1e3:8.2f}ms "
                  f"{p99 * 1e3:8.2f}ms {p50 / floor_p50:9.2f}x {p99 / floor_p50:9.2f}x {sum_p50 * 1e3:9.2f}ms "
                  f"{p50 / sum_p50:7.2f}x")
        print(f"{engine:10} the engine alone: {apply_p50 * 1e3:.3f} ms (p50) per latency batch (404 frontier changes"
              f"{', applied and encoded' if engine == 'native' else ''}); the service's CPU time per ws latency "
              f"batch: {m['ws_cpu_per_batch'] * 1e3:.3f} ms")
        figures[f"{prefix}ws_service_cpu_per_batch_ms"] = m["ws_cpu_per_batch"] * 1e3
        for size, (updates, service_runs, floor_runs) in m["ingest"].items():
            service_rate, floor_rate = updates / min(service_runs), updates / min(floor_runs)
            suffix = "" if size == BATCH else f"_{size}"
            figures.update({f"{prefix}ingest{suffix}_service_seconds_runs": service_runs,
                            f"{prefix}ingest{suffix}_floor_seconds_runs": floor_runs,
                            f"ingest{suffix}_updates": updates, f"ingest{suffix}_batch_size": size,
                            f"{prefix}service{suffix}_updates_per_s": service_rate,
                            f"{prefix}floor{suffix}_updates_per_s": floor_rate,
                            f"{prefix}ingest{suffix}_ratio": service_rate / floor_rate})
            print(f"{engine:10} ingest (best of 3): {updates} updates in batches of {size} from {workers} pipelined "
                  f"WebSocket workers: service {service_rate:,.0f}/s, transport floor {floor_rate:,.0f}/s, "
                  f"ratio {service_rate / floor_rate:.2f}")
    targets: dict[str, Any] = {"ingest_ratio": {"min": 0.5}, "ingest_512_ratio": {"min": 0.5}}
    _print_as_user(as_user, rtts, figures, targets)
    return {"name": "service", "figures": figures, "targets": targets}
