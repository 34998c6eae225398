"""The vertex API (Naiad's ``onRecv``/``onNotify``/``sendBy``/``notifyAt``) and the logical
dataflow a program declares.

A :class:`Dataflow` is a *logical* graph of stages joined by channels. At run time every
worker process hosts one :class:`Vertex` per stage (data parallelism, as in Naiad): a channel's
``partition`` function picks the worker whose vertex receives each message (no function: the
vertex of the same worker). The service tracks progress on the logical graph (Naiad's
projection of physical pointstamps onto logical ones), so every vertex of a stage shares the
frontier of the stage's inputs: coarser, never unsafe.

How callbacks become occurrence counts (locations as in :mod:`tracker.graph`, those inside a
nested scope as in :mod:`tracker.scope`; ``docs/workers.md`` restates this table):

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

Long because: the dataflow a worker program declares (stages, channels, scopes) and the
vertex API it hosts are one vocabulary that a user reads together.

>>> class Doubler(Vertex):
...     def on_recv(self, edge, message, time):
...         self.send_by(0, 2 * message, time)
>>> flow = Dataflow("demo")
>>> source = flow.input("numbers")
>>> double = flow.stage("double", lambda worker, workers: Doubler(), inputs=1, outputs=1)
>>> flow.connect((source, 0), (double, 0), partition=lambda n: n)
>>> flow.registration(workers=2)["initial"]
[{'location': {'node': 0, 'port': 0, 'kind': 'source'}, 'time': [0], 'delta': 2}]

**Nested scopes.** :meth:`Dataflow.scope` opens a scope (a :class:`Subscope`) in which stages
are declared the same way, and scopes nest to any depth. In an ``iterative`` scope stages see
times with one more coordinate, the loop counter, and its ``feedback()`` stage increments it;
a ``region`` keeps its parent's times. :meth:`Dataflow.connect` joins stages of any two scopes:
the builder gives every scope the channel crosses a port for it, and the runtime carries the
message's time across (entering a loop appends ``0``, leaving it drops the counter) and counts
it at the receiving input, in that input's scope and time. Only the root holds input stages.

>>> flow = Dataflow("collatz")
>>> numbers = flow.input("numbers")
>>> with flow.scope("loop") as loop:                 # times (epoch, step) inside
...     step = loop.stage("step", lambda index, peers: Vertex(), inputs=2, outputs=2)
...     again = loop.feedback()                      # (e, s) -> (e, s + 1)
>>> done = flow.stage("done", lambda index, peers: Vertex(), inputs=1, outputs=0)
>>> flow.connect((numbers, 0), (step, 0))             # enters the loop: (e,) -> (e, 0)
>>> flow.connect((step, 0), (again, 0))
>>> flow.connect((again, 0), (step, 1))
>>> flow.connect((step, 1), (done, 0))                # leaves it: (e, s) -> (e,)
>>> [(s.name, s.scope, s.node, flow.arity_of(s.id)) for s in flow.stages]
[('numbers', (), 0, 1), ('step', (1,), 1, 2), ('feedback', (1,), 2, 2), ('done', (), 2, 1)]
>>> [(n["id"], n["name"], n["inputs"], n["outputs"], "scope" in n) for n in flow.registration(1)["nodes"]]
[(0, 'numbers', 0, 1, False), (1, 'loop', 1, 1, True), (2, 'done', 1, 0, False)]
>>> flow.nested().scope_summaries[(1,)]                # the loop, seen from outside
{(0, 0): ((0,),)}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tracker.graph import Connection, Edge, Graph, Kind, Location, Node
from tracker.scope import NestedGraph, ScopedLocation, ScopePath
from tracker.timestamp import PathSummary, Timestamp, less_equal

Partition = Callable[[Any], int]
"""Maps a message to a worker index (taken modulo the number of workers)."""
AnyLocation = Location | ScopedLocation
"""A location as the SDK reports it: a :class:`~tracker.graph.Location` in the root scope (so
that flat dataflows report exactly what they always did), a
:class:`~tracker.scope.ScopedLocation` inside a nested scope."""
ScopeKind = Literal["iterative", "region"]


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
    scope: ScopePath = ()
    """The path of scope-node ids from the root to the scope holding this stage."""
    node: int = -1
    """The stage's node id within its scope (``-1``: its ``id``, as in a flat dataflow)."""

    def __post_init__(self) -> None:
        if self.node < 0:
            self.node = self.id

    def source(self, port: int) -> AnyLocation:
        """Output ``port`` as a location of the registered graph."""
        return at(self.scope, self.node, port, "source")

    def target(self, port: int) -> AnyLocation:
        """Input ``port`` as a location of the registered graph."""
        return at(self.scope, self.node, port, "target")


