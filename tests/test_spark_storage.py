"""Delta storage: layout and types of DESIGN section 4, atomic commits, time travel, read back by
independent readers (polars, and delta-rs directly), and the Spark read path."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction

from spark_jobs.frames import transitions_from_tables
from spark_jobs.storage import TABLES, UnknownDataflowError, Warehouse
from tracker.graph import Connection, Edge, Graph, Location, Node
from tracker.structure import path_summaries
from tracker.timestamp import PathSummary


def loop_graph(arity: int = 2) -> Graph:
    """Input 0 -> op 1 (two inputs) -> feedback 2 (+1 on the last coordinate) -> back into op 1."""
    step = PathSummary((0,) * (arity - 1) + (1,))
    return Graph.build(
        arity,
        [
            Node(0, 0, 1, "input"),
            Node(1, 2, 1, "body"),
            Node(2, 1, 2, "feedback", (Connection(0, 0, (step,)), Connection(0, 1, (step, step)))),
        ],
        [
            Edge(Location.source(0, 0), Location.target(1, 0)),
            Edge(Location.source(1, 0), Location.target(2, 0)),
            Edge(Location.source(2, 0), Location.target(1, 1)),
        ],
    )


def test_schemas_follow_the_design_contract(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path)
    wh.write_dataflow("df-1", "loop", loop_graph())
    expected_columns = {
        "dataflows": ["dataflow_id", "name", "timestamp_arity", "graph_version", "created_at", "deleted_at"],
        "scopes": ["dataflow_id", "scope", "kind", "arity"],
        "nodes": ["dataflow_id", "scope", "node", "name", "inputs", "outputs", "is_scope"],
        "connections": ["dataflow_id", "scope", "node", "input_port", "output_port", "summary"],
        "edges": ["dataflow_id", "scope", "src_node", "src_port", "dst_node", "dst_port"],
        "summaries": ["dataflow_id", "scope", "from_node", "from_port", "from_kind", "to_node", "to_port", "to_kind",
                      "summary"],
        "progress": ["dataflow_id", "version", "worker", "seq", "scope", "node", "port", "kind", "time", "delta",
                     "received_at"],
        "pointstamps": ["dataflow_id", "scope", "node", "port", "kind", "time", "count", "born_at", "worker"],
        "frontiers": ["dataflow_id", "scope", "node", "port", "kind", "time", "since"],
        "frontier_changes": ["dataflow_id", "version", "scope", "node", "port", "kind", "time", "diff", "at"],
        "operator_stats": ["dataflow_id", "worker", "at", "seconds", "scope", "node", "busy_ns", "schedules"],
        "channel_stats": ["dataflow_id", "worker", "at", "seconds", "scope", "src_node", "src_port", "dst_node",
                          "dst_port", "messages", "records"],
    }
    assert {name: schema.names for name, schema in TABLES.items()} == expected_columns
    assert TABLES["connections"].field("summary").type == pa.list_(pa.int64())
    assert TABLES["frontier_changes"].field("at").type == pa.timestamp("us", tz="UTC")
    assert TABLES["frontiers"].field("scope").type == pa.list_(pa.int32())
    for table in ("dataflows", "scopes", "nodes", "connections", "edges"):
        delta = DeltaTable(wh.path(table))
        assert delta.metadata().partition_columns == ["dataflow_id"], table
    stored = pl.read_delta(wh.path("connections")).schema
    assert stored["summary"] == pl.List(pl.Int64) and stored["node"] == pl.Int32 and stored["dataflow_id"] == pl.String
    assert stored["scope"] == pl.List(pl.Int32)
    # A flat dataflow: one root scope, every row in scope [].
    assert pl.read_delta(wh.path("scopes")).select("scope", "kind", "arity").to_dicts() == [
        {"scope": [], "kind": "root", "arity": 2}]
    assert {tuple(s) for s in pl.read_delta(wh.path("nodes"))["scope"].to_list()} == {()}


def test_graph_round_trip_and_independent_reader(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path)
    graph = loop_graph()
    wh.write_dataflow("df-1", "loop", graph)
    wh.write_dataflow("df-2", "other", loop_graph(1))
    assert wh.dataflow_ids() == ["df-1", "df-2"]
    assert sorted(wh.read_graph("df-1").transitions()) == sorted(graph.transitions())
    # Row for row, through polars (an independent Delta reader): every summary is one row.
    conns = pl.read_delta(wh.path("connections")).filter(pl.col("dataflow_id") == "df-1").sort("node", "output_port")
    expected = sorted(
        (n.id, c.input, c.output, list(s)) for n in graph.nodes for c in graph.connections(n) for s in c.summaries
    )
    got = sorted((r["node"], r["input_port"], r["output_port"], r["summary"]) for r in conns.to_dicts())
    assert got == expected
    edges = pl.read_delta(wh.path("edges")).filter(pl.col("dataflow_id") == "df-1")
    assert sorted(tuple(r.values())[2:] for r in edges.to_dicts()) == sorted(
        (e.source.node, e.source.port, e.target.node, e.target.port) for e in graph.edges
    )
    with pytest.raises(UnknownDataflowError):
        wh.read_graph("nope")


def test_commits_are_versions_and_time_travel_works(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path)
    row = {"dataflow_id": "a", "scope": [], "node": 1, "port": 0, "kind": "target", "time": [3], "since": None}
    assert wh.append("frontiers", [row]) == 0
    assert wh.append("frontiers", [{**row, "dataflow_id": "b", "time": [9]}]) == 1
    assert wh.replace_partition("frontiers", "a", [{**row, "time": [4]}, {**row, "port": 1, "time": [5]}]) == 2
    assert wh.replace_partition("frontiers", "b", []) == 3
    assert sorted(map(str, wh.read("frontiers").to_pylist())) == sorted(
        map(str, [{**row, "time": [4]}, {**row, "port": 1, "time": [5]}])
    )
    # Time travel, checked with delta-rs opened independently at each version.
    for version, expected in [(0, {("a", 3)}), (1, {("a", 3), ("b", 9)}), (2, {("a", 4), ("a", 5), ("b", 9)})]:
        ours = {(r["dataflow_id"], r["time"][0]) for r in wh.read("frontiers", version=version).to_pylist()}
        theirs = {
            (r["dataflow_id"], r["time"][0])
            for r in DeltaTable(wh.path("frontiers"), version=version).to_pyarrow_table().to_pylist()
        }
        assert ours == theirs == expected
    assert wh.read("frontiers", "b").num_rows == 0
    with pytest.raises(ValueError):
        wh.replace_partition("frontiers", "a", [{**row, "dataflow_id": "b"}])
    with pytest.raises(ValueError):
        wh.append("no_such_table", [])


def test_summaries_pointstamps_frontiers_round_trip(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path)
    graph = loop_graph()
    psi = path_summaries(graph)
    wh.write_summaries("df", psi)
    assert wh.read_summaries("df") == psi
    counts = {(Location.source(0, 0), (0, 0)): 2, (Location.target(1, 1), (1, 3)): -1}
    wh.write_pointstamps("df", counts)
    assert wh.read_pointstamps("df") == counts
    wh.write_frontiers("df", {Location.target(1, 0): [(0, 1), (1, 0)]})
    assert wh.read_frontiers("df") == {Location.target(1, 0): [(0, 1), (1, 0)]}
    polars_rows = pl.read_delta(wh.path("pointstamps")).sort("count").to_dicts()
    assert [(r["node"], r["kind"], r["time"], r["count"]) for r in polars_rows] == [
        (1, "target", [1, 3], -1),
        (0, "source", [0, 0], 2),
    ]


@pytest.mark.spark
def test_spark_reads_and_writes_the_same_tables(spark, tmp_path: Path) -> None:
    wh = Warehouse(tmp_path, spark)
    assert wh.backend in ("delta-rs", "delta-spark")
    graph = loop_graph()
    wh.write_dataflow("df", "loop", graph)
    df = wh.spark_read("edges", "df")
    assert df.count() == len(graph.edges)
    transitions = transitions_from_tables(
        wh.spark_read("dataflows"), wh.spark_read("connections"), wh.spark_read("edges")
    )
    assert transitions.count() == len(graph.transitions())
    empty = wh.spark_read("frontier_changes")
    assert empty.count() == 0 and empty.columns == TABLES["frontier_changes"].names
    version = wh.spark_write(
        "frontiers",
        spark.createDataFrame(
            [("df", 1, 0, "target", [7, 1])], "dataflow_id string, node int, port int, kind string, time array<bigint>"
        ),
        "df",
    )
    assert version == 0
    assert pl.read_delta(wh.path("frontiers")).to_dicts() == [
        {"dataflow_id": "df", "scope": [], "node": 1, "port": 0, "kind": "target", "time": [7, 1], "since": None}
    ]  # a frame without `scope` is the root's (and without `since`, when its frontier moved is unknown)
    assert wh.spark_read("frontiers", version=0).collect()[0]["time"] == [7, 1]


BACKENDS = ["delta-spark", "delta-rs"]


def _rows(path: str) -> list[str]:
    return sorted(map(str, pl.read_delta(path).drop(["created_at", "received_at", "at"], strict=False).to_dicts()))


@pytest.mark.spark
@pytest.mark.parametrize("writer", BACKENDS)
def test_each_backend_reads_what_the_other_wrote(spark, tmp_path: Path, writer: str) -> None:
    """Tables written by delta-spark or by delta-rs are read back, row for row, by the other
    backend and by Polars, and each commits to the tables the other created; the watermarks of a
    multi-dataflow commit too."""
    from spark_jobs.session import has_delta_jvm

    assert has_delta_jvm(spark), "the set-up fetches delta-spark: `python -m spark_jobs.jars`"
    reader = "delta-rs" if writer == "delta-spark" else "delta-spark"
    wh = Warehouse(tmp_path, spark, backend=writer)  # type: ignore[arg-type]
    other = Warehouse(tmp_path, spark, backend=reader)  # type: ignore[arg-type]
    assert (wh.backend, other.backend) == (writer, reader)
    graph = loop_graph()
    wh.write_dataflows([("a", "loop", graph, datetime.now(UTC)),
                        ("b", "one", loop_graph(1), datetime.now(UTC))])
    assert sorted(other.read_graph("a").transitions()) == sorted(graph.transitions())
    assert other.dataflow_ids() == ["a", "b"]
    counts = {"a": {(Location.source(0, 0), (0, 0)): 2}, "b": {(Location.target(1, 0), (3,)): 1}}
    version, _ = wh.write_states({i: (7 + n, c, {Location.target(1, 0): [(0, 0)]} if i == "a" else None)
                                  for n, (i, c) in enumerate(counts.items())})
    for reading in (wh, other):
        assert reading.version("pointstamps") == version
        assert reading.pointstamps_version("a") == 7 and reading.pointstamps_version("b") == 8
        assert reading.read_pointstamps("a") == counts["a"] and reading.read_pointstamps("b") == counts["b"]
        assert reading.read_frontiers("a") == {Location.target(1, 0): [(0, 0)]}
    psi = path_summaries(graph)
    wh.write_summaries("a", psi)
    assert other.read_summaries("a") == psi
    assert pl.read_delta(wh.path("summaries")).height == sum(len(c) for c in psi.values())
    # A replace of one dataflow leaves the other's rows and watermark alone.
    wh.write_pointstamps("b", {}, as_of_version=9)
    assert other.read_pointstamps("b") == {} and other.read_pointstamps("a") == counts["a"]
    assert other.pointstamps_version("a") == 7 and other.pointstamps_version("b") == 9
    # Time travel reads the same past from either side.
    assert other.read_pointstamps("b", version) == counts["b"]
    # Each commits to the tables the other created (a warehouse used from a cluster, then locally).
    other.write_pointstamps("a", {}, as_of_version=10)
    assert wh.read_pointstamps("a") == {} and wh.pointstamps_version("a") == 10 and wh.pointstamps_version("b") == 9
    # The same writes through the other backend give the same rows.
    again = Warehouse(tmp_path / "again", spark, backend=reader)  # type: ignore[arg-type]
    again.write_dataflows([("a", "loop", graph, datetime.now(UTC)),
                           ("b", "one", loop_graph(1), datetime.now(UTC))])
    for table in ("dataflows", "nodes", "connections", "edges"):
        assert _rows(wh.path(table)) == _rows(again.path(table)), table


@pytest.mark.spark
def test_delta_spark_warehouse_never_calls_delta_rs(spark, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRACKER_DRIVER_DELTA_RS", "forbid")
    wh = Warehouse(tmp_path, spark)
    assert wh.backend == "delta-spark"
    wh.write_dataflow("df", "loop", loop_graph())
    assert wh.read_graph("df").arity == 2 and wh.version("edges") == 0
    with pytest.raises(RuntimeError, match="forbid"):
        wh._open(wh.path("edges"))


def test_a_warehouse_of_the_layout_before_scopes_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    import argparse

    from deltalake import write_deltalake

    from spark_jobs.cli import run_job
    from spark_jobs.storage import LegacyWarehouseError

    wh = Warehouse(tmp_path)
    wh.write_dataflow("df", "loop", loop_graph())
    # `frontiers` as the previous layout wrote it: no `scope` column.
    old = pa.table({"dataflow_id": ["df"], "node": pa.array([1], pa.int32()), "port": pa.array([0], pa.int32()),
                    "kind": ["target"], "time": pa.array([[3]], pa.list_(pa.int64()))})
    write_deltalake(wh.path("frontiers"), old, partition_by=["dataflow_id"])
    with pytest.raises(LegacyWarehouseError, match=r"table 'frontiers' .*no column scope"):
        wh.check_layout()
    args = argparse.Namespace(job="propagate", warehouse=str(tmp_path), dataflow=["df"], all=False, master=None)
    assert run_job(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no column scope" in err and "Traceback" not in err
    assert DeltaTable(wh.path("frontiers")).version() == 0  # nothing written


def test_tables_written_before_the_ages_are_upgraded_in_place_and_read_as_unknown(tmp_path: Path) -> None:
    """``pointstamps`` and ``frontiers`` written before they kept ages (``born_at``, ``worker``,
    ``since``) gain those columns at the next start, null in their old rows; recovery's reader
    takes the old rows as ages unknown and the new ones as written."""
    from deltalake import write_deltalake

    from api.delta.store import Store
    from spark_jobs.storage import POINTSTAMPS_APP
    from spark_jobs.tables import ADDED_COLUMNS

    wh = Warehouse(tmp_path)
    counts = {(Location.source(0, 0), (3,)): 1}
    wh.write_states({"old": (2, counts, {Location.target(1, 0): [(3,)]})})
    for table in ("pointstamps", "frontiers"):  # as the previous release wrote them: without the ages
        rows = DeltaTable(wh.path(table)).to_pyarrow_table().drop_columns(list(ADDED_COLUMNS[table]))
        write_deltalake(wh.path(table), rows, mode="overwrite", schema_mode="overwrite", partition_by=["dataflow_id"],
                        commit_properties=CommitProperties(app_transactions=[Transaction(POINTSTAMPS_APP + "old", 2)])
                        if table == "pointstamps" else None)
    assert "born_at" not in (wh.stored_columns("pointstamps") or [])
    wh.check_layout()
    assert {"born_at", "worker"} <= set(wh.stored_columns("pointstamps") or [])
    assert "since" in (wh.stored_columns("frontiers") or [])
    wh.write_states({"new": (5, counts, {Location.target(1, 0): [(3,)]})},
                    {"new": ({(Location.source(0, 0), (3,)): (100.5, "w1")}, {Location.target(1, 0): 99.25})})
    store = Store(tmp_path)
    survey = store.survey(["old", "new"])
    assert survey.snapshots == {"old": (2, counts), "new": (5, counts)}
    assert survey.births == {"new": {(Location.source(0, 0), (3,)): (100.5, "w1")}}
    assert survey.since == {"new": {Location.target(1, 0): 99.25}}
    assert survey.problems == {}
