"""Nested scopes end to end against the real service: registration, updates, frontiers, SSE,
``/scopes``, ``?scope=`` filters, explain across scope boundaries, recovery after ``kill -9``,
and random nested dataflows against the flattened oracle (:mod:`tracker.scoped_oracle`)."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import httpx
import polars as pl
import pytest
from httpx_sse import connect_sse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs.storage import Warehouse
from tests.helpers import (
    ROOT,
    ServiceProcess,
    ServiceStarter,
    edge,
    loop_graph,
    loop_then_stage,
    register,
    update,
)
from tests.strategies import nested_batches, nested_bodies
from tracker import scoped_oracle
from tracker.scope import NestedGraph, ScopedLocation
from tracker.structure import path_summaries

pytestmark = pytest.mark.service


def three_levels() -> dict[str, Any]:
    """input 0 -> iterative [3] (-> iterative [3,1] (-> region [3,1,1])) -> sink 4."""
    region = {"kind": "region", "nodes": [{"id": 1, "name": "work", "inputs": 1, "outputs": 1}],
              "edges": [edge((0, 0), (1, 0)), edge((1, 0), (0, 0))]}

    def loop(inner: dict[str, Any], width: int) -> dict[str, Any]:
        step = [0] * (width - 1) + [1]
        return {"kind": "iterative",
                "nodes": [{"id": 1, "name": "inner", "inputs": 1, "outputs": 1, "scope": inner},
                          {"id": 2, "name": "merge", "inputs": 2, "outputs": 1},
                          {"id": 3, "name": "feedback", "inputs": 1, "outputs": 1,
                           "connections": [{"input": 0, "output": 0, "summaries": [step]}]}],
                "edges": [edge((0, 0), (2, 0)), edge((2, 0), (1, 0)), edge((1, 0), (3, 0)), edge((3, 0), (2, 1)),
                          edge((1, 0), (0, 0))]}

    return {"name": "deep", "nodes": [{"id": 0, "name": "input", "inputs": 0, "outputs": 1},
                                      {"id": 3, "name": "outer", "inputs": 1, "outputs": 1,
                                       "scope": loop(loop(region, 3), 2)},
                                      {"id": 4, "name": "sink", "inputs": 1, "outputs": 0}],
            "edges": [edge((0, 0), (3, 0)), edge((3, 0), (4, 0))]}


def at(scope: list[int], node: int, port: int, kind: str, time_: list[int], delta: int) -> dict[str, Any]:
    location: dict[str, Any] = {"node": node, "port": port, "kind": kind}
    if scope:
        location = {"scope": scope, **location}
    return {"location": location, "time": time_, "delta": delta}


def post(client: httpx.Client, dataflow: str, seq: int, updates: list[dict[str, Any]], worker: str = "w"
         ) -> httpx.Response:
    return client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": worker, "seq": seq, "updates": updates})


def frontier_of(client: httpx.Client, dataflow: str, **where: Any) -> list[list[int]]:
    """The frontier of one location (``scope`` not given: the root; as a filter it means any scope)."""
    params = {k: (",".join(map(str, v)) if isinstance(v, list) else v) for k, v in {"scope": [], **where}.items()}
    rows = client.get(f"/v1/dataflows/{dataflow}/frontier", params=params).json()["locations"]
    assert len(rows) == 1, rows
    return rows[0]["frontier"]


def scoped_frontiers(answer: dict[str, Any]) -> dict[ScopedLocation, list[tuple[int, ...]]]:
    return {ScopedLocation(tuple(r["location"].get("scope", ())), r["location"]["node"], r["location"]["port"],
                           r["location"]["kind"]): [tuple(t) for t in r["frontier"]] for r in answer["locations"]}


def test_a_three_level_nested_dataflow_registers_and_is_served_back(service: ServiceProcess) -> None:
    body = three_levels()
    dataflow, token = register(service, body)
    with service.client(token) as client:
        detail = client.get(f"/v1/dataflows/{dataflow}").json()
        assert detail["nodes"][1]["scope"]["nodes"][0]["scope"]["nodes"][0]["scope"]["kind"] == "region"
        assert detail["edges"] == body["edges"] and detail["timestamp_arity"] == 1
        scopes = client.get(f"/v1/dataflows/{dataflow}/scopes").json()
        assert [(s["scope"], s["kind"], s["arity"]) for s in scopes] == [
            ([3], "iterative", 2), ([3, 1], "iterative", 3), ([3, 1, 1], "region", 3)]
        assert scopes[0]["summaries"] == [{"input": 0, "output": 0, "summaries": [[0]]}]
        assert scopes[1]["summaries"] == [{"input": 0, "output": 0, "summaries": [[0, 0]]}]
        # The input's capability at 0 reaches every scope, in that scope's time.
        assert frontier_of(client, dataflow, scope=[3, 1, 1], node=1, port=0, kind="target") == [[0, 0, 0]]
        assert frontier_of(client, dataflow, scope=[3], node=2, port=1, kind="target") == [[0, 1]]
        assert frontier_of(client, dataflow, node=4, port=0, kind="target") == [[0]]
        everything = client.get(f"/v1/dataflows/{dataflow}/frontier").json()["locations"]
        assert len(everything) == len(list(NestedGraph.from_json(1, body).locations()))
        root_only = client.get(f"/v1/dataflows/{dataflow}/frontier", params={"scope": ""}).json()["locations"]
        assert root_only and all("scope" not in row["location"] for row in root_only)
        inner = client.get(f"/v1/dataflows/{dataflow}/frontier", params={"scope": "3,1"}).json()["locations"]
        assert inner and all(row["location"]["scope"] == [3, 1] for row in inner)
        unknown = client.get(f"/v1/dataflows/{dataflow}/frontier", params={"scope": "9"}).json()
        assert unknown == {"error": "unknown_scope", "detail": "unknown scope [9]"}
        answer = post(client, dataflow, 0, [at([3, 1, 1], 1, 0, "source", [0, 2, 1], 1),
                                            at([], 0, 0, "source", [0], -1), at([], 0, 0, "source", [1], 1)])
        assert answer.status_code == 200, answer.text
        assert frontier_of(client, dataflow, node=4, port=0, kind="target") == [[0]]
        assert frontier_of(client, dataflow, scope=[3], node=2, port=1, kind="target") == [[0, 3], [1, 1]]
        nested = NestedGraph.from_json(1, body)
        counts = {(ScopedLocation((), 0, 0, "source"), (1,)): 1,
                  (ScopedLocation((3, 1, 1), 1, 0, "source"), (0, 2, 1)): 1}
        assert scoped_frontiers(client.get(f"/v1/dataflows/{dataflow}/frontier").json()) == scoped_oracle.frontiers(
            nested, counts)
        psi = client.get(f"/v1/dataflows/{dataflow}/summaries", params={"scope": "3,1", "from_node": 0,
                                                                       "from_port": 0, "from_kind": "source",
                                                                       "to_node": 0, "to_kind": "target"}).json()
        assert psi == [{"from": {"scope": [3, 1], "node": 0, "port": 0, "kind": "source"},
                        "to": {"scope": [3, 1], "node": 0, "port": 0, "kind": "target"}, "summaries": [[0, 0, 0]]}]
        points = client.get(f"/v1/dataflows/{dataflow}/pointstamps").json()
        assert points == [{"location": {"node": 0, "port": 0, "kind": "source"}, "time": [1], "count": 1},
                          {"location": {"scope": [3, 1, 1], "node": 1, "port": 0, "kind": "source"},
                           "time": [0, 2, 1], "count": 1}]


def scope_of(body: dict[str, Any], **change: Any) -> dict[str, Any]:
    """``loop_then_stage`` with the loop's scope object updated."""
    body["nodes"][1]["scope"].update(change)
    return body