@dataclass
class Channel:
    """A logical edge from output ``source`` to input ``target`` with an optional partition
    (``node`` in both is the stage id; :meth:`Stage.source` and :meth:`Stage.target` give the
    locations the service sees)."""

    source: Location
    target: Location
    partition: Partition | None = None
    leave: int = 0
    """Iterative scopes the channel leaves: egress drops this many last coordinates."""
    enter: int = 0
    """Iterative scopes the channel enters: ingress appends this many zeros."""

    def carry(self, time: Timestamp) -> Timestamp:
        """A time at the source as a time at the target (egress, then ingress).

        >>> Channel(Location.source(1, 0), Location.target(2, 0), leave=2, enter=1).carry((4, 3, 2))
        (4, 0)
        """
        if self.leave:
            time = time[:len(time) - self.leave]
        return (*time, *(0,) * self.enter) if self.enter else time


@dataclass
class _ScopeState:
    """What the builder knows of one scope (the root included)."""

    path: ScopePath
    name: str
    kind: str  # "root", "iterative" or "region"
    arity: int
    next_node: int
    members: list[tuple[int, int | None]] = field(default_factory=list)  # (node, stage id or None: a scope)
    inputs: int = 0
    outputs: int = 0
    edges: list[tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=list)
    ingress: dict[tuple[int, int], int] = field(default_factory=dict)  # parent's source -> our input port
    egress: dict[tuple[int, int], int] = field(default_factory=dict)  # inner source -> our output port

    def add(self) -> int:
        node = self.next_node
        self.next_node += 1
        return node

    def edge(self, source: tuple[int, int], target: tuple[int, int], *, once: bool) -> None:
        if not (once and (source, target) in self.edges):
            self.edges.append((source, target))


