"""Publication in process: the published frontier, its history, subscribers and version order."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.live.ages import MOVES_HELD, Ages
from api.live.state import LiveState
from api.streams.encoding import changes_json
from api.streams.publish import Publication
from api.streams.subscribers import (
    RESYNC,
    WRITE_BYTES,
    Subscriber,
    attach,
    next_events,
    sse_events,
    sse_frame,
    ws_message,
)
from tests.strategies import acyclic_graphs, update_batches
from tracker.compiled import CompiledTracker
from tracker.graph import Edge, Graph, Location, Node
from tracker.reachability import FrontierChange, Tracker

GRAPH = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
SOURCE, TARGET = Location.source(0, 0), Location.target(1, 0)


def _advance(tracker: Tracker, time: int) -> list[FrontierChange]:
    """Move the single pointstamp at the source from ``time - 1`` to ``time``."""
    return tracker.apply([(SOURCE, (time - 1,), -1), (SOURCE, (time,), 1)])


def _published(history_limit: int = 100, versions: int = 5) -> tuple[Publication, list[tuple[int, str, float]]]:
    seen: list[tuple[int, str, float]] = []
    tracker = Tracker(GRAPH)
    tracker.apply([(SOURCE, (0,), 1)])
    publication = Publication(GRAPH, history_limit, lambda v, encoded, at: seen.append((v, encoded, at)))
    publication.reset(tracker.frontiers(), 0)
    for version in range(1, versions + 1):
        publication.publish(version, _advance(tracker, version), notify=False, at=float(version))
    return publication, seen


def test_the_frontier_as_of_every_retained_version() -> None:
    publication, seen = _published()
    assert publication.frontier_version == 5
    for version in range(6):
        at, view = publication.frontier_at(version)
        assert at == version and view[TARGET] == {(version,)} and view[SOURCE] == {(version,)}
    with pytest.raises(LookupError):
        publication.frontier_at(6)
    # Every version's changes went to the Delta side once, with the time they were applied at.
    assert [(v, at) for v, _, at in seen] == [(v, float(v)) for v in range(1, 6)]
    assert json.loads(seen[0][1]) == json.loads(changes_json(_advance(_fresh_tracker_at(0), 1)))


def _fresh_tracker_at(time: int) -> Tracker:
    tracker = Tracker(GRAPH)
    tracker.apply([(SOURCE, (time,), 1)])
    return tracker


def test_the_history_is_bounded_and_says_how_far_back_it_reaches() -> None:
    publication, _ = _published(history_limit=3, versions=6)
    assert [v for v, _, _ in publication.history] == [4, 5, 6]
    assert publication.history_floor == 3
    assert publication.frontier_at(3)[1][TARGET] == {(3,)}
    with pytest.raises(LookupError):
        publication.frontier_at(2)
    assert publication.changes_since(2) is None
    assert [v for v, _ in publication.changes_since(4) or []] == [5, 6]


def test_subscribers_get_every_version_once_in_order_after_their_snapshot() -> None:
    async def main() -> list[tuple[str, int]]:
        tracker = _fresh_tracker_at(0)
        publication = Publication(GRAPH)
        publication.reset(tracker.frontiers(), 0)
        publication.publish(1, _advance(tracker, 1))
        subscriber, first = attach(publication, None, maxsize=100)
        for version in range(2, 6):
            publication.publish(version, _advance(tracker, version))
        publication.publish(6, [])  # a version without changes sends nothing
        got = [(event, version) for event, version, _ in first]
        while not subscriber.queue.empty():
            got += [(event, version) for event, version, _ in await next_events(publication, subscriber)]
        return got

    assert asyncio.run(main()) == [("snapshot", 1), ("changes", 2), ("changes", 3), ("changes", 4), ("changes", 5)]


def test_a_subscriber_resuming_from_a_version_gets_exactly_the_missed_changes() -> None:
    async def main(after: str) -> list[int]:
        publication, _ = _published(versions=5)
        _, first = attach(publication, after, maxsize=100)
        return [version for event, version, data in first if event == "changes"
                and json.loads(ws_message(event, version, data))["version"] == version]

    assert asyncio.run(main("2")) == [3, 4, 5]
    assert asyncio.run(main("0")) == [1, 2, 3, 4, 5]  # more versions than changes in each


def test_a_slow_subscriber_is_resynchronised_without_slowing_the_publisher() -> None:
    async def main() -> list[str]:
        tracker = _fresh_tracker_at(0)
        publication = Publication(GRAPH)
        publication.reset(tracker.frontiers(), 0)
        lags: list[int] = []
        subscriber = Subscriber(2, on_lag=lambda: lags.append(1))
        publication.subscribers.add(subscriber)
        for version in range(1, 6):
            publication.publish(version, _advance(tracker, version))
        assert lags == [1] and subscriber.queue.qsize() == 1 and subscriber.queue.get_nowait() == RESYNC
        subscriber.queue.put_nowait(RESYNC)
        events = await next_events(publication, subscriber)
        assert json.loads(events[1][2])["version"] == 5
        return [event for event, _, _ in events]

    assert asyncio.run(main()) == ["resync", "snapshot"]


def test_subscribers_share_one_wire_form_per_version_and_catch_up_in_bounded_writes() -> None:
    # 500 SSE subscribers once copied each version's changes three times each (2.5 GB resident).
    async def main() -> tuple[list[bytes], list[bytes], list[int]]:
        tracker = _fresh_tracker_at(0)
        publication = Publication(GRAPH)
        publication.reset(tracker.frontiers(), 0)
        streams = [sse_events(publication, None, 1000) for _ in range(2)]
        firsts = [await anext(stream) for stream in streams]  # subscribed: their snapshots
        assert all(b"event: snapshot" in first for first in firsts)
        for version in range(1, 4):
            publication.publish(version, _advance(tracker, version))
        one, two = await anext(streams[0]), await anext(streams[1])
        # A catch-up of many versions goes out in several writes of bounded size.
        wide = [FrontierChange(TARGET, (t,), 1) for t in range(4, 204)]
        narrow = [FrontierChange(c.location, c.time, -1) for c in wide]
        for version in range(4, 44):
            publication.publish(version, wide if version % 2 == 0 else narrow)
        sizes = [len(await asyncio.wait_for(anext(streams[0]), 5))]
        while sum(sizes) < 40 * len(changes_json(wide)):
            sizes.append(len(await asyncio.wait_for(anext(streams[0]), 5)))
        return [one], [two], sizes

    one, two, sizes = asyncio.run(main())
    assert one == two and b"id: 3" in one[0] and b"id: 1" in one[0]
    frame = len(sse_frame("changes", 43, changes_json([FrontierChange(TARGET, (999,), -1)] * 200)))
    assert len(sizes) > 1 and max(sizes) <= WRITE_BYTES + frame


def test_changes_events_are_one_shared_string_per_version() -> None:
    encoded = changes_json([FrontierChange(TARGET, (1,), 1)])
    assert ws_message("changes", 1, encoded) is ws_message("changes", 1, encoded)
    assert sse_frame("changes", 1, encoded) is sse_frame("changes", 1, encoded)
    assert ws_message("changes", 1, encoded) is not ws_message("changes", 2, encoded)
    assert json.loads(ws_message("changes", 2, encoded)) == {"type": "changes", "version": 2,
                                                            "changes": json.loads(encoded)}
    frame = sse_frame("changes", 2, encoded).decode()
    assert frame.startswith("id: 2\r\nevent: changes\r\ndata: ") and frame.endswith("\r\n\r\n")
    assert json.loads(frame.split("data: ", 1)[1]) == {"version": 2, "changes": json.loads(encoded)}


def test_ages_hold_a_bounded_number_of_unfolded_changes() -> None:
    ages = Ages(0.0)
    wide = [FrontierChange(TARGET, (t,), 1) for t in range(30_000)]
    for version in range(20):
        ages.frontier_moved(wide, float(version))
        assert sum(len(changes) for _, changes in ages._moves) < MOVES_HELD
    ages._fold_moves()  # folded, not dropped: the location moved at the last version
    assert ages._moved[TARGET] == 19.0


def _births_by_definition(batches: list[tuple[float, str | None, list[tuple[Location, tuple[int, ...], int]]]]
                          ) -> dict[tuple[Location, tuple[int, ...]], tuple[float, str | None]]:
    """Every live pointstamp's (birth, last worker) from the definition: a batch's updates summed
    per pointstamp; born when its count last went from zero or below to above zero; the worker
    of the last batch naming it; live while its count is positive."""
    counts: dict[tuple[Location, tuple[int, ...]], int] = {}
    born: dict[tuple[Location, tuple[int, ...]], float] = {}
    last: dict[tuple[Location, tuple[int, ...]], str | None] = {}
    for at, worker, updates in batches:
        net: dict[tuple[Location, tuple[int, ...]], int] = {}
        for location, time, delta in updates:
            net[(location, time)] = net.get((location, time), 0) + delta
        for key, delta in net.items():
            before = counts.get(key, 0)
            counts[key] = before + delta
            last[key] = worker
            if before <= 0 < counts[key]:
                born[key] = at
    return {key: (born[key], last[key]) for key, count in counts.items() if count > 0}


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_births_kept_by_the_engine_follow_the_definition(data: st.DataObject) -> None:
    """``Ages.births_in_engine``: blame and the oldest pointstamp per location, after batches
    given as the engine takes them (``Indexed``) or as lists (initial, recovery), equal the
    definition's, including negative counts and batches that retire and re-report."""
    from api.schema.parsing import Indexed

    graph = data.draw(acyclic_graphs(arity=data.draw(st.integers(1, 2))))
    tracker = CompiledTracker(graph)
    order = tracker.locations
    ages = Ages(0.0)
    ages.births_in_engine(tracker.engine.index, order, graph.arity)
    places = st.sampled_from(graph.locations())
    times = st.tuples(*[st.integers(0, 3)] * graph.arity)
    batches = data.draw(st.lists(st.tuples(st.lists(st.tuples(places, times, st.integers(-2, 2)), max_size=8),
                                           st.sampled_from(["w0", "w1", None]), st.booleans()), max_size=12))
    seen: list[tuple[float, str | None, list[tuple[Location, tuple[int, ...], int]]]] = []
    for at, (updates, worker, indexed) in enumerate(batches):
        seen.append((float(at), worker, updates))
        if indexed:
            index = tracker.engine.index
            ages.batch_durable(float(at), worker, Indexed(order, graph.arity, [index(u[0]) for u in updates],
                                                          [c for u in updates for c in u[1]], [u[2] for u in updates]))
        else:
            ages.batch_durable(float(at), worker, updates)
    expected = _births_by_definition(seen)
    assert {key: ages.blame(*key) for key in expected} == expected
    oldest: dict[Location, tuple[tuple[int, ...], float, str | None]] = {}
    for (location, time), (at, worker) in expected.items():
        if location not in oldest or (at, time) < (oldest[location][1], oldest[location][0]):
            oldest[location] = (time, at, worker)
    assert ages.oldest_by_location() == oldest
    live = {key: count for key, count in _counts(seen).items() if count}
    ages.seed(live, 99.0)  # recovered from a snapshot: every live pointstamp born then, by nobody
    least: dict[Location, tuple[int, ...]] = {}
    for location, time in expected:  # all born at once: the least time first
        least[location] = min(time, least.get(location, time))
    assert ages.oldest_by_location() == {loc: (time, 99.0, None) for loc, time in least.items()}


