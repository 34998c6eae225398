"""``tracker jobs ...`` end to end over a real warehouse: results read back with delta-rs/polars
and compared with the native core; errors are clean; incremental runs never apply a batch twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from spark_jobs.ownership import WarehouseLock
from spark_jobs.storage import Warehouse
from tests.helpers import chain
from tracker import oracle
from tracker.cli import main
from tracker.graph import Edge, Graph, Location, Node
from tracker.reachability import Tracker
from tracker.structure import path_summaries

pytestmark = pytest.mark.spark


def progress_rows(dataflow_id: str, version: int, updates: list) -> list[dict]:
    return [
        {
            "dataflow_id": dataflow_id,
            "version": version,
            "worker": "w",
            "seq": version,
            "node": loc.node,
            "port": loc.port,
            "kind": loc.kind,
            "time": list(t),
            "delta": d,
        }
        for loc, t, d in updates
    ]


def test_unknown_dataflow_and_missing_warehouse_exit_2(tmp_path: Path, capsys) -> None:
    Warehouse(tmp_path).write_dataflow("known", "c", chain(2))
    assert main(["jobs", "cycles", "--warehouse", str(tmp_path), "--dataflow", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown dataflow nope" in err and "known" in err and "Traceback" not in err
    assert main(["jobs", "propagate", "--warehouse", str(tmp_path / "missing"), "--dataflow", "x"]) == 2
    assert main(["report", "--warehouse", str(tmp_path / "missing"), "--dataflow", "x"]) == 2
    assert not (tmp_path / "missing").exists(), "a report created the warehouse it was asked about"
    capsys.readouterr()
    held = WarehouseLock.acquire(tmp_path, "tracker serve on port 1234")
    try:
        for job in ("summaries", "propagate", "incremental"):
            assert main(["jobs", job, "--warehouse", str(tmp_path), "--dataflow", "known"]) == 2
            err = capsys.readouterr().err
            assert "tracker serve on port 1234" in err and "stop the service first" in err and "Traceback" not in err
    finally:
        held.release()


def test_a_refused_job_exits_2_while_its_jvm_is_still_starting(tmp_path: Path) -> None:
    """The console script, as a user runs it: the JVM starts on a thread while the warehouse is
    checked, and a refusal (here: the service holds the warehouse) returns during that start.
    The interpreter's teardown used to race it and abort (exit status -6, "terminate called
    without an active exception") now and then; the process must end with the refusal's 2."""
    Warehouse(tmp_path).write_dataflow("known", "c", chain(2))
    held = WarehouseLock.acquire(tmp_path, "tracker serve on port 1234")
    try:
        for _ in range(5):  # the old code aborted about once in 25 runs
            done = subprocess.run([sys.executable, "-m", "tracker.cli", "jobs", "propagate", "--warehouse",
                                   str(tmp_path), "--dataflow", "known"], capture_output=True, text=True, timeout=120)
            assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
            assert "stop the service first" in done.stderr and "Traceback" not in done.stderr
    finally:
        held.release()


