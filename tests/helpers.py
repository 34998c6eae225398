"""What the test modules share besides fixtures: graphs, registration and update builders, and
the conversions of the service's JSON that oracle comparisons need.

Test modules import helpers from here (or from ``tests/strategies.py``), never from each other.
The service launcher lives in :mod:`api.run.process` and the registration helpers in
:mod:`bench.workloads`, since the benchmarks use them too; they are re-exported here so that a
test module has one place to import from. Fixtures are in ``tests/conftest.py``.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx

from api.run.process import ADMIN_TOKEN, ServiceProcess, free_port
from bench.workloads import core_graph, loop_graph, program_token, register, update
from tracker.graph import Connection, Edge, Graph, Location, Node, Update
from tracker.timestamp import PathSummary, less_equal

__all__ = [
    "ADMIN_TOKEN",
    "ROOT",
    "BatchWriter",
    "ServiceProcess",
    "ServiceStarter",
    "as_updates",
    "assert_oversized_progress_refused",
    "chain",
    "core_graph",
    "counts_map",
    "edge",
    "free_port",
    "frontier_map",
    "loop_graph",
    "loop_then_stage",
    "nested_pipeline",
    "program_token",
    "register",
    "stop_writers",
    "update",
    "violations",
    "wait_for",
]

ROOT = Path(__file__).resolve().parent.parent
"""The source tree's root (the working directory of the subprocesses the tests run)."""


class ServiceStarter:
    """Starts real services (:class:`ServiceProcess`) with warehouses under ``root``, and stops
    every one it started at :meth:`stop_all`. The ``start_service`` and ``service`` fixtures
    (``tests/conftest.py``) hand one out and call :meth:`stop_all` at their teardown."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[ServiceProcess] = []

    def __call__(self, *, spark: bool = False, engine: str = "native", shards: int = 1, shard_hosts: str = "",
                 proxy: str = "auto", **env: str) -> ServiceProcess:
        """Start a service on a fresh warehouse and wait until it answers ``/healthz``.

        ``env`` is added to the service's environment (``TRACKER_FLUSH_SECONDS="0.2"``...);
        ``spark=True`` lets it start its Spark session, ``engine="spark"`` keeps frontiers in
        Spark, ``shards=N`` runs N shards behind HAProxy (``proxy="none"``: without it;
        ``shard_hosts``: shards said to run elsewhere, ``--shard-hosts``). The first warehouse
        is ``root / "warehouse"``, any later one ``warehouse-2``... A restart on the same
        warehouse, or ``kill -9``, are the process's own methods."""
        name = "warehouse" if not self.started else f"warehouse-{len(self.started) + 1}"
        service = ServiceProcess(self.root / name, spark=spark, engine=engine, env=env, shards=shards,
                                 shard_hosts=shard_hosts, proxy=proxy)
        self.started.append(service)  # before start(): one that never got healthy is stopped too
        return service.start()

    def stop_all(self) -> None:
        """Stop (gracefully, or by SIGKILL if it lingers) every service started here still running."""
        for service in self.started:
            service.stop()


def chain(length: int, arity: int = 1) -> Graph:
    """``length`` one-in one-out operators in a row, closed by a +1 feedback into operator 1."""
    step = PathSummary((0,) * (arity - 1) + (1,))
    nodes = [Node(0, 0, 1)] + [Node(i, 2 if i == 1 else 1, 1) for i in range(1, length)]
    nodes.append(Node(length, 1, 1, "feedback", (Connection(0, 0, (step,)),)))
    edges = [Edge(Location.source(i, 0), Location.target(i + 1, 0)) for i in range(length)]
    edges.append(Edge(Location.source(length, 0), Location.target(1, 1)))
    return Graph.build(arity, nodes, edges)


def as_updates(batch: list[dict[str, Any]]) -> list[Update]:
    """A batch of update JSON (as :func:`update` builds it) as core updates."""
    return [(Location(**u["location"]), tuple(u["time"]), u["delta"]) for u in batch]


def frontier_map(answer: dict[str, Any]) -> dict[Location, list[tuple[int, ...]]]:
    """A ``/frontier`` answer as ``{location: frontier}``, comparable with ``oracle.frontiers``."""
    return {Location(**row["location"]): [tuple(t) for t in row["frontier"]] for row in answer["locations"]}


