"""Spark is optional everywhere: faults of the Spark process and of its JVM, under load, never
reach the core. Throughout each fault the service acknowledges progress, ``/healthz`` tells the
truth within seconds (with a reason whenever Spark is not ready), nothing acknowledged is lost,
the service never exits, and Spark is back once the fault ends; work in flight (a registration
check, an audit asked for) is done by the next Spark process, not failed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import (
    BatchWriter,
    ServiceProcess,
    as_updates,
    core_graph,
    counts_map,
    frontier_map,
    loop_graph,
    register,
    stop_writers,
    update,
    wait_for,
)
from tracker import oracle
from tracker.graph import Location

pytestmark = pytest.mark.service(spark=True, SPARK_MASTER="local[1]", TRACKER_AUDIT_SECONDS="0")
TRUTH_SECONDS = 5.0
"""``/healthz`` must say Spark is not ready within this long of a fault."""


class Writer(BatchWriter):
    """Random batches on a loop of two-coordinate times."""

    def __init__(self, name: str, service: ServiceProcess, token: str, dataflow: str, locations: list[Location]):
        super().__init__(name, service.url, token, dataflow)
        self.locations, self.rng = locations, random.Random(name)

    def batch(self) -> list[dict[str, Any]]:
        return [update(*self.rng.choice(self.locations), [self.rng.randint(0, 4), self.rng.randint(0, 4)],
                       self.rng.choice([-1, 1, 1, 2])) for _ in range(self.rng.randint(1, 3))]


class Watch(threading.Thread):
    """Samples ``/healthz`` and the writers' acknowledgements every 0.1 s."""

    def __init__(self, service: ServiceProcess, writers: list[Writer]) -> None:
        super().__init__(daemon=True)
        self.service, self.writers = service, writers
        self.health: list[tuple[float, dict[str, Any]]] = []
        self.acks: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.service.url, timeout=5.0) as client:
            while not self.done.is_set():
                now = time.monotonic()
                self.acks.append((now, sum(len(w.acked) for w in self.writers)))
                try:
                    self.health.append((now, client.get("/healthz").json()))
                except httpx.HTTPError as error:
                    self.health.append((now, {"error": str(error)}))
                time.sleep(0.1)

    def longest_ack_gap(self) -> float:
        """The longest time the writers' acknowledgements did not grow."""
        gaps, last = [0.0], self.acks[0]
        for at, count in self.acks[1:]:
            if count > last[1]:
                gaps.append(at - last[0])
                last = (at, count)
        gaps.append(self.acks[-1][0] - last[0])
        return max(gaps)

    def since(self, moment: float, until: float = float("inf")) -> list[dict[str, Any]]:
        return [h for at, h in self.health if moment <= at <= until]


def spark_pids(service: ServiceProcess) -> list[int]:
    """The Spark processes under the supervisor, found in ``/proc`` (whether connected or not)."""
    from api.run.process import descendants

    assert service.process is not None
    found = []
    for pid in descendants(service.process.pid):
        try:
            if b"api.spark.process" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def ready(service: ServiceProcess) -> dict[str, Any] | None:
    health = dict(httpx.get(service.url + "/healthz", timeout=5).json())
    return health if health["spark"] == "ready" else None


class Load:
    """Two writers on a loop, and the watch over them; :meth:`check` ends them and compares
    the service's counts and frontiers with the oracle over what was acknowledged."""

    def __init__(self, service: ServiceProcess) -> None:
        body = loop_graph(operators=3, arity=2)
        self.service = service
        self.dataflow, self.token = register(service, body)
        self.graph, self.initial = core_graph(body)
        self.writers = [Writer(f"w{i}", service, self.token, self.dataflow, self.graph.locations()) for i in range(2)]
        self.watch = Watch(service, self.writers)
        for thread in (*self.writers, self.watch):
            thread.start()

    def check(self) -> float:
        """Stop; assert nothing acknowledged was lost or applied twice; the longest ack gap."""
        self.watch.done.set()
        self.watch.join(10)
        assert stop_writers(self.writers) == []
        acked = [as_updates(b) for w in self.writers for b in w.acked]
        counts = oracle.accumulate([self.initial, *acked])
        with self.service.client(self.token) as client:
            assert client.get(f"/v1/dataflows/{self.dataflow}").json()["version"] == len(acked)
            assert counts_map(client.get(f"/v1/dataflows/{self.dataflow}/pointstamps").json()) == counts
            assert frontier_map(client.get(f"/v1/dataflows/{self.dataflow}/frontier").json()) == \
                oracle.frontiers(self.graph, counts)
        assert self.watch.health and all("error" not in h for _, h in self.watch.health), "it stopped answering"
        return self.watch.longest_ack_gap()


def assert_truthful(samples: list[dict[str, Any]]) -> None:
    """Whenever Spark is not ready, ``/healthz`` says why."""
    for health in samples:
        if health["spark"] != "ready":
            assert health.get("spark_reason"), health


