"""native: the incremental tracker against a from-scratch recompute, and the compiled engine against it.

Part one: for each workload (a chain, a PageRank-like loop, a random graph with feedback loops) a
protocol-following update sequence is applied to the native :class:`~tracker.reachability.Tracker`,
and at sampled points the naive baseline recomputes every frontier from scratch
(:func:`tracker.oracle.fixpoint_frontiers`, the frontier of ``docs/core.md`` without
incremental tricks) from the same counts. Both are timed in the same run; the figure is the
ratio per batch, and the two answers are compared at every sample (a disagreement raises).

>>> figures = _measure("chain", chain(20), batches=40, samples=4)
>>> figures["locations"], figures["batches"], figures["speedup"] > 0
(39, 40, True)

Part two: the compiled engine (``progress_engine``, built from ``engine/``) side by side with
the Python reference on the same batches, interleaved batch by batch, every batch's changes
checked identical, each batch's least time of three passes kept: the reference
``Tracker.apply``, ``CompiledTracker.apply`` (the same Python objects out), and the low-level
``Engine.apply_indexed`` (flat integers in, a compiled ``ChangeBatch`` out; alone, and followed
by ``ChangeBatch.to_json``). Workloads: a 100-operator
ring with a feedback loop where each batch moves the input capability (all 404 frontier entries
change); ~1,000 random locations of arity 2 with loops, an epoch advanced every 50 batches and
the other batches reporting 16 messages processed each (oldest first); and a 500-wide fan-out
whose input capability moves every batch (2,002 changes).

Part three: wide antichains. The input of a 200-operator chain (arity 2) holds ``w + 1``
incomparable times ``(i, w - i)``; each batch moves them whole (retracts every time and adds it
one later in both coordinates), so every frontier changes entirely: ``2 (w + 1)`` changes at
each of the 399 locations. The engine's CPU time per batch (``time.thread_time``, the median of
three moves) beside the same engine built with ``pairwise=True`` (the algorithm it had before:
pairwise antichains, one time per propagation round), the two interleaved in one process and
their changes compared; every frontier is checked against the moved antichain. The same moves
through a 200-operator PageRank-like loop (arity 2) and a 200-operator chain of arity 3; the
pairwise algorithm runs beside them at width 250 only (at 1,000 it would take minutes), and
``--quick`` compares the chain at 250 only. First, the same moves on smaller graphs against the
oracle: every change and every frontier.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from progress_engine import ChangeBatch, Engine

from bench.workloads import Simulation, chain, fanout, loop, random_graph, ring
from tracker import oracle
from tracker.compiled import CompiledTracker, engine_for
from tracker.graph import Graph, Location, Update
from tracker.reachability import Tracker
from tracker.timestamp import Timestamp

TARGET_SPEEDUP = 50.0
TARGET_ENGINE = 20.0
"""The low-level compiled API's speedup over the reference per batch (mean), on ring and random."""
ROUNDS = 3
"""Passes over each engine workload; each batch keeps its least time per implementation."""


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


def _capability_moves(graph: Graph, batches: int) -> tuple[list[Update], list[list[Update]]]:
    """The input's capability moved from ``e`` to ``e + 1`` in batch ``e``: every frontier moves."""
    (source, start, _), = graph.default_initial()
    moves = []
    for epoch in range(batches):
        old = (start[0] + epoch, *start[1:])
        moves.append([(source, (old[0] + 1, *old[1:]), 1), (source, old, -1)])
    return graph.default_initial(), moves