def test_jobs_end_to_end(spark, tmp_path: Path, capsys) -> None:
    wh = Warehouse(tmp_path)
    graph = chain(3, arity=2)
    bad = Graph.build(1, [Node(0, 1, 1)], [Edge(Location.source(0, 0), Location.target(0, 0))])
    wh.write_dataflow("good", "chain", graph)
    wh.write_dataflow("bad", "zero loop", bad)
    args = ["--warehouse", str(tmp_path), "--master", "local[2]"]

    assert main(["jobs", "cycles", *args, "--dataflow", "good"]) == 0
    assert main(["jobs", "cycles", *args, "--dataflow", "bad"]) == 1
    out = capsys.readouterr()
    assert "2 transitions on non-incrementing cycles" in out.out and "iteration" in out.err

    assert main(["jobs", "summaries", *args, "--dataflow", "good"]) == 0
    assert wh.read_summaries("good") == path_summaries(graph)
    assert pl.read_delta(wh.path("summaries")).filter(pl.col("dataflow_id") == "good").height == sum(
        len(a) for a in path_summaries(graph).values()
    )

    batches = [
        [(Location.source(0, 0), (0, 0), 1)],
        [(Location.source(0, 0), (0, 0), -1), (Location.source(0, 0), (1, 0), 1)],
        [(Location.target(2, 0), (0, 2), 1)],
    ]
    for version, batch in enumerate(batches[:2]):
        wh.append("progress", progress_rows("good", version, batch))
    assert main(["jobs", "incremental", *args, "--dataflow", "good"]) == 0
    tracker = Tracker(graph)
    native = {(c.location, c.time, c.diff) for b in batches[:2] for c in tracker.apply(b)}
    changes = wh.read("frontier_changes", "good").to_pylist()
    assert {r["version"] for r in changes} == {1}
    got = {(Location(r["node"], r["port"], r["kind"]), tuple(r["time"]), r["diff"]) for r in changes}
    # One batch of two versions: the net change equals the native tracker's changes consolidated.
    net: dict = {}
    for loc, t, d in native:
        net[(loc, t)] = net.get((loc, t), 0) + d
    assert got == {(loc, t, d) for (loc, t), d in net.items() if d}
    assert main(["jobs", "incremental", *args, "--dataflow", "good"]) == 0  # nothing new: no double apply
    assert len(wh.read("frontier_changes", "good")) == len(changes)
    wh.append("progress", progress_rows("good", 2, batches[2]))
    assert main(["jobs", "incremental", *args, "--dataflow", "good"]) == 0
    later = {
        (Location(r["node"], r["port"], r["kind"]), tuple(r["time"]), r["diff"])
        for r in wh.read("frontier_changes", "good").to_pylist()
        if r["version"] == 2
    }
    assert later == {(c.location, c.time, c.diff) for c in tracker.apply(batches[2])}
    counts = oracle.accumulate(batches)
    assert wh.read_pointstamps("good") == counts
    expected = {loc: ts for loc, ts in oracle.frontiers(graph, counts).items() if ts}
    assert wh.read_frontiers("good") == expected

    # frontier_changes ahead of the watermark (the service appends changes before it writes
    # pointstamps, and crashed in between): those versions are folded in, not appended again.
    more = [[(Location.source(0, 0), (1, 0), -1), (Location.source(0, 0), (2, 0), 1)],
            [(Location.source(0, 0), (2, 0), -1), (Location.source(0, 0), (3, 0), 1)]]
    for version, batch in enumerate(more, start=3):
        wh.append("progress", progress_rows("good", version, batch))
    service_changes = tracker.apply(more[0])
    wh.append("frontier_changes", [{"dataflow_id": "good", "version": 3, "node": c.location.node,
                                    "port": c.location.port, "kind": c.location.kind, "time": list(c.time),
                                    "diff": c.diff} for c in service_changes])
    assert main(["jobs", "incremental", *args, "--dataflow", "good"]) == 0
    rows = wh.read("frontier_changes", "good").to_pylist()
    assert sorted((r["node"], r["kind"], r["time"], r["diff"]) for r in rows if r["version"] == 3) == sorted(
        (c.location.node, c.location.kind, list(c.time), c.diff) for c in service_changes)
    assert {(Location(r["node"], r["port"], r["kind"]), tuple(r["time"]), r["diff"]) for r in rows
            if r["version"] == 4} == {(c.location, c.time, c.diff) for c in tracker.apply(more[1])}
    counts = oracle.accumulate(batches + more)
    assert wh.read_pointstamps("good") == counts
    expected = {loc: ts for loc, ts in oracle.frontiers(graph, counts).items() if ts}
    assert wh.read_frontiers("good") == expected

    wh.replace_partition("frontiers", "good", [])
    assert main(["jobs", "propagate", *args, "--dataflow", "good"]) == 0
    assert wh.read_frontiers("good") == expected
    assert "frontiers:" in capsys.readouterr().out


