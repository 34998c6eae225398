"""REST end to end against the real service: registration, progress, queries, auth, bad input."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from typing import Any

import httpx
import pytest

from tests.helpers import (
    ServiceProcess,
    ServiceStarter,
    as_updates,
    assert_oversized_progress_refused,
    core_graph,
    counts_map,
    frontier_map,
    loop_graph,
    register,
    update,
)
from tracker import oracle
from tracker.graph import Graph, Location
from tracker.structure import path_summaries

pytestmark = pytest.mark.service


def random_batch(rng: random.Random, graph: Graph, held: list[tuple[Location, tuple[int, ...]]]) -> list[dict]:
    """Retire a held pointstamp and mint later ones (a well-behaved worker), or add fresh ones."""
    batch = []
    if held and rng.random() < 0.7:
        loc, time_ = held.pop(rng.randrange(len(held)))
        batch.append(update(loc.node, loc.port, loc.kind, list(time_), -1))
        for _ in range(rng.randint(0, 2)):
            later = tuple(t + rng.randint(0, 2) for t in time_)
            dest = rng.choice(graph.locations())
            held.append((dest, later))
            batch.append(update(dest.node, dest.port, dest.kind, list(later), 1))
    else:
        dest = rng.choice(graph.locations())
        time_ = tuple(rng.randint(0, 5) for _ in range(graph.arity))
        held.append((dest, time_))
        batch.append(update(dest.node, dest.port, dest.kind, list(time_), 1))
    return batch


def test_progress_frontiers_match_the_oracle_at_every_version(service: ServiceProcess) -> None:
    body = loop_graph(operators=4, arity=2)
    dataflow_id, token = register(service, body)
    graph, initial = core_graph(body)
    rng = random.Random(7)
    held = [(loc, time_) for loc, time_, _ in initial]
    batches: list[list[tuple[Location, tuple[int, ...], int]]] = [initial]
    with service.client(token) as client:
        assert client.get(f"/v1/dataflows/{dataflow_id}").json()["version"] == 0
        for seq in range(25):
            batch = random_batch(rng, graph, held)
            answer = client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w0", "seq": seq,
                                                                               "updates": batch})
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"applied": True, "duplicate": False, "version": seq + 1}
            batches.append(as_updates(batch))
        counts = oracle.accumulate(batches)
        frontier = client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()
        assert frontier["version"] == 25
        assert frontier_map(frontier) == oracle.frontiers(graph, counts)
        assert counts_map(client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json()) == counts
        for version in (0, 1, 10, 24):
            past = client.get(f"/v1/dataflows/{dataflow_id}/frontier", params={"version": version}).json()
            assert past["version"] == version
            assert frontier_map(past) == oracle.frontiers(graph, oracle.accumulate(batches[: version + 1]))
        filtered = client.get(f"/v1/dataflows/{dataflow_id}/frontier", params={"node": 2, "kind": "target"}).json()
        assert [row["location"] for row in filtered["locations"]] == [{"node": 2, "port": 0, "kind": "target"}]
        assert client.get(f"/v1/dataflows/{dataflow_id}/frontier", params={"version": 26}).status_code == 404


def test_duplicates_are_acknowledged_not_applied_and_gaps_refused(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph())
    url = f"/v1/dataflows/{dataflow_id}/progress"
    batch = [update(1, 0, "target", [3], 1)]
    with service.client(token) as client:
        assert client.post(url, json={"worker": "a", "seq": 0, "updates": batch}).json()["applied"] is True
        again = client.post(url, json={"worker": "a", "seq": 0, "updates": batch})
        assert again.status_code == 200
        assert again.json() == {"applied": False, "duplicate": True, "version": 1}
        gap = client.post(url, json={"worker": "a", "seq": 2, "updates": batch})
        assert gap.status_code == 409
        assert gap.json()["error"] == "sequence_gap" and gap.json()["expected"] == 1
        first_of_b = client.post(url, json={"worker": "b", "seq": 1, "updates": batch})
        assert first_of_b.status_code == 409 and first_of_b.json()["expected"] == 0
        counts = counts_map(client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json())
        assert counts[(Location(1, 0, "target"), (3,))] == 1
        assert client.post(url, json={"worker": "b", "seq": 0, "updates": batch}).json()["version"] == 2
        assert client.post(url, json={"worker": "a", "seq": 1, "updates": []}).json()["version"] == 3
        status = client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]
        assert status["workers"] == {"a": 1, "b": 0}


BAD_PROGRESS: list[tuple[str, Any, int, str]] = [
    ("malformed json", b'{"worker": "w", "seq": 0, "updates": [', 400, "malformed_json"),
    ("invalid utf-8 in a value", b'{"worker": "\xff", "seq": 0, "updates": []}', 400, "malformed_json"),
    ("invalid utf-8 in a key", b'{"wor\xffker": "w", "seq": 0, "updates": []}', 400, "malformed_json"),
    ("not an object", [1, 2], 422, "invalid_request"),
    ("negative seq", {"worker": "w", "seq": -1, "updates": []}, 422, "invalid_request"),
    ("string seq", {"worker": "w", "seq": "0", "updates": []}, 422, "invalid_request"),
    ("missing worker", {"seq": 0, "updates": []}, 422, "invalid_request"),
    ("empty worker", {"worker": "", "seq": 0, "updates": []}, 422, "invalid_request"),
    ("extra field", {"worker": "w", "seq": 0, "updates": [], "oops": 1}, 422, "invalid_request"),
    ("wrong arity", {"worker": "w", "seq": 0, "updates": [update(1, 0, "target", [1], 1)]}, 422,
     "invalid_update"),
    ("unknown node", {"worker": "w", "seq": 0, "updates": [update(99, 0, "target", [1, 1], 1)]}, 422,
     "invalid_update"),
    ("unknown port", {"worker": "w", "seq": 0, "updates": [update(1, 7, "source", [1, 1], 1)]}, 422,
     "invalid_update"),
    ("bad kind", {"worker": "w", "seq": 0, "updates": [update(1, 0, "middle", [1, 1], 1)]}, 422,
     "invalid_request"),
    ("negative time", {"worker": "w", "seq": 0, "updates": [update(1, 0, "target", [1, -1], 1)]}, 422,
     "invalid_update"),
    ("float time", {"worker": "w", "seq": 0, "updates": [update(1, 0, "target", [1, 1.5], 1)]}, 422,
     "invalid_request"),
    ("bool delta", {"worker": "w", "seq": 0, "updates": [update(1, 0, "target", [1, 1], True)]}, 422,
     "invalid_request"),
    ("time beyond 2**62 - 1", {"worker": "w", "seq": 0, "updates": [update(1, 0, "target", [1, 2**62], 1)]}, 422,
     "invalid_update"),
    ("time beyond 64 bits", {"worker": "w", "seq": 0, "updates": [update(1, 0, "target", [1, 2**64], 1)]}, 422,
     "invalid_update"),
    ("delta beyond 2**31 - 1", {"worker": "w", "seq": 0, "updates": [update(1, 0, "target", [1, 1], -2**31)]},
     422, "invalid_request"),
    ("seq beyond 2**63 - 1", {"worker": "w", "seq": 2**63, "updates": []}, 422, "invalid_request"),
    ("bool node", {"worker": "w", "seq": 0, "updates": [update(True, 0, "target", [1, 1], 1)]}, 422,
     "invalid_request"),
    ("one bad update among good ones", {"worker": "w", "seq": 0, "updates": [
        update(1, 0, "target", [1, 1], 1), update(2, 0, "target", [1, 1], 1), update(1, 0, "target", [1], 1)]},
     422, "invalid_update"),
]


@pytest.mark.parametrize(("case", "body", "status", "error"), BAD_PROGRESS, ids=[c[0] for c in BAD_PROGRESS])
def test_bad_progress_is_a_clear_4xx_and_changes_nothing(service: ServiceProcess, case: str, body: Any,
                                                          status: int, error: str) -> None:
    dataflow_id, token = register(service, loop_graph(arity=2))
    url = f"/v1/dataflows/{dataflow_id}/progress"
    with service.client(token) as client:
        before = client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json()
        if isinstance(body, bytes):
            answer = client.post(url, content=body, headers={"Content-Type": "application/json"})
        else:
            answer = client.post(url, json=body)
        assert answer.status_code == status, (case, answer.text)
        assert answer.json()["error"] == error
        assert answer.json().get("detail")
        if case == "bad kind":  # an enumerated field: the answer names the values it takes
            assert answer.json()["detail"] == [{"loc": "body.updates.0.location.kind", "type": "invalid",
                                                "msg": "Input should be 'source' or 'target', got 'middle'"}]
        assert client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json() == before
        assert client.get(f"/v1/dataflows/{dataflow_id}").json()["version"] == 0
        # The failed attempt did not consume the seq: seq 0 is still the one expected.
        ok = client.post(url, json={"worker": "w", "seq": 0, "updates": [update(1, 0, "target", [1, 1], 1)]})
        assert ok.status_code == 200 and ok.json()["version"] == 1


def test_oversized_body_is_413(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph())
    with service.client(token) as client:
        huge = {"worker": "w", "seq": 0, "updates": [update(1, 0, "target", [1], 1)] * 40_000}
        assert_oversized_progress_refused(client, dataflow_id, huge,
                                          [b'{"worker": "w", "seq": 0, "updates": [' + b" " * 2_000_000, b"]}"])
        assert client.get(f"/v1/dataflows/{dataflow_id}").json()["version"] == 0


def test_non_incrementing_cycle_names_its_transitions(service: ServiceProcess) -> None:
    body = loop_graph(operators=3)
    del body["nodes"][3]["connections"]  # the ring no longer advances time
    with service.client() as client:
        answer = client.post("/v1/dataflows", json=body)
        assert answer.status_code == 422
        data = answer.json()
        assert data["error"] == "non_incrementing_cycle"
        steps = {((s["from"]["node"], s["from"]["kind"]), (s["to"]["node"], s["to"]["kind"])) for s in data["cycle"]}
        assert ((3, "source"), (1, "target")) in steps and ((1, "target"), (1, "source")) in steps
        assert all(s["summary"] == [0] for s in data["cycle"])
        # The input edge leads into the cycle but is not on it.
        assert ((0, "source"), (1, "target")) not in steps
        assert "(3,0,source) -> (1,0,target) +[0]" in data["detail"]  # the service's notation, no Python tuples
        assert ",)" not in data["detail"]


_UNITS = [[1 if j == i else 0 for j in range(4)] for i in range(4)]


def _two_summary_chain(operators: int) -> dict[str, Any]:
    """An input, then ``operators`` operators in a row whose connections carry the two summaries
    ``[1, 0]`` and ``[0, 1]``, then a sink: ``k + 1`` incomparable summaries after ``k`` of them."""
    nodes = [{"id": 0, "inputs": 0, "outputs": 1}] + [
        {"id": k, "inputs": 1, "outputs": 1, "connections": [{"input": 0, "output": 0, "summaries": [[1, 0], [0, 1]]}]}
        for k in range(1, operators + 1)] + [{"id": operators + 1, "inputs": 1, "outputs": 0}]
    edges = [{"source": {"node": k, "port": 0}, "target": {"node": k + 1, "port": 0}} for k in range(operators + 1)]
    return {"name": f"chain{operators}", "timestamp_arity": 2, "nodes": nodes, "edges": edges}
BAD_GRAPHS: list[tuple[str, Any]] = [
    # Sums of 6 unit vectors of arity 4: 84 incomparable minimal summaries from the input to the end.
    ("combinatorial summaries", {"name": "g", "timestamp_arity": 4, "nodes": [{"id": 0, "inputs": 0, "outputs": 1}] + [
        {"id": i, "inputs": 1, "outputs": 1, "connections": [{"input": 0, "output": 0, "summaries": _UNITS}]}
        for i in range(1, 7)], "edges": [{"source": {"node": i, "port": 0}, "target": {"node": i + 1, "port": 0}}
                                         for i in range(6)]}),
    # (A 40-operator chain of two-summary connections, 41 summaries at its end and widths growing
    # all along, takes the reference tracker seconds per batch: refused by --engine reference,
    # accepted by the compiled engine (under 1 ms per pointstamp); see tests/test_api_engine.py.)
    ("edge to unknown port", {"name": "g", "nodes": [{"id": 0, "inputs": 0, "outputs": 1}],
                              "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 5, "port": 0}}]}),
    ("duplicate node", {"name": "g", "nodes": [{"id": 0, "inputs": 0, "outputs": 1},
                                               {"id": 0, "inputs": 1, "outputs": 0}], "edges": []}),
    ("summary arity", {"name": "g", "timestamp_arity": 2, "nodes": [{"id": 0, "inputs": 1, "outputs": 1,
                       "connections": [{"input": 0, "output": 0, "summaries": [[1]]}]}], "edges": []}),
    ("connection port", {"name": "g", "nodes": [{"id": 0, "inputs": 1, "outputs": 1,
                         "connections": [{"input": 3, "output": 0, "summaries": [[1]]}]}], "edges": []}),
    ("initial at unknown place", {"name": "g", "nodes": [{"id": 0, "inputs": 0, "outputs": 1}], "edges": [],
                                  "initial": [update(4, 0, "source", [0], 1)]}),
    ("no ports", {"name": "g", "nodes": [], "edges": []}),
    ("node id beyond 32 bits", {"name": "g", "nodes": [{"id": 2**31, "inputs": 0, "outputs": 1}], "edges": []}),
    ("summary increment beyond 2**31 - 1", {"name": "g", "nodes": [{"id": 0, "inputs": 1, "outputs": 1,
                                            "connections": [{"input": 0, "output": 0, "summaries": [[2**31]]}]}],
                                            "edges": []}),
]


@pytest.mark.parametrize(("case", "body"), BAD_GRAPHS, ids=[c[0] for c in BAD_GRAPHS])
def test_invalid_graphs_are_422_with_a_reason(service: ServiceProcess, case: str, body: Any) -> None:
    with service.client() as client:
        count = len(client.get("/v1/dataflows").json())
        answer = client.post("/v1/dataflows", json=body)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"] == "invalid_graph" and answer.json()["detail"]
        assert len(client.get("/v1/dataflows").json()) == count


def test_a_short_chain_of_two_summary_connections_is_accepted_and_tracked_exactly(service: ServiceProcess) -> None:
    body = _two_summary_chain(12)  # widths up to 13: within the cost budget
    dataflow_id, token = register(service, body)
    graph, initial = core_graph(body)
    moved = [(Location.source(0, 0), (0, 0), -1), (Location.source(0, 0), (1, 0), 1)]
    with service.client(token) as client:
        answer = client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [0, 0], -1), update(0, 0, "source", [1, 0], 1)]})
        assert answer.status_code == 200
        rows = client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()["locations"]
    got = {Location(**r["location"]): [tuple(t) for t in r["frontier"]] for r in rows}
    assert got == oracle.frontiers(graph, oracle.accumulate([initial, moved]))
    assert len(got[Location.target(13, 0)]) == 13


def test_registration_bodies_not_one_json_document_are_400_and_other_types_415(service: ServiceProcess) -> None:
    with service.client() as client:
        count = len(client.get("/v1/dataflows").json())
        for body in (b'{"name": "\xff", "nodes": [], "edges": []}', b'{"name": "g", "nodes": ['):
            answer = client.post("/v1/dataflows", content=body, headers={"Content-Type": "application/json"})
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"] == "malformed_json" and answer.json()["detail"]
        for body in (b"", b" ", b'{"name": "x", "timestamp_arity": NaN, "nodes": []}', b'{"name": "x"} {}'):
            answer = client.post("/v1/dataflows", content=body, headers={"Content-Type": "application/json"})
            assert answer.status_code == 400 and answer.json()["error"] == "malformed_json", (body, answer.text)
        huge = b'{"name": "x", "nodes": [], "timestamp_arity": 1' + b"0" * 30 + b"}"
        answer = client.post("/v1/dataflows", content=huge, headers={"Content-Type": "application/json"})
        assert answer.status_code == 422 and answer.json()["error"] == "invalid_request"
        good = json.dumps(loop_graph(name="typed")).encode()
        for content_type in ("text/plain", "application/x-www-form-urlencoded"):  # curl -d sends the second
            answer = client.post("/v1/dataflows", content=good, headers={"Content-Type": content_type})
            assert answer.status_code == 415 and answer.json()["error"] == "unsupported_media_type", answer.text
        assert len(client.get("/v1/dataflows").json()) == count
        for headers in ({"Content-Type": "application/json; charset=utf-8"}, {}):  # no declaration: read as JSON
            typed = client.post("/v1/dataflows", content=good, headers=headers)
            assert typed.status_code == 201, typed.text
        progress = f"/v1/dataflows/{typed.json()['id']}/progress"
        batch = json.dumps({"worker": "w", "seq": 0, "updates": []}).encode()
        refused = client.post(progress, content=batch, headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert refused.status_code == 415 and refused.json()["error"] == "unsupported_media_type"
        assert client.post(progress, content=batch).json()["version"] == 1  # nothing was applied before


def test_auth_401_403_404(service: ServiceProcess) -> None:
    mine, my_token = register(service, loop_graph(name="mine"))
    other, _ = register(service, loop_graph(name="other"))
    path = f"/v1/dataflows/{other}/frontier"
    with httpx.Client(base_url=service.url) as anonymous:
        missing = anonymous.get(path)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert anonymous.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert anonymous.get(path, headers={"Authorization": "Basic abc"}).status_code == 401
        assert anonymous.get("/healthz").status_code == 200
    with service.client(my_token) as client:
        assert client.get(path).status_code == 403
        assert client.post(f"/v1/dataflows/{other}/progress", json={"worker": "w", "seq": 0, "updates": []}
                           ).status_code == 403
        assert client.get("/v1/dataflows/does-not-exist").status_code == 403
        assert client.get(f"/v1/dataflows/{'x' * 100}").status_code == 403  # any id: tokens reveal nothing
        assert client.post("/v1/dataflows", json=loop_graph()).status_code == 403
        assert [d["id"] for d in client.get("/v1/dataflows").json()] == [mine]
        assert client.get(f"/v1/dataflows/{mine}/frontier").status_code == 200
    with service.client() as admin:
        assert admin.get("/v1/dataflows/does-not-exist").status_code == 404
        assert admin.get(f"/v1/dataflows/{'x' * 100}/frontier").status_code == 404
        assert admin.get(f"/v1/dataflows/{other}").json()["version"] == 0
        ids = {d["id"] for d in admin.get("/v1/dataflows").json()}
        assert {mine, other} <= ids


def test_summaries_of_a_large_graph_are_served_one_origin_at_a_time(service: ServiceProcess) -> None:
    body = loop_graph(operators=1200)  # 2,402 locations: the whole of Psi would be millions of rows
    dataflow_id, token = register(service, body)
    graph, _ = core_graph(body)
    with service.client(token) as client:
        whole = client.get(f"/v1/dataflows/{dataflow_id}/summaries")
        assert whole.status_code == 422 and whole.json()["error"] == "too_large"
        rows = client.get(f"/v1/dataflows/{dataflow_id}/summaries",
                          params={"from_node": 600, "from_port": 0, "from_kind": "source"}).json()
    origin = Location.source(600, 0)
    expected = {k: sorted(v) for k, v in path_summaries(graph, [origin]).items()}
    assert {(Location(**r["from"]), Location(**r["to"])): sorted(tuple(s) for s in r["summaries"])
            for r in rows} == expected
    assert len(rows) == len(graph.locations()) - 2  # all but the input and the ring entry it feeds


def test_summaries_and_explain(service: ServiceProcess) -> None:
    body = loop_graph(operators=3)
    dataflow_id, token = register(service, body)
    graph, _ = core_graph(body)
    with service.client(token) as client:
        rows = client.get(f"/v1/dataflows/{dataflow_id}/summaries").json()
        got = {(Location(**r["from"]), Location(**r["to"])): sorted(tuple(s) for s in r["summaries"]) for r in rows}
        assert got == {k: sorted(v) for k, v in path_summaries(graph).items()}
        one = client.get(f"/v1/dataflows/{dataflow_id}/summaries",
                         params={"from_node": 1, "from_port": 0, "from_kind": "target", "to_node": 1,
                                 "to_kind": "source"}).json()
        assert one == [{"from": {"node": 1, "port": 0, "kind": "target"}, "to": {"node": 1, "port": 0,
                        "kind": "source"}, "summaries": [[0]]}]
        client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [0], -1), update(2, 0, "source", [4], 1)]})
        missing = client.get(f"/v1/dataflows/{dataflow_id}/summaries",
                             params={"from_node": 9, "from_port": 0, "from_kind": "target"})
        assert missing.status_code == 422 and missing.json()["error"] == "unknown_location"
        url = f"/v1/dataflows/{dataflow_id}/frontier/explain"
        stuck = client.get(url, params={"node": 1, "port": 0, "kind": "target", "time": "6"}).json()
        assert stuck["safe_to_notify"] is False and stuck["frontier"] == [[5]]
        [blocker] = stuck["blockers"]
        assert blocker["location"] == {"node": 2, "port": 0, "kind": "source"} and blocker["time"] == [4]
        assert blocker["summary"] == [1] and blocker["arrives_as"] == [5]
        hops = [(s["from"]["node"], s["from"]["kind"], s["to"]["node"], s["to"]["kind"]) for s in blocker["path"]]
        assert hops == [(2, "source", 3, "target"), (3, "target", 3, "source"), (3, "source", 1, "target")]
        assert [s["time"] for s in blocker["path"]] == [[4], [5], [5]]  # node 3 closes the loop: +1
        assert "Not safe" in stuck["explanation"] and "(2,0,source)@[4]" in blocker["text"]
        safe = client.get(url, params={"node": 1, "port": 0, "kind": "target", "time": "4"}).json()
        assert safe["safe_to_notify"] is True and safe["blockers"] == []
        for bad in ("x", "\u0663", "1_0", "-1", "", f"{2**62}"):  # "\u0663": an Arabic-Indic 3, which int() takes
            answer = client.get(url, params={"node": 1, "port": 0, "kind": "target", "time": bad})
            assert answer.status_code == 422 and answer.json()["error"] == "invalid_time", bad
        assert client.get(url, params={"node": 1, "port": 0, "kind": "target", "time": " 4 "}).json()["safe_to_notify"]
        assert client.get(url, params={"node": 1, "port": 0, "kind": "target", "time": "1,2"}).status_code == 422
        assert client.get(url, params={"node": 9, "port": 0, "kind": "target", "time": "1"}).status_code == 422


def test_healthz_metrics_and_openapi(service: ServiceProcess) -> None:
    with service.client() as admin:  # a deleted dataflow stays hosted, but is not live (the front's load)
        made = admin.post("/v1/dataflows", json=loop_graph(name="gone")).json()["id"]
        before = admin.get("/healthz").json()
        assert admin.delete(f"/v1/dataflows/{made}").status_code == 204
        after = admin.get("/healthz").json()
        assert (after["dataflows"], after["live_dataflows"]) == (before["dataflows"], before["live_dataflows"] - 1)
    with httpx.Client(base_url=service.url) as client:
        assert client.get("/healthz").json()["status"] == "ok"
        text = client.get("/metrics").text
        for name in ("tracker_batches_total", "tracker_updates_total", "tracker_frontier_changes_total",
                     "tracker_apply_latency_seconds_bucket", "tracker_subscribers", "tracker_wal_sync_seconds"):
            assert name in text, name
        assert 'tracker_batches_total{outcome="applied"}' in text
        spec = client.get("/openapi.json").json()
        for path in ("/v1/dataflows", "/v1/dataflows/{id}", "/v1/dataflows/{id}/progress",
                     "/v1/dataflows/{id}/frontier", "/v1/dataflows/{id}/pointstamps", "/v1/dataflows/{id}/summaries",
                     "/v1/dataflows/{id}/frontier/explain", "/v1/dataflows/{id}/frontier/stream", "/healthz",
                     "/metrics"):
            assert path in spec["paths"], path
        # Auth is a security scheme on every /v1 operation, not a header parameter each.
        assert spec["components"]["securitySchemes"]["bearer"] == {**spec["components"]["securitySchemes"]["bearer"],
                                                                    "type": "http", "scheme": "bearer"}
        for path, operations in spec["paths"].items():
            for operation in operations.values():
                secured = path.startswith(("/v1", "/dashboard/api"))
                assert (operation.get("security") == [{"bearer": []}]) == secured, path
                assert all(p["name"].lower() != "authorization" for p in operation.get("parameters", [])), path
        stream = spec["paths"]["/v1/dataflows/{id}/frontier/stream"]["get"]
        assert any(p["name"] == "Last-Event-ID" and p["in"] == "header" for p in stream["parameters"])
        assert "/v1/dataflows/{id}/ws" in spec["info"]["description"]
        location = spec["components"]["schemas"]["LocationModel"]["properties"]["node"]
        assert location["maximum"] == 2**31 - 1
        # /docs works offline: every script and style sheet it loads is served by the service.
        page = client.get("/docs")
        assert page.status_code == 200
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert assets and all(a.startswith("/") or a.startswith("data:") for a in assets), assets
        for asset in assets:
            if asset.startswith("/"):
                assert client.get(asset).status_code == 200, asset


def test_admin_token_is_generated_when_not_given(start_service: ServiceStarter) -> None:
    proc = start_service(TRACKER_ADMIN_TOKEN="")
    token_file = proc.warehouse / "admin-token"
    token = token_file.read_text().strip()
    assert token and (token_file.stat().st_mode & 0o777) == 0o600
    with proc.client(token) as client:
        assert client.get("/v1/dataflows").status_code == 200
    with proc.client() as wrong:  # the default test token is not this service's
        assert wrong.get("/v1/dataflows").status_code == 401
    proc.stop()  # the whole log, shutdown included
    log = proc.log_path.read_text()
    assert str(token_file) in log
    assert log.count(token) == 1  # announced once at generation, never logged again


def test_registering_a_large_graph_does_not_block_progress(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph(operators=2))
    big = loop_graph(operators=4000, name="big")
    done: list[float] = []

    def register_big() -> None:
        started = time.perf_counter()
        register(service, big)
        done.append(time.perf_counter() - started)

    thread = threading.Thread(target=register_big)
    latencies = []
    with service.client(token) as client:
        thread.start()
        seq = overlapped = 0
        while thread.is_alive() or seq < 30:  # posting for as long as the registration runs
            in_flight = thread.is_alive()
            started = time.perf_counter()
            answer = client.post(f"/v1/dataflows/{dataflow_id}/progress",
                                 json={"worker": "w", "seq": seq, "updates": [update(1, 0, "target", [seq], 1)]})
            latencies.append(time.perf_counter() - started)
            assert answer.status_code == 200
            overlapped += in_flight and thread.is_alive()  # sent and answered while it ran
            seq += 1
        thread.join(120)
    assert done, "the large registration failed"
    print(f"registration took {done[0]:.2f} s; {overlapped} batches answered during it; "
          f"progress latencies max {max(latencies) * 1e3:.1f} ms")
    assert overlapped >= 2, "registration was too quick to overlap with the progress"
    assert max(latencies) < max(0.5, done[0] / 2), "a progress batch waited for the registration"


def test_an_audit_asked_with_spark_off_is_409_and_the_processes_are_listed(service: ServiceProcess) -> None:
    dataflow_id, _ = register(service, loop_graph(operators=2, name="no-spark"))
    with service.client() as admin:
        answer = admin.post(f"/v1/dataflows/{dataflow_id}/audit")
        assert answer.status_code == 409 and answer.json()["error"] == "spark_off", answer.text
        assert admin.post("/v1/dataflows/nope/audit").status_code == 404
        roles = [p["role"] for p in admin.get("/v1/processes").json()]
        health = admin.get("/healthz").json()
    assert roles == ["supervisor", "hot"] and health["spark"] == "disabled"
