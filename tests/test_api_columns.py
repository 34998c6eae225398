"""The Delta rows built by Arrow from JSON (api.delta.columns) equal the rows built from Python objects."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from api.delta.columns import Places, RawBatch, changes_table, progress_table
from api.delta.store import Store, _progress_rows
from api.schema.parsing import parse_progress
from api.streams.encoding import changes_json
from tests.helpers import core_graph, loop_graph
from tracker.compiled import CompiledTracker
from tracker.reachability import FrontierChange

GRAPH, _ = core_graph(loop_graph(operators=4, arity=2))
LOCATIONS = GRAPH.locations()
SORT = ["version", "node", "port", "kind", "time", "delta"]


def _update(draw: st.DrawFn) -> dict[str, Any]:
    loc = draw(st.sampled_from(LOCATIONS))
    time = draw(st.lists(st.integers(0, 2**62 - 1), min_size=2, max_size=2))
    delta = draw(st.integers(-(2**31 - 1), 2**31 - 1))
    return {"location": {"node": loc.node, "port": loc.port, "kind": loc.kind}, "time": time, "delta": delta}


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A valid progress body, in any of the spellings a client may use (key order, whitespace)."""
    body = {"worker": draw(st.sampled_from(["w", "wörker", 'a "quoted"\nname'])), "seq": draw(st.integers(0, 9)),
            "updates": [_update(draw) for _ in range(draw(st.integers(1, 6)))]}
    order = draw(st.permutations(list(body)))
    indent = draw(st.sampled_from([None, 2]))
    return json.dumps({k: body[k] for k in order}, indent=indent, ensure_ascii=draw(st.booleans())).encode()


def _sorted(table: Any) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    return frame.with_columns(pl.col("time").cast(pl.List(pl.Int64)).list.eval(pl.element().cast(pl.String))
                              .list.join(",")).sort(SORT)


@settings(max_examples=60, deadline=None)
@given(st.lists(bodies(), min_size=1, max_size=5))
def test_progress_rows_from_arrow_equal_rows_from_the_parser(raw_bodies: list[bytes]) -> None:
    items, decoded = [], []
    for version, raw in enumerate(raw_bodies, start=1):
        worker, seq, updates = parse_progress(raw, GRAPH)
        items.append(("df", version, worker, seq, RawBatch(raw, len(updates)), 1_700_000_000.0 + version))
        decoded.append(("df", GRAPH, version, worker, seq, updates, 1_700_000_000.0 + version))
    from_arrow = progress_table(items)
    assert from_arrow is not None
    assert from_arrow.schema == _progress_rows(decoded).schema
    assert _sorted(from_arrow).equals(_sorted(_progress_rows(decoded)))


def test_a_body_arrow_reads_differently_falls_back_to_the_parser(tmp_path: Path) -> None:
    # msgspec (the parser) takes the last of duplicate keys, Arrow refuses them: the rows must be
    # what the tracker applied, so the store re-parses such a body in Python.
    raw = (b'{"worker":"w","seq":0,"updates":[{"location":{"node":1,"port":0,"kind":"target"},'
           b'"time":[3,1],"delta":1,"delta":5}]}')
    worker, seq, updates = parse_progress(raw, GRAPH)
    assert updates[0][2] == 5
    assert progress_table([("df", 1, worker, seq, RawBatch(raw, 1), 0.0)]) is None
    store = Store(tmp_path / "warehouse")
    store.append_progress([("df", GRAPH, 1, worker, seq, RawBatch(raw, 1), 0.0),
                           ("df", GRAPH, 2, "v", 0, [], 0.0)])
    # Read back by an independent reader (delta-rs through polars), not through the store.
    rows = pl.read_delta(str(tmp_path / "warehouse" / "progress")).sort("version").to_dicts()
    assert [(r["version"], r["node"], r["time"], r["delta"]) for r in rows] == [(1, 1, [3, 1], 5), (2, 0, [0, 0], 0)]


