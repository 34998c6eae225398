"""The violation rule against simulated protocol-following programs (``docs/core.md``, "Negative
counts and violations").

Workers are simulated as timely's are: each holds capabilities at operator outputs, sends
messages along edges under them (``+1`` at the target), consumes messages (``-1``, maybe taking
capabilities at the operator's outputs through its connections' summaries), copies, downgrades
and drops capabilities, and records every such update in a local buffer that it sends, whole and
in order, whenever it likes: never (a capability held), at once (timely's ``Eager``), or in
between (``Demand`` defers any update; this sends less often than ``Demand`` ever may). The
service sees, at every moment, some prefix of each worker's batches, applied in any interleaving.

The rule's claim: at every such moment, every negative count is explained (a live pointstamp
could-result-in it), so :func:`api.live.lifecycle.assess` never reports a violation; and a
message consumed twice, once everything else has drained, is one. The tests draw random graphs
(with loops), random executions and random interleavings, and check every state against the
reference tracker's frontier (positive counts only).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.live.lifecycle import Rules, assess, frontier_explains
from tests.strategies import acyclic_graphs, break_cycles
from tracker.graph import Edge, Graph, Location, Update
from tracker.reachability import Tracker
from tracker.timestamp import Timestamp

RULES = Rules(stall_seconds=60.0)
ACTIONS = ["message"] * 3 + ["receive"] * 3 + ["flush"] * 2 + ["copy", "downgrade", "drop"]
"""Weighted so that messages cross between workers often: what makes counts go negative."""


@dataclass
class SimWorker:
    """One simulated worker: what it holds, what it has not sent, what it sent (batches, in order)."""

    capabilities: Counter[tuple[Location, Timestamp]] = field(default_factory=Counter)
    buffer: list[Update] = field(default_factory=list)
    sent: list[list[Update]] = field(default_factory=list)

    def flush(self) -> None:
        if self.buffer:
            self.sent.append(self.buffer)
            self.buffer = []


@st.composite
def connected_graphs(draw: st.DrawFn) -> Graph:
    """A random graph whose every output leads somewhere (so capabilities send messages), its
    loops made to advance time."""
    graph = draw(acyclic_graphs(loops=True, max_nodes=5))
    targets = [loc for loc in graph.locations() if loc.kind == "target"]
    edges = list(graph.edges)
    if targets:
        for source in (loc for loc in graph.locations() if loc.kind == "source"):
            if not any(e.source == source for e in edges):
                edges.append(Edge(source, draw(st.sampled_from(targets))))
    return break_cycles(Graph.build(graph.arity, list(graph.nodes), edges))


def _later(draw: st.DrawFn, time: Timestamp) -> Timestamp:
    return tuple(c + draw(st.integers(0, 1)) for c in time)


def simulate(draw: st.DrawFn, graph: Graph, workers: int, steps: int, drain: bool) -> tuple[list[Update],
                                                                                          list[SimWorker]]:
    """A random protocol-following execution: the initial pointstamps (one capability per worker
    at each output of each node without inputs, as timely's workers start) and every worker's
    batches. With ``drain``, everything is consumed, dropped and sent at the end."""
    sim = [SimWorker() for _ in range(workers)]
    initial: list[Update] = []
    for location, time, _ in graph.default_initial():
        initial.append((location, time, workers))
        for worker in sim:
            worker.capabilities[(location, time)] += 1
    outgoing = {source: [e.target for e in graph.edges if e.source == source] for source in graph.locations()}
    nodes = {node.id: node for node in graph.nodes}
    messages: list[tuple[Location, Timestamp, int]] = []

    def receive(index: int) -> None:
        target, time, receiver = messages.pop(index)
        worker = sim[receiver]
        worker.buffer.append((target, time, -1))
        for connection in graph.connections(nodes[target.node]):
            if connection.input == target.port and draw(st.booleans()):
                summary = draw(st.sampled_from(connection.summaries))
                later = summary.results_in(time)
                assert later is not None
                source = Location.source(target.node, connection.output)
                worker.buffer.append((source, later, 1))
                worker.capabilities[(source, later)] += 1

    for _ in range(steps):
        w = draw(st.integers(0, workers - 1))
        worker = sim[w]
        held = sorted(c for c, n in worker.capabilities.items() if n > 0)
        action = draw(st.sampled_from(ACTIONS))
        if action == "receive" and messages:
            receive(draw(st.integers(0, len(messages) - 1)))
        elif action == "flush":
            worker.flush()
        elif held and action in ("message", "copy", "downgrade", "drop"):
            source, time = draw(st.sampled_from(held))
            if action == "message" and outgoing[source]:
                target = draw(st.sampled_from(outgoing[source]))
                worker.buffer.append((target, time, 1))
                messages.append((target, time, draw(st.integers(0, workers - 1))))
            elif action in ("copy", "downgrade"):
                later = _later(draw, time)
                worker.buffer.append((source, later, 1))
                worker.capabilities[(source, later)] += 1
                if action == "downgrade":
                    worker.buffer.append((source, time, -1))
                    worker.capabilities[(source, time)] -= 1
            elif action == "drop":
                worker.buffer.append((source, time, -1))
                worker.capabilities[(source, time)] -= 1
    if drain:
        while messages:
            receive(0)
        for worker in sim:
            for (source, time), n in worker.capabilities.items():
                if n > 0:
                    worker.buffer.append((source, time, -n))
            worker.capabilities.clear()
            worker.flush()
    return initial, sim


def interleave(draw: st.DrawFn, sim: list[SimWorker]) -> list[list[Update]]:
    """Every worker's batches in its own order, the workers' interleaved at random (what the
    service applies), cut after a random number of them (what it has received so far)."""
    order = [w for w, worker in enumerate(sim) for _ in worker.sent]
    order = draw(st.permutations(order))
    taken = draw(st.integers(0, len(order)))
    cursor = [0] * len(sim)
    applied = []
    for w in order[:taken]:
        applied.append(sim[w].sent[cursor[w]])
        cursor[w] += 1
    return applied


def unexplained(graph: Graph, initial: list[Update], batches: list[list[Update]]) -> list[tuple[int, list[str]]]:
    """For each state the service passes through (after each batch), the negative counts no live
    pointstamp explains, and whether :func:`assess` said ``violation`` exactly then."""
    tracker = Tracker(graph)
    tracker.apply(initial)
    found = []
    for step, batch in enumerate([[], *batches]):
        tracker.apply(batch)
        counts = tracker.pointstamps()
        explains = frontier_explains(tracker.frontier)
        bad = [f"{loc}@{list(t)}: {c}" for (loc, t), c in counts.items() if c < 0 and not explains(loc, t)]
        state = assess(RULES, counts, last_change=0.0, last_batch=0.0, now=1.0, explained=explains)["state"]
        assert (state == "violation") == bool(bad), (state, bad)
        if bad:
            found.append((step, bad))
    return found


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_protocol_following_program_never_shows_an_unexplained_negative_count(data: st.DataObject) -> None:
    graph = data.draw(connected_graphs())
    # Two workers at least: one worker's own batches never leave a negative count behind.
    initial, sim = simulate(data.draw, graph, data.draw(st.integers(2, 3)), data.draw(st.integers(0, 60)),
                            drain=data.draw(st.booleans()))
    for _ in range(3):  # several views of the same execution
        assert unexplained(graph, initial, interleave(data.draw, sim)) == []


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_message_consumed_twice_is_a_violation_once_the_program_drains(data: st.DataObject) -> None:
    graph = data.draw(connected_graphs())
    initial, sim = simulate(data.draw, graph, data.draw(st.integers(1, 3)), data.draw(st.integers(5, 40)),
                            drain=True)
    consumptions = [(w, b, u) for w, worker in enumerate(sim) for b, batch in enumerate(worker.sent)
                    for u, (loc, _, delta) in enumerate(batch) if loc.kind == "target" and delta < 0]
    if not consumptions:
        return
    w, b, u = data.draw(st.sampled_from(consumptions))
    sim[w].sent[b] = [*sim[w].sent[b], sim[w].sent[b][u]]  # the same message retired once more
    every = [batch for worker in sim for batch in worker.sent]
    found = unexplained(graph, initial, every)
    assert found and found[-1][0] == len(every), found  # the last state (everything applied) is one
    location, time, _ = sim[w].sent[b][u]
    assert any(entry.startswith(f"{location}@{list(time)}: ") for entry in found[-1][1]), found


def test_a_deferred_increment_under_a_held_capability_is_stalled_not_a_violation() -> None:
    """Timely's ``Demand`` mode, as reported: worker 0 holds its capability at 2 and sends
    messages at 3 to worker 1, deferring their ``+1`` (they cannot change any frontier while the
    capability is held); worker 1 reports consuming them. The count of ``-2`` at 3 is explained by
    the held capability for as long as it is held, however long no batch arrives: the dataflow is
    ``stalled``, and the blame (the capability) is what holds it."""
    from tests.helpers import chain

    graph = chain(2)
    source, target = Location.source(0, 0), Location.target(1, 0)
    tracker = Tracker(graph)
    tracker.apply([(source, (0,), 1), (source, (2,), 1), (source, (0,), -1)])  # the capability moved to 2
    tracker.apply([(target, (3,), -2)])  # worker 1's consumption; worker 0's +2 deferred
    counts = tracker.pointstamps()
    status = assess(RULES, counts, last_change=0.0, last_batch=0.0, now=150.0, explained=frontier_explains(
        tracker.frontier))
    assert status["state"] == "stalled" and status["violations"] == [], status
    assert counts[(target, (3,))] == -2 and tracker.frontier(target) == [(2,)]


def test_a_worker_that_reorders_its_own_updates_is_caught() -> None:
    """A worker retires the capability it sent a message under before it reports the message
    (two batches, the wrong way round) while the receiver reports the consumption: the service
    sees the consumption with nothing live upstream, which no protocol-following order allows."""
    from tests.helpers import chain

    graph = chain(2)
    source, target = Location.source(0, 0), Location.target(1, 0)
    batches = [[(source, (0,), -1)], [(target, (0,), -1)], [(target, (0,), 1)]]
    found = unexplained(graph, graph.default_initial(), batches)
    assert [step for step, _ in found] == [2], found