def counts_map(rows: list[dict[str, Any]]) -> dict[tuple[Location, tuple[int, ...]], int]:
    """A ``/pointstamps`` answer as ``{(location, time): count}``, comparable with ``oracle.accumulate``."""
    return {(Location(**r["location"]), tuple(r["time"])): r["count"] for r in rows}


def violations(events: list[Any]) -> list[str]:
    """Every message at a time ``<= t`` that reached a vertex after its ``on_notify(t)``.

    ``events`` is a worker trace: ``["recv", stage, worker, port, time]`` and
    ``["notify", stage, worker, time]`` in the order the callbacks ran (per vertex)."""
    notified: dict[tuple[int, int], list[tuple[int, ...]]] = defaultdict(list)
    found = []
    for event in events:
        key = (event[1], event[2])
        if event[0] == "notify":
            notified[key].append(tuple(event[3]))
        else:
            time = tuple(event[4])
            early = [t for t in notified[key] if less_equal(time, t)]
            if early:
                found.append(f"stage {key[0]} worker {key[1]}: message at {time} after on_notify{early[0]}")
    return found


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 180.0, *, interval: float = 0.5,
             service: ServiceProcess | None = None) -> Any:
    """``probe()``'s first truthy value, calling it every ``interval`` seconds; an
    ``AssertionError`` naming ``what`` (and the tail of ``service``'s log, if given) once
    ``timeout`` seconds pass without one.

    >>> wait_for("a value", iter([0, "", 7]).__next__, interval=0)
    7
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    tail = f":\n{service.log_tail()}" if service is not None else ""
    raise AssertionError(f"timed out waiting for {what}{tail}")


class BatchWriter(threading.Thread):
    """A worker thread posting ``batch()`` to a dataflow's ``/progress`` with seq 0, 1, 2...
    until :attr:`stop` is set. Like a real worker, it resends the same batch after a transport
    error (it cannot know whether the batch got in), for up to 90 s (across service restarts),
    then moves on once answered. :attr:`acked` holds every batch answered 200, in seq order;
    :attr:`errors` the reason it gave up (no answer for 90 s, or any other status), if it did.

    Subclasses override :meth:`batch`; the thread's name is the worker's name."""

    def __init__(self, name: str, url: str, token: str, dataflow_id: str) -> None:
        super().__init__(name=name, daemon=True)
        self.url, self.token, self.dataflow_id = url, token, dataflow_id
        self.acked: list[list[dict[str, Any]]] = []
        self.stop = threading.Event()
        self.errors: list[str] = []

    def batch(self) -> list[dict[str, Any]]:
        """The next batch's updates (as :func:`update` builds them); called once per seq."""
        raise NotImplementedError

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=5.0) as client:
            while not self.stop.is_set():
                seq, updates = len(self.acked), self.batch()
                deadline = time.monotonic() + 90
                while True:
                    try:
                        answer = client.post(f"/v1/dataflows/{self.dataflow_id}/progress",
                                             json={"worker": self.name, "seq": seq, "updates": updates})
                    except httpx.HTTPError:
                        if time.monotonic() > deadline:
                            self.errors.append(f"seq {seq}: no answer for 90 s")
                            return
                        time.sleep(0.02)
                        continue
                    if answer.status_code in (502, 503) and "shard_unavailable" in answer.text:
                        time.sleep(0.02)  # the shard restarts: as after a transport error, resend it
                        continue
                    if answer.status_code != 200:
                        self.errors.append(f"seq {seq}: {answer.status_code} {answer.text}")
                        return
                    self.acked.append(updates)
                    break


def stop_writers(writers: Sequence[BatchWriter], timeout: float = 120.0) -> list[str]:
    """Set every writer's :attr:`~BatchWriter.stop`, wait up to ``timeout`` seconds for each to
    end, and return every error they recorded (in writer order)."""
    for writer in writers:
        writer.stop.set()
    for writer in writers:
        writer.join(timeout)
    return [error for writer in writers for error in writer.errors]