@dataclass
class Dataflow:
    """A logical timely dataflow: stages, channels and the timestamp arity (of the root scope).

    Stage ids are assigned in declaration order from 0, across all scopes; in a dataflow without
    scopes they are also the node ids the service sees. :meth:`scope` opens a nested scope
    (a :class:`Subscope`), which declares stages inside it the same way; :meth:`connect` joins
    stages of any two scopes.
    """

    name: str
    arity: int = 1
    stages: list[Stage] = field(default_factory=list)
    channels: list[Channel] = field(default_factory=list)
    last_epoch: int | None = None
    """The last epoch the inputs send at, if known: registered, so the service's progress
    estimates say when each operator should be done."""
    _scopes: dict[ScopePath, _ScopeState] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        root = self._scopes[()] = _ScopeState((), self.name, "root", self.arity, 0)
        for stage in self.stages:  # given to the constructor: a flat dataflow
            root.members.append((stage.node, stage.id))
            root.next_node = max(root.next_node, stage.node + 1)
        for channel in self.channels:
            root.edges.append(((channel.source.node, channel.source.port), (channel.target.node, channel.target.port)))

    def input(self, name: str, outputs: int = 1) -> int:
        """Declare an input stage (in the root scope); every worker holds one capability at the
        zero time on each output until it advances or closes its
        :class:`~tracker.worker.InputHandle`."""
        return self._add((), Stage(len(self.stages), name, 0, outputs, None))

    def stage(self, name: str, factory: VertexFactory, inputs: int, outputs: int,
              connections: dict[tuple[int, int], list[tuple[int, ...]]] | None = None) -> int:
        """Declare a stage whose vertices ``factory(index, peers)`` builds; returns its id.

        ``connections`` maps ``(input, output)`` to the least increments from that input to that
        output (default: every input reaches every output unchanged).

        Raises:
            ValueError: ``inputs < 1`` (an input stage is declared with :meth:`input`).
        """
        return self._stage((), name, factory, inputs, outputs, connections)

    def feedback(self, name: str = "feedback") -> int:
        """A :class:`Feedback` stage: one input, one output, summary ``+1`` on the last
        coordinate. Every cycle must pass through one (the service refuses others)."""
        return self._feedback((), name)

    def scope(self, name: str, kind: ScopeKind = "iterative") -> Subscope:
        """Open a nested scope in the root scope: ``iterative`` (its stages see times with one
        more coordinate, the loop counter) or ``region`` (the same times as outside)."""
        return self._scope((), name, kind)

    def arity_of(self, stage: int) -> int:
        """The arity of the times ``stage`` sees (its scope's)."""
        return self._scopes[self.stages[stage].scope].arity

    def connect(self, source: tuple[int, int], target: tuple[int, int], partition: Partition | None = None) -> None:
        """Add a channel from ``(stage, output)`` to ``(stage, input)``; ``partition`` routes
        each message to worker ``partition(message) % peers`` (default: the same worker).

        The stages may be in any two scopes: the channel leaves the source's scopes up to the
        innermost scope holding both, then enters the target's. Each scope node it crosses gets
        a port for it (shared by the channels from the same source), with the boundary edges
        inside, so that the registered graph holds the path; times are carried across (see
        :meth:`Channel.carry`).

        Raises:
            ValueError: the stage has no such port.
        """
        src, dst = Location.source(*source), Location.target(*target)
        for loc, count in ((src, self.stages[src.node].outputs), (dst, self.stages[dst.node].inputs)):
            if not 0 <= loc.port < count:
                raise ValueError(f"{loc}: stage {self.stages[loc.node].name!r} has {count} such ports")
        a, b = self.stages[src.node], self.stages[dst.node]
        common = 0
        while common < min(len(a.scope), len(b.scope)) and a.scope[common] == b.scope[common]:
            common += 1
        crossing = len(a.scope) != common or len(b.scope) != common
        here = (a.node, src.port)  # the source, in the scope being walked
        leave = enter = 0
        for depth in range(len(a.scope), common, -1):  # egress, innermost scope first
            inner = self._scopes[a.scope[:depth]]
            port = inner.egress.get(here)
            if port is None:
                port = inner.egress[here] = inner.outputs
                inner.outputs += 1
            inner.edge(here, (0, port), once=True)
            here = (a.scope[depth - 1], port)
            leave += inner.kind == "iterative"
        for depth in range(common + 1, len(b.scope) + 1):  # ingress, outermost scope first
            inner = self._scopes[b.scope[:depth]]
            port = inner.ingress.get(here)
            if port is None:
                port = inner.ingress[here] = inner.inputs
                inner.inputs += 1
            self._scopes[b.scope[:depth - 1]].edge(here, (b.scope[depth - 1], port), once=True)
            here = (0, port)
            enter += inner.kind == "iterative"
        self._scopes[b.scope].edge(here, (b.node, dst.port), once=crossing)
        self.channels.append(Channel(src, dst, partition, leave, enter))

    # -- declared through the root or a Subscope ----------------------------------------------------

    def _stage(self, path: ScopePath, name: str, factory: VertexFactory, inputs: int, outputs: int,
               connections: dict[tuple[int, int], list[tuple[int, ...]]] | None) -> int:
        if inputs < 1:
            raise ValueError(f"stage {name!r}: a vertex stage needs at least one input (use input())")
        return self._add(path, Stage(len(self.stages), name, inputs, outputs, factory, connections))

    def _feedback(self, path: ScopePath, name: str) -> int:
        arity = self._scopes[path].arity
        step = tuple([0] * (arity - 1) + [1])
        return self._stage(path, name, lambda index, peers: Feedback(), 1, 1, {(0, 0): [step]})

    def _scope(self, path: ScopePath, name: str, kind: ScopeKind) -> Subscope:
        if kind not in ("iterative", "region"):
            raise ValueError(f"scope {name!r}: kind must be 'iterative' or 'region', got {kind!r}")
        parent = self._scopes[path]
        node = parent.add()
        parent.members.append((node, None))
        child = (*path, node)
        self._scopes[child] = _ScopeState(child, name, kind, parent.arity + (kind == "iterative"), 1)
        return Subscope(self, child)

    def _add(self, path: ScopePath, stage: Stage) -> int:
        scope = self._scopes[path]
        stage.scope, stage.node = path, scope.add()
        scope.members.append((stage.node, stage.id))
        self.stages.append(stage)
        return stage.id

    # -- what the service and the trackers see -------------------------------------------------------

    def has_scopes(self) -> bool:
        """True iff some stage lives in a nested scope (or a scope was opened)."""
        return len(self._scopes) > 1

    def graph(self) -> Graph:
        """The logical graph as the core's :class:`~tracker.graph.Graph` (a dataflow without
        scopes; see :meth:`nested` for any dataflow).

        Raises:
            tracker.graph.GraphError: the declared graph is invalid (a bad summary, say).
            ValueError: the dataflow has nested scopes.
        """
        if self.has_scopes():
            raise ValueError(f"dataflow {self.name!r} has nested scopes: use nested()")
        nodes = []
        for s in self.stages:
            conns = None
            if s.connections is not None:
                conns = tuple(Connection(i, o, tuple(PathSummary(x) for x in sums))
                              for (i, o), sums in sorted(s.connections.items()))
            nodes.append(Node(s.id, s.inputs, s.outputs, s.name, conns))
        return Graph.build(self.arity, nodes, [Edge(c.source, c.target) for c in self.channels])

    def nested(self) -> NestedGraph:
        """The registered graph, scopes and all, as the core's :class:`~tracker.scope.NestedGraph`
        (what :class:`~tracker.scoped.ScopedTracker` tracks; fine for a flat dataflow too).

        Raises:
            tracker.graph.GraphError: the declared graph is invalid, naming the scope.
        """
        return NestedGraph.from_json(self.arity, self._body(()))

    def initial(self, workers: int) -> list[tuple[Location, Timestamp, int]]:
        """One capability per worker at the zero time on each output of each input stage."""
        zero = (0,) * self.arity
        return [(Location.source(s.node, p), zero, workers) for s in self.stages if s.factory is None
                for p in range(s.outputs)]

    def registration(self, workers: int) -> dict[str, Any]:
        """The ``POST /v1/dataflows`` body for a run with ``workers`` worker processes (nested
        scopes as ``"scope": {"kind", "nodes", "edges"}`` in their scope node)."""
        body = self._body(())
        initial = [location_update(loc, t, d) for loc, t, d in self.initial(workers)]
        extra = {} if self.last_epoch is None else {"last_epoch": self.last_epoch}
        return {"name": self.name, "timestamp_arity": self.arity, "nodes": body["nodes"], "edges": body["edges"],
                "initial": initial, **extra}

    def _body(self, path: ScopePath) -> dict[str, Any]:
        scope = self._scopes[path]
        nodes: list[dict[str, Any]] = []
        for node_id, stage_id in scope.members:
            if stage_id is None:
                child = self._scopes[(*path, node_id)]
                inner = self._body(child.path)
                nodes.append({"id": node_id, "name": child.name, "inputs": child.inputs, "outputs": child.outputs,
                              "scope": {"kind": child.kind, "nodes": inner["nodes"], "edges": inner["edges"]}})
                continue
            s = self.stages[stage_id]
            node: dict[str, Any] = {"id": node_id, "name": s.name, "inputs": s.inputs, "outputs": s.outputs}
            if s.connections is not None:
                node["connections"] = [{"input": i, "output": o, "summaries": [list(x) for x in sums]}
                                       for (i, o), sums in sorted(s.connections.items())]
            nodes.append(node)
        edges = [{"source": {"node": a, "port": p}, "target": {"node": b, "port": q}}
                 for (a, p), (b, q) in scope.edges]
        return {"nodes": nodes, "edges": edges}

    def summaries(self, stage: int, input_port: int, output_port: int) -> list[tuple[int, ...]]:
        """The least increments from ``input_port`` to ``output_port`` of ``stage`` (empty if
        the input does not reach that output), in the times of the stage's scope."""
        s = self.stages[stage]
        if s.connections is None:
            return [(0,) * self.arity_of(stage)]
        return [tuple(x) for x in s.connections.get((input_port, output_port), [])]


