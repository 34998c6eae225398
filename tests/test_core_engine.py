"""The compiled engine against the Python reference tracker and the brute-force oracle.

Differential: on hypothesis-generated graphs (loops, arity 1-3, a few of higher arity) and
batch sequences with transiently negative counts, the compiled engine (through
:class:`~tracker.compiled.CompiledTracker` and through its low-level flat API), the reference
:class:`~tracker.reachability.Tracker` and the oracle agree on every change of every batch and
on every frontier; the low-level API's JSON equals ``json.dumps`` of the reference's changes.
Nested scopes too: a :class:`~tracker.scoped.ScopedTracker` running the compiled engine in each
scope (as the service's ``NestedEngine`` does) against the reference ``ScopedTracker`` and the
flattened oracle (:mod:`tracker.scoped_oracle`).
"""

from __future__ import annotations

import json
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from progress_engine import Engine, MovedAt

from tests.strategies import acyclic_graphs, nested_batches, nested_bodies, raw_graphs, update_batches
from tracker import oracle, scoped_oracle
from tracker.compiled import CompiledTracker, engine_for, location_json
from tracker.graph import Connection, Edge, Graph, GraphError, Location, Node, Update
from tracker.reachability import FrontierChange, Tracker
from tracker.scope import NestedGraph
from tracker.scoped import ScopedTracker
from tracker.structure import find_cycles
from tracker.timestamp import PathSummary

SETTINGS = settings(max_examples=150, deadline=None)


def _payload(changes: list[FrontierChange]) -> list[dict]:
    return [{"location": c.location._asdict(), "time": list(c.time), "diff": c.diff} for c in changes]


def _flat(batch: list[Update], index: dict[Location, int]) -> tuple[list[int], list[int], list[int]]:
    return [index[loc] for loc, _, _ in batch], [c for _, t, _ in batch for c in t], [d for _, _, d in batch]


