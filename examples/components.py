"""Connected components by label propagation in a loop scope.

``input -> loop[cc (2 inputs) -> feedback (+1 iteration) -> cc] -> sink``: the input and the
sink see epochs ``(e,)``; ``cc`` and the feedback stage live in an iterative scope and see
``(e, iteration)`` (the runtime appends the loop counter on the way in and drops it on the way
out). Epoch ``e`` adds a batch of undirected edges; the answer for ``e`` labels every node seen
so far with the smallest node id of its component in the graph of all edges of epochs ``<= e``.
Epochs may run concurrently (``(e, 3)`` and ``(e + 1, 0)`` are incomparable), so ``cc`` keeps
separate state per epoch, built when notified at ``(e, 0)`` (by then every edge of every epoch
``<= e`` has arrived). Each iteration, nodes whose label dropped send it to their neighbours
and to the sink. The sink asks for ``(e,)``: the tracker holds it back while anything of epoch
``e`` is still inside the loop, so its notification means the loop is drained for ``e``.
(``cc`` keeps each epoch's labels to the end of the run: nothing inside the loop can tell that
an epoch has stopped iterating.)

The guarantee: each epoch's row equals the union-find :func:`reference`, on any number of
workers. On one worker against an in-process tracker:

>>> import asyncio
>>> from tracker.worker import LocalHub
>>> config = {**DEFAULTS, "epochs": 2}
>>> flow = build(config)
>>> [(stage.name, stage.scope, flow.arity_of(stage.id)) for stage in flow.stages]
[('edges', (), 1), ('cc', (1,), 2), ('feedback', (1,), 2), ('sink', (), 1)]
>>> worker = Worker(flow, 0, 1, LocalHub.for_dataflow(flow, workers=1).link("w0"))
>>> _ = asyncio.run(worker.run(lambda w: drive(w, config)))
>>> collect(worker) == reference(config)
True
>>> render(collect(worker))
['epoch 0: 14 nodes, 6 components; largest 1:3, 6:3, 4:2', 'epoch 1: 20 nodes, 6 components; largest 1:6, 0:4, 6:4']
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from examples._common import epochs, sink_rows
from tracker.timestamp import Timestamp
from tracker.worker import Worker
from tracker.worker.vertex import Dataflow, Vertex

DEFAULTS: dict[str, Any] = {"epochs": 4, "nodes": 40, "edges": 8, "seed": 1, "pace": 0.0}
INPUT, CC, FEEDBACK, SINK = 0, 1, 2, 3  # stage ids, in declaration order


def make_input(config: dict[str, Any]) -> list[list[list[int]]]:
    """Each epoch's new edges ``[u, v]`` (at least one per epoch), deterministic for the seed."""
    c = {**DEFAULTS, **config}
    rng = random.Random(c["seed"])
    return [[[rng.randrange(c["nodes"]), rng.randrange(c["nodes"])] for _ in range(max(1, c["edges"]))]
            for _ in range(c["epochs"])]


class Components(Vertex):
    """Input 0: half-edges ``[u, v]`` owned by ``u`` and ticks ``[index, None]``; input 1: label
    proposals ``[node, label]``. Output 0: proposals to neighbours; output 1: labels to the sink."""

    def __init__(self) -> None:
        self.edges: dict[int, list[tuple[int, int]]] = defaultdict(list)  # epoch -> owned half-edges
        self.labels: dict[int, dict[int, int]] = {}  # epoch -> owned node -> label
        self.adjacency: dict[int, dict[int, set[int]]] = {}
        self.dirty: dict[int, set[int]] = defaultdict(set)
        self.early: dict[int, list[tuple[int, int]]] = defaultdict(list)  # proposals before (e, 0)

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        epoch = time[0]
        if edge == 0:
            if message[1] is not None:
                self.edges[epoch].append((message[0], message[1]))
            self.notify_at(time)
            return
        node, label = message
        if epoch not in self.labels:
            self.early[epoch].append((node, label))  # a faster worker's iteration 1 came first
        else:
            self._propose(epoch, node, label)
        self.notify_at(time)

    def _propose(self, epoch: int, node: int, label: int) -> None:
        labels = self.labels[epoch]
        if label < labels.setdefault(node, node):
            labels[node] = label
            self.dirty[epoch].add(node)

    def on_notify(self, time: Timestamp) -> None:
        epoch, iteration = time
        if iteration == 0:
            adjacency: dict[int, set[int]] = defaultdict(set)
            for e, half_edges in self.edges.items():
                if e <= epoch:
                    for u, v in half_edges:
                        adjacency[u].add(v)
            self.adjacency[epoch] = adjacency
            self.labels[epoch] = {u: u for u in adjacency}
            self.dirty[epoch] = set(adjacency)
            for node, label in self.early.pop(epoch, []):
                self._propose(epoch, node, label)
        labels, adjacency = self.labels[epoch], self.adjacency[epoch]
        for node in sorted(self.dirty.pop(epoch, ())):
            self.send_by(1, [node, labels[node]], time)
            for neighbour in sorted(adjacency[node]):
                self.send_by(0, [neighbour, labels[node]], time)


