"""End to end: the real service (``tracker serve``) and 2-3 real worker processes per run.

Each run registers the example's dataflow, starts the workers (``tracker worker``), which
exchange data over loopback TCP and talk to the service over WebSockets, and compares the
merged rows with the sequential reference. Traces of every callback are checked for
notification safety. Two runs break the workers' connections to the service mid-run: a proxy
in front of one worker cuts it off for a while, and the service itself is killed (``-9``) and
restarted; results must not change, and the service must end with no pointstamp left over
(a batch applied twice, or lost, would leave a non-zero count behind).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ADMIN_TOKEN, ROOT, ServiceProcess, free_port, program_token, violations
from tracker.graph import Location
from tracker.worker.client import register
from tracker.worker.cluster import launch, load_example
from tracker.worker.link import LinkFailure, ServiceLink

# Delta flushing off: these tests are about workers, and the machine's 2 cores are shared.
pytestmark = pytest.mark.service(TRACKER_DELTA="0")


def leftover_pointstamps(service: ServiceProcess, dataflow: str) -> list[Any]:
    with service.client() as client:
        answer = client.get(f"/v1/dataflows/{dataflow}/pointstamps")
    assert answer.status_code == 200, answer.text
    return answer.json()


def read_traces(directory: Path) -> list[list[Any]]:
    return [[json.loads(line) for line in path.read_text().splitlines()] for path in sorted(directory.glob("*.jsonl"))]


@pytest.mark.parametrize("run", range(9))
def test_examples_on_worker_processes_match_the_reference(service: ServiceProcess, tmp_path: Path, run: int) -> None:
    rng = random.Random(run)
    # components (a loop scope) and digitroot (a loop in a loop) register nested scopes.
    name = ("wordcount", "components", "digitroot")[run % 3]
    workers = (3, 2, 2, 3, 3, 3, 2, 2, 3)[run]
    link = "sse" if run >= 6 else "ws"  # the last three runs (one per example) use the POST + SSE fallback
    example = load_example(name)
    config = {**example.DEFAULTS, "seed": 100 + run, "epochs": rng.randint(4, 6)}
    delay = rng.choice([0.001, 0.003, 0.006])  # random delay of every data message, up to this
    result = launch(name, config, service.url, ADMIN_TOKEN, workers, delay=delay,
                    progress_delay=rng.choice([0.0, 0.003]), seed=run, trace_dir=tmp_path, timeout=60, link=link)
    assert result["rows"] == example.reference(config)
    assert len(result["rows"]) == config["epochs"]
    traces = read_traces(tmp_path)
    assert len(traces) == workers and all(traces), "every worker ran callbacks"
    for trace in traces:
        assert violations(trace) == []
    assert leftover_pointstamps(service, result["dataflow"]) == []
    with service.client() as client:  # workers that keep the protocol never move a frontier backwards
        assert client.get(f"/v1/dataflows/{result['dataflow']}").json()["status"]["regression_count"] == 0


class Proxy:
    """A TCP proxy to the service that can cut every connection and refuse new ones for a while."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.refusing = False
        self.forwarded = 0  # bytes from the worker to the service
        self.cuts = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), daemon=True)
        self._thread.start()
        assert ready.wait(10)

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", self.port))
        ready.set()
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer, True), self._pipe(up_reader, writer, False))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool) -> None:
        try:
            while data := await reader.read(65536):
                if upstream:
                    self.forwarded += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()

    def cut(self, outage: float) -> None:
        """Abort every connection now and refuse new ones for ``outage`` seconds."""
        def go() -> None:
            self.refusing = True
            self.cuts += 1
            for writer in self._writers:
                writer.transport.abort()
            self._writers.clear()
            self._loop.call_later(outage, setattr, self, "refusing", False)
        self._loop.call_soon_threadsafe(go)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def launch_in_thread(**kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = launch(**kwargs)
        except BaseException as error:  # reported by the test
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def test_cutting_a_workers_connection_mid_run_changes_no_result(service: ServiceProcess) -> None:
    example = load_example("components")
    config = {**example.DEFAULTS, "seed": 7, "epochs": 6, "pace": 0.2}
    proxy = Proxy(service.port)
    try:
        thread, outcome = launch_in_thread(
            name="components", config=config, url=service.url, token=ADMIN_TOKEN, workers=3, delay=0.01,
            seed=7, timeout=60, service_url=[service.url, proxy.url, service.url])
        deadline = time.monotonic() + 30
        while proxy.forwarded < 2000 and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.01)
        assert thread.is_alive(), f"the run ended before the cut: {outcome}"
        proxy.cut(outage=0.8)
        thread.join(90)
    finally:
        proxy.close()
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert result["rows"] == example.reference(config)
    stats = result["stats"][1]
    assert stats["link_connections"] >= 2, f"worker 1 never reconnected: {stats}"
    assert leftover_pointstamps(service, result["dataflow"]) == []


