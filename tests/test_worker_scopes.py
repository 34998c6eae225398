"""Nested scopes in the worker SDK: the builder's registration body, the runtime's time
transformations and scoped updates, and randomized in-process runs of the scoped examples.

The registration bodies are checked against hand-written expectations and against the core's
:meth:`NestedGraph.from_json`; the runs (``LocalHub`` with random delays on data messages,
progress batches and frontier updates, 1-3 workers over real loopback transports) are compared
with the sequential references, and their traces checked for notification safety in every
vertex's own time.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from examples import components, digitroot, wordcount
from tests.test_worker_runtime import RecordingLink, UnsafeWorker, _run_local, violations
from tracker.graph import GraphError, Location
from tracker.scope import NestedGraph, ScopedLocation
from tracker.scoped import ScopedTracker
from tracker.worker import Dataflow, LocalHub, ProgressError, Vertex, Worker
from tracker.worker.link import FrontierView
from tracker.worker.vertex import as_scoped, location_update


def edge(a: int, p: int, b: int, q: int) -> dict[str, Any]:
    return {"source": {"node": a, "port": p}, "target": {"node": b, "port": q}}


def test_components_registers_a_loop_scope() -> None:
    body = components.build({}).registration(workers=2)
    assert body == {
        "name": "components", "timestamp_arity": 1,
        "nodes": [
            {"id": 0, "name": "edges", "inputs": 0, "outputs": 1},
            {"id": 1, "name": "loop", "inputs": 1, "outputs": 1, "scope": {
                "kind": "iterative",
                "nodes": [{"id": 1, "name": "cc", "inputs": 2, "outputs": 2},
                          {"id": 2, "name": "feedback", "inputs": 1, "outputs": 1,
                           "connections": [{"input": 0, "output": 0, "summaries": [[0, 1]]}]}],
                "edges": [edge(0, 0, 1, 0), edge(1, 0, 2, 0), edge(2, 0, 1, 1), edge(1, 1, 0, 0)]}},
            {"id": 2, "name": "sink", "inputs": 1, "outputs": 0}],
        "edges": [edge(0, 0, 1, 0), edge(1, 0, 2, 0)],
        "initial": [{"location": {"node": 0, "port": 0, "kind": "source"}, "time": [0], "delta": 2}],
    }
    nested = NestedGraph.from_json(1, body)
    assert nested.scopes[(1,)].arity == 2
    assert nested.scope_summaries[(1,)] == {(0, 0): ((0,),)}
    assert components.build({}).nested().scope_summaries == nested.scope_summaries


def test_digitroot_registers_two_nested_loops() -> None:
    flow = digitroot.build({})
    body = flow.registration(workers=3)
    assert json.loads(json.dumps(body)) == body, "plain JSON"
    rounds = body["nodes"][1]
    assert (rounds["id"], rounds["inputs"], rounds["outputs"], rounds["scope"]["kind"]) == (1, 1, 1, "iterative")
    digits = rounds["scope"]["nodes"][1]
    assert (digits["id"], digits["name"], digits["inputs"], digits["outputs"]) == (2, "digits", 1, 1)
    assert digits["scope"]["edges"] == [edge(0, 0, 1, 0), edge(1, 0, 2, 0), edge(2, 0, 1, 1), edge(1, 1, 0, 0)]
    # rounds: boundary -> check, check -> digits, digits -> again, again -> check, check -> boundary
    assert rounds["scope"]["edges"] == [edge(0, 0, 1, 0), edge(1, 0, 2, 0), edge(2, 0, 3, 0), edge(3, 0, 1, 1),
                                        edge(1, 1, 0, 0)]
    assert body["edges"] == [edge(0, 0, 1, 0), edge(1, 0, 2, 0)]
    nested = NestedGraph.from_json(1, body)
    assert {path: scope.arity for path, scope in nested.scopes.items()} == {(): 1, (1,): 2, (1, 2): 3}
    assert [(s.name, s.scope, s.node) for s in flow.stages] == [
        ("numbers", (), 0), ("check", (1,), 1), ("sum", (1, 2), 1), ("carry", (1, 2), 2), ("again", (1,), 3),
        ("sink", (), 2)]


def test_flat_dataflows_register_exactly_as_before() -> None:
    for module in (wordcount,):
        flow = module.build({})
        body = flow.registration(2)
        assert "scope" not in json.dumps(body)
        assert [n["id"] for n in body["nodes"]] == [s.id for s in flow.stages]
        assert flow.nested().root.graph == flow.graph()
        assert flow.initial(2) == [(Location.source(0, 0), (0,), 2)]
        assert not flow.has_scopes()


def test_channels_allocate_ports_on_every_scope_they_cross() -> None:
    flow = Dataflow("ports", arity=1)
    source = flow.input("in", outputs=2)
    a = flow.scope("a")
    b = flow.scope("b", kind="region")
    deep = a.scope("deep")
    x = deep.stage("x", lambda i, n: Vertex(), inputs=2, outputs=1)
    y = b.stage("y", lambda i, n: Vertex(), inputs=1, outputs=1)
    z = a.stage("z", lambda i, n: Vertex(), inputs=1, outputs=0)
    flow.connect((source, 0), (x, 0))
    flow.connect((source, 0), (x, 1))  # same source: shares the ports of a and deep
    flow.connect((source, 1), (z, 0))  # another source: its own port of a
    flow.connect((x, 0), (y, 0))  # out of deep and a, into b
    flow.connect((x, 0), (z, 0))  # out of deep only
    body = flow.registration(1)
    nested = NestedGraph.from_json(1, body)
    assert {p: s.arity for p, s in nested.scopes.items()} == {(): 1, (1,): 2, (2,): 1, (1, 1): 3}
    # root nodes in declaration order: the input (0), the scopes a (1) and b (2)
    assert [(n["id"], n["name"], n["inputs"], n["outputs"]) for n in body["nodes"]] == [
        (0, "in", 0, 2), (1, "a", 2, 1), (2, "b", 1, 0)]
    assert body["edges"] == [edge(0, 0, 1, 0), edge(0, 1, 1, 1), edge(1, 0, 2, 0)]
    a_body = body["nodes"][1]["scope"]
    assert [(n["id"], n["name"], n["inputs"], n["outputs"]) for n in a_body["nodes"]] == [
        (1, "deep", 1, 1), (2, "z", 1, 0)]
    assert a_body["edges"] == [edge(0, 0, 1, 0), edge(0, 1, 2, 0), edge(1, 0, 0, 0), edge(1, 0, 2, 0)]
    assert a_body["nodes"][0]["scope"]["edges"] == [edge(0, 0, 1, 0), edge(0, 0, 1, 1), edge(1, 0, 0, 0)]
    assert body["nodes"][2]["scope"]["edges"] == [edge(0, 0, 1, 0)]
    carried = {(c.source.node, c.target.node): c.carry for c in flow.channels}
    assert carried[(source, x)]((5,)) == (5, 0, 0)
    assert carried[(x, y)]((5, 2, 7)) == (5,)  # leaves two loops, enters a region
    assert carried[(x, z)]((5, 2, 7)) == (5, 2)
    assert [flow.arity_of(s) for s in (source, x, y, z)] == [1, 3, 1, 2]
    with pytest.raises(ValueError, match="nested scopes"):
        flow.graph()
    with pytest.raises(ValueError, match="kind"):
        flow.scope("bad", kind="loop")  # type: ignore[arg-type]


def test_a_feedback_loop_around_a_scope_boundary_is_refused_without_feedback() -> None:
    flow = Dataflow("cycle")
    source = flow.input("in")
    loop = flow.scope("loop")
    step = loop.stage("step", lambda i, n: Vertex(), inputs=2, outputs=1)
    after = flow.stage("after", lambda i, n: Vertex(), inputs=1, outputs=1)
    flow.connect((source, 0), (step, 0))
    flow.connect((step, 0), (after, 0))
    flow.connect((after, 0), (step, 1))  # back in at the root's time: no advance
    with pytest.raises(GraphError, match="does not advance"):
        flow.nested()


def test_crossing_messages_are_counted_in_the_receiving_scope() -> None:
    link = RecordingLink()
    worker = Worker(components.build({}), 0, 1, link)
    inside = lambda node, port, kind: ScopedLocation((1,), node, port, kind)  # noqa: E731
    worker.input(components.INPUT).send([[3, 4]])
    assert link.batches[-1] == [(inside(1, 0, "target"), (0, 0), 1)]  # ingress appends the loop counter
    assert worker.queue[0] == (components.CC, 0, (0, 0), [3, 4])
    worker._recv_one()
    assert link.batches[-1] == [(inside(1, 0, "target"), (0, 0), -1), (inside(1, 0, "source"), (0, 0), 1),
                                (inside(1, 1, "source"), (0, 0), 1)]  # the notification's capabilities
    worker.link.view.snapshot(0, [])
    assert worker._notify_ready()
    sent = link.batches[-1]
    assert sent[:2] == [(inside(1, 0, "source"), (0, 0), -1), (inside(1, 1, "source"), (0, 0), -1)]
    assert (Location.target(2, 0), (0,), 1) in sent  # egress: the sink counts at (epoch,), at the root
    assert (inside(2, 0, "target"), (0, 0), 1) in sent  # around the loop
    assert [(time, message) for stage, _, time, message in worker.queue if stage == components.SINK] == [
        ((0,), [3, 3])]  # delivered at the sink's own time
    kinds = {json.dumps(location_update(loc, t, d)["location"]) for loc, t, d in sent}
    assert '{"scope": [1], "node": 2, "port": 0, "kind": "target"}' in kinds
    assert '{"node": 2, "port": 0, "kind": "target"}' in kinds

    class Backwards(Vertex):
        def on_recv(self, edge: int, message: Any, time: tuple[int, ...]) -> None:
            self.send_by(0, message, (time[0],))  # a time of the root's arity, inside the loop

    worker.vertices[components.CC] = Backwards()
    worker.vertices[components.CC].stage, worker.vertices[components.CC]._scheduler = components.CC, worker
    worker.queue.clear()
    worker.deliver(components.CC, 1, (0, 1), [1, 1])
    with pytest.raises(ProgressError, match="arity 2"):
        worker._recv_one()


def test_frontier_view_and_hub_speak_scoped_locations() -> None:
    view = FrontierView()
    view.snapshot(1, [{"location": {"scope": [1], "node": 1, "port": 0, "kind": "target"}, "frontier": [[2, 0]]},
                      {"location": {"scope": [], "node": 2, "port": 0, "kind": "target"}, "frontier": [[2]]}])
    assert view.blocks(ScopedLocation((1,), 1, 0, "target"), (2, 5))
    assert not view.blocks(ScopedLocation((1,), 1, 0, "target"), (1, 5))
    assert view.blocks(Location.target(2, 0), (2,)) and not view.blocks(Location.target(2, 0), (1,))
    view.apply(2, [{"location": {"scope": [1], "node": 1, "port": 0, "kind": "target"}, "time": [2, 0], "diff": -1}])
    assert not view.blocks(ScopedLocation((1,), 1, 0, "target"), (2, 5))

    flow = components.build({})
    hub = LocalHub.for_dataflow(flow, workers=1)
    snapshot = {json.dumps(row["location"]): row["frontier"] for row in hub._snapshot()}
    assert snapshot['{"node": 2, "port": 0, "kind": "target"}'] == [[0]]
    assert snapshot['{"scope": [1], "node": 1, "port": 1, "kind": "target"}'] == [[0, 1]]
    cap = ScopedLocation((1,), 1, 1, "source")
    hub._apply([(Location.source(0, 0), (0,), -1), (cap, (0, 3), 1)])  # a capability in the loop
    assert hub.tracker.frontier(as_scoped(Location.target(2, 0))) == [(0,)]  # holds the sink (root node 2)
    assert isinstance(hub.tracker, ScopedTracker)
    hub._apply([(cap, (0, 3), -1)])
    assert hub.tracker.frontier(as_scoped(Location.target(2, 0))) == []


def arities_are_their_scopes(module: Any, config: dict[str, Any], trace: list[Any]) -> None:
    flow = module.build(config)
    for event in trace:
        time = event[4] if event[0] == "recv" else event[3]
        assert len(time) == flow.arity_of(event[1]), event


RUNS = 16


@pytest.mark.parametrize("seed", range(RUNS))
def test_randomized_scoped_runs_are_correct_and_notification_safe(seed: int) -> None:
    rng = random.Random(1000 + seed)
    module = digitroot if seed % 2 else components
    peers = 1 + seed % 3
    delay = rng.choice([0.0, 0.001, 0.004])
    config = {**module.DEFAULTS, "seed": seed, "epochs": rng.randint(2, 5), "lockstep": seed % 4 == 3}
    rows, trace = asyncio.run(_run_local(module, config, peers, delay, seed))
    assert violations(trace) == []
    assert rows == module.reference(config)
    arities_are_their_scopes(module, config, trace)
    notified = {(e[1], len(e[3])) for e in trace if e[0] == "notify"}
    sink = module.SINK
    assert (sink, 1) in notified, "the sink is notified at (epoch,)"
    if module is digitroot:
        assert {(digitroot.CHECK, 2), (digitroot.SUM, 3)} <= notified


def test_the_safety_check_catches_early_notifications_in_nested_loops() -> None:
    caught = 0
    for seed in range(3):
        config = {**digitroot.DEFAULTS, "seed": seed, "epochs": 3}
        rows, trace = asyncio.run(_run_local(digitroot, config, 2, 0.003, seed, UnsafeWorker))
        caught += bool(violations(trace)) or rows != digitroot.reference(config)
    assert caught, "an unsafe scheduler went unnoticed"


def test_a_region_keeps_times() -> None:
    seen: list[tuple[str, Any, tuple[int, ...]]] = []

    class Tag(Vertex):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def on_recv(self, edge: int, message: Any, time: tuple[int, ...]) -> None:
            seen.append((self.tag, message, time))
            self.notify_at(time)

        def on_notify(self, time: tuple[int, ...]) -> None:
            seen.append((self.tag, "notify", time))
            if self.tag == "inner":
                self.send_by(0, "out", time)

    flow = Dataflow("region", arity=2)
    source = flow.input("in")
    with flow.scope("r", kind="region") as region:
        inner = region.stage("inner", lambda i, n: Tag("inner"), inputs=1, outputs=1)
    outer = flow.stage("outer", lambda i, n: Tag("outer"), inputs=1, outputs=0)
    flow.connect((source, 0), (inner, 0))
    flow.connect((inner, 0), (outer, 0))

    async def drive(worker: Worker) -> None:
        handle = worker.input(source)
        handle.send(["a"])
        handle.advance_to(1)
        handle.close()

    worker = Worker(flow, 0, 1, LocalHub.for_dataflow(flow, 1).link("w0"))
    asyncio.run(worker.run(drive, timeout=10))
    assert seen == [("inner", "a", (0, 0)), ("inner", "notify", (0, 0)), ("outer", "out", (0, 0)),
                    ("outer", "notify", (0, 0))]


def test_every_example_has_the_surface_and_a_command() -> None:
    import argparse

    from tracker.worker.cluster import EXAMPLES, load_example
    from tracker.worker.commands import add_commands

    commands = argparse.ArgumentParser(prog="tracker").add_subparsers()
    add_commands(commands)
    assert "digitroot" in EXAMPLES
    for name in EXAMPLES:
        assert commands.choices["example"].parse_args([name]).name == name
        module = load_example(name)
        for attribute in ("DEFAULTS", "build", "drive", "collect", "reference", "render"):
            assert hasattr(module, attribute), (name, attribute)
        module.build(module.DEFAULTS).nested()  # a graph the core accepts