def test_names_resolve_and_the_job_says_what_it_does(spark, tmp_path: Path, capsys, monkeypatch) -> None:
    """``--dataflow`` takes a name that one dataflow has; a name several have is one line
    listing them; the first lines say what happens before Spark is asked for anything."""
    wh = Warehouse(tmp_path)
    wh.write_dataflow("id-1", "twin", chain(2))
    wh.write_dataflow("id-2", "twin", chain(2))
    wh.write_dataflow("id-3", "single", chain(3))
    args = ["--warehouse", str(tmp_path), "--master", "local[2]"]
    assert main(["jobs", "cycles", *args, "--dataflow", "twin"]) == 2
    err = capsys.readouterr().err
    assert "2 dataflows are named 'twin' (id-1, id-2): give one id" in err and "Traceback" not in err
    assert main(["jobs", "cycles", *args, "--dataflow", "single"]) == 0
    out = capsys.readouterr()
    assert "id-3: no non-incrementing cycle" in out.out
    said = [line for line in out.err.splitlines() if line.startswith("[cycles]")]
    assert said[0] == f"[cycles] checking the warehouse {tmp_path}..." and "starting Spark" in said[1]
    assert any("graph engine: graphx" in line for line in said) and "done in" in said[-1]
    assert any("tables read and written by delta-rs" in line for line in said)  # a local master
    import os

    try:  # the DataFrame path, chosen explicitly, answers the same
        assert main(["jobs", "cycles", *args, "--dataflow", "single", "--graph-engine", "dataframe"]) == 0
        out = capsys.readouterr()
        assert "id-3: no non-incrementing cycle" in out.out and "graph engine: dataframe" in out.err
    finally:
        os.environ.pop("TRACKER_GRAPH_ENGINE", None)
    monkeypatch.setenv("TRACKER_JOBS_DELTA", "delta-spark")  # as on a cluster: the same answer
    assert main(["jobs", "cycles", *args, "--dataflow", "single"]) == 0
    out = capsys.readouterr()
    assert "id-3: no non-incrementing cycle" in out.out and "tables read and written by delta-spark" in out.err
    monkeypatch.setenv("TRACKER_JOBS_DELTA", "parquet")
    assert main(["jobs", "cycles", *args, "--dataflow", "single"]) == 2
    assert "TRACKER_JOBS_DELTA='parquet'" in capsys.readouterr().err


def test_a_job_in_its_own_process_starts_its_jvm_quickly_and_answers_right(tmp_path: Path) -> None:
    """``tracker jobs propagate`` as a user runs it (its own process, local master): the driver
    JVM gets the quick start (and the set-up's class-data archive when there is one), and the
    frontiers written are the oracle's."""
    import os
    import subprocess
    import sys

    from spark_jobs import quickstart

    wh = Warehouse(tmp_path)
    graph = chain(3, arity=2)
    wh.write_dataflow("q", "quick", graph)
    counts = {(Location.source(0, 0), (0, 0)): 1, (Location.target(2, 0), (1, 3)): 2}
    wh.write_states({"q": (0, counts, None)})
    done = subprocess.run([sys.executable, "-m", "tracker.cli", "jobs", "propagate", "--warehouse", str(tmp_path),
                           "--all", "--master", "local[1]"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-2000:]
    archive = quickstart.archive_path()
    expected = quickstart.describe(quickstart.driver_options(archive))
    assert f"JVM: {expected}" in done.stderr
    kept: dict[Location, list] = {loc: [] for loc in graph.locations()}
    for r in pl.read_delta(wh.path("frontiers")).filter(pl.col("dataflow_id") == "q").iter_rows(named=True):
        kept[Location(r["node"], r["port"], r["kind"])].append(tuple(r["time"]))
    assert {loc: sorted(ts) for loc, ts in kept.items()} == oracle.frontiers(graph, counts)


def test_spark_local_ip_defaults_to_loopback_for_local_masters(monkeypatch) -> None:
    from spark_jobs.cli import local_ip_default

    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    local_ip_default("spark://10.1.2.3:7077")
    import os

    assert "SPARK_LOCAL_IP" not in os.environ  # a remote master's executors call the driver back
    local_ip_default(None)
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.2")
    local_ip_default("local[2]")
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.2"
