"""The chaos suite's tenants (:mod:`bench.chaos`), in a process of their own, so that the
nemesis and the checker never share their interpreter: ``python -m bench.chaos_tenants CONFIG
RESULTS``.

Each tenant is one dataflow's workers, and each worker keeps a :class:`History`: every batch it
saw acknowledged (seq and updates) and how long it waited for acknowledgements. The kinds:

* ``post``: a raw sender, one batch at a time by ``POST .../progress``, resending the same
  batch (same seq, same updates) after a transport error or a 5xx until it is answered 200;
* ``ws``: the same over a WebSocket (``?subscribe=false``), reconnecting to resend;
* ``sdk-ws``, ``sdk-sse``: two SDK workers (:class:`~tracker.worker.Worker`, over
  ``ServiceLink`` or ``SseLink``, messages between them on loopback) running a small dataflow
  whose sink checks each epoch's total against what the inputs sent;
* ``costly``: a raw POST sender, idle until told ``costly NAME``, then moving a wide antichain
  of incomparable times along a long chain :data:`BURST` times in a row.

Raw senders' batches follow the progress protocol (:class:`bench.workloads.Simulation`). Commands
come on stdin, one a line: ``costly NAME``; ``stop`` (or end of file): send no new batch, get
every sent one acknowledged, let the SDK dataflows finish, write RESULTS (JSON) and exit. The
process prints ``ready`` once every tenant runs and ``done`` once RESULTS is written.

A *wait* runs from the moment a worker has a batch outstanding and no ack since to its next
ack: how long the worker waited on the service, never its own idle time.

The planted bug: with ``TRACKER_CHAOS_PLANT=skip-resend`` (read here, in :func:`planted`, and
nowhere else) the raw WebSocket sender of shard 1 does not resend a batch after a transport
error: it builds a new batch under the same seq and takes the answer (a duplicate's ack when
the first one was applied) as the new batch's. The checker must report that tenant.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from bench.workloads import Simulation, core_graph, update
from tracker.timestamp import Timestamp
from tracker.worker.cluster import free_ports
from tracker.worker.link import Link, ServiceLink
from tracker.worker.runtime import Worker
from tracker.worker.sse_link import SseLink
from tracker.worker.transport import Transport
from tracker.worker.vertex import Dataflow, Vertex

PLANT_ENV = "TRACKER_CHAOS_PLANT"
PLANTED_TENANT = "s1-ws"
"""The tenant the planted bug (``TRACKER_CHAOS_PLANT=skip-resend``) makes skip its resends."""
BURST = 3
"""Costly batches sent back to back per ``costly`` command."""
KEPT = 0.05
"""Waits at least this long keep their interval (for the checker's healthy/faulted split)."""
RETRY = 0.05
"""Seconds between two attempts at one batch."""
SDK_WORKERS = 2
Batch = list[dict[str, Any]]


def planted(tenant: str) -> bool:
    """Whether ``tenant`` runs with the planted bug; one line and exit code 2 for an unknown plant."""
    plant = os.environ.get(PLANT_ENV, "")
    if plant not in ("", "skip-resend"):
        raise SystemExit(f"chaos: error: {PLANT_ENV} must be 'skip-resend' or unset, got {plant!r}")
    return plant == "skip-resend" and tenant == PLANTED_TENANT


class History:
    """One worker's acknowledged batches and waits (``time.monotonic()``: one clock for every
    process of the machine)."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.acked: list[tuple[int, Batch, float]] = []
        self.waits: list[float] = []
        self.kept: list[tuple[float, float]] = []
        self.outstanding = 0
        self.since: float | None = None
        self.transport_errors = 0
        self.retries = 0

    def sending(self) -> None:
        """A new batch goes out (not a resend)."""
        if self.outstanding == 0:
            self.since = time.monotonic()
        self.outstanding += 1

    def acknowledged(self, seq: int, updates: Batch) -> None:
        """The batch ``seq`` (with ``updates``, as this worker believes) was acknowledged."""
        now = time.monotonic()
        self.acked.append((seq, updates, now))
        if self.since is not None:
            self.waits.append(now - self.since)
            if now - self.since >= KEPT:
                self.kept.append((self.since, now))
        self.outstanding = max(0, self.outstanding - 1)
        self.since = now if self.outstanding else None

    def as_json(self) -> dict[str, Any]:
        """What the checker reads; a wait still open is closed now and marked unfinished."""
        now = time.monotonic()
        return {"acked": [{"seq": s, "updates": u, "at": round(a, 4)} for s, u, a in self.acked],
                "waits": [round(w, 4) for w in self.waits], "kept": [[round(a, 4), round(b, 4)] for a, b in self.kept],
                "open": [round(self.since, 4), round(now, 4)] if self.since is not None else None,
                "outstanding": self.outstanding, "transport_errors": self.transport_errors, "retries": self.retries}


class Tenant:
    """One dataflow's workers; ``spec`` is its entry of the config (name, kind, base, dataflow,
    token, body). :meth:`run` never raises: an error ends up in :attr:`errors`."""

    def __init__(self, spec: dict[str, Any], config: dict[str, Any]) -> None:
        self.spec, self.config = spec, config
        self.name, self.kind = str(spec["name"]), str(spec["kind"])
        self.histories: dict[str, History] = {}
        self.errors: list[str] = []
        self.rows_ok: bool | None = None
        self.commands: asyncio.Queue[int] = asyncio.Queue()
        self.rng = random.Random(f"{config['seed']}-{self.name}")
        self.planted = planted(self.name)
        self.finished = False

    def history(self, worker: str) -> History:
        return self.histories.setdefault(worker, History(worker))

    async def run(self, stopping: asyncio.Event) -> None:
        try:
            if self.kind in ("sdk-ws", "sdk-sse"):
                await self._sdk(stopping)
            elif self.kind == "costly":
                make = self._costly_batches()
                await self._post(self.history("w0"), self._costly(stopping, make), make)
            else:
                make = self._simulated()
                worker = self._post if self.kind == "post" else self._ws
                await worker(self.history("w0"), self._paced(stopping, make), make)
            self.finished = True
        except Exception as error:  # the report says what stopped a tenant
            self.errors.append(f"{type(error).__name__}: {error}")

    def _simulated(self) -> Callable[[], Batch]:
        simulation = Simulation(core_graph(self.spec["body"])[0], seed=self.rng.randrange(1 << 30))

        def make() -> Batch:
            return [update(loc.node, loc.port, loc.kind, list(t), d) for loc, t, d in simulation.step()]
        return make

    def _paced(self, stopping: asyncio.Event, make: Callable[[], Batch]) -> Callable[[], Awaitable[Batch | None]]:
        async def next_batch() -> Batch | None:
            await asyncio.sleep(self.config["pace"])
            return None if stopping.is_set() else make()
        return next_batch

    def _costly(self, stopping: asyncio.Event, make: Callable[[], Batch]) -> Callable[[], Awaitable[Batch | None]]:
        owed = [0]

        async def next_batch() -> Batch | None:
            while not owed[0]:
                if stopping.is_set():
                    return None
                if self.commands.empty():
                    await asyncio.sleep(0.05)
                else:
                    owed[0] += self.commands.get_nowait()
            owed[0] -= 1
            return make()
        return next_batch

    def _costly_batches(self) -> Callable[[], Batch]:
        """Each batch moves all of ``width + 1`` incomparable times ``(i + k, width - i)`` one step."""
        width, shift = int(self.config["costly_width"]), [0]

        def make() -> Batch:
            k = shift[0]
            shift[0] += 1
            old = [update(0, 0, "source", [0, 0], -1)] if k == 0 else [
                update(0, 0, "source", [i + k - 1, width - i], -1) for i in range(width + 1)]
            return old + [update(0, 0, "source", [i + k, width - i], 1) for i in range(width + 1)]
        return make

    async def _post(self, history: History, next_batch: Callable[[], Awaitable[Batch | None]],
                    make: Callable[[], Batch]) -> None:
        url = f"{self.spec['base']}/v1/dataflows/{self.spec['dataflow']}/progress"
        timeout = self.config["costly_timeout"] if self.kind == "costly" else self.config["timeout"]
        headers = {"Authorization": f"Bearer {self.spec['token']}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(headers=headers, timeout=timeout) as client:
            seq = 0
            while (updates := await next_batch()) is not None:
                history.sending()
                while True:
                    try:
                        answer = await client.post(url, content=json.dumps(
                            {"worker": history.worker, "seq": seq, "updates": updates}))
                    except httpx.HTTPError:
                        history.transport_errors += 1
                        updates = make() if self.planted else updates
                        await asyncio.sleep(RETRY)
                        continue
                    if answer.status_code == 200:
                        history.acknowledged(seq, updates)
                        break
                    if answer.status_code < 500:  # a correct sender never sees one: a bug to report
                        raise RuntimeError(f"seq {seq} refused: {answer.status_code} {answer.text[:300]}")
                    history.retries += 1  # shard_unavailable, log_failed...: the same batch again
                    await asyncio.sleep(RETRY)
                seq += 1

    async def _ws(self, history: History, next_batch: Callable[[], Awaitable[Batch | None]],
                  make: Callable[[], Batch]) -> None:
        base = str(self.spec["base"]).replace("http://", "ws://", 1)
        url = f"{base}/v1/dataflows/{self.spec['dataflow']}/ws?subscribe=false"
        timeout = float(self.config["timeout"])
        seq, updates = 0, None
        while True:
            try:
                async with connect(url, additional_headers={"Authorization": f"Bearer {self.spec['token']}"},
                                   open_timeout=timeout, close_timeout=0.5, ping_interval=None, compression=None,
                                   max_size=None) as ws:
                    while True:
                        if updates is None:
                            if (updates := await next_batch()) is None:
                                return
                            history.sending()
                        await ws.send(json.dumps({"worker": history.worker, "seq": seq, "updates": updates}))
                        reply = json.loads(await asyncio.wait_for(ws.recv(), timeout))
                        if reply.get("type") == "ack" and reply.get("seq") == seq:
                            history.acknowledged(seq, updates)
                            seq, updates = seq + 1, None
                        elif reply.get("type") == "error" and int(reply.get("status", 0)) >= 500:
                            history.retries += 1
                            break  # reconnect, then the same batch again
                        else:
                            raise RuntimeError(f"seq {seq}: unexpected answer {json.dumps(reply)[:300]}")
            except (OSError, TimeoutError, WebSocketException):
                history.transport_errors += 1
                updates = make() if self.planted and updates is not None else updates
            await asyncio.sleep(RETRY)

    async def _sdk(self, stopping: asyncio.Event) -> None:
        addresses = [("127.0.0.1", port) for port in free_ports(SDK_WORKERS)]
        transports = [Transport(i, addresses) for i in range(SDK_WORKERS)]
        for transport in transports:
            await transport.start()
        await asyncio.gather(*(t.connect_all() for t in transports))
        links: list[Link] = []
        for i in range(SDK_WORKERS):
            args = (self.spec["base"], self.spec["dataflow"], self.spec["token"], f"w{i}")
            link: RecordedWs | RecordedSse = RecordedWs(*args) if self.kind == "sdk-ws" else RecordedSse(*args)
            link.history = self.history(f"w{i}")
            links.append(link)
        workers = [Worker(sdk_dataflow(self.name), i, SDK_WORKERS, links[i], transports[i])
                   for i in range(SDK_WORKERS)]
        sent: list[Counter[int]] = [Counter() for _ in workers]

        async def feed(worker: Worker) -> None:
            handle, epoch = worker.input(0), 0
            while not stopping.is_set():
                records = [self.rng.randrange(1000) for _ in range(3)]
                handle.send(records)
                sent[worker.index][epoch] += len(records)
                epoch += 1
                handle.advance_to(epoch)
                await asyncio.sleep(self.config["pace"] * 2)
            handle.close()

        await asyncio.gather(*(w.run(feed, timeout=self.config["worker_timeout"]) for w in workers))
        total = workers[0].vertices[2]
        assert isinstance(total, Total)
        expected = dict(sum(sent, Counter()))
        self.rows_ok = total.rows == expected
        if not self.rows_ok:
            wrong = sorted(e for e in set(expected) | set(total.rows) if total.rows.get(e) != expected.get(e))
            self.errors.append(f"sink totals differ from what was sent at epochs {wrong[:10]}")

    def result(self) -> dict[str, Any]:
        return {"kind": self.kind, "errors": self.errors, "finished": self.finished, "rows_ok": self.rows_ok,
                "planted": self.planted, "workers": {w: h.as_json() for w, h in self.histories.items()}}


class Recording(Link):
    """A link that tells its :class:`History` of every new batch and every acknowledgement (the
    SDK's own bookkeeping, seen from inside: its ``_next_batch`` and ``_acked``)."""

    history: History

    def _next_batch(self) -> tuple[int, str] | None:
        batch = super()._next_batch()
        if batch is not None:
            self.history.sending()
        return batch

    def _acked(self, seq: int) -> None:
        done = [(s, text) for s, text in self.unacked if s <= seq]
        super()._acked(seq)
        for s, text in done:
            self.history.acknowledged(s, json.loads(text)["updates"])


class RecordedWs(Recording, ServiceLink):
    """:class:`~tracker.worker.link.ServiceLink` with a history."""


class RecordedSse(Recording, SseLink):
    """:class:`~tracker.worker.sse_link.SseLink` with a history."""


class Tally(Vertex):
    """Counts each epoch's records; sends the count once the epoch is complete here."""

    def __init__(self) -> None:
        self.seen: Counter[Timestamp] = Counter()

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        self.seen[time] += 1
        self.notify_at(time)

    def on_notify(self, time: Timestamp) -> None:
        self.send_by(0, self.seen.pop(time), time)


class Total(Vertex):
    """Adds the tallies of each epoch (on worker 0); notified once every tally of it arrived."""

    def __init__(self) -> None:
        self.pending: Counter[Timestamp] = Counter()
        self.rows: dict[int, int] = {}

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        self.pending[time] += message
        self.notify_at(time)

    def on_notify(self, time: Timestamp) -> None:
        self.rows[time[0]] = self.pending.pop(time)


def sdk_dataflow(name: str) -> Dataflow:
    """The SDK tenants' dataflow: ``records -> tally (by value) -> total (on worker 0)``.

    >>> [s.name for s in sdk_dataflow("t").stages], sdk_dataflow("t").registration(2)["initial"][0]["delta"]
    (['records', 'tally', 'total'], 2)
    """
    flow = Dataflow(name, arity=1)
    records = flow.input("records")
    tally = flow.stage("tally", lambda i, n: Tally(), inputs=1, outputs=1)
    total = flow.stage("total", lambda i, n: Total(), inputs=1, outputs=0)
    flow.connect((records, 0), (tally, 0), partition=lambda record: int(record))
    flow.connect((tally, 0), (total, 0), partition=lambda count: 0)
    return flow


async def _serve(config: dict[str, Any], results: Path) -> None:
    stopping = asyncio.Event()
    tenants = {spec["name"]: Tenant(spec, config) for spec in config["tenants"]}
    tasks = [asyncio.create_task(t.run(stopping)) for t in tenants.values()]
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print("ready", flush=True)
    while line := await reader.readline():
        words = line.decode().split()
        if words[:1] == ["costly"] and words[1] in tenants:
            tenants[words[1]].commands.put_nowait(BURST)
        elif words[:1] == ["stop"]:
            break
    stopping.set()
    _, late = await asyncio.wait(tasks, timeout=config["finish_seconds"])
    for task in late:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for tenant in tenants.values():
        if not tenant.finished and not tenant.errors:
            tenant.errors.append(f"not finished {config['finish_seconds']} s after the stop")
    results.write_text(json.dumps({name: t.result() for name, t in tenants.items()}))
    print("done", flush=True)


def main(argv: list[str]) -> int:
    """``python -m bench.chaos_tenants CONFIG RESULTS``; the exit code."""
    config = json.loads(Path(argv[0]).read_text())
    for spec in config["tenants"]:
        planted(spec["name"])  # an unknown plant is refused before anything runs
    asyncio.run(_serve(config, Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
