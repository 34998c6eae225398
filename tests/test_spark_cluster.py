"""``tracker jobs`` against a real standalone cluster (master + one worker), as a user runs it: a
subprocess per job, on the GraphX engine (the helper jar shipped to the executors). Results equal
the oracle; the driver made no delta-rs call (the jobs run with
``TRACKER_DRIVER_DELTA_RS=forbid``), the worker ran executors for every job, and the commits
were made by Delta on Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from spark_jobs.storage import Warehouse
from tests.test_spark_cli import progress_rows
from tests.test_spark_jobs import chain
from tracker import oracle
from tracker.graph import Location
from tracker.structure import path_summaries

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
        map(str, pl.read_delta(wh.path("frontiers")).to_dicts()))
    # Executors: the worker ran one application per job; the commits are Delta-on-Spark ones.
    assert len(set(spark_cluster.applications()) - before) == 4
    for table in ("summaries", "pointstamps", "frontiers", "frontier_changes"):
        assert any(e.startswith("Apache-Spark/") and "Delta-Lake/" in e for e in engines(Path(wh.path(table)))), table