@pytest.mark.parametrize(("body", "error", "detail"), [
    (scope_of(loop_then_stage(), kind="loop"), "invalid_graph",
     "scope [1]: kind must be 'iterative' or 'region', got 'loop'"),
    (scope_of(loop_then_stage(), nodes=[{"id": 0, "inputs": 1, "outputs": 1}]), "invalid_graph",
     "scope [1]: node 0 is the scope's boundary; number the scope's own nodes from 1"),
    (scope_of(loop_then_stage(), edges=[edge((0, 0), (7, 0))]), "invalid_graph", "scope [1]: "),
])
def test_bad_nested_bodies_are_exact_422s(service: ServiceProcess, body: dict[str, Any], error: str,
                                          detail: str) -> None:
    with service.client() as client:
        answer = client.post("/v1/dataflows", json=body)
    assert answer.status_code == 422
    assert answer.json()["error"] == error and answer.json()["detail"].startswith(detail), answer.json()


def test_scope_nodes_connections_depth_and_cycles_are_refused_naming_the_scope(service: ServiceProcess) -> None:
    with service.client() as client:
        body = loop_then_stage()
        body["nodes"][1]["connections"] = [{"input": 0, "output": 0, "summaries": [[0]]}]
        answer = client.post("/v1/dataflows", json=body).json()
        assert answer == {"error": "invalid_graph", "detail": "root scope: node 1 is a scope and cannot have "
                          "connections of its own (its summaries are computed from its inside)"}
        deep: dict[str, Any] = {"kind": "region", "nodes": [], "edges": [edge((0, 0), (0, 0))]}
        for _ in range(17):
            deep = {"kind": "region", "nodes": [{"id": 1, "inputs": 1, "outputs": 1, "scope": deep}],
                    "edges": [edge((0, 0), (1, 0)), edge((1, 0), (0, 0))]}
        answer = client.post("/v1/dataflows", json={"name": "deep", "nodes": [
            {"id": 0, "inputs": 0, "outputs": 1}, {"id": 1, "inputs": 1, "outputs": 1, "scope": deep}],
            "edges": [edge((0, 0), (1, 0))]}).json()
        assert answer["error"] == "invalid_graph" and "scopes nest at most 16 deep" in answer["detail"], answer
        body = loop_then_stage()
        body["nodes"][1]["scope"]["nodes"][1].pop("connections")  # the feedback no longer advances the counter
        answer = client.post("/v1/dataflows", json=body).json()
        assert answer["error"] == "non_incrementing_cycle"
        assert {json.dumps(t["from"], sort_keys=True) for t in answer["cycle"]} >= {
            json.dumps({"scope": [1], "node": 1, "port": 0, "kind": "source"}, sort_keys=True)}
        assert all(t["from"]["scope"] == [1] and t["to"]["scope"] == [1] for t in answer["cycle"])