def _simulated(graph: Graph, batches: int, epoch_every: int = 50, messages: int = 16
               ) -> tuple[list[Update], list[list[Update]]]:
    """Protocol-following batches: every ``epoch_every``-th batch advances the input's epoch,
    every other one reports ``messages`` messages processed, oldest first (a worker's report of
    its recent work)."""
    simulation = Simulation(graph)
    sequence = []
    for number in range(batches):
        if number % epoch_every == 0 or not simulation.messages:
            sequence.append(simulation.advance_epoch())
            continue
        batch: list[Update] = []
        for _ in range(messages):
            if simulation.messages:
                batch += simulation.process_message(oldest=True)
        sequence.append(batch)
    return simulation.initial(), sequence


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _compare(name: str, graph: Graph, initial: list[Update], sequence: list[list[Update]],
             rounds: int) -> dict[str, float]:
    """Time the reference, CompiledTracker and the low-level API on ``sequence``, interleaved
    batch by batch, in ``rounds`` passes over fresh trackers, keeping each batch's least time
    per implementation (on a shared machine, preemption otherwise decides the means); raise if
    any batch's changes differ."""
    index = {loc: i for i, loc in enumerate(sorted(graph.locations()))}

    def flat(batch: list[Update]) -> tuple[list[int], list[int], list[int]]:
        return [index[loc] for loc, _, _ in batch], [c for _, t, _ in batch for c in t], [d for _, _, d in batch]

    flats = [flat(batch) for batch in sequence]
    clock = time.perf_counter
    kinds = ("reference", "compiled", "lowlevel", "lowlevel_json")
    seconds: dict[str, list[float]] = {k: [float("inf")] * len(sequence) for k in kinds}
    sizes: list[int] = []
    for _ in range(rounds):
        reference = Tracker(graph)
        compiled = CompiledTracker(graph)
        engine = CompiledTracker(graph).engine
        assert all(engine.index(loc) == i for loc, i in index.items())
        reference.apply(initial, validated=True)
        compiled.apply(initial, validated=True)
        engine.apply_indexed(*flat(initial))
        sizes = []
        for number, batch in enumerate(sequence):
            locations, times, deltas = flats[number]
            started = clock()
            expected = reference.apply(batch, validated=True)
            middle = clock()
            got = compiled.apply(batch, validated=True)
            after = clock()
            low = engine.apply_indexed(locations, times, deltas)
            done = clock()
            low.to_json()
            encoded = clock()
            for kind, spent in zip(kinds, (middle - started, after - middle, done - after, encoded - after),
                                   strict=True):
                seconds[kind][number] = min(seconds[kind][number], spent)
            sizes.append(len(expected))
            if got != expected or low.to_list(labels=True) != [tuple(c) for c in expected]:
                raise AssertionError(f"{name}: the compiled engine and the reference disagree on batch {number}")
        if compiled.frontiers() != reference.frontiers():
            raise AssertionError(f"{name}: frontiers differ at the end")
    figures: dict[str, float] = {
        "locations": len(graph.locations()),
        "batches": len(sequence),
        "changes_per_batch": sum(sizes) / len(sizes),
    }
    busy = [i for i, size in enumerate(sizes) if size]
    for kind in kinds:
        per_batch = [s * 1e6 for s in seconds[kind]]
        per_change = [per_batch[i] / sizes[i] for i in busy] or [0.0]
        figures[f"{kind}_us_per_batch"] = statistics.fmean(per_batch)
        figures[f"{kind}_p50_us"] = _quantile(per_batch, 0.5)
        figures[f"{kind}_p99_us"] = _quantile(per_batch, 0.99)
        figures[f"{kind}_ns_per_change"] = 1e3 * sum(per_batch) / max(1, sum(sizes))
        figures[f"{kind}_p50_ns_per_change"] = 1e3 * _quantile(per_change, 0.5)
        figures[f"{kind}_p99_ns_per_change"] = 1e3 * _quantile(per_change, 0.99)
        if kind != "reference":
            figures[f"{kind}_speedup"] = figures["reference_us_per_batch"] / figures[f"{kind}_us_per_batch"]
            figures[f"{kind}_p50_speedup"] = figures["reference_p50_us"] / figures[f"{kind}_p50_us"]
    return figures


_ENGINE_WORKLOADS: dict[str, Callable[[int], tuple[Graph, list[Update], list[list[Update]]]]] = {
    "ring": lambda n: (g := ring(100), *_capability_moves(g, n)),
    "random2": lambda n: (g := random_graph(420, arity=2), *_simulated(g, n)),
    "fanout": lambda n: (g := fanout(500), *_capability_moves(g, n)),
}

_LABELS = {"reference": "reference", "compiled": "CompiledTracker", "lowlevel": "apply_indexed",
           "lowlevel_json": "+ to_json"}