@pytest.mark.parametrize("link", ["ws", "sse"])
def test_service_restart_mid_run_loses_and_duplicates_nothing(service: ServiceProcess, link: str) -> None:
    example = load_example("wordcount")
    config = {**example.DEFAULTS, "seed": 11, "epochs": 8, "pace": 0.25}  # >= 2 s of input
    with service.client() as client:
        before = {d["id"] for d in client.get("/v1/dataflows").json()}
    thread, outcome = launch_in_thread(name="wordcount", config=config, url=service.url, token=ADMIN_TOKEN,
                                       workers=2, delay=0.01, progress_delay=0.01, seed=3, timeout=60, link=link)
    deadline = time.monotonic() + 30
    version = 0
    while version < 3 and time.monotonic() < deadline and thread.is_alive():
        with service.client() as client:
            version = max([d["version"] for d in client.get("/v1/dataflows").json() if d["id"] not in before] or [0])
        time.sleep(0.02)
    assert thread.is_alive() and version >= 3, f"no progress to interrupt (version {version}): {outcome}"
    service.kill9()
    time.sleep(0.3)
    service.restart()
    thread.join(90)
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert result["rows"] == example.reference(config)
    # The restart interrupted the run: a worker came back to the new service. (Not necessarily
    # every one: a worker that already knew all it needed may finish without reconnecting its
    # SSE stream, which made an `all` here fail now and then.)
    assert any(s.get("link_connections", 0) >= 2 for s in result["stats"]), result["stats"]
    assert leftover_pointstamps(service, result["dataflow"]) == []


def test_example_command_prints_the_reference_rows(service: ServiceProcess) -> None:
    command = [sys.executable, "-m", "tracker.cli", "example", "components", "--url", service.url, "--workers", "2",
               "--epochs", "3", "--check"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"TRACKER_PROGRAM_TOKEN": program_token(service), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    example = load_example("components")
    expected = example.render(example.reference({**example.DEFAULTS, "epochs": 3}))
    header, *rows = done.stdout.splitlines()
    assert re.fullmatch("dataflow components registered: id [0-9a-f]{32}", header), header
    assert rows == [*expected, "OK: 3 epochs equal the sequential reference"]


def test_link_resends_unacknowledged_batches_and_the_service_drops_duplicates(service: ServiceProcess) -> None:
    flow = load_example("wordcount").build({})
    dataflow, token = register(service.url, ADMIN_TOKEN, flow.registration(1))
    source = Location.source(0, 0)

    async def scenario() -> tuple[ServiceLink, int]:
        link = ServiceLink(service.url, dataflow, token, "w0")
        runner = asyncio.create_task(link.run())
        link.submit([(source, (1,), 1), (source, (0,), -1)])
        while not link.idle() or (link.view.version or 0) < 1:
            await asyncio.sleep(0.01)
        # As if the ack of seq 0 had been lost with the connection: it must be resent as seq 0.
        link.unacked.append((0, json.dumps({"worker": "w0", "seq": 0, "updates": [
            {"location": {"node": 0, "port": 0, "kind": "source"}, "time": [1], "delta": 1},
            {"location": {"node": 0, "port": 0, "kind": "source"}, "time": [0], "delta": -1}]})))
        await link._ws.close()
        while not link.idle():
            await asyncio.sleep(0.01)
        link.submit([(source, (2,), 1), (source, (1,), -1)])  # seq 1 follows on the new connection
        while not link.idle() or (link.view.version or 0) < 2:
            await asyncio.sleep(0.01)
        await link.close()
        await asyncio.wait_for(runner, 5)
        return link, link.view.version

    link, version = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert link.stats["connections"] == 2 and link.stats["resent"] == 1 and link.stats["duplicates"] == 1
    assert version == 2, "the resent batch was not applied a second time"
    assert leftover_pointstamps(service, dataflow) == [
        {"location": {"node": 0, "port": 0, "kind": "source"}, "time": [2], "count": 1}]


def test_link_failures_surface_instead_of_retrying_forever(service: ServiceProcess) -> None:
    flow = load_example("wordcount").build({})
    dataflow, token = register(service.url, ADMIN_TOKEN, flow.registration(1))

    async def bad_token() -> None:
        link = ServiceLink(service.url, dataflow, "not-a-token", "w0")
        link.refusal_window = 0.3
        await asyncio.wait_for(link.run(), 10)

    async def bad_update() -> None:
        link = ServiceLink(service.url, dataflow, token, "w0")
        link.submit([(Location.target(99, 0), (0,), 1)])
        await asyncio.wait_for(link.run(), 10)

    with pytest.raises(LinkFailure, match="refused the connection"):
        asyncio.run(bad_token())
    with pytest.raises(LinkFailure, match="invalid_update"):
        asyncio.run(bad_update())


def test_a_server_error_is_retried_like_a_lost_connection() -> None:
    """A 5xx answer to a batch (503 ``log_failed`` from a service whose log failed, until it is
    restarted) is the service's trouble, not the batch's: the WebSocket link reconnects and
    resends the batch with the same seq, as the POST link does; a 4xx stays fatal (above)."""
    from websockets.asyncio.server import ServerConnection, serve

    answered: list[str] = []

    async def service(ws: ServerConnection) -> None:  # the first batch gets a 503, every later one an ack
        async for raw in ws:
            batch = json.loads(raw)
            if not answered:
                answered.append("503")
                await ws.send(json.dumps({"type": "error", "status": 503, "error": "log_failed", "seq": batch["seq"],
                                          "detail": "the write-ahead log failed; the service must restart"}))
            else:
                answered.append("ack")
                await ws.send(json.dumps({"type": "ack", "applied": True, "duplicate": False, "version": 1,
                                          "worker": batch["worker"], "seq": batch["seq"]}))

    async def scenario() -> ServiceLink:
        async with serve(service, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            link = ServiceLink(f"http://127.0.0.1:{port}", "df", "token", "w0")
            runner = asyncio.create_task(link.run())
            link.submit([(Location.source(0, 0), (1,), 1)])
            while not link.idle():
                if runner.done():
                    runner.result()  # a LinkFailure surfaces here
                await asyncio.sleep(0.01)
            await link.close()
            await asyncio.wait_for(runner, 5)
            return link

    link = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert answered == ["503", "ack"] and link.stats["connections"] == 2 and link.stats["resent"] == 1, link.stats