def test_the_jvm_killed_alone_is_seen_the_session_rebuilt_and_work_in_flight_done(service: ServiceProcess) -> None:
    wait_for("the Spark session", lambda: ready(service), 600, service=service)
    load = Load(service)
    jvm = next(p["jvm"] for p in service.processes() if p["role"] == "spark")
    spark_before = spark_pids(service)
    checked, _ = register(service, loop_graph(operators=2, name="checked-across-the-jvm-death"))
    with service.client() as admin:
        assert admin.post(f"/v1/dataflows/{load.dataflow}/audit").status_code == 202
    os.kill(jvm, signal.SIGKILL)
    killed = time.monotonic()
    seen = wait_for("/healthz to see the JVM gone", lambda: (h := httpx.get(service.url + "/healthz").json())[
        "spark"] != "ready" and h, 30, interval=0.1)
    assert time.monotonic() - killed <= TRUTH_SECONDS, seen
    back = wait_for("Spark back", lambda: ready(service), 120, service=service)
    assert back["spark"] == "ready" and spark_pids(service) != spark_before
    assert next(p["jvm"] for p in service.processes() if p["role"] == "spark") != jvm
    assert any("JVM" in h.get("spark_reason", "") for h in load.watch.since(killed)), load.watch.since(killed)
    with service.client() as admin:  # the check and the audit in flight were done by the new process
        status = wait_for("the check", lambda: (s := admin.get(f"/v1/dataflows/{checked}").json()["status"])[
            "spark_check"] not in ("pending", "running") and s, 120, service=service)
        assert status["spark_check"] == "agreed", status
        audit = wait_for("the audit", lambda: admin.get(f"/v1/dataflows/{load.dataflow}").json()["status"]["audit"],
                         120, service=service)
        assert audit["ok"] is True, audit
    assert_truthful(load.watch.since(killed))
    assert load.check() < 2.0


def test_a_stopped_spark_process_is_reported_within_seconds_and_replaced(service: ServiceProcess) -> None:
    wait_for("the Spark session", lambda: ready(service), 600, service=service)
    load = Load(service)
    stopped = spark_pids(service)[0]
    os.kill(stopped, signal.SIGSTOP)
    began = time.monotonic()
    try:
        seen = wait_for("/healthz to see the Spark process stopped", lambda: (
            h := httpx.get(service.url + "/healthz").json())["spark"] == "unresponsive" and h, 30, interval=0.1)
        assert time.monotonic() - began <= TRUTH_SECONDS, seen
        time.sleep(max(0.0, 40 - (time.monotonic() - began)))
    finally:
        with contextlib.suppress(ProcessLookupError):  # its supervisor may have killed it for its silence
            os.kill(stopped, signal.SIGCONT)
    ended = time.monotonic()
    wait_for("Spark back", lambda: ready(service), 120, service=service)
    assert time.monotonic() - ended <= 90
    assert_truthful(load.watch.since(began))
    assert load.check() < 2.0


def test_the_spark_process_killed_ten_times_in_ten_seconds_never_stops_the_service(service: ServiceProcess) -> None:
    wait_for("the Spark session", lambda: ready(service), 600, service=service)
    assert service.process is not None
    supervisor = service.process.pid
    load = Load(service)
    began = time.monotonic()
    kills = 0
    while kills < 10:
        for pid in spark_pids(service):
            try:
                os.kill(pid, signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
        time.sleep(1.0)
    ended = time.monotonic()
    after = load.watch.since(began + TRUTH_SECONDS, ended)
    assert all(h["spark"] != "ready" for h in after if h), "reported ready while it was being killed"
    assert any(h["spark"] == "down" and "SIGKILL" in h.get("spark_reason", "") for h in after), after[-5:]
    wait_for("Spark back", lambda: ready(service), 120, service=service)
    assert time.monotonic() - ended <= 90
    assert service.process.poll() is None and service.process.pid == supervisor, "the service exited for Spark"
    assert_truthful(load.watch.since(began))
    assert load.check() < 2.0


def test_a_graph_the_spark_process_cannot_rebuild_is_answered_with_errors_on_an_open_channel(tmp_path: Path) -> None:
    """Each piece of that dataflow's work is answered with an error naming why (its check
    ``error``, its audit stopped, its micro-batch failed), and the connection stays open for
    the others: nothing is dropped, so nothing is resent in a loop."""
    from api.channel.link import Peer, frame, read_frame
    from api.channel.messages import Applied, Audit, Audited, Check, Checked, Forget, Know, MicroBatch, decode_to_hot
    from api.config import Settings
    from api.schema.spec import Spec
    from api.spark.process import SparkProcess
    from tests.helpers import loop_then_stage

    body = loop_then_stage()  # no scope of it holds a time of three coordinates
    broken = Spec(name="broken", arity=1, nodes=body["nodes"], edges=body["edges"],
                  initial=[(1, 0, "source", (0, 0, 0), 1)])

    async def exchange() -> list[Any]:
        process = SparkProcess(Settings(warehouse=tmp_path, spark=True, delta=False))
        address = str(tmp_path / "spark.sock")
        server = await asyncio.start_unix_server(lambda r, w: process.serve(Peer(r, w)), address)
        reader, writer = await asyncio.open_unix_connection(address)
        for message in (Know(df="bad", spec=broken), Check(df="bad"), Audit(df="bad", version=3, counts=[], live=[]),
                        MicroBatch(df="bad", version=3, updates=[]), Forget(df="bad"), Check(df="bad")):
            writer.write(frame(message))
        answers: list[Any] = []
        while len([a for a in answers if not isinstance(a, Status)]) < 4:
            payload = await asyncio.wait_for(read_frame(reader), 10)
            assert payload is not None, f"the connection was closed after {answers}"
            answers.append(decode_to_hot(payload))
        assert not writer.is_closing()
        writer.close()
        server.close()
        return [a for a in answers if not isinstance(a, Status)]

    from api.channel.messages import Status

    checked, audited, applied, unknown = asyncio.run(exchange())
    assert isinstance(checked, Checked) and checked.result == "error", checked
    assert checked.detail is not None and "cannot rebuild this graph" in checked.detail and \
        "initial pointstamps: update 0" in checked.detail, checked.detail
    assert isinstance(audited, Audited) and audited.stop and audited.audit["ok"] is None, audited
    assert isinstance(applied, Applied) and applied.error and applied.version == 3, applied
    assert isinstance(unknown, Checked) and unknown.result == "error", unknown  # work for a graph it was never told