def run_engine(quick: bool = False) -> tuple[dict[str, dict[str, float]], bool]:
    """Part two: the compiled engine against the reference; print a table; return the figures
    and whether the target is met."""
    batches = {"ring": 300, "random2": 500, "fanout": 100} if quick else {"ring": 4000, "random2": 4000, "fanout": 1000}
    rounds = 2 if quick else ROUNDS
    figures: dict[str, dict[str, float]] = {}
    print()
    print(f"compiled engine vs reference: each batch's least time of {rounds} passes, interleaved, outputs checked")
    print(f"{'workload':9} {'locs':>5} {'chg/b':>6} {'implementation':16} {'us/batch':>9} {'p50 us':>8} {'p99 us':>8} "
          f"{'ns/chg':>7} {'p50 ns/c':>8} {'p99 ns/c':>8} {'speedup':>8} {'p50 x':>6}")
    for name, build in _ENGINE_WORKLOADS.items():
        graph, initial, sequence = build(batches[name])
        f = _compare(name, graph, initial, sequence, rounds)
        figures[name] = f
        for kind, label in _LABELS.items():
            speed = f.get(f"{kind}_speedup", 1.0)
            p50 = f.get(f"{kind}_p50_speedup", 1.0)
            print(f"{name:9} {f['locations']:5.0f} {f['changes_per_batch']:6.0f} {label:16} "
                  f"{f[f'{kind}_us_per_batch']:9.1f} {f[f'{kind}_p50_us']:8.1f} {f[f'{kind}_p99_us']:8.1f} "
                  f"{f[f'{kind}_ns_per_change']:7.0f} {f[f'{kind}_p50_ns_per_change']:8.0f} "
                  f"{f[f'{kind}_p99_ns_per_change']:8.0f} {speed:7.1f}x {p50:5.1f}x")
    met = all(figures[w]["lowlevel_speedup"] >= TARGET_ENGINE for w in ("ring", "random2"))
    print(f"compiled low-level API: {figures['ring']['lowlevel_speedup']:.1f}x the reference on the ring, "
          f"{figures['random2']['lowlevel_speedup']:.1f}x on random (target >= {TARGET_ENGINE:.0f}x on both)")
    return figures, met


TARGET_WIDE_SECONDS = 0.1
"""CPU seconds of the compiled engine's batch moving a 1,001-time antichain whole through the chain."""
_WIDE: dict[str, tuple[Callable[[], Graph], tuple[int, ...]]] = {
    "chain": (lambda: chain(200, arity=2), (250, 500, 1000)),
    "loop": (lambda: loop(200), (250, 1000)),
    "chain3": (lambda: chain(200, arity=3), (250, 1000)),
}
"""Part three's workloads and their antichain widths ``w`` (``w + 1`` times each)."""
_MOVES = 3
FlatBatch = tuple[list[int], list[int], list[int]]


def _antichain(arity: int, width: int, shift: int) -> list[Timestamp]:
    """``width + 1`` times ``(shift + i, shift + width - i, shift)``, cut to ``arity``
    coordinates: incomparable from two coordinates on."""
    return [(shift + i, shift + width - i, shift)[:arity] for i in range(width + 1)]


def _wide_batch(source: int, arity: int, width: int, shift: int, *, move: bool) -> FlatBatch:
    """The antichain at ``shift`` placed at ``source`` (``move=False``), or moved from ``shift``
    to ``shift + 1``: every time retracted, and added one later in every coordinate.

    >>> _wide_batch(7, 2, 1, 0, move=True)
    ([7, 7, 7, 7], [0, 1, 1, 0, 1, 2, 2, 1], [-1, -1, 1, 1])
    """
    times = _antichain(arity, width, shift)
    if not move:
        return [source] * len(times), [c for t in times for c in t], [1] * len(times)
    later = _antichain(arity, width, shift + 1)
    return ([source] * (2 * len(times)), [c for t in times + later for c in t],
            [-1] * len(times) + [1] * len(later))


def _cpu(engine: Engine, batch: FlatBatch) -> tuple[float, ChangeBatch]:
    started = time.thread_time()
    changes = engine.apply_indexed(*batch)
    return time.thread_time() - started, changes


def _wide_oracle_check() -> None:
    """The moves of part three on graphs small enough for the oracle: each batch's changes are
    the difference of the oracle's frontiers before and after it, each frontier the oracle's."""
    for graph, width in ((chain(20, arity=2), 100), (loop(12), 80), (chain(12, arity=3), 40)):
        engine, order = engine_for(graph)
        source = Location.source(0, 0)
        psi = oracle.path_summaries(graph)
        counts: dict[tuple[Location, Timestamp], int] = {}
        before = oracle.frontiers(graph, counts, psi)
        for shift, move in ((0, False), (0, True), (1, True)):
            locations, times, deltas = _wide_batch(order.index(source), graph.arity, width, shift, move=move)
            got = engine.apply_indexed(locations, times, deltas).to_list(labels=True)
            for number, delta in enumerate(deltas):
                key = (source, tuple(times[number * graph.arity:(number + 1) * graph.arity]))
                counts[key] = counts.get(key, 0) + delta
            after = oracle.frontiers(graph, counts, psi)
            expected: list[tuple[Location, Timestamp, int]] = []
            for loc in order:
                old, new = set(before[loc]), set(after[loc])
                expected += [(loc, t, 1) for t in new - old] + [(loc, t, -1) for t in old - new]
            expected.sort(key=lambda change: (change[1], change[0]))
            if got != expected or engine.frontiers() != [after[loc] for loc in order]:
                raise AssertionError(f"wide antichains: the engine and the oracle disagree on {len(order)} locations")
            before = after


