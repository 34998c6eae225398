"""Round trip as a property: whatever ``POST /v1/dataflows`` accepts, and every batch it
acknowledges, is the same after the write-ahead log, ``kill -9`` and recovery, the Spark
process's rebuild of the graph, the Delta tables and ``GET``.

Random nested dataflows (scopes of both kinds, loops, names, ``last_epoch``, initial pointstamps
in any scope or none) take random batches; the service is killed with ``kill -9`` at a random
point (a batch may be in flight), restarted, and the rest of the batches sent again from the
first unacknowledged one: the answers, the counts and every frontier must equal the oracle's
(:mod:`tracker.scoped_oracle`), with each batch applied exactly once. At the end, Spark's check
of every dataflow must agree with the native one, an audit of each must find the live frontier
right, and the Delta tables, read back by delta-rs through Polars, must hold each graph as
registered, its counts and frontiers as the oracle says, and each batch once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.durability.records import Register
from api.durability.wal import WriteAheadLog
from api.schema.models import RegisterRequest
from api.schema.spec import registration_record
from api.shards.layout import wal_directory
from spark_jobs.storage import Warehouse
from tests.helpers import ServiceProcess, ServiceStarter, loop_then_stage, wait_for
from tests.strategies import nested_batches, nested_bodies
from tracker import scoped_oracle
from tracker.scope import NestedGraph, ScopedLocation

Batch = list[tuple[ScopedLocation, tuple[int, ...], int]]


@st.composite
def registrations(draw: st.DrawFn) -> tuple[NestedGraph, dict[str, Any], Batch]:
    """A random registration body, its graph and the initial counts the oracle starts from."""
    arity, body = draw(nested_bodies())
    nested = NestedGraph.from_json(arity, body)
    _name_some_nodes(draw, body["nodes"])
    request: dict[str, Any] = {"name": draw(st.text(min_size=1, max_size=30)), "timestamp_arity": arity, **body}
    if draw(st.booleans()):
        request["last_epoch"] = draw(st.integers(0, 1_000))
    holders = [loc for loc in nested.locations() if nested.holds_pointstamps(loc)]
    initial: Batch = []
    if holders and draw(st.booleans()):
        for _ in range(draw(st.integers(1, 4))):
            loc = draw(st.sampled_from(holders))
            initial.append((loc, tuple(draw(st.lists(st.integers(0, 3), min_size=nested.arity_of(loc.scope),
                                                     max_size=nested.arity_of(loc.scope)))),
                            draw(st.integers(1, 3))))
        request["initial"] = [{"location": {**({"scope": list(loc.scope)} if loc.scope or draw(st.booleans())
                                                else {}), "node": loc.node, "port": loc.port, "kind": loc.kind},
                               "time": list(t), "delta": d} for loc, t, d in initial]
    else:  # none named: each output of each root input (no inputs, not a scope) holds one at zero
        if draw(st.booleans()):
            request["initial"] = []
        initial = [(ScopedLocation((), node["id"], port, "source"), (0,) * arity, 1) for node in body["nodes"]
                   if node["inputs"] == 0 and "scope" not in node for port in range(node["outputs"])]
    return nested, request, initial


def _name_some_nodes(draw: st.DrawFn, nodes: list[dict[str, Any]]) -> None:
    for node in nodes:
        if draw(st.booleans()):
            node["name"] = draw(st.text(min_size=1, max_size=12))
        if "scope" in node:
            _name_some_nodes(draw, node["scope"]["nodes"])


def updates_json(batch: Batch) -> list[dict[str, Any]]:
    return [{"location": {"scope": list(loc.scope), "node": loc.node, "port": loc.port, "kind": loc.kind},
             "time": list(t), "delta": d} for loc, t, d in batch]


def scoped_frontiers(answer: dict[str, Any]) -> dict[ScopedLocation, list[tuple[int, ...]]]:
    return {ScopedLocation(tuple(r["location"].get("scope", ())), r["location"]["node"], r["location"]["port"],
                           r["location"]["kind"]): [tuple(t) for t in r["frontier"]] for r in answer["locations"]}


def scoped_counts(rows: list[dict[str, Any]]) -> dict[tuple[ScopedLocation, tuple[int, ...]], int]:
    return {(ScopedLocation(tuple(r["location"].get("scope", ())), r["location"]["node"], r["location"]["port"],
                            r["location"]["kind"]), tuple(r["time"])): r["count"] for r in rows}


def canonical(body: dict[str, Any]) -> dict[str, Any]:
    """A registration as the service reads it (defaults filled in), comparable across the trip;
    ``initial: []`` names none, as an absent one does."""
    parsed = RegisterRequest.model_validate(body).model_dump()
    parsed["initial"] = parsed["initial"] or None
    for update in parsed["initial"] or []:
        update["location"]["scope"] = update["location"]["scope"] or None
    return parsed


class Kept:
    """What the service acknowledged of one dataflow, for the checks at the end."""

    def __init__(self, dataflow: str, token: str, nested: NestedGraph, request: dict[str, Any],
                 counts: dict[tuple[ScopedLocation, tuple[int, ...]], int], batches: int) -> None:
        self.dataflow, self.token, self.nested, self.request = dataflow, token, nested, request
        self.counts, self.batches = counts, batches


def _post(service: ServiceProcess, token: str, dataflow: str, seq: int, batch: Batch) -> httpx.Response:
    with service.client(token) as client:
        return client.post(f"/v1/dataflows/{dataflow}/progress",
                           json={"worker": "w", "seq": seq, "updates": updates_json(batch)})


def _in_flight(service: ServiceProcess, token: str, dataflow: str, seq: int, batch: Batch, delay: float) -> None:
    """Send batch ``seq`` and ``kill -9`` the service ``delay`` seconds later, whatever became of it."""
    def send() -> None:
        with contextlib.suppress(httpx.HTTPError):  # killed under it: the resend settles its outcome
            _post(service, token, dataflow, seq, batch)

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(delay)
    service.kill9()
    sender.join(30)


def test_whatever_is_accepted_comes_back_the_same_after_kill_9(start_service: ServiceStarter) -> None:
    service = start_service(spark=True, TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.5",
                            TRACKER_AUDIT_SECONDS="0")
    kept: list[Kept] = []

    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        nested, request, initial = data.draw(registrations(), label="registration")
        batches = data.draw(nested_batches(nested), label="batches") if any(
            nested.holds_pointstamps(loc) for loc in nested.locations()) else []
        with service.client() as client:
            answer = client.post("/v1/dataflows", json=request)
        assert answer.status_code == 201, answer.text
        dataflow, token = answer.json()["id"], answer.json()["token"]
        acknowledged = data.draw(st.integers(0, len(batches)), label="acknowledged before the kill")
        for seq in range(acknowledged):
            assert _post(service, token, dataflow, seq, batches[seq]).json()["applied"]
        if acknowledged < len(batches) and data.draw(st.booleans(), label="a batch in flight"):
            _in_flight(service, token, dataflow, acknowledged, batches[acknowledged],
                       data.draw(st.floats(0, 0.01), label="kill after"))
        else:
            service.kill9()
        service.restart()
        for seq in range(acknowledged, len(batches)):  # the first may have been applied: a duplicate then
            answer = _post(service, token, dataflow, seq, batches[seq])
            assert answer.status_code == 200 and answer.json()["version"] == seq + 1, answer.text
        counts = scoped_oracle.accumulate([initial, *batches])
        with service.client(token) as client:
            detail = client.get(f"/v1/dataflows/{dataflow}").json()
            assert canonical({k: detail[k] for k in ("name", "timestamp_arity", "nodes", "edges", "initial",
                                                     "last_epoch")}) == canonical(request)
            assert detail["version"] == len(batches)
            assert scoped_counts(client.get(f"/v1/dataflows/{dataflow}/pointstamps").json()) == counts
            assert scoped_frontiers(client.get(f"/v1/dataflows/{dataflow}/frontier").json()) == \
                scoped_oracle.frontiers(nested, counts)
        kept.append(Kept(dataflow, token, nested, request, counts, len(batches)))

    one()
    _spark_agrees(service, kept)
    _delta_agrees(service, kept)


def _spark_agrees(service: ServiceProcess, kept: list[Kept]) -> None:
    """Every registration check concluded ``agreed`` (logged before a kill, or run after it on
    the graph the Spark process rebuilt), and an audit of each finds the live frontier right."""
    def status(item: Kept) -> dict[str, Any]:
        with service.client() as client:
            return dict(client.get(f"/v1/dataflows/{item.dataflow}").json()["status"])

    for item in kept:
        check = wait_for("the Spark check", lambda item=item: status(item)["spark_check"] not in (  # type: ignore[misc]
            "pending", "running") and status(item), 600, service=service)
        assert check["spark_check"] == "agreed", (item.request, check)
        with service.client() as client:
            queued = wait_for("the audit queued", lambda item=item: client.post(  # type: ignore[misc]
                f"/v1/dataflows/{item.dataflow}/audit").status_code == 202, service=service)
        assert queued
        audit = wait_for("the audit", lambda item=item: status(item)["audit"], 600,  # type: ignore[misc]
                         service=service)
        assert audit["ok"] is True, (item.request, audit)


def _delta_agrees(service: ServiceProcess, kept: list[Kept]) -> None:
    """The tables, read back by delta-rs (Polars), hold each graph as registered, its counts and
    frontiers as the oracle says, and each batch once."""
    warehouse = Warehouse(service.warehouse)
    wait_for("compaction of every dataflow", lambda: all(
        warehouse.pointstamps_version(item.dataflow) == item.batches for item in kept), service=service)
    service.stop()
    tables = {name: pl.read_delta(str(service.warehouse / name)) for name in
              ("dataflows", "frontiers", "pointstamps", "progress")}
    for item in kept:
        mine = {name: t.filter(pl.col("dataflow_id") == item.dataflow) for name, t in tables.items()}
        assert mine["dataflows"].select("name", "timestamp_arity").rows() == [
            (item.request["name"], item.request["timestamp_arity"])]
        stored = warehouse.read_nested(item.dataflow)
        assert {path: (scope.kind, scope.arity, sorted(scope.graph.transitions())) for path, scope in
                stored.scopes.items()} == {path: (scope.kind, scope.arity, sorted(scope.graph.transitions()))
                                           for path, scope in item.nested.scopes.items()}
        counts = {(ScopedLocation(tuple(r["scope"]), r["node"], r["port"], r["kind"]), tuple(r["time"])): r["count"]
                  for r in mine["pointstamps"].iter_rows(named=True)}
        assert counts == item.counts
        expected = scoped_oracle.frontiers(item.nested, item.counts)
        assert {(ScopedLocation(tuple(r["scope"]), r["node"], r["port"], r["kind"]), tuple(r["time"]))
                for r in mine["frontiers"].iter_rows(named=True)} == {
            (loc, t) for loc, times in expected.items() for t in times}
        batches = mine["progress"].filter(pl.col("worker") == "w").select("version", "seq").unique().rows()
        assert sorted(batches) == [(seq + 1, seq) for seq in range(item.batches)]


def test_a_registration_logged_without_its_initial_scopes_still_recovers(start_service: ServiceStarter,
                                                                          tmp_path: Path) -> None:
    """Releases before this one logged a registration without its initial pointstamps' scopes:
    such a log recovers, each pointstamp in the one scope that can hold it."""
    service = start_service()
    service.stop()  # a warehouse the service made, holding no dataflow
    body = loop_then_stage()
    inside = {"scope": [1], "node": 1, "port": 0, "kind": "source"}
    spec = registration_record(RegisterRequest.model_validate(
        {**body, "initial": [{"location": inside, "time": [2, 1], "delta": 1}]}))
    old = Register(name=spec.name, arity=spec.arity, nodes=spec.nodes, edges=spec.edges, initial=spec.initial,
                   df="0123456789abcdef0123456789abcdef", token="ab" * 32, created_at="2026-12-01T00:00:00+00:00")

    async def log() -> None:
        wal = WriteAheadLog(wal_directory(service.warehouse, 0))
        wal.open()
        await wal.enqueue(old)
        wal.close()

    asyncio.run(log())
    service.restart()
    with service.client() as client:
        assert client.get("/v1/dataflows/0123456789abcdef0123456789abcdef/pointstamps").json() == [
            {"location": inside, "time": [2, 1], "count": 1}]
