"""The vertex API (Naiad's ``onRecv``/``onNotify``/``sendBy``/``notifyAt``) and the logical
dataflow a program declares.

A :class:`Dataflow` is a *logical* graph of stages joined by channels. At run time every
worker process hosts one :class:`Vertex` per stage (data parallelism, as in Naiad): a channel's
``partition`` function picks the worker whose vertex receives each message (no function: the
vertex of the same worker). The service tracks progress on the logical graph (Naiad's
projection of physical pointstamps onto logical ones), so every vertex of a stage shares the
frontier of the stage's inputs: coarser, never unsafe.

How callbacks become occurrence counts (locations as in :mod:`tracker.graph`; ``docs/workers.md``
restates this table):

* ``send_by(port, m, t)``: ``+1`` at ``(target, t)`` for every channel leaving output ``port``
  (the message's pointstamp lives at the receiving input, as in timely);
* ``on_recv(port, m, t)`` completing: ``-1`` at ``(stage's input port, t)``;
* ``notify_at(t)``: ``+1`` at every *output* of the stage (a capability, as timely holds them
  at outputs); a stage without outputs needs none, since nothing downstream could be held;
  repeated requests for the same time are coalesced into one;
* ``on_notify(t)`` completing: ``-1`` at every output.

The ``-1`` of what a callback consumed and the ``+1`` of everything it produced travel in one
atomic batch. Times a callback produces are checked against the stage's connection summaries
(no sending back in time); a violation raises :class:`ProgressError` at the call.

>>> class Doubler(Vertex):
...     def on_recv(self, edge, message, time):
...         self.send_by(0, 2 * message, time)
>>> flow = Dataflow("demo")
>>> source = flow.input("numbers")
>>> double = flow.stage("double", lambda worker, workers: Doubler(), inputs=1, outputs=1)
>>> flow.connect((source, 0), (double, 0), partition=lambda n: n)
>>> flow.registration(workers=2)["initial"]
[{'location': {'node': 0, 'port': 0, 'kind': 'source'}, 'time': [0], 'delta': 2}]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracker.graph import Connection, Edge, Graph, Location, Node
from tracker.timestamp import PathSummary, Timestamp, less_equal

Partition = Callable[[Any], int]
"""Maps a message to a worker index (taken modulo the number of workers)."""


class ProgressError(RuntimeError):
    """A vertex broke the progress protocol: a time earlier than it may produce, a call outside
    a callback, an unknown port. Raised at the offending call, before any count changes."""


class Scheduler(Protocol):
    """What a :class:`Vertex` calls into; implemented by :class:`tracker.worker.Worker`."""

    def send_by(self, vertex: Vertex, port: int, message: Any, time: Timestamp) -> None: ...

    def notify_at(self, vertex: Vertex, time: Timestamp) -> None: ...


class Vertex:
    """One data-parallel instance of a stage. Subclass it and override the callbacks.

    ``on_recv(edge, message, time)`` is called for every message arriving at input ``edge``;
    ``on_notify(time)`` once per requested time, and only when no message at a time ``<= time``
    can reach this vertex any more (the guarantee the whole system exists for). From inside
    either callback the vertex may call :meth:`send_by` and :meth:`notify_at`. ``index`` and
    ``peers`` say which of how many instances this is.

    >>> class Doubler(Vertex):
    ...     def on_recv(self, edge, message, time):
    ...         self.send_by(0, 2 * message, time)
    """

    index: int = 0
    peers: int = 1
    stage: int = -1
    _scheduler: Scheduler | None = None

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        """A message arrived at input ``edge`` at ``time``. Default: ignore it."""

    def on_notify(self, time: Timestamp) -> None:
        """Every message at times ``<= time`` has been delivered here. Default: nothing."""

    def send_by(self, edge: int, message: Any, time: Timestamp) -> None:
        """Send ``message`` at ``time`` along every channel leaving output ``edge``.

        ``time`` must be reachable from what the current callback holds (``>=`` its time, plus
        the stage's connection summary); raises :class:`ProgressError` otherwise."""
        if self._scheduler is None:
            raise ProgressError("send_by called on a vertex that is not running")
        self._scheduler.send_by(self, edge, message, tuple(time))

    def notify_at(self, time: Timestamp) -> None:
        """Ask for ``on_notify(time)`` once nothing at a time ``<= time`` can arrive any more."""
        if self._scheduler is None:
            raise ProgressError("notify_at called on a vertex that is not running")
        self._scheduler.notify_at(self, tuple(time))


class Feedback(Vertex):
    """Naiad's feedback vertex: forwards every message with the loop counter (the last
    coordinate) incremented by one. Stages made by :meth:`Dataflow.feedback` use it."""

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        self.send_by(0, message, (*time[:-1], time[-1] + 1))


VertexFactory = Callable[[int, int], Vertex]
"""Builds the vertex of worker ``index`` out of ``peers`` workers."""


@dataclass
class Stage:
    """A logical operator: ``inputs`` targets, ``outputs`` sources, a vertex per worker.

    ``factory`` is ``None`` for input stages (driven through
    :class:`tracker.worker.InputHandle`). ``connections`` maps ``(input, output)`` to the least
    increments the stage applies; ``None`` means every input reaches every output unchanged.
    """

    id: int
    name: str
    inputs: int
    outputs: int
    factory: VertexFactory | None
    connections: dict[tuple[int, int], list[tuple[int, ...]]] | None = None


@dataclass
class Channel:
    """A logical edge from output ``source`` to input ``target`` with an optional partition."""

    source: Location
    target: Location
    partition: Partition | None = None


@dataclass
class Dataflow:
    """A logical timely dataflow: stages, channels and the timestamp arity.

    Stage ids are assigned in declaration order from 0 and are the node ids the service sees.
    """

    name: str
    arity: int = 1
    stages: list[Stage] = field(default_factory=list)
    channels: list[Channel] = field(default_factory=list)

    def input(self, name: str, outputs: int = 1) -> int:
        """Declare an input stage; every worker holds one capability at the zero time on each
        output until it advances or closes its :class:`~tracker.worker.InputHandle`."""
        return self._add(Stage(len(self.stages), name, 0, outputs, None))

    def stage(self, name: str, factory: VertexFactory, inputs: int, outputs: int,
              connections: dict[tuple[int, int], list[tuple[int, ...]]] | None = None) -> int:
        """Declare a stage whose vertices ``factory(index, peers)`` builds; returns its id.

        ``connections`` maps ``(input, output)`` to the least increments from that input to that
        output (default: every input reaches every output unchanged).

        Raises:
            ValueError: ``inputs < 1`` (an input stage is declared with :meth:`input`).
        """
        if inputs < 1:
            raise ValueError(f"stage {name!r}: a vertex stage needs at least one input (use input())")
        return self._add(Stage(len(self.stages), name, inputs, outputs, factory, connections))

    def feedback(self, name: str = "feedback") -> int:
        """A :class:`Feedback` stage: one input, one output, summary ``+1`` on the last
        coordinate. Every cycle must pass through one (the service refuses others)."""
        step = tuple([0] * (self.arity - 1) + [1])
        return self.stage(name, lambda index, peers: Feedback(), 1, 1, {(0, 0): [step]})

    def connect(self, source: tuple[int, int], target: tuple[int, int], partition: Partition | None = None) -> None:
        """Add a channel from ``(stage, output)`` to ``(stage, input)``; ``partition`` routes
        each message to worker ``partition(message) % peers`` (default: the same worker).

        Raises:
            ValueError: the stage has no such port.
        """
        src, dst = Location.source(*source), Location.target(*target)
        for loc, count in ((src, self.stages[src.node].outputs), (dst, self.stages[dst.node].inputs)):
            if not 0 <= loc.port < count:
                raise ValueError(f"{loc}: stage {self.stages[loc.node].name!r} has {count} such ports")
        self.channels.append(Channel(src, dst, partition))

    def _add(self, stage: Stage) -> int:
        self.stages.append(stage)
        return stage.id

    def graph(self) -> Graph:
        """The logical graph as the core's :class:`~tracker.graph.Graph`.

        Raises:
            tracker.graph.GraphError: the declared graph is invalid (a bad summary, say).
        """
        nodes = []
        for s in self.stages:
            conns = None
            if s.connections is not None:
                conns = tuple(Connection(i, o, tuple(PathSummary(x) for x in sums))
                              for (i, o), sums in sorted(s.connections.items()))
            nodes.append(Node(s.id, s.inputs, s.outputs, s.name, conns))
        return Graph.build(self.arity, nodes, [Edge(c.source, c.target) for c in self.channels])

    def initial(self, workers: int) -> list[tuple[Location, Timestamp, int]]:
        """One capability per worker at the zero time on each output of each input stage."""
        zero = (0,) * self.arity
        return [(Location.source(s.id, p), zero, workers) for s in self.stages if s.factory is None
                for p in range(s.outputs)]

    def registration(self, workers: int) -> dict[str, Any]:
        """The ``POST /v1/dataflows`` body for a run with ``workers`` worker processes."""
        nodes: list[dict[str, Any]] = []
        for s in self.stages:
            node: dict[str, Any] = {"id": s.id, "name": s.name, "inputs": s.inputs, "outputs": s.outputs}
            if s.connections is not None:
                node["connections"] = [{"input": i, "output": o, "summaries": [list(x) for x in sums]}
                                       for (i, o), sums in sorted(s.connections.items())]
            nodes.append(node)
        edges = [{"source": {"node": c.source.node, "port": c.source.port},
                  "target": {"node": c.target.node, "port": c.target.port}} for c in self.channels]
        initial = [location_update(loc, t, d) for loc, t, d in self.initial(workers)]
        return {"name": self.name, "timestamp_arity": self.arity, "nodes": nodes, "edges": edges,
                "initial": initial}

    def summaries(self, stage: int, input_port: int, output_port: int) -> list[tuple[int, ...]]:
        """The least increments from ``input_port`` to ``output_port`` of ``stage`` (empty if
        the input does not reach that output)."""
        s = self.stages[stage]
        if s.connections is None:
            return [(0,) * self.arity]
        return [tuple(x) for x in s.connections.get((input_port, output_port), [])]


def location_update(location: Location, time: Sequence[int], delta: int) -> dict[str, Any]:
    """One update in the service's JSON shape."""
    return {"location": {"node": location.node, "port": location.port, "kind": location.kind},
            "time": list(time), "delta": delta}


def reachable(summaries: Sequence[Sequence[int]], held: Timestamp, time: Timestamp) -> bool:
    """True iff some summary ``s`` gives ``s(held) <= time``: ``time`` may be produced by a
    callback holding ``held``.

    >>> reachable([(0, 1)], (3, 0), (3, 1)), reachable([(0, 1)], (3, 0), (3, 0))
    (True, False)
    """
    return any(less_equal(tuple(h + d for h, d in zip(held, s, strict=True)), time) for s in summaries)
