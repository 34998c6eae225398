"""Dataflow shapes shared by the benchmarks: chains, PageRank-like loops, rings, fan-outs, random graphs.

Each builder returns a validated :class:`~tracker.graph.Graph`; node 0 is always an input
(no inputs, one output) so the default initial pointstamps hold one capability there, and every
cycle passes through a feedback operator that advances time (so the trackers accept them).
:class:`Simulation` produces update batches that follow the protocol workers follow.

>>> graph = loop(5)
>>> len(graph.locations()), graph.arity
(10, 2)
>>> simulation = Simulation(graph)
>>> simulation.initial()
[(Location(node=0, port=0, kind='source'), (0, 0), 1)]
>>> for location, time, delta in simulation.step():  # the input moves to epoch 1, sends at epoch 0
...     print(location, time, delta)
(0,0,source) (1, 0) 1
(0,0,source) (0, 0) -1
(1,0,target) (0, 0) 1

For the benchmarks of the real service (and the tests, which use the same ones):
:func:`loop_graph` is a registration body, :func:`register` registers one with a running
:class:`~api.run.process.ServiceProcess`, :func:`update` is one update's JSON, and
:func:`core_graph` builds a body's core graph exactly as the service does.
"""

from __future__ import annotations

import random
from typing import Any

from api.run.process import ServiceProcess
from tracker.graph import Connection, Edge, Graph, Location, Node, Update
from tracker.timestamp import PathSummary, Timestamp


def chain(operators: int, arity: int = 1) -> Graph:
    """An input followed by ``operators - 1`` one-in-one-out operators in a line."""
    nodes = [Node(0, 0, 1, "input")] + [Node(i, 1, 1, f"map{i}") for i in range(1, operators)]
    edges = [Edge(Location.source(i, 0), Location.target(i + 1, 0)) for i in range(operators - 1)]
    return Graph.build(arity, nodes, edges)


def loop(operators: int) -> Graph:
    """A PageRank-like loop, stretched: input -> pagerank(2 inputs) -> ``operators - 3``
    operators in the loop body -> feedback (+1 iteration) -> back into pagerank. Arity 2:
    ``(epoch, iteration)``."""
    body = max(operators - 3, 1)
    feedback = 2 + body
    nodes = [Node(0, 0, 1, "input"), Node(1, 2, 1, "pagerank")]
    nodes += [Node(2 + i, 1, 1, f"body{i}") for i in range(body)]
    nodes.append(Node(feedback, 1, 1, "feedback", (Connection(0, 0, (PathSummary((0, 1)),)),)))
    edges = [Edge(Location.source(0, 0), Location.target(1, 0)), Edge(Location.source(1, 0), Location.target(2, 0))]
    edges += [Edge(Location.source(2 + i, 0), Location.target(3 + i, 0)) for i in range(body)]
    edges.append(Edge(Location.source(feedback, 0), Location.target(1, 1)))
    return Graph.build(2, nodes, edges)


def ring(operators: int = 100, arity: int = 1) -> Graph:
    """An input feeding a ring of ``operators`` one-output operators (the first has two inputs:
    the input's edge and the ring's back edge); the last one adds one to the last coordinate.
    ``2 * operators + 2`` locations; moving the input's capability moves every frontier."""
    step = PathSummary((0,) * (arity - 1) + (1,))
    nodes = [Node(0, 0, 1, "input")]
    for i in range(1, operators + 1):
        connections = (Connection(0, 0, (step,)),) if i == operators else None
        nodes.append(Node(i, 2 if i == 1 else 1, 1, f"op{i}", connections))
    edges = [Edge(Location.source(0, 0), Location.target(1, 1))]
    edges += [Edge(Location.source(i, 0), Location.target(1 if i == operators else i + 1, 0))
              for i in range(1, operators + 1)]
    return Graph.build(arity, nodes, edges)


def fanout(width: int, arity: int = 1) -> Graph:
    """An input whose one output feeds ``width`` one-in-one-out operators: ``2 * width + 1``
    locations, and one location with ``width`` outgoing edges."""
    nodes = [Node(0, 0, 1, "input")] + [Node(i, 1, 1, f"op{i}") for i in range(1, width + 1)]
    edges = [Edge(Location.source(0, 0), Location.target(i, 0)) for i in range(1, width + 1)]
    return Graph.build(arity, nodes, edges)