@pytest.mark.parametrize("loops", [False, True], ids=["dag", "loops"])
@pytest.mark.parametrize("arity", [1, 2, 3])
def test_engine_reference_and_oracle_agree_on_every_batch(arity: int, loops: bool) -> None:
    @SETTINGS
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        graph = data.draw(acyclic_graphs(arity=arity, loops=loops))
        batches = data.draw(update_batches(graph))
        reference = Tracker(graph)
        compiled = CompiledTracker(graph)
        engine, order = engine_for(graph)
        index = {loc: i for i, loc in enumerate(order)}
        wanted = data.draw(st.sets(st.sampled_from(order)))
        selection = engine.selection([index[loc] for loc in wanted])
        psi = oracle.path_summaries(graph)
        published = engine.frontier_copy()  # what the service publishes: batches folded in, in the engine
        moved, last_moved = MovedAt(), {}  # when each location's frontier last moved (here: batch numbers)
        for number, batch in enumerate(batches):
            expected = reference.apply(batch)
            assert compiled.apply(batch) == expected
            assert all(type(c) is FrontierChange and type(c.location) is Location for c in compiled.apply([]))
            low = engine.apply_indexed(*_flat(batch, index))
            moved.stamp(low, float(number))
            last_moved.update({index[c.location]: float(number) for c in expected})
            assert len(low) == len(expected)
            assert [(order[i], t, d) for i, t, d in low.to_list()] == [tuple(c) for c in expected]
            assert low.to_list(labels=True) == [tuple(c) for c in expected]
            assert low.to_json() == json.dumps(_payload(expected))
            low.prepare_json()  # the compact payload of every change, encoded by a thread of its own
            low.prepare_json()  # already under way: nothing more
            assert low.to_json(compact=True) == json.dumps(_payload(expected), separators=(",", ":"))
            low.prepare_json()  # taken by that to_json: a new one
            assert low.to_json_bytes(compact=True) == json.dumps(_payload(expected), separators=(",", ":")).encode()
            assert low.to_json(compact=True) == json.dumps(_payload(expected), separators=(",", ":"))
            assert low.to_json_bytes() == json.dumps(_payload(expected)).encode()
            mine = [c for c in expected if c.location in wanted]
            assert low.to_json(selection) == json.dumps(_payload(mine))
            assert low.count(selection) == len(mine) == len(low.select(selection))
            assert low.select(selection).to_list(labels=True) == [tuple(c) for c in mine]
            truth = oracle.frontiers(graph, oracle.accumulate(batches[: number + 1]), psi)
            assert compiled.frontiers() == reference.frontiers() == truth
            assert engine.frontiers() == [truth[loc] for loc in order]
            published.fold(low)
            assert published.to_dict() == {loc: set(times) for loc, times in truth.items()}
            assert [published.frontier(i) for i in range(len(order))] == [truth[loc] for loc in order]
        assert [moved.get(i) for i in range(len(order) + 2)] == [last_moved.get(i) for i in range(len(order) + 2)]
        frozen = moved.copy()
        moved.stamp(low, -1.0)  # a copy does not see later stamps
        assert [frozen.get(i) for i in range(len(order))] == [last_moved.get(i) for i in range(len(order))]
        last_moved.update({i: -1.0 for i in low.locations()})
        assert [moved.get(i) for i in range(len(order))] == [last_moved.get(i) for i in range(len(order))]
        assert compiled.pointstamps() == reference.pointstamps() == oracle.accumulate(batches)
        times = st.tuples(*[st.integers(0, 4)] * arity)
        for loc, time in data.draw(st.lists(st.tuples(st.sampled_from(order), times), max_size=10)):
            assert compiled.can_notify(loc, time) == reference.can_notify(loc, time)
            assert compiled.frontier(loc) == reference.frontier(loc)

    check()


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_engine_equals_reference_on_larger_graphs(data: st.DataObject) -> None:
    """Graphs too large for path enumeration: every change against the reference, every
    frontier against the from-scratch fixed point."""
    graph = data.draw(acyclic_graphs(arity=data.draw(st.sampled_from([1, 2, 3])), max_nodes=25))
    batches = data.draw(update_batches(graph, max_batches=15))
    reference, compiled = Tracker(graph), CompiledTracker(graph)
    for number, batch in enumerate(batches):
        assert compiled.apply(batch) == reference.apply(batch)
        assert compiled.frontiers() == oracle.fixpoint_frontiers(graph, oracle.accumulate(batches[: number + 1]))


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_engine_any_arity(data: st.DataObject) -> None:
    """Arities without a fixed-size specialisation (5) and the largest one that has it (4)."""
    graph = data.draw(acyclic_graphs(arity=data.draw(st.sampled_from([4, 5])), max_nodes=4))
    batches = data.draw(update_batches(graph, max_batches=5))
    reference, compiled = Tracker(graph), CompiledTracker(graph)
    for batch in batches:
        assert compiled.apply(batch) == reference.apply(batch)
        assert compiled.frontiers() == reference.frontiers()
    assert compiled.pointstamps() == reference.pointstamps()


@settings(max_examples=100, deadline=None)
@given(graph=raw_graphs())
def test_cycle_check_as_the_reference(graph: Graph) -> None:
    if find_cycles(graph):
        with pytest.raises(ValueError, match="non-incrementing"):
            CompiledTracker(graph)
        # The engine refuses identity cycles on its own too, even when told they were checked.
        with pytest.raises(ValueError, match="non-incrementing cycle"):
            CompiledTracker(graph, cycles_checked=True)
    else:
        CompiledTracker(graph)


def _timely_example() -> Graph:
    nodes = [Node(0, 1, 1), Node(1, 1, 1), Node(2, 1, 1, connections=(Connection(0, 0, (PathSummary((1,)),)),))]
    edges = [Edge(Location.source(a, 0), Location.target(b, 0)) for a, b in [(0, 1), (1, 2), (2, 0)]]
    return Graph.build(1, nodes, edges)