class Sink(Vertex):
    """Keeps the least label seen per node and epoch; one row when the epoch is over (times
    ``(epoch,)``: outside the loop)."""

    def __init__(self) -> None:
        self.labels: dict[int, dict[int, int]] = defaultdict(dict)
        self.rows: list[dict[str, Any]] = []

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        node, label = message
        labels = self.labels[time[0]]
        labels[node] = min(label, labels.get(node, label))
        self.notify_at(time)

    def on_notify(self, time: Timestamp) -> None:
        self.rows.append({"epoch": time[0], "labels": sorted([n, lab] for n, lab in self.labels.pop(time[0]).items())})


def build(config: dict[str, Any]) -> Dataflow:
    """The dataflow: epochs outside, ``(epoch, iteration)`` inside the loop scope."""
    flow = Dataflow("components")
    edges = flow.input("edges")
    with flow.scope("loop", kind="iterative") as loop:
        cc = loop.stage("cc", lambda i, n: Components(), inputs=2, outputs=2)
        feedback = loop.feedback("feedback")
    sink = flow.stage("sink", lambda i, n: Sink(), inputs=1, outputs=0)
    assert (edges, cc, feedback, sink) == (INPUT, CC, FEEDBACK, SINK)
    flow.connect((edges, 0), (cc, 0), partition=lambda message: message[0])  # enters the loop
    flow.connect((cc, 0), (feedback, 0), partition=lambda message: message[0])
    flow.connect((feedback, 0), (cc, 1))
    flow.connect((cc, 1), (sink, 0), partition=lambda message: 0)  # leaves the loop
    return flow


async def drive(worker: Worker, config: dict[str, Any]) -> None:
    """Feed this worker's share of each epoch's edges (both directions); worker 0 also ticks
    every ``cc`` vertex each epoch so that each one builds the epoch's state."""
    handle = worker.input(INPUT)
    async for _, edges in epochs(worker, handle, SINK, make_input(config), config):
        mine = [e for i, e in enumerate(edges) if i % worker.peers == worker.index]
        handle.send([m for u, v in mine for m in ([u, v], [v, u])])
        if worker.index == 0:
            handle.send([j, None] for j in range(worker.peers))


def collect(worker: Worker) -> list[dict[str, Any]]:
    """This worker's rows (only worker 0's sink receives any)."""
    return sink_rows(worker, SINK)


def reference(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Union-find over the edges of epochs ``<= e``, for each ``e``: the same rows."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    rows = []
    for epoch, edges in enumerate(make_input(config)):
        for u, v in edges:
            parent.setdefault(u, u)
            parent.setdefault(v, v)
            a, b = find(u), find(v)
            if a != b:
                parent[max(a, b)] = min(a, b)  # the root stays the least id of its component
        rows.append({"epoch": epoch, "labels": sorted([n, find(n)] for n in parent)})
    return rows


def render(rows: list[dict[str, Any]]) -> list[str]:
    """One line per epoch: node count, component count and the largest components' sizes."""
    lines = []
    for row in sorted(rows, key=lambda r: r["epoch"]):
        sizes: dict[int, int] = defaultdict(int)
        for _, label in row["labels"]:
            sizes[label] += 1
        biggest = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        lines.append(f"epoch {row['epoch']}: {len(row['labels'])} nodes, {len(sizes)} components; largest "
                     + ", ".join(f"{label}:{size}" for label, size in biggest))
    return lines
