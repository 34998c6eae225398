"""scopes: a batch through a 3-level nested dataflow against a flat one with as many locations.

Both dataflows are chains of ``width`` operators per level with a feedback loop at each level;
the nested one puts each next level in an iterative scope (times grow one coordinate per
level), the flat one strings the levels together in one scope of arity 1. Every batch advances
the input's epoch, so the frontier of every location moves. The same flat engine (the Python
reference) runs under both, so the ratio is the cost of the scopes' wiring (projections of
inner capabilities to scope outputs, and the parent's frontiers carried in). Both trackers'
frontiers are checked against each other at the end (the stage after the last level).

>>> nested, flat = _bodies(2)
>>> def count(body): return sum(1 for _ in NestedGraph.from_json(1, body).locations())
>>> count(nested) == count(flat)
True
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from tracker.scope import NestedGraph, ScopedLocation
from tracker.scoped import ScopedTracker

TARGET_RATIO = 1.5
LEVELS = 3


def _edge(src: tuple[int, int], dst: tuple[int, int]) -> dict[str, Any]:
    return {"source": {"node": src[0], "port": src[1]}, "target": {"node": dst[0], "port": dst[1]}}


def _level(width: int, first: int, entry: tuple[int, int], arity: int) -> tuple[list[dict[str, Any]],
                                                                                  list[dict[str, Any]], int]:
    """A chain of ``width`` operators from ``entry`` with a feedback loop around it; its last node."""
    nodes: list[dict[str, Any]] = [{"id": first, "inputs": 2, "outputs": 1}]
    nodes += [{"id": first + i, "inputs": 1, "outputs": 1} for i in range(1, width)]
    feedback = first + width
    nodes.append({"id": feedback, "inputs": 1, "outputs": 1,
                  "connections": [{"input": 0, "output": 0, "summaries": [[0] * (arity - 1) + [1]]}]})
    edges = [_edge(entry, (first, 0))]
    edges += [_edge((first + i - 1, 0), (first + i, 0)) for i in range(1, width)]
    edges += [_edge((first + width - 1, 0), (feedback, 0)), _edge((feedback, 0), (first, 1))]
    return nodes, edges, first + width - 1


def _bodies(width: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(nested, flat) registration bodies with the same number of locations."""
    def nested_scope(level: int) -> dict[str, Any]:
        nodes, edges, last = _level(width, 1, (0, 0), 1 + level)
        if level < LEVELS:
            scope_id = last + 2
            nodes.append({"id": scope_id, "inputs": 1, "outputs": 1,
                          "scope": {"kind": "iterative", **nested_scope(level + 1)}})
            edges += [_edge((last, 0), (scope_id, 0)), _edge((scope_id, 0), (0, 0))]
        else:
            edges.append(_edge((last, 0), (0, 0)))
        return {"nodes": nodes, "edges": edges}

    nested = {"nodes": [{"id": 0, "inputs": 0, "outputs": 1},
                        {"id": 1, "inputs": 1, "outputs": 1, "scope": {"kind": "iterative", **nested_scope(1)}},
                        {"id": 2, "inputs": 1, "outputs": 0}],
              "edges": [_edge((0, 0), (1, 0)), _edge((1, 0), (2, 0))]}
    # Flat: the same operators level after level; a scope node's two ports become a pass-through.
    nodes: list[dict[str, Any]] = [{"id": 0, "inputs": 0, "outputs": 1}]
    edges: list[dict[str, Any]] = []
    entry, first = (0, 0), 1
    for _ in range(LEVELS):
        level_nodes, level_edges, last = _level(width, first, entry, 1)
        passthrough = first + width + 1
        nodes += [*level_nodes, {"id": passthrough, "inputs": 1, "outputs": 1},
                  {"id": passthrough + 1, "inputs": 1, "outputs": 1}]  # the scope's node and boundary
        edges += [*level_edges, _edge((last, 0), (passthrough, 0)), _edge((passthrough, 0), (passthrough + 1, 0))]
        entry, first = (passthrough + 1, 0), passthrough + 2
    nodes.append({"id": first, "inputs": 1, "outputs": 0})
    edges.append(_edge(entry, (first, 0)))
    return nested, {"nodes": nodes, "edges": edges}


def _time(tracker: ScopedTracker, batches: int) -> tuple[list[float], int]:
    source = ScopedLocation((), 0, 0, "source")
    tracker.apply([(source, (0,), 1)])
    samples, changes = [], 0
    for epoch in range(batches):
        started = time.perf_counter()
        changes += len(tracker.apply([(source, (epoch,), -1), (source, (epoch + 1,), 1)], validated=True))
        samples.append(time.perf_counter() - started)
    return samples, changes


def run(quick: bool) -> dict[str, Any]:
    width, batches = (8, 200) if quick else (30, 1000)
    nested_body, flat_body = _bodies(width)
    nested = ScopedTracker(NestedGraph.from_json(1, nested_body))
    flat = ScopedTracker(NestedGraph.from_json(1, flat_body))
    locations = sum(1 for _ in nested.nested.locations())
    # Interleaved rounds, so that the machine's noise falls on both alike.
    nested_samples: list[float] = []
    flat_samples: list[float] = []
    nested_changes = flat_changes = 0
    for _ in range(5):
        s, c = _time(flat, batches // 5)
        flat_samples += s
        flat_changes += c
        s, c = _time(nested, batches // 5)
        nested_samples += s
        nested_changes += c
    nested_last = nested.frontier(ScopedLocation((), 2, 0, "target"))
    assert nested_last == [(batches // 5,)], nested_last
    p50 = {name: statistics.median(s) * 1e6 for name, s in (("nested", nested_samples), ("flat", flat_samples))}
    p99 = {name: sorted(s)[int(len(s) * 0.99)] * 1e6 for name, s in (("nested", nested_samples),
                                                                      ("flat", flat_samples))}
    mean = {name: statistics.fmean(s) * 1e6 for name, s in (("nested", nested_samples), ("flat", flat_samples))}
    print(f"{locations} locations each, {LEVELS} levels of iterative scopes vs flat, {batches} batches each")
    print(f"{'':8} {'mean µs':>10} {'p50 µs':>10} {'p99 µs':>10} {'changes/batch':>14}")
    for name, count in (("flat", flat_changes), ("nested", nested_changes)):
        print(f"{name:8} {mean[name]:10.1f} {p50[name]:10.1f} {p99[name]:10.1f} {count / batches:14.1f}")
    ratio = mean["nested"] / mean["flat"]
    print(f"nested / flat per batch: {ratio:.2f}x (target <= {TARGET_RATIO}x)")
    return {"name": "scopes", "figures": {"locations": locations, "flat_us": mean["flat"],
                                          "nested_us": mean["nested"], "ratio": ratio,
                                          "nested_p99_us": p99["nested"], "flat_p99_us": p99["flat"]},
            "targets": {"ratio": TARGET_RATIO}}