def test_bad_batches_change_nothing() -> None:
    tracker = CompiledTracker(_timely_example())
    tracker.apply([(Location.source(0, 0), (1,), 1)])
    before = (tracker.frontiers(), tracker.pointstamps())
    with pytest.raises(GraphError, match="update 1: unknown location"):
        tracker.apply([(Location.source(1, 0), (1,), 1), (Location.source(9, 0), (1,), 1)])
    with pytest.raises(GraphError, match="arity is 1"):
        tracker.apply([(Location.source(1, 0), (1, 2), 1)])
    with pytest.raises(GraphError, match="delta must be an integer"):
        tracker.apply([(Location.source(1, 0), (1,), 1.5)])
    engine = tracker.engine
    with pytest.raises(IndexError):
        engine.apply_indexed([0, 6], [1, 1], [1, 1])
    with pytest.raises(ValueError, match="non-negative"):
        engine.apply_indexed([0, 1], [1, -1], [1, 1])
    with pytest.raises(ValueError, match="deltas"):
        engine.apply_indexed([0, 1], [1, 1], [1])
    with pytest.raises(KeyError, match="unknown location"):
        engine.apply([(Location.source(1, 0), (1,), 1), (Location.source(7, 0), (1,), 1)])
    with pytest.raises(ValueError, match="update 0: time has 2 coordinates"):
        engine.apply([(Location.source(1, 0), (1, 2), 1)])
    assert (tracker.frontiers(), tracker.pointstamps()) == before


def test_low_level_api_takes_buffers_and_moves_every_frontier_of_a_ring() -> None:
    graph = _timely_example()
    engine, order = engine_for(graph)
    source = order.index(Location.source(0, 0))
    first = engine.apply_indexed(array("q", [source]), array("q", [0]), array("q", [1]))
    assert len(first) == 6
    for epoch in range(3):
        batch = engine.apply_indexed(array("q", [source, source]), array("q", [epoch + 1, epoch]), (1, -1))
        assert len(batch) == 12 and batch.diffs().count(1) == 6
        assert batch.flat_times() == [t[0] for _, t, _ in batch.to_list()]
        assert batch.locations() == [i for i, _, _ in batch.to_list()]
    assert engine.frontier(source) == [(3,)]
    # Labelled updates may be any 3-sequences, times tuples or lists.
    moved = engine.apply([[Location.source(0, 0), [4], 1], (Location.source(0, 0), (3,), -1)])
    assert len(moved) == 12
    engine.apply([(Location.source(0, 0), [3], 1), [Location.source(0, 0), (4,), -1]])
    with pytest.raises(ValueError, match="expected"):
        engine.apply([[Location.source(0, 0), (4,)]])
    assert engine.pointstamps() == [(source, (3,), 1)]
    assert engine.index(Location.source(0, 0)) == source and len(engine) == 6 and engine.arity == 1
    selection = engine.selection([source])
    assert len(selection) == 1 and source in selection and selection.members() == [source]
    assert location_json(order[0]) == json.dumps(order[0]._asdict())


def test_json_fragments_as_a_list_or_joined_by_newlines() -> None:
    fragments = ['{"node": 0}', '{"node": 1, "kind": "a b"}', "{}"]
    transitions: list[tuple[int, int, list[int] | None]] = [(0, 1, None), (1, 2, [1])]
    listed, joined = (Engine(1, 3, transitions, json=given) for given in (fragments, "\n".join(fragments)))
    first, second = (engine.apply_indexed([0], [5], [1]) for engine in (listed, joined))
    assert first.to_json() == second.to_json() == ('[{"location": {"node": 0}, "time": [5], "diff": 1}, '
                                                   '{"location": {"node": 1, "kind": "a b"}, "time": [5], "diff": 1}, '
                                                   '{"location": {}, "time": [6], "diff": 1}]')
    assert first.to_json(compact=True) == second.to_json(compact=True)
    with pytest.raises(ValueError, match="json has 2 entries for 3 locations"):
        Engine(1, 3, transitions, json='{"node": 0}\n{}')
    with pytest.raises(ValueError, match="json has 0 entries for 3 locations"):  # "" joins no fragments
        Engine(1, 3, transitions, json="")
    assert Engine(1, 0, [], json="").apply_indexed([], [], []).to_json() == "[]"


def test_prepared_encodings_beyond_the_bound_and_dropped_ones_change_nothing() -> None:
    # At most 8 prepared encodings wait at once (each holds its batch's text); the others are
    # encoded when asked, and a batch dropped unasked gives its place back.
    engine, order = engine_for(Graph.build(1, [Node(0, 0, 1), Node(1, 1, 1), Node(2, 1, 0)], [
        Edge(Location.source(0, 0), Location.target(1, 0)), Edge(Location.source(1, 0), Location.target(2, 0))]))
    source = order.index(Location.source(0, 0))
    engine.apply_indexed([source], [0], [1])
    for _ in range(3):
        batches = [engine.apply_indexed([source, source], [t, t + 1], [-1, 1]) for t in range(20)]
        expected = [batch.to_json(compact=True) for batch in batches]
        for batch in batches:
            batch.prepare_json()
        del batches[::2]  # dropped with their encodings unasked
        assert [batch.to_json(compact=True) for batch in batches] == expected[1::2]
        engine.apply_indexed([source, source], [20, 0], [-1, 1])  # back to the start


