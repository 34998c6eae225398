"""native: the incremental tracker against a from-scratch recompute, per batch, ~1,000 locations.

For each workload (a chain, a PageRank-like loop, a random graph with feedback loops) a
protocol-following update sequence is applied to the native :class:`~tracker.reachability.Tracker`,
and at sampled points the naive baseline recomputes every frontier from scratch
(:func:`tracker.oracle.fixpoint_frontiers`, the frontier of ``docs/core.md`` without
incremental tricks) from the same counts. Both are timed in the same run; the figure is the
ratio per batch, and the two answers are compared at every sample (a disagreement raises).

>>> figures = _measure("chain", chain(20), batches=40, samples=4)
>>> figures["locations"], figures["batches"], figures["speedup"] > 0
(39, 40, True)
"""

from __future__ import annotations

import time
from typing import Any

from bench.workloads import Simulation, chain, loop, random_graph
from tracker import oracle
from tracker.graph import Graph, Update
from tracker.reachability import Tracker

TARGET_SPEEDUP = 50.0


class _EpochsOnly(Simulation):
    """Only input epochs advance: every batch moves the frontier at every location (worst case)."""

    def step(self) -> list[Update]:
        self.messages.clear()
        batch = super().step()
        return batch[:2]


def _measure(name: str, graph: Graph, batches: int, samples: int) -> dict[str, float]:
    simulation = (_EpochsOnly if name.endswith("epochs") else Simulation)(graph)
    tracker = Tracker(graph)
    tracker.apply(simulation.initial())
    sequence = [simulation.step() for _ in range(batches)]
    counts = oracle.accumulate([simulation.initial()])
    every = max(1, batches // samples)
    tracker_seconds = 0.0
    baseline_seconds = 0.0
    baseline_runs = 0
    changes = 0
    for index, batch in enumerate(sequence):
        started = time.perf_counter()
        changes += len(tracker.apply(batch, validated=True))
        tracker_seconds += time.perf_counter() - started
        for location, at, delta in batch:
            counts[(location, at)] = counts.get((location, at), 0) + delta
        if index % every == 0:
            started = time.perf_counter()
            expected = oracle.fixpoint_frontiers(graph, counts)
            baseline_seconds += time.perf_counter() - started
            baseline_runs += 1
            if expected != tracker.frontiers():
                raise AssertionError(f"{name}: tracker and baseline disagree after batch {index}")
    updates = sum(len(b) for b in sequence)
    per_batch = tracker_seconds / batches
    baseline_per_batch = baseline_seconds / baseline_runs
    return {
        "locations": len(graph.locations()),
        "batches": batches,
        "updates": updates,
        "frontier_changes": changes,
        "tracker_us_per_batch": per_batch * 1e6,
        "tracker_batches_per_s": 1 / per_batch,
        "tracker_updates_per_s": updates / tracker_seconds,
        "baseline_ms_per_batch": baseline_per_batch * 1e3,
        "speedup": baseline_per_batch / per_batch,
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Run the three workloads; print a table; return the figures and targets."""
    size = 150 if quick else 500
    batches = 500 if quick else 4000
    workloads = {
        "chain": chain(size),
        "loop": loop(size),
        "random": random_graph(int(size * 0.9)),
        "chain-epochs": chain(size),
    }
    figures: dict[str, dict[str, float]] = {}
    print(f"{'workload':12} {'locs':>6} {'batches':>8} {'upd/s':>10} {'batch/s':>9} {'us/batch':>9} "
          f"{'scratch ms':>10} {'speedup':>8}")
    for name, graph in workloads.items():
        f = _measure(name, graph, batches, samples=20 if quick else 40)
        figures[name] = f
        print(f"{name:12} {f['locations']:6d} {f['batches']:8d} {f['tracker_updates_per_s']:10.0f} "
              f"{f['tracker_batches_per_s']:9.0f} {f['tracker_us_per_batch']:9.1f} "
              f"{f['baseline_ms_per_batch']:10.2f} {f['speedup']:7.0f}x")
    speedup = figures["random"]["speedup"]
    print(f"random graph: incremental is {speedup:.0f}x the from-scratch recompute per batch "
          f"(target >= {TARGET_SPEEDUP:.0f}x)")
    return {
        "name": "native",
        "figures": {f"{w}.{k}": round(v, 3) for w, fs in figures.items() for k, v in fs.items()},
        "targets": {"random.speedup": f">= {TARGET_SPEEDUP}", "met": speedup >= TARGET_SPEEDUP},
    }