def random_graph(operators: int, seed: int = 1, feedback_every: int = 10, arity: int = 1) -> Graph:
    """A random layered DAG of one- and two-input operators, with a feedback operator (+1 on
    the last coordinate) closing a loop back to an earlier operator every ``feedback_every``
    operators."""
    rng = random.Random(seed)
    step = PathSummary((0,) * (arity - 1) + (1,))
    nodes: list[Node] = [Node(0, 0, 1, "input")]
    edges: list[Edge] = []
    for i in range(1, operators):
        if i % feedback_every == 0 and i > 2:
            nodes.append(Node(i, 1, 1, f"feedback{i}", (Connection(0, 0, (step,)),)))
        else:
            nodes.append(Node(i, 2 if rng.random() < 0.3 else 1, 1, f"op{i}"))
    for node in nodes[1:]:
        for port in range(node.inputs):
            upstream = rng.randrange(max(0, node.id - 5), node.id)
            edges.append(Edge(Location.source(upstream, 0), Location.target(node.id, port)))
    # Feedback outputs loop back into a fresh input port of an earlier operator.
    extended = {n.id: n for n in nodes}
    plain = [n.id for n in nodes[1:] if not n.name.startswith("feedback")]
    for node in nodes:
        if node.name.startswith("feedback"):
            back = rng.choice([p for p in plain if p < node.id])
            old = extended[back]
            extended[back] = Node(old.id, old.inputs + 1, old.outputs, old.name)
            edges.append(Edge(Location.source(node.id, 0), Location.target(back, old.inputs)))
    return Graph.build(arity, [extended[i] for i in sorted(extended)], edges)


class Simulation:
    """Protocol-following update batches for a graph, as workers would report them.

    Holds the messages in flight (at targets) and the input capabilities. Each :meth:`step`
    either advances an input's epoch (``+1`` at the new epoch, ``-1`` at the old, and a message
    for the old epoch on each outgoing edge) or processes one message: ``-1`` where it was,
    ``+1`` for each message it produces downstream (times advanced by the connection's summary;
    a message crossing a feedback stops after ``max_rounds`` iterations so loops end). Deterministic
    for a seed. :meth:`advance_epoch` and :meth:`process_message` make the two kinds of batch
    on demand, for workloads that schedule them themselves.
    """

    def __init__(self, graph: Graph, seed: int = 7, max_rounds: int = 3) -> None:
        self.graph = graph
        self.rng = random.Random(seed)
        self.max_rounds = max_rounds
        self.downstream: dict[Location, list[Location]] = {}
        for edge in graph.edges:
            self.downstream.setdefault(edge.source, []).append(edge.target)
        self.inputs = [loc for loc, _, _ in graph.default_initial()]
        self.epoch = {loc: graph.default_initial()[0][1] for loc in self.inputs}
        self.messages: list[tuple[Location, Timestamp]] = []
        self.nodes = {n.id: n for n in graph.nodes}

    def initial(self) -> list[Update]:
        """The registration's initial pointstamps."""
        return self.graph.default_initial()

    def step(self) -> list[Update]:
        """One atomic batch of updates."""
        if not self.messages or self.rng.random() < 0.05:
            return self.advance_epoch()
        return self.process_message()

    def advance_epoch(self) -> list[tuple[Location, tuple[int, ...], int]]:
        """An input's epoch advances: ``+1`` at the new epoch, ``-1`` at the old, and a message
        for the old epoch on each outgoing edge."""
        source = self.rng.choice(self.inputs)
        old = self.epoch[source]
        new = (old[0] + 1, *old[1:])
        self.epoch[source] = new
        batch = [(source, new, 1), (source, old, -1)]
        for target in self.downstream.get(source, []):
            self.messages.append((target, old))
            batch.append((target, old, 1))
        return batch

    def process_message(self, oldest: bool = False) -> list[tuple[Location, tuple[int, ...], int]]:
        """A message in flight (a random one, or with ``oldest`` the oldest) is processed:
        ``-1`` where it was and ``+1`` for each message it produces downstream. Needs one."""
        if oldest:
            target, time = self.messages.pop(0)
        else:
            index = self.rng.randrange(len(self.messages))
            self.messages[index], self.messages[-1] = self.messages[-1], self.messages[index]
            target, time = self.messages.pop()
        batch = [(target, time, -1)]
        node = self.nodes[target.node]
        for conn in self.graph.connections(node):
            if conn.input != target.port:
                continue
            summary = conn.summaries[0]
            moved = summary.results_in(time)
            if moved is None or (not summary.is_zero() and self._loop_ends(moved)):
                continue
            for dest in self.downstream.get(Location.source(node.id, conn.output), []):
                self.messages.append((dest, moved))
                batch.append((dest, moved, 1))
        return batch

    def _loop_ends(self, moved: Timestamp) -> bool:
        if self.graph.arity > 1:
            return moved[-1] > self.max_rounds
        return self.rng.random() < 1 / self.max_rounds