def test_texts_over_a_mebibyte_are_the_same_strings() -> None:
    # Long ASCII texts are copied into their str without the GIL (progress_engine's
    # detached_string); a non-ASCII fragment takes the ordinary path. Both must be exact.
    for kind in ("a", "\u00e9"):
        fragments = ['{"node": 0}', f'{{"node": 1, "kind": "{kind}"}}']
        engine = Engine(2, 2, [(0, 1, None)], json=fragments)
        wide = list(range(45_000))
        engine.apply_indexed([0] * len(wide), [c for i in wide for c in (i, 90_000 - i)], [1] * len(wide))
        batch = engine.apply_indexed([0] * (2 * len(wide)),
                                     [c for i in wide for c in (i, 90_000 - i, i + 1, 90_000 - i)],
                                     [d for _ in wide for d in (-1, 1)])
        expected = json.dumps([{"location": json.loads(fragments[loc]), "time": list(t), "diff": d}
                               for loc, t, d in batch.to_list()], separators=(",", ":"), ensure_ascii=False)
        assert len(expected) > 1 << 20
        text = batch.to_json(compact=True)
        assert text == expected and text.isascii() == (kind == "a") and hash(text) == hash(expected)
        assert json.loads(text)[0]["diff"] in (-1, 1)
        copy = engine.frontier_copy()
        rows = copy.rows_json(list(range(2)))
        assert len(rows) > 1 << 20 and json.loads(f"[{rows}]")[0]["frontier"][0] == [1, 90_000]


def test_engine_without_labels_or_json() -> None:
    engine = Engine(2, 3, [(0, 1, None), (1, 2, [0, 1])])
    batch = engine.apply_indexed([0], [4, 0], [1])
    assert batch.to_list() == [(0, (4, 0), 1), (1, (4, 0), 1), (2, (4, 1), 1)]
    batch.prepare_json()  # nothing to encode with
    with pytest.raises(ValueError, match="no JSON"):
        batch.to_json()
    with pytest.raises(ValueError, match="no JSON"):
        batch.to_json(compact=True)
    with pytest.raises(ValueError, match="no labels"):
        batch.to_list(labels=True)
    typed = batch.to_list(cls=FrontierChange)
    assert [type(c) for c in typed] == [FrontierChange] * 3 and typed[2].time == (4, 1) and typed[2].location == 2
    with pytest.raises(TypeError, match="subclass of tuple"):
        batch.to_list(cls=list)
    with pytest.raises(ValueError, match="no labels"):
        engine.apply([(0, (1, 1), 1)])
    with pytest.raises(ValueError, match="non-incrementing cycle"):
        Engine(1, 2, [(0, 1, None), (1, 0, [0])])
    with pytest.raises(ValueError, match="summary has 1 coordinates"):
        Engine(2, 2, [(0, 1, [1])])
    assert engine.can_notify(2, (4, 0)) and not engine.can_notify(2, (4, 1))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_compiled_engine_in_every_scope_equals_the_reference_and_the_scoped_oracle(data: st.DataObject) -> None:
    arity, body = data.draw(nested_bodies())
    nested = NestedGraph.from_json(arity, body)
    compiled = ScopedTracker(nested, lambda graph: CompiledTracker(graph, cycles_checked=True))
    reference = ScopedTracker(nested)
    batches = data.draw(nested_batches(nested))  # transiently negative counts included
    for done in range(1, len(batches) + 1):
        assert compiled.apply(batches[done - 1]) == reference.apply(batches[done - 1])
        expected = scoped_oracle.frontiers(nested, scoped_oracle.accumulate(batches[:done]))
        assert compiled.frontiers() == reference.frontiers() == expected
        assert all(compiled.can_notify(loc, time) == reference.can_notify(loc, time)
                   for batch in batches[:done] for loc, time, _ in batch)
    assert compiled.pointstamps() == reference.pointstamps() == scoped_oracle.accumulate(batches)