def test_bad_updates_are_422_and_nothing_of_the_batch_is_applied(service: ServiceProcess) -> None:
    dataflow, token = register(service, loop_then_stage())
    good = at([1], 1, 0, "source", [0, 3], 1)
    bad = {
        "wrong arity for the scope": (at([1], 1, 0, "source", [0], 1), "update 1: time [0] has 1 coordinates, "
                                                                     "the arity of scope [1] is 2"),
        "wrong arity at the root": (at([], 2, 0, "target", [0, 1], 1), "update 1: time [0, 1] has 2 coordinates, "
                                                                        "the arity of the root scope is 1"),
        "unknown scope": (at([5], 1, 0, "source", [0, 0], 1), "update 1: unknown scope [5]"),
        "the boundary": (at([1], 0, 0, "source", [0, 0], 1), "update 1: [1](0,0,source) is the boundary"),
        "a scope node's output": (at([], 1, 0, "source", [0], 1), "update 1: [](1,0,source) is a scope node's output"),
        "unknown port in a scope": (at([1], 9, 0, "target", [0, 0], 1), "update 1: scope [1]: unknown location"),
    }
    with service.client(token) as client:
        before = client.get(f"/v1/dataflows/{dataflow}/pointstamps").json()
        for name, (update_, detail) in bad.items():
            answer = post(client, dataflow, 0, [good, update_])
            assert answer.status_code == 422, name
            assert answer.json()["error"] == "invalid_update" and answer.json()["detail"].startswith(detail), (
                name, answer.json())
        assert client.get(f"/v1/dataflows/{dataflow}/pointstamps").json() == before
        assert client.get(f"/v1/dataflows/{dataflow}").json()["version"] == 0
        assert post(client, dataflow, 0, [good]).json()["version"] == 1  # the seq was not consumed