class Subscope:
    """A nested scope of a :class:`Dataflow`, made by :meth:`Dataflow.scope` (or
    :meth:`Subscope.scope`, to nest deeper). Declares stages inside it; channels are made with
    :meth:`Dataflow.connect` (or :meth:`connect`, the same). Usable as a context manager, just
    to indent what is inside:

    >>> flow = Dataflow("nest")
    >>> with flow.scope("outer") as outer, outer.scope("inner", kind="region") as inner:
    ...     step = inner.stage("step", lambda index, peers: Vertex(), inputs=1, outputs=1)
    >>> inner.path, inner.kind, inner.arity, flow.arity_of(step)
    ((0, 1), 'region', 2, 2)
    """

    def __init__(self, flow: Dataflow, path: ScopePath) -> None:
        self.flow = flow
        self.path = path

    @property
    def name(self) -> str:
        return self.flow._scopes[self.path].name

    @property
    def kind(self) -> str:
        """``iterative`` or ``region``."""
        return self.flow._scopes[self.path].kind

    @property
    def arity(self) -> int:
        """The arity of the times of the stages inside."""
        return self.flow._scopes[self.path].arity

    def stage(self, name: str, factory: VertexFactory, inputs: int, outputs: int,
              connections: dict[tuple[int, int], list[tuple[int, ...]]] | None = None) -> int:
        """Declare a stage inside this scope; as :meth:`Dataflow.stage` (summaries in this
        scope's times)."""
        return self.flow._stage(self.path, name, factory, inputs, outputs, connections)

    def feedback(self, name: str = "feedback") -> int:
        """A :class:`Feedback` stage inside this scope: ``+1`` on the last coordinate of its
        times (in an iterative scope, its loop counter)."""
        return self.flow._feedback(self.path, name)

    def scope(self, name: str, kind: ScopeKind = "iterative") -> Subscope:
        """Open a scope nested in this one."""
        return self.flow._scope(self.path, name, kind)

    def connect(self, source: tuple[int, int], target: tuple[int, int], partition: Partition | None = None) -> None:
        """The same as :meth:`Dataflow.connect`."""
        self.flow.connect(source, target, partition)

    def __enter__(self) -> Subscope:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def at(scope: ScopePath, node: int, port: int, kind: Kind) -> AnyLocation:
    """A location as the SDK reports it: a plain :class:`~tracker.graph.Location` in the root
    scope, a :class:`~tracker.scope.ScopedLocation` in a nested one.

    >>> at((), 1, 0, "target"), at((2,), 1, 0, "target")
    (Location(node=1, port=0, kind='target'), ScopedLocation(scope=(2,), node=1, port=0, kind='target'))
    """
    return ScopedLocation(scope, node, port, kind) if scope else Location(node, port, kind)