def test_change_rows_from_arrow_equal_the_changes() -> None:
    rng = random.Random(7)
    items, expected = [], []
    for version in range(1, 30):
        changes = [FrontierChange(rng.choice(LOCATIONS), (rng.randrange(2**62), rng.randrange(5)), rng.choice([1, -1]))
                   for _ in range(rng.randrange(1, 8))]
        items.append(("df", version, changes_json(changes), 0.0))
        expected += [(version, c.location.node, c.location.port, c.location.kind, list(c.time), c.diff)
                     for c in changes]
    table = changes_table(items)
    got = [(r["version"], r["node"], r["port"], r["kind"], r["time"], r["diff"]) for r in table.to_pylist()]
    assert sorted(got) == sorted(expected)


def _engine_changes(arity: int, operators: int, rng: random.Random, versions: int) -> tuple[Any, list[Any]]:
    """A compiled engine over a ring and the change batches of ``versions`` random batches."""
    graph, _ = core_graph(loop_graph(operators=operators, arity=arity))
    tracker = CompiledTracker(graph)
    sources = [loc for loc in tracker.locations if loc.kind == "source"]
    held: list[tuple[int, tuple[int, ...]]] = []
    batches = []
    for _ in range(versions):
        updates = []
        for _ in range(rng.randint(1, 4)):
            if held and rng.random() < 0.4:
                index, time = held.pop(rng.randrange(len(held)))
                updates.append((index, time, -1))
            else:
                index, time = rng.randrange(len(sources)), tuple(rng.randrange(6) for _ in range(arity))
                held.append((index, time))
                updates.append((index, time, 1))
        batches.append(tracker.engine.apply([(sources[i], t, d) for i, t, d in updates]))
    return tracker, batches


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.tuples(st.integers(1, 3), st.integers(1, 5)), min_size=1, max_size=4))
def test_change_rows_from_the_compiled_engine_equal_the_rows_of_its_json(seed: int, dataflows: list[tuple[int, int]]
                                                                       ) -> None:
    # Several dataflows (arities 1-3) in one flush, their items interleaved: the rows built from
    # the engine's buffers are the rows Arrow reads from the same changes' JSON.
    rng = random.Random(seed)
    native: list[Any] = []
    encoded: list[Any] = []
    for number, (arity, operators) in enumerate(dataflows):
        tracker, batches = _engine_changes(arity, operators, rng, rng.randint(1, 6))
        places = Places.of(tracker.locations)
        for version, batch in enumerate(batches, start=1):
            native.append((f"df{number}", version, (batch, places), 1_700_000_000.0 + version))
            encoded.append((f"df{number}", version, batch.to_json(None, compact=True), 1_700_000_000.0 + version))
    order = list(range(len(native)))
    rng.shuffle(order)
    from_engine = changes_table([native[i] for i in order])
    from_json = changes_table(encoded)
    assert from_engine.schema == from_json.schema
    key = ["dataflow_id", "version", "node", "port", "kind", "time", "diff"]
    assert _rows(from_engine, key) == _rows(from_json, key)
    mixed = changes_table([native[0], encoded[-1]])  # both kinds in one flush
    assert mixed.num_rows == len(native[0][2][0]) + len(json.loads(encoded[-1][2]))


def _rows(table: Any, key: list[str]) -> list[tuple[Any, ...]]:
    return sorted(tuple(str(row[k]) for k in [*key, "scope", "at"]) for row in table.to_pylist())


def test_the_largest_time_goes_through_the_compiled_engine_buffers() -> None:
    tracker, _ = _engine_changes(1, 1, random.Random(1), 0)
    source = next(loc for loc in tracker.locations if loc.kind == "source")
    batch = tracker.engine.apply([(source, (2**63 - 1,), 1)])
    rows = changes_table([("df", 1, (batch, Places.of(tracker.locations)), 0.0)]).to_pylist()
    assert sorted((r["node"], r["kind"], r["time"], r["diff"], r["scope"]) for r in rows) == [
        (0, "source", [2**63 - 1], 1, []), (1, "target", [2**63 - 1], 1, [])]