def test_a_capability_inside_a_loop_holds_the_stage_after_it_over_http_and_sse(service: ServiceProcess) -> None:
    dataflow, token = register(service, loop_then_stage())
    events: list[dict[str, Any]] = []
    ready = threading.Event()

    def listen() -> None:
        with service.client(token, timeout=30) as client, connect_sse(
                client, "GET", f"/v1/dataflows/{dataflow}/frontier/stream") as source:
            for event in source.iter_sse():
                events.append({"event": event.event, **json.loads(event.data)})
                ready.set()
                if event.event == "changes" and event.id == "3":
                    return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(10)
    after = {"node": 2, "port": 0, "kind": "target"}
    with service.client(token) as client:
        assert post(client, dataflow, 0, [at([], 0, 0, "source", [5], 1), at([], 0, 0, "source", [0], -1),
                                          at([1], 1, 0, "source", [5, 3], 1)]).status_code == 200
        assert frontier_of(client, dataflow, **after) == [[5]]
        assert post(client, dataflow, 1, [at([], 0, 0, "source", [5], -1), at([], 0, 0, "source", [6], 1)]
                    ).status_code == 200
        assert frontier_of(client, dataflow, **after) == [[5]], "the loop still holds epoch 5"
        assert frontier_of(client, dataflow, scope=[1], node=1, port=1, kind="target") == [[5, 4], [6, 1]]
        explained = client.get(f"/v1/dataflows/{dataflow}/frontier/explain",
                               params={**after, "time": "5"}).json()
        assert client.get(f"/v1/dataflows/{dataflow}/frontier", params=after).json()["locations"][1]["location"][
            "scope"] == [1], "no scope given: the filter matches every scope"
        assert not explained["safe_to_notify"] and explained["frontier"] == [[5]]
        [blocker] = explained["blockers"]
        assert blocker["location"] == {"scope": [1], "node": 1, "port": 0, "kind": "source"}
        assert blocker["arrives_as"] == [5] and blocker["summary"] is None
        assert [step["via"] for step in blocker["path"]] == ["edge", "egress", "edge"]
        assert blocker["path"][1] == {"from": {"scope": [1], "node": 0, "port": 0, "kind": "target"},
                                      "to": {"node": 1, "port": 0, "kind": "source"}, "summary": [], "time": [5],
                                      "via": "egress"}
        inside = client.get(f"/v1/dataflows/{dataflow}/frontier/explain",
                            params={"scope": "1", "node": 1, "port": 1, "kind": "target", "time": "6,1"}).json()
        paths = {tuple(step["via"] for step in b["path"]) for b in inside["blockers"]}
        assert ("edge", "ingress", "edge", "operator", "edge", "operator", "edge") in paths, inside
        assert client.get(f"/v1/dataflows/{dataflow}/frontier/explain", params={
            "scope": "1", "node": 1, "port": 1, "kind": "target", "time": "6"}).json()["error"] == "invalid_time"
        assert post(client, dataflow, 2, [at([1], 1, 0, "source", [5, 3], -1)]).status_code == 200
        assert frontier_of(client, dataflow, **after) == [[6]]
        assert client.get(f"/v1/dataflows/{dataflow}/frontier/explain",
                          params={**after, "time": "5"}).json()["safe_to_notify"]
    listener.join(10)
    assert [(e["event"], e["version"]) for e in events] == [("snapshot", 0), ("changes", 1), ("changes", 2),
                                                            ("changes", 3)]
    snapshot = scoped_frontiers(events[0])
    assert snapshot[ScopedLocation((1,), 1, 0, "target")] == [(0, 0)]
    first, middle, last = events[1]["changes"], events[2]["changes"], events[3]["changes"]
    assert all(change["location"] != after for change in middle), "the loop held the stage at 5"
    assert {"location": after, "time": [5], "diff": 1} in first
    assert {"location": {"scope": [1], "node": 1, "port": 0, "kind": "source"}, "time": [5, 0], "diff": 1} in first
    assert {"location": after, "time": [5], "diff": -1} in last and {"location": after, "time": [6], "diff": 1} in last