def location_json(location: AnyLocation) -> dict[str, Any]:
    """A location in the service's JSON shape (``scope`` only when not the root).

    >>> location_json(at((3, 1), 1, 0, "target"))
    {'scope': [3, 1], 'node': 1, 'port': 0, 'kind': 'target'}
    """
    if isinstance(location, ScopedLocation) and location.scope:
        return {"scope": list(location.scope), "node": location.node, "port": location.port, "kind": location.kind}
    return {"node": location.node, "port": location.port, "kind": location.kind}


def parse_location(raw: Mapping[str, Any]) -> AnyLocation:
    """A location from the service's JSON shape (``scope`` absent or ``[]`` for the root)."""
    return at(tuple(raw.get("scope") or ()), raw["node"], raw["port"], raw["kind"])


def as_scoped(location: AnyLocation) -> ScopedLocation:
    """Any location as a :class:`~tracker.scope.ScopedLocation` (the root's with scope ``()``)."""
    return location if isinstance(location, ScopedLocation) else ScopedLocation((), *location)


def location_update(location: AnyLocation, time: Sequence[int], delta: int) -> dict[str, Any]:
    """One update in the service's JSON shape."""
    return {"location": location_json(location), "time": list(time), "delta": delta}


def reachable(summaries: Sequence[Sequence[int]], held: Timestamp, time: Timestamp) -> bool:
    """True iff some summary ``s`` gives ``s(held) <= time``: ``time`` may be produced by a
    callback holding ``held``.

    >>> reachable([(0, 1)], (3, 0), (3, 1)), reachable([(0, 1)], (3, 0), (3, 0))
    (True, False)
    """
    return any(less_equal(tuple(h + d for h, d in zip(held, s, strict=True)), time) for s in summaries)