def run_wide(quick: bool = False) -> tuple[dict[str, dict[str, float]], bool]:
    """Part three: wide antichains moved whole, the engine beside its pairwise algorithm; print a
    table; return the figures and whether the target is met."""
    _wide_oracle_check()
    figures: dict[str, dict[str, float]] = {}
    print()
    print(f"wide antichains moved whole: CPU s per batch, engine (median of {_MOVES}) beside pairwise=True "
          f"(one batch), interleaved, changes compared; oracle checked on smaller graphs")
    print(f"{'workload':9} {'locs':>5} {'times':>6} {'chg/batch':>10} {'place s':>8} {'move s':>8} "
          f"{'pairwise place':>15} {'pairwise move':>14} {'speedup':>8}")
    for name, (build, widths) in _WIDE.items():
        graph = build()
        for width in widths:
            engine, order = engine_for(graph)
            # The pairwise algorithm takes ~90 s at the chain's widest: only the chain compares
            # every width, and only on full runs; --quick compares the chain's narrowest.
            compared = (not quick or width == widths[0]) if name == "chain" else (not quick and width == widths[0])
            pairwise = engine_for(graph, pairwise=True)[0] if compared else None
            source, arity = order.index(Location.source(0, 0)), graph.arity
            place = _wide_batch(source, arity, width, 0, move=False)
            f: dict[str, float] = {"locations": len(order), "times": width + 1, "place_s": _cpu(engine, place)[0]}
            if pairwise is not None:
                f["pairwise_place_s"] = _cpu(pairwise, place)[0]
            moves = []
            for shift in range(_MOVES):
                seconds, batch = _cpu(engine, _wide_batch(source, arity, width, shift, move=True))
                moves.append(seconds)
                if pairwise is not None and shift == 0:
                    f["pairwise_move_s"], theirs = _cpu(pairwise, _wide_batch(source, arity, width, 0, move=True))
                    if (batch.locations(), batch.flat_times(), batch.diffs()) != (
                            theirs.locations(), theirs.flat_times(), theirs.diffs()):
                        raise AssertionError(f"wide antichains, {name} {width}: the two algorithms disagree")
            if name == "chain" and any(times != _antichain(arity, width, _MOVES) for times in engine.frontiers()):
                raise AssertionError(f"wide antichains, chain {width}: a frontier is not the moved antichain")
            f.update(changes_per_batch=len(batch), move_s=statistics.median(moves), move_min_s=min(moves))
            if pairwise is not None:
                f["speedup"] = f["pairwise_move_s"] / f["move_s"]
            figures[f"{name}.w{width}"] = f
            pair = (f"{f['pairwise_place_s']:15.3f} {f['pairwise_move_s']:14.3f} {f['speedup']:7.0f}x"
                    if pairwise is not None else f"{'-':>15} {'-':>14} {'-':>8}")
            print(f"{name:9} {len(order):5d} {width + 1:6d} {len(batch):10d} {f['place_s']:8.4f} {f['move_s']:8.4f} "
                  f"{pair}")
    widest = figures["chain.w1000"]["move_s"]
    print(f"moving 1,001 incomparable times through the 200-operator chain: {widest:.4f} s of CPU per batch "
          f"(target <= {TARGET_WIDE_SECONDS} s)")
    return figures, widest <= TARGET_WIDE_SECONDS


def run(quick: bool = False) -> dict[str, Any]:
    """Run both parts; print the tables; return the figures and targets."""
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
    engine, engine_met = run_engine(quick)
    figures.update({f"engine.{w}": fs for w, fs in engine.items()})
    wide, wide_met = run_wide(quick)
    figures.update({f"wide.{w}": fs for w, fs in wide.items()})
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (the machine is shared: other work inflates "
          "every figure)")
    return {
        "name": "native",
        "figures": {f"{w}.{k}": round(v, 6 if w.startswith("wide.") else 3) for w, fs in figures.items()
                    for k, v in fs.items()},
        "targets": {
            "random.speedup": f">= {TARGET_SPEEDUP}",
            "engine.ring.lowlevel_speedup": f">= {TARGET_ENGINE}",
            "engine.random2.lowlevel_speedup": f">= {TARGET_ENGINE}",
            "wide.chain.w1000.move_s": f"<= {TARGET_WIDE_SECONDS}",
            "met": speedup >= TARGET_SPEEDUP and engine_met and wide_met,
        },
    }