def test_a_flat_dataflow_answers_as_before(service: ServiceProcess) -> None:
    dataflow, token = register(service, loop_graph(operators=2))
    with service.client(token) as client:
        assert client.get(f"/v1/dataflows/{dataflow}/scopes").json() == []
        detail = client.get(f"/v1/dataflows/{dataflow}").json()
        assert all("scope" not in node for node in detail["nodes"])
        assert client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [3], 1), update(0, 0, "source", [0], -1)]}).status_code == 200
        answer = client.get(f"/v1/dataflows/{dataflow}/frontier", params={"node": 1, "port": 1, "kind": "target"})
        assert answer.json() == {"version": 1, "locations": [
            {"location": {"node": 1, "port": 1, "kind": "target"}, "frontier": [[3]]}]}
        assert client.get(f"/v1/dataflows/{dataflow}/frontier", params={"scope": "", "node": 1, "port": 1,
                                                                         "kind": "target"}).json() == answer.json()
        assert client.get(f"/v1/dataflows/{dataflow}/frontier", params={"scope": "1"}).status_code == 422
        explained = client.get(f"/v1/dataflows/{dataflow}/frontier/explain",
                               params={"node": 1, "port": 1, "kind": "target", "time": "3"}).json()
        assert "via" not in json.dumps(explained) and "scope" not in json.dumps(explained)
        assert explained["blockers"][0]["summary"] == [0]
        with connect_sse(client, "GET", f"/v1/dataflows/{dataflow}/frontier/stream") as source:
            snapshot = next(iter(source.iter_sse()))
        assert "scope" not in snapshot.data
        root = {"scope": [], "node": 0, "port": 0, "kind": "source"}  # "scope": [] is the root, in any dataflow
        assert client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": "w", "seq": 1, "updates": [
            {"location": root, "time": [4], "delta": 1}, {"location": root, "time": [3], "delta": -1}]}).json()[
            "version"] == 2
        refused = client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": "w", "seq": 2, "updates": [
            {"location": {**root, "scope": [1]}, "time": [5], "delta": 1}]}).json()
        assert refused == {"error": "invalid_update", "detail": "update 0: unknown scope [1]"}


