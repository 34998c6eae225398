"""restart: how soon a service hosting many dataflows serves again after ``kill -9``.

``N`` small dataflows (a 3-operator ring each; 2,000, or 200 with ``--quick``) are registered and
each receives a few batches; once the Delta flush and compaction have caught up the service is
killed with SIGKILL and restarted. The figures: the wall time from the restart until
``/healthz`` answers, until every dataflow answers its ``GET /v1/dataflows/{id}`` with the
version it had, and the service's own ``recovered`` seconds (its JSON log).

>>> _percentile([3.0, 1.0, 2.0], 50)
2.0
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

from api.run.process import ADMIN_TOKEN, ServiceProcess
from bench.workloads import loop_graph, update

BATCHES = 3
CONCURRENCY = 16


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def _populate(service: ServiceProcess, count: int) -> dict[str, str]:
    """Register ``count`` dataflows and send each ``BATCHES`` batches; ``{id: token}``."""
    tokens: dict[str, str] = {}
    limit = asyncio.Semaphore(CONCURRENCY)
    # Short keep-alive: reusing a connection the server is just closing fails the request.
    async with httpx.AsyncClient(base_url=service.url, timeout=120, limits=httpx.Limits(keepalive_expiry=1.0),
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        async def post(url: str, body: dict[str, Any]) -> httpx.Response:
            for _ in range(5):  # a batch is idempotent (seq); a registration retried may register twice
                try:
                    answer = await client.post(url, json=body)
                except httpx.TransportError:
                    continue
                answer.raise_for_status()
                return answer
            raise RuntimeError(f"{url}: no answer after 5 attempts")

        async def one(index: int) -> None:
            async with limit:
                answer = await post("/v1/dataflows", loop_graph(3, name=f"restart-{index}"))
                dataflow_id, token = answer.json()["id"], answer.json()["token"]
                for seq in range(BATCHES):
                    await post(f"/v1/dataflows/{dataflow_id}/progress", {
                        "worker": "w", "seq": seq, "updates": [update(1, 0, "target", [seq], 1)]})
                tokens[dataflow_id] = token

        await asyncio.gather(*(one(i) for i in range(count)))
    return tokens


async def _all_answer(service: ServiceProcess, ids: list[str], started: float) -> float:
    """Seconds from ``started`` until every dataflow answered 200 with version ``BATCHES``,
    asked over :data:`CONCURRENCY` keep-alive connections at once, as many workers reconnecting
    would. Plain HTTP/1.1 on asyncio streams: an httpx client spends ~2 ms of its own per request
    on this machine, and 2,000 of them measured mostly the client."""
    async def until_served(share: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
        try:
            for dataflow_id in share:
                while True:
                    status, body = await _get(reader, writer, f"/v1/dataflows/{dataflow_id}")
                    if status == 200:
                        if json.loads(body)["version"] != BATCHES:
                            raise RuntimeError(f"{dataflow_id} came back at version {json.loads(body)['version']}")
                        break
                    if status != 503:
                        raise RuntimeError(f"{dataflow_id}: {status} {body[:200]!r}")
                    await asyncio.sleep(0.05)
        finally:
            writer.close()

    await asyncio.gather(*(until_served(ids[i::CONCURRENCY]) for i in range(CONCURRENCY)))
    return time.perf_counter() - started


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> tuple[int, bytes]:
    """One keep-alive ``GET`` as the admin: ``(status, body)``."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    status = int(lines[0].split()[1])
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"]))
    # A whole-graph answer is streamed (chunked) by the service.
    chunks = []
    while size := int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16):
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)
    await reader.readuntil(b"\r\n")  # the empty trailer
    return status, b"".join(chunks)


def _recovered_seconds(log: str) -> float | None:
    lines = [json.loads(line) for line in log.splitlines() if '"msg": "recovered"' in line]
    return float(lines[-1]["seconds"]) if lines else None


def run(quick: bool) -> dict[str, Any]:
    """Measure, print a table, return the figures."""
    count = 200 if quick else 2_000
    root = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    # Registered in one burst, beyond the default registration rate and dataflow limits (not what is measured).
    service = ServiceProcess(root / "warehouse", env={
        "TRACKER_LOG_LEVEL": "info", "TRACKER_FLUSH_SECONDS": "0.5", "TRACKER_COMPACT_SECONDS": "1",
        "TRACKER_REGISTER_RATE": "0", "TRACKER_MAX_DATAFLOWS": "0"})
    try:
        service.start()
        started = time.perf_counter()
        tokens = asyncio.run(_populate(service, count))
        populate = time.perf_counter() - started
        time.sleep(4)  # a few flush and compaction passes: the snapshot holds every dataflow
        service.kill9()
        started = time.perf_counter()
        service.start(timeout=600)
        healthy = time.perf_counter() - started
        every = asyncio.run(_all_answer(service, sorted(tokens), started))
        recovered = _recovered_seconds(service.log_tail(5_000))
    finally:
        service.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"restart benchmark: {count} dataflows of 3 operators, {BATCHES} batches each "
          f"(registered and fed in {populate:.1f} s)")
    print(f"{'until /healthz answers':34} {healthy:8.2f}s")
    print(f"{'until every dataflow answers':34} {every:8.2f}s")
    print(f"{'recovery (the service log)':34} {recovered if recovered is not None else float('nan'):8.2f}s")
    figures = {"dataflows": count, "healthy_seconds": healthy, "all_dataflows_seconds": every,
               "recovered_seconds": recovered}
    return {"name": "restart", "figures": figures, "targets": {"all_dataflows_seconds": 10.0}}