def test_an_engine_takes_its_label_index_from_the_caller_only_if_it_covers_every_label() -> None:
    graph = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
    order = graph.sorted_locations()
    with pytest.raises(ValueError, match="every label"):
        Engine(1, len(order), [], labels=order, index={order[0]: 0})
    engine = Engine(1, len(order), [], labels=order, index={loc: i for i, loc in enumerate(order)})
    assert engine.apply([(Location.source(0, 0), (1,), 1)]).to_list(labels=True) == [(Location.source(0, 0), (1,), 1)]


def test_a_frontier_copy_takes_only_its_own_engines_batches_that_follow_it() -> None:
    graph = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
    engine, order = engine_for(graph)
    other, _ = engine_for(graph)
    copy, stale = engine.frontier_copy(), engine.frontier_copy()
    source = order.index(Location.source(0, 0))
    with pytest.raises(ValueError, match="another engine"):
        copy.fold(other.apply_indexed([source], [3], [1]))
    copy.fold(engine.apply_indexed([source], [3], [1]))
    assert copy.frontier(source) == [(3,)] and len(copy) == len(order)
    retired = engine.apply_indexed([source], [3], [-1])
    with pytest.raises(ValueError, match="does not follow"):
        stale.fold(retired)  # it never saw (3,) enter
    copy.fold(retired)
    assert copy.to_dict() == {loc: set() for loc in order}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 699), st.booleans()), min_size=1, max_size=12))
def test_frontier_copies_share_their_chunks_yet_stay_independent(moves: list[tuple[int, int, bool]]) -> None:
    """Copies of a frontier share its chunks of 256 locations until one changes: on a chain of
    1,400 locations (six chunks), every copy taken between batches still reads what it read
    when taken, however the original and the other copies were folded since, and the original
    reads what the engine reads."""
    nodes = [Node(0, 0, 1)] + [Node(i, 1, 1) for i in range(1, 700)]
    chain = Graph.build(1, nodes, [Edge(Location.source(i, 0), Location.target(i + 1, 0)) for i in range(699)])
    engine, order = engine_for(chain)
    published = engine.frontier_copy()
    held: dict[int, int] = {}  # operator -> the time its output holds
    copies = [(published.copy(), published.to_dict())]
    for time, node, fold_copy in moves:
        at = order.index(Location.source(node, 0))
        locations, times, deltas = [at], [time], [1]
        if node in held:
            locations, times, deltas = [at, at], [held[node], time], [-1, 1]
            if held[node] == time:
                continue
        held[node] = time
        batch = engine.apply_indexed(locations, times, deltas)
        published.fold(batch)
        if fold_copy:  # a copy folded too: it and the original each own what they change
            copy, _ = copies[-1]
            copy.fold(batch)
            copies[-1] = (copy, published.to_dict())
        copies.append((published.copy(), published.to_dict()))
    assert published.to_dict() == engine.frontier_copy().to_dict()
    for copy, taken in copies:
        assert copy.to_dict() == taken


@pytest.mark.parametrize("width", [3, 40])  # one departure at a time, and through a set
def test_a_frontier_copy_folds_a_wide_antichain_moved_whole(width: int) -> None:
    chain = Graph.build(2, [Node(0, 0, 1), Node(1, 1, 1), Node(2, 1, 0)],
                        [Edge(Location.source(i, 0), Location.target(i + 1, 0)) for i in range(2)])
    engine, order = engine_for(chain)
    source = order.index(Location.source(0, 0))
    wide = [(i, width - i) for i in range(width + 1)]
    engine.apply_indexed([source] * len(wide), [c for t in wide for c in t], [1] * len(wide))
    copy, stale = engine.frontier_copy(), engine.frontier_copy()
    moved = [(i + 1, width - i) for i in range(width + 1)]
    batch = engine.apply_indexed([source] * 2 * len(wide), [c for t in wide + moved for c in t],
                                 [-1] * len(wide) + [1] * len(moved))
    copy.fold(batch)
    assert copy.to_dict() == engine.frontier_copy().to_dict()
    assert sorted(copy.frontier(order.index(Location.target(2, 0)))) == moved
    stale.fold(batch)
    with pytest.raises(ValueError, match=r"has no time .* to retire"):
        stale.fold(batch)  # the departures are gone already
