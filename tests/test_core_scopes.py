"""Nested scopes: the model, the scoped tracker and the flattened oracle agree.

The oracle (:mod:`tracker.scoped_oracle`) searches the flattened graph with ingress and egress
steps and uses none of the engine's machinery (no computed scope summaries, no projections).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.strategies import nested_batches, nested_bodies
from tracker import scoped_oracle
from tracker.graph import GraphError
from tracker.scope import NestedGraph, NonIncrementingCycle, ScopedLocation
from tracker.scoped import ScopedTracker


def _edge(src: tuple[int, int], dst: tuple[int, int]) -> dict[str, Any]:
    return {"source": {"node": src[0], "port": src[1]}, "target": {"node": dst[0], "port": dst[1]}}


def _loop_then_stage() -> dict[str, Any]:
    """input 0 -> iterative scope 1 (operator 1, feedback 2 adding one to the loop counter) -> stage 2."""
    loop = {"kind": "iterative",
            "nodes": [{"id": 1, "name": "step", "inputs": 2, "outputs": 1},
                      {"id": 2, "name": "feedback", "inputs": 1, "outputs": 1,
                       "connections": [{"input": 0, "output": 0, "summaries": [[0, 1]]}]}],
            "edges": [_edge((0, 0), (1, 0)), _edge((1, 0), (2, 0)), _edge((2, 0), (1, 1)), _edge((1, 0), (0, 0))]}
    return {"nodes": [{"id": 0, "name": "input", "inputs": 0, "outputs": 1},
                      {"id": 1, "name": "loop", "inputs": 1, "outputs": 1, "scope": loop},
                      {"id": 2, "name": "after", "inputs": 1, "outputs": 0}],
            "edges": [_edge((0, 0), (1, 0)), _edge((1, 0), (2, 0))]}


def test_a_capability_inside_a_loop_holds_the_stage_after_it_until_the_loop_drains() -> None:
    tracker = ScopedTracker(NestedGraph.from_json(1, _loop_then_stage()))
    source = ScopedLocation((), 0, 0, "source")
    inside = ScopedLocation((1,), 1, 0, "source")
    after = ScopedLocation((), 2, 0, "target")
    tracker.apply([(source, (5,), 1), (inside, (5, 3), 1)])
    assert tracker.frontier(after) == [(5,)]
    tracker.apply([(source, (5,), -1), (source, (6,), 1)])  # the input moves on to epoch 6
    assert tracker.frontier(after) == [(5,)], "the loop still holds epoch 5"
    assert not tracker.can_notify(after, (5,))
    # The feedback input, in inner time: the capability's next round, and epoch 6's first.
    assert tracker.frontier(ScopedLocation((1,), 1, 1, "target")) == [(5, 4), (6, 1)]
    changes = tracker.apply([(inside, (5, 3), -1)])  # the loop is drained
    assert tracker.frontier(after) == [(6,)]
    assert tracker.can_notify(after, (5,))
    assert (after, (5,), -1) in changes and (after, (6,), 1) in changes


def test_the_loops_summary_as_an_operator_drops_the_loop_counter() -> None:
    nested = NestedGraph.from_json(1, _loop_then_stage())
    assert {k: [tuple(s) for s in v] for k, v in nested.scope_summaries[(1,)].items()} == {(0, 0): [(0,)]}
    assert scoped_oracle.scope_summaries(nested)[(1,)] == {(0, 0): [(0,)]}


@pytest.mark.parametrize("body, message", [
    ({"nodes": [{"id": 1, "inputs": 1, "outputs": 1, "connections": [], "scope": {"kind": "region", "nodes": [],
                                                                                  "edges": []}}], "edges": []},
     "node 1 is a scope and cannot have connections"),
    ({"nodes": [{"id": 1, "inputs": 1, "outputs": 1, "scope": {"kind": "loop", "nodes": [], "edges": []}}],
      "edges": []}, "kind must be 'iterative' or 'region'"),
    ({"nodes": [{"id": 1, "inputs": 1, "outputs": 1, "scope": {"kind": "region", "nodes": [
        {"id": 0, "inputs": 1, "outputs": 1}], "edges": []}}], "edges": []}, "node 0 is the scope's boundary"),
    ({"nodes": [{"id": 1, "inputs": 1, "outputs": 1, "scope": {"kind": "region", "nodes": [],
                                                               "edges": [_edge((0, 0), (7, 0))]}}], "edges": []},
     "scope [1]: edge"),
])
def test_invalid_scopes_are_refused_naming_the_scope(body: dict[str, Any], message: str) -> None:
    with pytest.raises(GraphError, match=message.replace("[", r"\[").replace("]", r"\]")):
        NestedGraph.from_json(1, body)


def test_a_cycle_through_a_region_is_refused_with_its_scope_path() -> None:
    region = {"kind": "region", "nodes": [], "edges": [_edge((0, 0), (0, 0))]}  # a pass-through
    body = {"nodes": [{"id": 1, "inputs": 1, "outputs": 1, "scope": region}], "edges": [_edge((1, 0), (1, 0))]}
    with pytest.raises(NonIncrementingCycle) as refused:
        NestedGraph.from_json(1, body)
    assert refused.value.path == ()
    assert "[](1,0,source) -> (1,0,target)" in str(refused.value)


def test_updates_are_checked_against_their_scope() -> None:
    tracker = ScopedTracker(NestedGraph.from_json(1, _loop_then_stage()))
    bad = [
        ((ScopedLocation((1,), 1, 0, "source"), (5,), 1), "arity"),
        ((ScopedLocation((1,), 0, 0, "source"), (5, 0), 1), "boundary"),
        ((ScopedLocation((), 1, 0, "source"), (5,), 1), "scope node's output"),
        ((ScopedLocation((9,), 1, 0, "source"), (5,), 1), "unknown scope"),
    ]
    for update, message in bad:
        with pytest.raises(GraphError, match=message):
            tracker.apply([update])
    assert tracker.pointstamps() == {}


def test_scopes_nest_eight_deep() -> None:
    body: dict[str, Any] = {"kind": "iterative", "nodes": [{"id": 1, "inputs": 1, "outputs": 1}],
                            "edges": [_edge((0, 0), (1, 0)), _edge((1, 0), (0, 0))]}
    for _ in range(7):
        body = {"kind": "iterative", "nodes": [{"id": 1, "inputs": 1, "outputs": 1, "scope": body}],
                "edges": [_edge((0, 0), (1, 0)), _edge((1, 0), (0, 0))]}
    root = {"nodes": [{"id": 0, "inputs": 0, "outputs": 1}, {"id": 1, "inputs": 1, "outputs": 1, "scope": body},
                      {"id": 2, "inputs": 1, "outputs": 0}], "edges": [_edge((0, 0), (1, 0)), _edge((1, 0), (2, 0))]}
    nested = NestedGraph.from_json(1, root)
    deepest = (1,) * 8
    assert nested.arity_of(deepest) == 9
    tracker = ScopedTracker(nested)
    tracker.apply([(ScopedLocation(deepest, 1, 0, "source"), (3,) + (0,) * 8, 1)])
    assert tracker.frontier(ScopedLocation((), 2, 0, "target")) == [(3,)]


def _replay(changes: list[Any], into: dict[ScopedLocation, dict[tuple[int, ...], int]]) -> None:
    for location, time, diff in changes:
        into[location][time] += diff


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_scoped_tracker_equals_the_flattened_oracle_after_every_batch(data: st.DataObject) -> None:
    arity, body = data.draw(nested_bodies())
    nested = NestedGraph.from_json(arity, body)
    tracker = ScopedTracker(nested)
    replayed: dict[ScopedLocation, dict[tuple[int, ...], int]] = defaultdict(lambda: defaultdict(int))
    batches = data.draw(nested_batches(nested))
    for done in range(1, len(batches) + 1):
        _replay(tracker.apply(batches[done - 1]), replayed)
        expected = scoped_oracle.frontiers(nested, scoped_oracle.accumulate(batches[:done]))
        assert tracker.frontiers() == expected
        rebuilt = {loc: sorted(t for t, c in times.items() if c) for loc, times in replayed.items()}
        assert {loc: times for loc, times in rebuilt.items() if times} == {
            loc: times for loc, times in expected.items() if times}
        assert all(c in (0, 1) for times in replayed.values() for c in times.values())
    assert tracker.pointstamps() == scoped_oracle.accumulate(batches)


@settings(max_examples=100, deadline=None)
@given(nested_bodies())
def test_scope_summaries_equal_the_flattened_search(drawn: tuple[int, dict[str, Any]]) -> None:
    nested = NestedGraph.from_json(*drawn)
    computed = {path: {k: sorted(tuple(s) for s in v) for k, v in found.items()}
                for path, found in nested.scope_summaries.items()}
    assert computed == scoped_oracle.scope_summaries(nested)


def test_a_transient_negative_inside_a_scope_does_not_cancel_a_capability_there() -> None:
    # A receiver's -1 may be applied before its sender's +1 (workers report independently). Inside
    # the loop, a -1 at the operator's input and a capability at its output both lead to (5,)
    # outside: only the capability, a positive count, may count there.
    tracker = ScopedTracker(NestedGraph.from_json(1, _loop_then_stage()))
    after = ScopedLocation((), 2, 0, "target")
    capability, received = ScopedLocation((1,), 1, 0, "source"), ScopedLocation((1,), 1, 0, "target")
    tracker.apply([(capability, (5, 2), 1)])
    tracker.apply([(received, (5, 3), -1)])
    assert tracker.frontier(after) == [(5,)]
    tracker.apply([(received, (5, 3), 1)])  # the sender's +1, late
    assert tracker.frontier(after) == [(5,)]
    tracker.apply([(capability, (5, 2), -1)])
    assert tracker.frontier(after) == []
    nested = NestedGraph.from_json(1, _loop_then_stage())
    batches = [[(capability, (5, 2), 1)], [(received, (5, 3), -1)]]
    assert scoped_oracle.frontiers(nested, scoped_oracle.accumulate(batches))[after] == [(5,)]
