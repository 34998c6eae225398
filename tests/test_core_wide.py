"""The compiled engine on wide antichains, against the reference, the oracle and its pairwise algorithm.

Batches place antichains of up to 60 incomparable times at one location at once
(``(b + i, b + w - i, ...)``), retract them, and move them whole (every time retracted and added
shifted, in one batch): the batches the engine settles in rounds of many times, with the
staircase antichains of two coordinates. Hypothesis graphs with loops (feedback summaries) and
without, of arity 1, 2 and 3, and nested dataflows with the compiled engine in every scope (as
the service's ``NestedEngine`` runs them). Batch by batch, the changes equal the reference's and
those of the engine's pairwise algorithm (``engine_for(..., pairwise=True)``), and every
frontier equals the oracle's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.workloads import chain, loop, ring
from tests.strategies import acyclic_graphs, nested_bodies
from tracker import oracle, scoped_oracle
from tracker.compiled import CompiledTracker, engine_for
from tracker.graph import Connection, Edge, Graph, Location, Node, Update
from tracker.reachability import Tracker
from tracker.scope import NestedGraph, ScopedLocation
from tracker.scoped import ScopedTracker
from tracker.timestamp import PathSummary, Timestamp


def _antichain(arity: int, width: int, base: int, tail: tuple[int, ...], step: int = 1) -> list[Timestamp]:
    """``width + 1`` times ``(base + step * i, base + step * (width - i), *tail)``, cut to
    ``arity`` coordinates: incomparable from arity 2 on, a run of times for one coordinate."""
    return [(base + step * i, base + step * (width - i), *tail)[:arity] for i in range(width + 1)]


@st.composite
def _wide_batches(draw: st.DrawFn, holders: Sequence[Any], arity_of: Mapping[Any, int], max_batches: int = 6,
                  max_width: int = 60) -> list[list[tuple[Any, Timestamp, int]]]:
    """Batches that place antichains at ``holders``, move them whole (retract and add shifted),
    retract them, or make a little noise (counts going transiently negative); each batch's
    updates shuffled."""
    placed: list[tuple[Any, list[Timestamp]]] = []
    batches: list[list[tuple[Any, Timestamp, int]]] = []
    for _ in range(draw(st.integers(2, max_batches))):
        kind = draw(st.sampled_from(["place", "place", "move", "move", "retract", "pluck", "noise"]))
        batch: list[tuple[Any, Timestamp, int]] = []
        if kind == "pluck" and placed:
            # One time of an antichain leaves alone (or is counted twice), so that the times
            # its neighbours dominate are looked at one removal at a time; later moves may take
            # its count below zero.
            location, times = draw(st.sampled_from(placed))
            batch.append((location, draw(st.sampled_from(times)), draw(st.sampled_from([-1, 1]))))
        elif kind in ("move", "retract") and placed:
            number = draw(st.integers(0, len(placed) - 1))
            location, times = placed[number]
            batch += [(location, t, -1) for t in times]
            if kind == "move":
                shift = draw(st.tuples(*[st.integers(0, 2)] * arity_of[location]))
                times = [tuple(c + s for c, s in zip(t, shift, strict=True)) for t in times]
                batch += [(location, t, 1) for t in times]
                placed[number] = (location, times)
            else:
                placed.pop(number)
        elif kind == "noise":
            for _ in range(draw(st.integers(1, 4))):
                location = draw(st.sampled_from(holders))
                time = draw(st.tuples(*[st.integers(0, 4)] * arity_of[location]))
                batch.append((location, time, draw(st.sampled_from([-1, 1, 2]))))
        else:
            # An antichain, and maybe a shifted copy at the same location: times that several
            # elements dominate, freed one removal at a time.
            location = draw(st.sampled_from(holders))
            arity = arity_of[location]
            tail = draw(st.tuples(*[st.integers(0, 2)] * max(0, arity - 2)))
            step = draw(st.sampled_from([1, 1, 2]))
            times = _antichain(arity, draw(st.integers(1, max_width)), draw(st.integers(0, 3)), tail, step)
            shifts = [(), *draw(st.lists(st.tuples(*[st.integers(0, 1)] * arity), max_size=1))]
            for shift in shifts:
                copy = [tuple(c + s for c, s in zip(t, shift, strict=True)) for t in times] if shift else times
                batch += [(location, t, 1) for t in copy]
                placed.append((location, copy))
        batches.append(draw(st.permutations(batch)) if batch else [])
    return batches


def _oracle_changes(before: dict[Location, list[Timestamp]], after: dict[Location, list[Timestamp]]
                   ) -> list[tuple[Location, Timestamp, int]]:
    """The consolidated changes from one set of frontiers to the next, sorted by (time, location)."""
    changes = []
    for location, times in after.items():
        old, new = set(before[location]), set(times)
        changes += [(location, t, 1) for t in new - old] + [(location, t, -1) for t in old - new]
    return sorted(changes, key=lambda change: (change[1], change[0]))


def _check_flat(graph: Graph, batches: list[list[Update]], *, with_reference: bool = True) -> None:
    """Every batch: the compiled engine's changes equal the oracle's (the difference of its
    frontiers before and after), the pairwise engine's and (``with_reference``) the reference
    tracker's; every frontier equals the oracle's; ``can_notify`` agrees with the frontiers at
    every time of the batch and next to it."""
    reference, compiled = Tracker(graph), CompiledTracker(graph)
    pairwise, _ = engine_for(graph, pairwise=True)
    psi = oracle.path_summaries(graph)
    truth = oracle.frontiers(graph, {}, psi)
    for number, batch in enumerate(batches):
        got = compiled.apply(batch)
        before, truth = truth, oracle.frontiers(graph, oracle.accumulate(batches[: number + 1]), psi)
        assert [tuple(c) for c in got] == _oracle_changes(before, truth), f"batch {number}"
        assert compiled.frontiers() == truth, f"batch {number}"
        assert pairwise.apply(batch).to_list(labels=True) == [tuple(c) for c in got], f"batch {number}"
        if with_reference:
            assert reference.apply(batch) == got, f"batch {number}"
        for location, time, _ in batch:
            for near in (time, tuple(c + 1 for c in time), tuple(max(0, c - 1) for c in time)):
                held = any(all(f <= c for f, c in zip(element, near, strict=True)) for element in truth[location])
                assert compiled.can_notify(location, near) is not held
    assert compiled.pointstamps() == oracle.accumulate(batches)


@pytest.mark.parametrize("loops", [False, True], ids=["dag", "loops"])
@pytest.mark.parametrize("arity", [1, 2, 3])
def test_wide_antichains_batch_by_batch(arity: int, loops: bool) -> None:
    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        graph = data.draw(acyclic_graphs(arity=arity, loops=loops, max_nodes=5))
        locations = graph.sorted_locations()
        batches = data.draw(_wide_batches(locations, {loc: arity for loc in locations}))
        _check_flat(graph, batches)

    check()


def _moves(source: Location, arity: int, width: int, moves: int) -> list[list[Update]]:
    """An antichain of ``width + 1`` times at ``source``, then ``moves`` batches each moving it
    whole by one in every coordinate."""
    tail = (0,) * max(0, arity - 2)
    times = _antichain(arity, width, 0, tail)
    batches: list[list[Update]] = [[(source, t, 1) for t in times]]
    for step in range(moves):
        shifted = [tuple(c + step + 1 for c in t) for t in times]
        before = [tuple(c + step for c in t) for t in times]
        batches.append([(source, t, -1) for t in before] + [(source, t, 1) for t in shifted])
    return batches


@pytest.mark.parametrize(("name", "graph", "width"), [
    ("chain", chain(20, arity=2), 100),
    ("chain3", chain(12, arity=3), 40),
    ("loop", loop(12), 80),
    ("ring", ring(10, arity=2), 60),
])
def test_whole_antichains_moved_through_chains_and_loops(name: str, graph: Graph, width: int) -> None:
    """The benchmark's workload, smaller, and the same moves through loops (a PageRank-like
    loop, a ring with feedback): every frontier changes entirely in every batch. (The reference
    tracker, whose antichains compare pairwise, would take minutes here: the oracle decides.)"""
    (source, _, _), = graph.default_initial()
    _check_flat(graph, _moves(source, graph.arity, width, moves=3), with_reference=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_wide_antichains_in_nested_scopes(data: st.DataObject) -> None:
    arity, body = data.draw(nested_bodies())
    nested = NestedGraph.from_json(arity, body)
    holders = [loc for loc in nested.locations() if nested.holds_pointstamps(loc)]
    if not holders:
        return
    arity_of = {loc: nested.arity_of(loc.scope) for loc in holders}
    batches: list[list[tuple[ScopedLocation, Timestamp, int]]] = data.draw(
        _wide_batches(holders, arity_of, max_batches=5, max_width=25))
    compiled = ScopedTracker(nested, lambda graph: CompiledTracker(graph, cycles_checked=True))
    reference = ScopedTracker(nested)
    for done in range(1, len(batches) + 1):
        assert compiled.apply(batches[done - 1]) == reference.apply(batches[done - 1])
        expected = scoped_oracle.frontiers(nested, scoped_oracle.accumulate(batches[:done]))
        assert compiled.frontiers() == reference.frontiers() == expected
    assert compiled.pointstamps() == reference.pointstamps() == scoped_oracle.accumulate(batches)


def _join() -> Graph:
    """An input reaching a three-input operator directly, through ``+(0, 1)`` and through
    ``+(1, 0)``: the operator's output counts every time of an antichain three times over."""
    nodes = [Node(0, 0, 1), Node(1, 1, 1, connections=(Connection(0, 0, (PathSummary((0, 1)),)),)),
             Node(2, 1, 1, connections=(Connection(0, 0, (PathSummary((1, 0)),)),)), Node(3, 3, 1)]
    edges = [Edge(Location.source(0, 0), Location.target(n, p)) for n, p in ((1, 0), (2, 0), (3, 0))]
    edges += [Edge(Location.source(1, 0), Location.target(3, 1)), Edge(Location.source(2, 0), Location.target(3, 2))]
    return Graph.build(2, nodes, edges)


@pytest.mark.parametrize("graph", [chain(4, arity=2), loop(5), _join()], ids=["chain", "loop", "join"])
def test_times_freed_one_removal_at_a_time(graph: Graph) -> None:
    """An antichain and two shifted copies (at the input, and through the join's paths): times
    that two elements dominate. The antichain's elements leave one batch at a time (the
    frontier's neighbours decide what each removal frees), come back in one batch, then move
    whole."""
    source = Location.source(0, 0)
    times = _antichain(2, 30, 0, ())
    stacked: list[Update] = [(source, (a + da, b + db), 1) for a, b in times for da, db in ((0, 0), (0, 1), (1, 0))]
    batches: list[list[Update]] = [stacked]
    batches += [[(source, t, -1)] for t in times[::2] + times[1::2]]
    batches.append([(source, t, 1) for t in times])
    batches.append([(source, t, -1) for t in times] + [(source, (a + 1, b + 1), 1) for a, b in times])
    _check_flat(graph, batches)
