"""Workloads for the Spark benchmark: many realistic dataflows, grown by count, not by depth.

Each dataflow is a pipeline of 10 to ``max_depth`` operators: an input, a chain of operators,
a branch that skips ahead and rejoins (a two-input operator), and an iterate region (a loop
through a feedback operator that adds 1 to the innermost coordinate, Naiad's loop shape).
Depth is bounded (rounds of an iteration follow depth); the workload grows by adding dataflows,
all in the same tables, partitioned by ``dataflow_id``.

>>> graphs = dataflows(3, seed=1)
>>> sorted(graphs), all(g.arity == 2 for g in graphs.values())
(['df00000', 'df00001', 'df00002'], True)
"""

from __future__ import annotations

import random

from tracker.graph import Connection, Edge, Graph, Location, Node, Update
from tracker.timestamp import PathSummary, Timestamp

Counts = dict[tuple[Location, Timestamp], int]
"""One dataflow's occurrence counts."""


def pipeline(depth: int, rng: random.Random, arity: int = 2) -> Graph:
    """One dataflow ``depth`` operators deep: chain + skip-ahead branch + one iterate loop."""
    depth = max(depth, 10)
    step = PathSummary((0,) * (arity - 1) + (1,))
    loop_start = rng.randrange(2, depth - 5)
    feedback = loop_start + rng.randrange(2, min(10, depth - 2 - loop_start))
    while True:  # a branch point and a join point that are not the loop's special operators
        branch = rng.randrange(1, depth - 3)
        join = rng.randrange(branch + 2, depth)
        if feedback not in (branch, join) and join != loop_start:
            break
    nodes = [Node(0, 0, 1, "input")]
    for i in range(1, depth):
        if i == feedback:
            nodes.append(Node(i, 1, 1, "feedback", (Connection(0, 0, (step,)),)))
        else:
            nodes.append(Node(i, 2 if i in (loop_start, join) else 1, 2 if i == branch else 1, f"op{i}"))
    edges = [Edge(Location.source(i, 0), Location.target(i + 1, 0)) for i in range(depth - 1)]
    edges.append(Edge(Location.source(feedback, 0), Location.target(loop_start, 1)))
    edges.append(Edge(Location.source(branch, 1), Location.target(join, 1)))
    return Graph.build(arity, nodes, edges)


def dataflows(count: int, seed: int = 7, max_depth: int = 50, arity: int = 2) -> dict[str, Graph]:
    """``count`` pipelines with depths drawn from 10..``max_depth``, by dataflow id."""
    rng = random.Random(seed)
    return {f"df{i:05d}": pipeline(rng.randrange(10, max_depth + 1), rng, arity) for i in range(count)}


def pointstamps(graphs: dict[str, Graph], seed: int = 11, per_dataflow: int = 4) -> dict[str, Counts]:
    """Per dataflow: the input's capability at epoch 0 plus a few in-flight messages."""
    rng = random.Random(seed)
    counts: dict[str, Counts] = {}
    for key, graph in graphs.items():
        zero = (0,) * graph.arity
        c: Counts = {(Location.source(0, 0), zero): 1}
        locations = graph.locations()
        for _ in range(per_dataflow - 1):
            time = tuple(rng.randrange(0, 3) for _ in range(graph.arity))
            c[(rng.choice(locations), time)] = c.get((rng.choice(locations), time), 0) + 1
        counts[key] = {k: v for k, v in c.items() if v}
    return counts


def change_batch(graphs: dict[str, Graph], counts: dict[str, Counts], fraction: float, seed: int = 13
                 ) -> dict[str, list[Update]]:
    """Updates at ``fraction`` of all locations: retire an active time there if any and
    introduce a later one (the usual shape of progress: things move forward)."""
    rng = random.Random(seed)
    everywhere = [(key, loc) for key, g in graphs.items() for loc in g.locations()]
    chosen = rng.sample(everywhere, max(1, int(len(everywhere) * fraction)))
    batch: dict[str, list[Update]] = {}
    for key, loc in chosen:
        active = [(t, c) for (location, t), c in counts[key].items() if location == loc and c > 0]
        arity = graphs[key].arity
        updates = batch.setdefault(key, [])
        if active:
            time, _ = active[0]
            updates.append((loc, time, -1))
            updates.append((loc, (time[0] + 1, *time[1:]), 1))
        else:
            updates.append((loc, (1,) + (0,) * (arity - 1), 1))
    return batch


def location_count(graphs: dict[str, Graph]) -> int:
    """Total locations over all dataflows."""
    return sum(len(g.locations()) for g in graphs.values())