def _counts(batches: list[tuple[float, str | None, list[tuple[Location, tuple[int, ...], int]]]]
            ) -> dict[tuple[Location, tuple[int, ...]], int]:
    counts: dict[tuple[Location, tuple[int, ...]], int] = {}
    for _, _, updates in batches:
        for location, time, delta in updates:
            counts[(location, time)] = counts.get((location, time), 0) + delta
    return counts


def _side_by_side(graph: Graph) -> tuple[LiveState, Publication, Tracker, Publication]:
    """The compiled engine's live state and publication of ``graph`` (publishing from its
    copy), and the reference tracker and its publication, both at version 0."""
    live = LiveState(CompiledTracker(graph))
    native = Publication(graph, 100, native=live.native, copy_at=live.frontier_copy_at)
    reference_tracker = Tracker(graph)
    reference = Publication(graph, 100)
    native.reset(live.tracker.frontiers, 0)
    reference.reset(reference_tracker.frontiers(), 0)
    return live, native, reference_tracker, reference


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_engine_writes_the_same_frontier_answers_as_python(data: st.DataObject) -> None:
    """Frontier answers and subscriber snapshots built by the compiled engine from its copy equal
    the Python ones (the reference engine's publication), version after version."""
    graph = data.draw(acyclic_graphs(arity=data.draw(st.integers(1, 2))))
    live, native, reference_tracker, reference = _side_by_side(graph)
    wanted = data.draw(st.sets(st.sampled_from(graph.locations())))
    node = data.draw(st.sampled_from([loc.node for loc in graph.locations()]))
    for version, batch in enumerate(data.draw(update_batches(graph)), start=1):
        live.version = version
        native.publish(version, live.native.apply(batch), notify=False)
        reference.publish(version, reference_tracker.apply(batch), notify=False)
        assert native.engine_rows and not reference.engine_rows
        assert native.frontier_json() == reference.frontier_json()
        write = native.frontier_writer()
        assert b"".join(write(native.row_indices())).decode() == reference.frontier_json()
        assert native.snapshot_json(native.select(wanted)) == reference.snapshot_json(reference.select(wanted))
        by_node = native.row_indices(lambda loc: loc.node == node)
        assert native.frontier_json(indices=by_node) == reference.frontier_json(lambda loc: loc.node == node)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_versions_prepared_in_a_lane_publish_what_folding_would(data: st.DataObject) -> None:
    """A version published with ``prepared`` (the engine's frontiers copied right after it was
    applied, its text made or left for later, as a lane does for a big batch) answers exactly
    as the reference: frontier, history text, rewinds and resumes."""
    graph = data.draw(acyclic_graphs(arity=data.draw(st.integers(1, 2))))
    live, native, reference_tracker, reference = _side_by_side(graph)
    for version, batch in enumerate(data.draw(update_batches(graph)), start=1):
        live.version = version
        changes = live.native.apply(batch)
        how = data.draw(st.sampled_from(["fold", "text", "no text"]))
        prepared = None if how == "fold" else (changes.to_json(compact=True) if how == "text" else None,
                                                live.native.frontier_copy())
        native.publish(version, changes, notify=False, prepared=prepared)
        reference.publish(version, reference_tracker.apply(batch), notify=False)
        assert native.frontier_json() == reference.frontier_json()
        assert native.changes_since(0) == reference.changes_since(0)
        back = data.draw(st.integers(0, version))
        assert ({loc: ts for loc, ts in native.frontier_at(back)[1].items() if ts}
                == {loc: ts for loc, ts in reference.frontier_at(back)[1].items() if ts})