def loop_graph(operators: int = 3, arity: int = 1, name: str = "loop") -> dict[str, Any]:
    """A registration body: an input operator feeding a ring of ``operators`` operators whose
    last one increments the last coordinate (a feedback loop)."""
    increment = [0] * (arity - 1) + [1]
    nodes: list[dict[str, Any]] = [{"id": 0, "name": "input", "inputs": 0, "outputs": 1}]
    for i in range(1, operators + 1):
        node: dict[str, Any] = {"id": i, "name": f"op{i}", "inputs": 2 if i == 1 else 1, "outputs": 1}
        if i == operators:
            node["connections"] = [{"input": 0, "output": 0, "summaries": [increment]}]
        nodes.append(node)
    edges = [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 1}}]
    for i in range(1, operators + 1):
        nxt = 1 if i == operators else i + 1
        edges.append({"source": {"node": i, "port": 0}, "target": {"node": nxt, "port": 0}})
    return {"name": name, "timestamp_arity": arity, "nodes": nodes, "edges": edges}


def core_graph(body: dict[str, Any]) -> tuple[Graph, list[Update]]:
    """The core ``Graph`` and initial pointstamps of a registration body, built exactly as the
    service builds them (for local oracles and native baselines)."""
    from api.host.service import build_graph, registration_record
    from api.schema.models import RegisterRequest

    return build_graph(registration_record(RegisterRequest.model_validate(body)))


def register(service: ServiceProcess, body: dict[str, Any]) -> tuple[str, str]:
    """Register ``body`` with the admin token; returns ``(id, token)``."""
    with service.client() as client:
        answer = client.post("/v1/dataflows", json=body)
    assert answer.status_code == 201, answer.text
    data = answer.json()
    return data["id"], data["token"]


def program_token(service: ServiceProcess) -> str:
    """The program token the service generated into its warehouse (``<warehouse>/program-token``:
    the service process writes it when it starts; no ``TRACKER_PROGRAM_TOKEN`` is set for it)."""
    return (service.warehouse / "program-token").read_text().strip()


def update(node: int, port: int, kind: str, time_: list[int], delta: int) -> dict[str, Any]:
    """One update's JSON."""
    return {"location": {"node": node, "port": port, "kind": kind}, "time": time_, "delta": delta}


def diamonds_graph(k: int, name: str = "diamonds") -> dict[str, Any]:
    """A registration body of arity 2: an input, then a chain of ``k`` diamonds, each two
    branches (summaries ``[1, 0]`` and ``[0, 1]``) from the previous output joining in one
    node. From the input, the minimal path summaries to the ``j``-th join are the ``j + 1``
    incomparable ``[a, j - a]``: the antichains, and the frontiers one time there makes, grow
    with ``k``.

    >>> body = diamonds_graph(2)
    >>> len(body["nodes"]), len(body["edges"])
    (7, 8)
    """
    nodes: list[dict[str, Any]] = [{"id": 0, "name": "input", "inputs": 0, "outputs": 1}]
    edges: list[dict[str, Any]] = []
    previous = 0
    for i in range(k):
        a, b, join = 3 * i + 1, 3 * i + 2, 3 * i + 3
        for node, summary in ((a, [1, 0]), (b, [0, 1])):
            nodes.append({"id": node, "inputs": 1, "outputs": 1,
                          "connections": [{"input": 0, "output": 0, "summaries": [summary]}]})
            edges.append({"source": {"node": previous, "port": 0}, "target": {"node": node, "port": 0}})
        nodes.append({"id": join, "inputs": 2, "outputs": 1})
        edges += [{"source": {"node": a, "port": 0}, "target": {"node": join, "port": 0}},
                  {"source": {"node": b, "port": 0}, "target": {"node": join, "port": 1}}]
        previous = join
    return {"name": name, "timestamp_arity": 2, "nodes": nodes, "edges": edges}