def assert_oversized_progress_refused(client: httpx.Client, dataflow_id: str, body: dict[str, Any],
                                      chunks: list[bytes]) -> httpx.Response:
    """Post ``body`` (over the service's body limit) to the dataflow's ``/progress``, then
    ``chunks`` as a streamed body (no ``Content-Length``: the size is only known as it is read);
    assert the first is refused 413 ``body_too_large`` and the second 413. Returns the first answer."""
    answer = client.post(f"/v1/dataflows/{dataflow_id}/progress", json=body)
    assert answer.status_code == 413 and answer.json()["error"] == "body_too_large"
    streamed = client.post(f"/v1/dataflows/{dataflow_id}/progress", content=iter(chunks),
                           headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413
    return answer


_SHAPE = ((40, 4), (25, 3), (20, 2), (10, 1), (8, 1), (8, 0))
"""Per level of :func:`nested_pipeline` (the root first): its plain operators and its scopes."""


def _pipeline_scope(level: int, prefix: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    plain, scopes = _SHAPE[level]
    nodes: list[dict[str, Any]] = []
    chain: list[int] = []
    if level == 0:
        nodes.append({"id": 0, "name": "source", "inputs": 0, "outputs": 1})
        chain.append(0)
    every = max(1, plain // (scopes + 1))
    for i in range(plain):
        chain.append(len(nodes) + (level > 0))
        nodes.append({"id": chain[-1], "name": f"{prefix}map{i}", "inputs": 1, "outputs": 1})
        made = sum(1 for n in nodes if "scope" in n)
        if made < scopes and (i + 1) % every == 0:
            kind = "iterative" if (level + made) % 2 == 0 else "region"
            inner_nodes, inner_edges = _pipeline_scope(level + 1, f"{prefix}s{made + 1}.")
            chain.append(len(nodes) + (level > 0))
            nodes.append({"id": chain[-1], "name": f"{prefix}scope{made + 1}", "inputs": 1, "outputs": 1,
                          "scope": {"kind": kind, "nodes": inner_nodes, "edges": inner_edges}})
    if level == 0:
        chain.append(len(nodes))
        nodes.append({"id": chain[-1], "name": "sink", "inputs": 1, "outputs": 0})
    path = ([0] if level > 0 else []) + chain + ([0] if level > 0 else [])  # node 0 inside: the boundary
    edges = [{"source": {"node": a, "port": 0}, "target": {"node": b, "port": 0}} for a, b in pairwise(path)]
    return nodes, edges


def edge(src: tuple[int, int], dst: tuple[int, int]) -> dict[str, Any]:
    """An edge's JSON from ``(node, port)`` to ``(node, port)``."""
    return {"source": {"node": src[0], "port": src[1]}, "target": {"node": dst[0], "port": dst[1]}}


def loop_then_stage(name: str = "loop") -> dict[str, Any]:
    """A registration body: input 0 -> iterative scope 1 (step 1, feedback 2 adding one to the
    loop counter) -> after 2; 11 locations over its two scopes.

    >>> [n.get("scope", {}).get("kind") for n in loop_then_stage()["nodes"]]
    [None, 'iterative', None]
    """
    loop = {"kind": "iterative",
            "nodes": [{"id": 1, "name": "step", "inputs": 2, "outputs": 1},
                      {"id": 2, "name": "feedback", "inputs": 1, "outputs": 1,
                       "connections": [{"input": 0, "output": 0, "summaries": [[0, 1]]}]}],
            "edges": [edge((0, 0), (1, 0)), edge((1, 0), (2, 0)), edge((2, 0), (1, 1)), edge((1, 0), (0, 0))]}
    return {"name": name, "nodes": [{"id": 0, "name": "input", "inputs": 0, "outputs": 1},
                                    {"id": 1, "name": "loop", "inputs": 1, "outputs": 1, "scope": loop},
                                    {"id": 2, "name": "after", "inputs": 1, "outputs": 0}],
            "edges": [edge((0, 0), (1, 0)), edge((1, 0), (2, 0))]}


def nested_pipeline(name: str = "pipeline") -> dict[str, Any]:
    """A registration body of 1,094 operators in a pipeline with scopes nested five deep (iterative
    and region ones alternating), the shape a real timely program registers: the root's 42
    operators and 4 scopes, each scope a chain of operators around scopes of its own.

    >>> def count(nodes): return sum(1 + count(n["scope"]["nodes"]) if "scope" in n else 1 for n in nodes)
    >>> count(nested_pipeline()["nodes"])
    1094
    """
    nodes, edges = _pipeline_scope(0, "")
    return {"name": name, "nodes": nodes, "edges": edges}
