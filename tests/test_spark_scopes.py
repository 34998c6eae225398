"""The Spark jobs over nested dataflows, read from the Delta tables: ``summaries``, ``propagate``,
``incremental`` and ``cycles`` per scope, against the native scoped engine
(:class:`tracker.scoped.ScopedTracker`, the bottom-up scope summaries of
:class:`tracker.scope.NestedGraph`) and the flattened oracle (:mod:`tracker.scoped_oracle`).
Each hypothesis example packs a dozen random nested dataflows into one warehouse and one run of
each job, so two examples cover two dozen dataflows."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from spark_jobs.jobs import cycles_job, incremental_job, propagate_job, summaries_job
from spark_jobs.storage import Warehouse
from tests.strategies import nested_batches, nested_bodies
from tracker import scoped_oracle
from tracker.graph import Location, Transition
from tracker.scope import NestedGraph, ScopedLocation
from tracker.scoped import ScopedTracker
from tracker.structure import path_summaries

pytestmark = pytest.mark.spark
# No shrinking: each example is a dozen dataflows through four Spark jobs, and a failure's
# example (all of its dataflows' graphs and batches) is printed whole anyway.
SPARK = settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck),
                 phases=[Phase.explicit, Phase.reuse, Phase.generate])
PER_EXAMPLE = 12


def _progress_rows(dataflow_id: str, version: int, batch: list[tuple[ScopedLocation, tuple[int, ...], int]]
                   ) -> list[dict[str, Any]]:
    return [{"dataflow_id": dataflow_id, "version": version, "worker": "w", "seq": version, "scope": list(loc.scope),
             "node": loc.node, "port": loc.port, "kind": loc.kind, "time": list(t), "delta": d}
            for loc, t, d in batch]


def _held(frontiers: dict[ScopedLocation, list[tuple[int, ...]]]) -> dict[ScopedLocation, list[tuple[int, ...]]]:
    return {loc: sorted(ts) for loc, ts in frontiers.items() if ts}


@SPARK
@given(data=st.data())
def test_jobs_over_nested_dataflows_equal_the_native_engine_and_the_oracle(
        spark: Any, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    graphs: dict[str, NestedGraph] = {}
    batches: dict[str, list[list[tuple[ScopedLocation, tuple[int, ...], int]]]] = {}
    for i in range(PER_EXAMPLE):
        arity, body = data.draw(nested_bodies(max_depth=3, max_nodes=3))
        graphs[f"n{i}"] = nested = NestedGraph.from_json(arity, body)
        batches[f"n{i}"] = data.draw(nested_batches(nested, max_batches=4))
    ids = sorted(graphs)
    root = tmp_path_factory.mktemp("nested")
    tables = Warehouse(root)  # written and read back by delta-rs; the jobs read through Spark
    tables.write_dataflows([(i, "random", g, datetime.now(UTC)) for i, g in graphs.items()])
    wh = Warehouse(root, spark, backend="delta-rs")

    # summaries: Psi within every scope, and every nested scope's summary as an operator.
    _, operators = summaries_job(wh, ids)
    for i, nested in graphs.items():
        assert tables.read_scoped_summaries(i) == {p: path_summaries(s.graph) for p, s in nested.scopes.items()}
    found: dict[str, dict[tuple[int, ...], dict[tuple[int, int], list[tuple[int, ...]]]]] = {
        i: {p: {} for p in g.scopes if p} for i, g in graphs.items()}
    for r in operators.toArrow().to_pylist():
        found[r["dataflow_id"]][(*r["scope"], r["node"])].setdefault(
            (r["input_port"], r["output_port"]), []).append(tuple(r["summary"]))
    for i, nested in graphs.items():
        got = {p: {k: sorted(v) for k, v in s.items()} for p, s in found[i].items()}
        native = {p: {k: sorted(tuple(x) for x in v) for k, v in s.items()} for p, s in nested.scope_summaries.items()}
        assert got == native == scoped_oracle.scope_summaries(nested), i

    # propagate: the counts after the first batch, from `pointstamps`.
    trackers = {i: ScopedTracker(g) for i, g in graphs.items()}
    for i, tracker in trackers.items():
        if batches[i]:
            tracker.apply(batches[i][0])
            tables.write_pointstamps(i, scoped_oracle.accumulate(batches[i][:1]), as_of_version=1)
    propagate_job(wh, ids)
    before = {i: tables.read_frontiers(i, scoped=True) for i in ids}
    for i, tracker in trackers.items():
        expected = _held(scoped_oracle.frontiers(graphs[i], scoped_oracle.accumulate(batches[i][:1])))
        assert before[i] == _held(tracker.frontiers()) == expected, i

    # incremental: the other batches from `progress`, folded into one batch per dataflow.
    rows = [row for i in ids for v, batch in enumerate(batches[i][1:], start=2) for row in _progress_rows(i, v, batch)]
    if rows:
        tables.append("progress", rows)
    incremental_job(wh, ids)
    changes = pl.read_delta(str(root / "frontier_changes")) if tables.exists("frontier_changes") else None
    for i, tracker in trackers.items():
        for batch in batches[i][1:]:
            tracker.apply(batch)
        after = tables.read_frontiers(i, scoped=True)
        assert after == _held(tracker.frontiers()) == _held(
            scoped_oracle.frontiers(graphs[i], scoped_oracle.accumulate(batches[i]))), i
        entered = {(loc, t, 1) for loc, ts in after.items() for t in ts if t not in before[i].get(loc, [])}
        left = {(loc, t, -1) for loc, ts in before[i].items() for t in ts if t not in after.get(loc, [])}
        appended = set() if changes is None else {
            (ScopedLocation(tuple(r["scope"]), r["node"], r["port"], r["kind"]), tuple(r["time"]), r["diff"])
            for r in changes.filter(pl.col("dataflow_id") == i).iter_rows(named=True)}
        assert appended == entered | left, i


def _rows(dataflow_id: str, scopes: dict[tuple[int, ...], tuple[str, list[tuple[int, int, int, bool]],
                                                                 list[tuple[int, int, int, int]]]]
          ) -> dict[str, list[dict[str, Any]]]:
    """Graph table rows written by hand (a refused graph cannot be built as a NestedGraph):
    ``scope -> (kind, [(node, inputs, outputs, is_scope)], [(src, port, dst, port)])``, every
    operator with zero connections from each input to each output."""
    out: dict[str, list[dict[str, Any]]] = {"scopes": [], "nodes": [], "connections": [], "edges": []}
    for path, (kind, nodes, edges) in scopes.items():
        scope = {"dataflow_id": dataflow_id, "scope": list(path)}
        out["scopes"].append({**scope, "kind": kind, "arity": 1})
        for node, inputs, outputs, is_scope in nodes:
            out["nodes"].append({**scope, "node": node, "name": "", "inputs": inputs, "outputs": outputs,
                                 "is_scope": is_scope})
            if not is_scope and not (path and node == 0):
                out["connections"] += [{**scope, "node": node, "input_port": i, "output_port": o, "summary": [0]}
                                       for i in range(inputs) for o in range(outputs)]
        out["edges"] += [{**scope, "src_node": a, "src_port": p, "dst_node": b, "dst_port": q} for a, p, b, q in edges]
    return out


def test_cycles_are_found_per_scope_with_scope_nodes_carrying_their_summaries(spark: Any, tmp_path: Path) -> None:
    # Root: input 0 -> region 1 (two inputs, passing both to its output) whose output feeds its
    # own second input: a zero cycle through the scope's summary. Inside the region, operator 2
    # feeds itself: a zero cycle of the region.
    bad = _rows("bad", {
        (): ("root", [(0, 0, 1, False), (1, 2, 1, True)], [(0, 0, 1, 0), (1, 0, 1, 1)]),
        (1,): ("region", [(0, 1, 2, False), (1, 2, 1, False), (2, 1, 1, False)],
               [(0, 0, 1, 0), (0, 1, 1, 1), (1, 0, 0, 0), (2, 0, 2, 0)]),
    })
    wh = Warehouse(tmp_path)
    for table, rows in bad.items():
        wh.append(table, rows)
    good = NestedGraph.from_json(1, {"nodes": [
        {"id": 0, "inputs": 0, "outputs": 1},
        {"id": 1, "inputs": 1, "outputs": 1, "scope": {"kind": "iterative", "nodes": [
            {"id": 1, "inputs": 1, "outputs": 1, "connections": [{"input": 0, "output": 0, "summaries": [[0, 1]]}]}],
            "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}},
                      {"source": {"node": 1, "port": 0}, "target": {"node": 0, "port": 0}}]}}],
        "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}}]})
    wh.write_dataflow("good", "good", good)
    wh.append("dataflows", [{"dataflow_id": "bad", "name": "bad", "timestamp_arity": 1, "graph_version": 1}])
    found = cycles_job(Warehouse(tmp_path, spark, backend="delta-rs"), ["bad", "good"])
    zero = (0,)
    assert found["good"] == []
    assert found["bad"] == [
        ((), Transition(Location.source(1, 0), Location.target(1, 1), zero)),
        ((), Transition(Location.target(1, 1), Location.source(1, 0), zero)),
        ((1,), Transition(Location.source(2, 0), Location.target(2, 0), zero)),
        ((1,), Transition(Location.target(2, 0), Location.source(2, 0), zero)),
    ]