def test_kill_9_restores_a_nested_dataflow(start_service: ServiceStarter) -> None:
    service = start_service(TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.5")
    dataflow, token = register(service, three_levels())
    with service.client(token) as client:
        for seq in range(6):
            updates = [at([3, 1, 1], 1, 0, "source", [seq, seq, 1], 1), at([3], 3, 0, "source", [seq, 2], 1)]
            if seq:
                updates.append(at([3, 1, 1], 1, 0, "source", [seq - 1, seq - 1, 1], -1))
            assert post(client, dataflow, seq, updates).status_code == 200
            if seq == 3:
                time.sleep(1.5)  # a compaction (snapshot on the stand-ins) and a flush happen in between
        before = (client.get(f"/v1/dataflows/{dataflow}/pointstamps").json(),
                  client.get(f"/v1/dataflows/{dataflow}/frontier").json())
        status = client.get(f"/v1/dataflows/{dataflow}").json()["status"]
        # The Delta rows were written (on the real locations); Spark is off here, so no check ran.
        assert status["delta_version"] >= 4 and status["spark_check"] == "skipped", status
    with service.client() as client:
        assert "tracker_delta_errors_total 0.0" in client.get("/metrics").text
    service.kill9()
    service.restart()
    with service.client(token) as client:
        after = (client.get(f"/v1/dataflows/{dataflow}/pointstamps").json(),
                 client.get(f"/v1/dataflows/{dataflow}/frontier").json())
        assert after == before and after[1]["version"] == 6
        assert client.get(f"/v1/dataflows/{dataflow}/scopes").json()[0]["scope"] == [3]
        assert post(client, dataflow, 6, [at([3, 1, 1], 1, 0, "source", [5, 5, 1], -1)]).json()["version"] == 7
    service.kill9()
    service.restart()  # once more, now from the log after a compaction
    with service.client(token) as client:
        assert client.get(f"/v1/dataflows/{dataflow}").json()["version"] == 7
        assert scoped_frontiers(client.get(f"/v1/dataflows/{dataflow}/frontier").json())[
            ScopedLocation((), 4, 0, "target")] == [(0,)]


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_nested_dataflows_equal_the_flattened_oracle(service: ServiceProcess, data: st.DataObject) -> None:
    arity, body = data.draw(nested_bodies())
    nested = NestedGraph.from_json(arity, body)
    batches = data.draw(nested_batches(nested))
    # One explicit initial capability (initial pointstamps must be positive), counted by the oracle too.
    initial = [(ScopedLocation((), 0, 0, "source"), (0,) * arity, 1)]
    dataflow, token = register(service, {"name": "random", "timestamp_arity": arity, **body,
                                         "initial": [{"location": {"node": 0, "port": 0, "kind": "source"},
                                                      "time": [0] * arity, "delta": 1}]})
    with service.client(token) as client:
        for seq, batch in enumerate(batches):
            answer = post(client, dataflow, seq, [at(list(loc.scope), loc.node, loc.port, loc.kind, list(t), d)
                                                  for loc, t, d in batch])
            assert answer.status_code == 200, answer.text
            expected = scoped_oracle.frontiers(nested, scoped_oracle.accumulate([initial, *batches[:seq + 1]]))
            assert scoped_frontiers(client.get(f"/v1/dataflows/{dataflow}/frontier").json()) == expected


def test_initial_pointstamps_may_lie_in_scopes_and_default_to_the_root_inputs(service: ServiceProcess) -> None:
    inside = {"scope": [1], "node": 1, "port": 0, "kind": "source"}
    dataflow, token = register(service, {**loop_then_stage(), "initial": [
        {"location": inside, "time": [2, 1], "delta": 1}]})
    with service.client(token) as client:
        assert client.get(f"/v1/dataflows/{dataflow}/pointstamps").json() == [
            {"location": inside, "time": [2, 1], "count": 1}]
        assert frontier_of(client, dataflow, node=2, port=0, kind="target") == [[2]]
    dataflow, token = register(service, three_levels())  # a scope node is no input, even one without inputs
    with service.client(token) as client:
        assert client.get(f"/v1/dataflows/{dataflow}/pointstamps").json() == [
            {"location": {"node": 0, "port": 0, "kind": "source"}, "time": [0], "count": 1}]
    with service.client() as client:
        refused = client.post("/v1/dataflows", json={**loop_then_stage(), "initial": [
            {"location": {"node": 1, "port": 0, "kind": "source"}, "time": [0], "delta": 1}]}).json()
        assert refused["error"] == "invalid_graph" and refused["detail"].startswith(
            "initial pointstamps: update 0: [](1,0,source) is a scope node's output"), refused
        flat = client.post("/v1/dataflows", json={**loop_graph(operators=2), "initial": [
            {"location": {"scope": [1], "node": 1, "port": 0, "kind": "source"}, "time": [0], "delta": 1}]}).json()
        assert flat == {"error": "invalid_graph", "detail": "initial pointstamps: update 0: unknown scope [1]"}


def _replayed(changes: pl.DataFrame) -> set[tuple[Any, ...]]:
    """``frontier_changes`` replayed from version 0 in version order: the elements left in, each
    entered once and never left without entering (the running sum stays 0 or 1)."""
    held: dict[tuple[Any, ...], int] = {}
    for row in changes.sort("version").iter_rows(named=True):
        key = (tuple(row["scope"]), row["node"], row["port"], row["kind"], tuple(row["time"]))
        held[key] = held.get(key, 0) + row["diff"]
        assert held[key] in (0, 1), (key, row)
    return {key for key, count in held.items() if count}


def test_the_tables_name_scopes_and_frontier_changes_replay_from_version_0(start_service: ServiceStarter) -> None:
    service = start_service(TRACKER_FLUSH_SECONDS="0.1", TRACKER_COMPACT_SECONDS="0.2")
    inside = {"scope": [1], "node": 1, "port": 0, "kind": "source"}
    cases = {  # with and without explicit initial pointstamps, flat and nested
        "flat": ({**loop_graph(operators=2), "name": "flat"}, [update(0, 0, "source", [0], -1)]),
        "flat-initial": ({**loop_graph(operators=2), "name": "flat-initial", "initial": [
            {"location": {"node": 1, "port": 0, "kind": "source"}, "time": [4], "delta": 1}]},
            [update(1, 0, "source", [4], -1), update(1, 0, "source", [6], 1)]),
        "nested": (three_levels(), [at([3, 1, 1], 1, 0, "source", [1, 2, 3], 1), at([], 0, 0, "source", [0], -1)]),
        "nested-initial": ({**loop_then_stage(), "initial": [{"location": inside, "time": [2, 1], "delta": 1}]},
                           [at([1], 1, 0, "source", [2, 1], -1), at([1], 2, 0, "target", [3, 0], 1)]),
    }
    registered = {name: register(service, body) for name, (body, _) in cases.items()}
    live = {}
    for name, (dataflow, token) in registered.items():
        with service.client(token) as client:
            assert post(client, dataflow, 0, cases[name][1]).status_code == 200
            live[dataflow] = scoped_frontiers(client.get(f"/v1/dataflows/{dataflow}/frontier").json())
    warehouse = Warehouse(service.warehouse)
    deadline = time.monotonic() + 30
    while any(warehouse.pointstamps_version(d) != 1 for d, _ in registered.values()):
        assert time.monotonic() < deadline, "compaction never caught up"
        time.sleep(0.1)
    service.stop()
    table = {name: pl.read_delta(str(service.warehouse / name)) for name in
             ("frontier_changes", "frontiers", "nodes", "summaries", "scopes", "progress", "pointstamps")}
    for name, (dataflow, _) in registered.items():
        mine = {t: df.filter(pl.col("dataflow_id") == dataflow) for t, df in table.items()}
        frontiers = {(tuple(r["scope"]), r["node"], r["port"], r["kind"], tuple(r["time"]))
                     for r in mine["frontiers"].iter_rows(named=True)}
        assert set(mine["frontier_changes"]["version"].to_list()) <= {0, 1}
        assert 0 in mine["frontier_changes"]["version"].to_list(), name  # the initial frontier is version 0's
        assert _replayed(mine["frontier_changes"]) == frontiers, name
        assert frontiers == {(loc.scope, loc.node, loc.port, loc.kind, t) for loc, ts in live[dataflow].items()
                             for t in ts}, name
        # Real locations everywhere: no stand-in (negative) node ids, scopes named by path.
        for t in ("frontier_changes", "frontiers", "nodes", "progress", "pointstamps"):
            assert (mine[t]["node"] >= 0).all(), (name, t)
        nested = warehouse.read_nested(dataflow)
        assert {tuple(s) for s in mine["scopes"]["scope"].to_list()} == set(nested.scopes), name
        # Psi of every scope, written at registration, equals the native computation.
        stored = warehouse.read_scoped_summaries(dataflow)
        assert stored == {path: path_summaries(scope.graph) for path, scope in nested.scopes.items()}, name
    assert table["progress"].filter(pl.col("dataflow_id") == registered["nested"][0]).filter(
        pl.col("version") == 1)["scope"].to_list() == [[3, 1, 1], []]
    # docs/tables.md's nested-scope Polars queries, run verbatim on the loop's tables.
    text = (ROOT / "docs" / "tables.md").read_text()
    helper = re.findall(r"```python\n(.*?)```", text.split("## Example queries: Polars\n", 1)[1], re.S)[0]
    nested_section = text.split("## Example queries: Polars, nested scopes", 1)[1]
    env: dict[str, Any] = {"WAREHOUSE": str(service.warehouse), "DATAFLOW": registered["nested-initial"][0],
                           "INNER": [1]}
    exec(compile(helper + "\n".join(re.findall(r"```python\n(.*?)```", nested_section, re.S)), "tables.md", "exec"),
         env)
    assert env["scopes"].rows() == [([], "root", 1), ([1], "iterative", 2)]
    loop = live[registered["nested-initial"][0]]
    assert {(r["node"], r["port"], r["kind"]): r["frontier"] for r in env["inside"].to_dicts()} == {
        (loc.node, loc.port, loc.kind): [list(t) for t in ts] for loc, ts in loop.items() if loc.scope == (1,) and ts}
    assert {r["name"] for r in env["inside"].to_dicts()} <= {"boundary", "step", "feedback"}
    assert {(r["port"], r["kind"]): r["frontier"] for r in env["at_scope_node"].to_dicts()} == {
        (loc.port, loc.kind): [list(t) for t in ts] for loc, ts in loop.items() if loc.scope == () and loc.node == 1
        and ts}
