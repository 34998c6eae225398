"""``tracker jobs`` against a real standalone cluster (master + one worker), as a user runs it: a
subprocess per job, on the GraphX engine (the helper jar shipped to the executors). Results equal
the oracle (and, on random graphs with loops and nested scopes, the native engine); the driver
made no delta-rs call (the jobs run with ``TRACKER_DRIVER_DELTA_RS=forbid``), the worker ran
executors for every job, and the commits were made by Delta on Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from spark_jobs.storage import Warehouse
from tests.strategies import acyclic_graphs, nested_batches, nested_bodies, raw_graphs, update_batches
from tests.test_spark_cli import progress_rows
from tests.test_spark_jobs import chain
from tracker import oracle, scoped_oracle
from tracker.graph import Location
from tracker.reachability import Tracker
from tracker.scope import NestedGraph
from tracker.scoped import ScopedTracker
from tracker.structure import find_cycles, path_summaries

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent


def jobs(cluster: object, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRACKER_DRIVER_DELTA_RS": "forbid", "PYSPARK_PYTHON": sys.executable}
    return subprocess.run([sys.executable, "-m", "tracker.cli", "jobs", *args, "--master", cluster.url],  # type: ignore[attr-defined]
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def engines(table: Path) -> set[str]:
    """``engineInfo`` of every commit of a Delta table's log."""
    found = set()
    for log in sorted((table / "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if info:
                found.add(info.get("engineInfo", "?"))
    return found


def test_jobs_on_a_standalone_cluster(spark_cluster, tmp_path: Path) -> None:
    wh = Warehouse(tmp_path)  # the set-up side writes with delta-rs, as the service does
    graphs = {"a": chain(3, arity=2), "b": chain(5, arity=2)}
    for i, graph in graphs.items():
        wh.write_dataflow(i, "chain", graph)
    batches = {i: [[(Location.source(0, 0), (0, 0), 1)],
                   [(Location.source(0, 0), (0, 0), -1), (Location.source(0, 0), (1, 0), 1),
                    (Location.target(2, 0), (0, 2), 1)]] for i in graphs}
    for i, bs in batches.items():
        for version, batch in enumerate(bs):
            wh.append("progress", progress_rows(i, version, batch))
    before = set(spark_cluster.applications())
    common = ["--warehouse", str(tmp_path), "--dataflow", "a", "--dataflow", "b"]

    done = jobs(spark_cluster, "cycles", *common)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "a: no non-incrementing cycle" in done.stdout and "b: no non-incrementing cycle" in done.stdout
    done = jobs(spark_cluster, "summaries", *common)
    assert done.returncode == 0, done.stderr[-3000:]
    done = jobs(spark_cluster, "incremental", "--warehouse", str(tmp_path), "--all")
    assert done.returncode == 0, done.stderr[-3000:]
    wh.replace_partitions("frontiers", ["a", "b"], [])
    done = jobs(spark_cluster, "propagate", *common)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "graph engine: graphx" in done.stderr and "propagating (GraphX helper)" in done.stderr

    for i, graph in graphs.items():
        assert wh.read_summaries(i) == path_summaries(graph) == oracle.path_summaries(graph)
        counts = oracle.accumulate(batches[i])
        assert wh.read_pointstamps(i) == counts
        assert wh.read_frontiers(i) == {loc: ts for loc, ts in oracle.frontiers(graph, counts).items() if ts}
        assert wh.pointstamps_version(i) == 1
    # Replaying frontier_changes from the start gives frontiers (they started empty here).
    changes = pl.read_delta(wh.path("frontier_changes"))
    assert changes.height > 0
    replay = (changes.group_by("dataflow_id", "scope", "node", "port", "kind", "time", maintain_order=True)
              .agg(pl.col("diff").sum()).filter(pl.col("diff") != 0))
    assert replay["diff"].to_list() == [1] * replay.height
    assert sorted(map(str, replay.drop("diff").to_dicts())) == sorted(
        map(str, pl.read_delta(wh.path("frontiers")).drop("since").to_dicts()))  # a job knows no ages
    # Executors: the worker ran one application per job; the commits are Delta-on-Spark ones.
    assert len(set(spark_cluster.applications()) - before) == 4
    for table in ("summaries", "pointstamps", "frontiers", "frontier_changes"):
        assert any(e.startswith("Apache-Spark/") and "Delta-Lake/" in e for e in engines(Path(wh.path(table)))), table


@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_random_graphs_with_loops_and_nested_scopes_on_the_cluster(spark_cluster, tmp_path_factory,
                                                                   data: st.DataObject) -> None:
    """The cycle check, ``Psi`` and propagation as ``tracker jobs`` computes them on the cluster
    (GraphX for the flat dataflows; nested ones scope by scope) equal the native engine and the
    oracle, on random graphs with loops and nested dataflows: one example of a dozen flat and
    four nested dataflows (each job is one cluster application for all of them)."""
    root = tmp_path_factory.mktemp("cluster-random")
    wh = Warehouse(root)
    cyclic = {f"c{i}": data.draw(raw_graphs()) for i in range(6)}
    flat = {f"f{i}": data.draw(acyclic_graphs(loops=True)) for i in range(6)}
    nested = {}
    for i in range(4):
        arity, body = data.draw(nested_bodies(max_depth=3, max_nodes=3))
        nested[f"n{i}"] = NestedGraph.from_json(arity, body)
    wh.write_dataflows([(i, "random", g, datetime.now(UTC)) for i, g in {**cyclic, **flat, **nested}.items()])

    done = jobs(spark_cluster, "cycles", "--warehouse", str(root), *(a for i in cyclic for a in ("--dataflow", i)))
    assert done.returncode in (0, 1), done.stderr[-3000:]
    for i, graph in cyclic.items():
        expected = find_cycles(graph)
        assert set(expected) == oracle.cycle_transitions(graph)
        line = next(x for x in done.stdout.splitlines() if x.startswith(f"{i}: "))
        if expected:
            assert line == f"{i}: {len(expected)} transitions on non-incrementing cycles: " + ", ".join(
                map(str, expected)), (line, graph)
        else:
            assert line == f"{i}: no non-incrementing cycle", (line, graph)

    counts = {}
    for i, graph in flat.items():
        batches = data.draw(update_batches(graph, max_batches=4))
        counts[i] = oracle.accumulate(batches)
        wh.write_pointstamps(i, counts[i], as_of_version=len(batches))
    scoped_counts = {}
    for i, graph in nested.items():
        scoped_counts[i] = scoped_oracle.accumulate(data.draw(nested_batches(graph, max_batches=3)))
        wh.write_pointstamps(i, scoped_counts[i], as_of_version=1)
    def named(ids: Iterable[str]) -> list[str]:
        return ["--warehouse", str(root), *(a for i in ids for a in ("--dataflow", i))]

    done = jobs(spark_cluster, "summaries", *named([*flat, *nested]))
    assert done.returncode == 0, done.stderr[-3000:]
    done = jobs(spark_cluster, "propagate", *named(flat))  # on GraphX: nested dataflows go through Psi
    assert done.returncode == 0 and "propagating (GraphX helper)" in done.stderr, done.stderr[-3000:]
    done = jobs(spark_cluster, "propagate", *named(nested))
    assert done.returncode == 0, done.stderr[-3000:]

    for i, graph in flat.items():
        assert wh.read_summaries(i) == path_summaries(graph) == oracle.path_summaries(graph), graph
        tracker = Tracker(graph)
        tracker.apply([(loc, t, c) for (loc, t), c in counts[i].items()])
        native = {loc: sorted(ts) for loc, ts in tracker.frontiers().items() if ts}
        expected = {loc: sorted(ts) for loc, ts in oracle.frontiers(graph, counts[i]).items() if ts}
        assert {loc: sorted(ts) for loc, ts in wh.read_frontiers(i).items()} == native == expected, graph
    for i, graph in nested.items():
        assert wh.read_scoped_summaries(i) == {p: path_summaries(s.graph) for p, s in graph.scopes.items()}
        scoped = ScopedTracker(graph)
        scoped.apply([(loc, t, c) for (loc, t), c in scoped_counts[i].items()])
        native = {loc: sorted(ts) for loc, ts in scoped.frontiers().items() if ts}
        expected = {loc: sorted(ts) for loc, ts in scoped_oracle.frontiers(graph, scoped_counts[i]).items() if ts}
        assert {loc: sorted(ts) for loc, ts in wh.read_frontiers(i, scoped=True).items()} == native == expected, i
