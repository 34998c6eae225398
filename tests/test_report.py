"""``tracker report`` and the docs/tables.md Polars queries, over real Delta tables.

The first tests write a small, hand-checked history through :class:`Warehouse` (the same
writer the service uses) and check every figure; the last one lets the real service write the
tables, stops it, and runs ``tracker report`` as a user would.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from spark_jobs.report import build_report
from spark_jobs.storage import Warehouse
from tests.helpers import ROOT, ServiceStarter, loop_graph, loop_then_stage, register, update, wait_for
from tracker.graph import Edge, Graph, Location, Node

DF = "chain"
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
AS_OF = T0 + timedelta(seconds=60)


def change(version: int, node: int, kind: str, time_: int, diff: int, seconds: float) -> dict[str, Any]:
    """One ``frontier_changes`` row of port 0, ``seconds`` after T0."""
    return {"dataflow_id": DF, "version": version, "node": node, "port": 0, "kind": kind, "time": [time_],
            "diff": diff, "at": T0 + timedelta(seconds=seconds)}


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """input(0) -> op1(1) -> op2(2); epoch 0 clears both operators at +2 s, epoch 1 clears op1 at
    +5 s and is still in op2's input frontier (op2 is stuck at 1)."""
    root = tmp_path_factory.mktemp("report") / "warehouse"
    wh = Warehouse(root)
    graph = Graph.build(1, [Node(0, 0, 1, "input"), Node(1, 1, 1, "op1"), Node(2, 1, 1, "op2")],
                        [Edge(Location.source(0, 0), Location.target(1, 0)),
                         Edge(Location.source(1, 0), Location.target(2, 0))])
    wh.write_dataflow(DF, "chain", graph)
    wh.replace_partition("dataflows", DF, [{"dataflow_id": DF, "name": "chain", "timestamp_arity": 1,
                                            "graph_version": 1, "created_at": T0}])
    wh.append("frontier_changes", [
        # version 1 (+2 s): the input moves 0 -> 1; op1 and op2 see epoch 0 leave, epoch 1 enter.
        change(1, 0, "source", 0, -1, 2), change(1, 0, "source", 1, 1, 2),
        change(1, 1, "target", 0, -1, 2), change(1, 1, "target", 1, 1, 2),
        change(1, 2, "target", 0, -1, 2), change(1, 2, "target", 1, 1, 2),
    ])
    # A second commit, as the service's compaction appends one per period.
    wh.append("frontier_changes", [
        change(2, 0, "source", 1, -1, 5), change(2, 0, "source", 2, 1, 5),
        change(2, 1, "target", 1, -1, 5), change(2, 1, "target", 2, 1, 5),
    ])
    wh.write_frontiers(DF, {Location.source(0, 0): [(2,)], Location.target(1, 0): [(2,)],
                            Location.target(2, 0): [(1,)]})
    wh.append("progress", [
        {"dataflow_id": DF, "version": v, "worker": "w", "seq": v - 1, "node": 0, "port": 0, "kind": "source",
         "time": [t], "delta": d, "received_at": T0 + timedelta(seconds=s)}
        for v, s in ((1, 2), (2, 5)) for t, d in ((v - 1, -1), (v, 1))
    ])
    # An empty batch (+7 s): one row with delta 0, a batch but no update.
    wh.append("progress", [{"dataflow_id": DF, "version": 3, "worker": "w", "seq": 2, "node": 0, "port": 0,
                            "kind": "source", "time": [0], "delta": 0, "received_at": T0 + timedelta(seconds=7)}])
    return root


def test_figures(warehouse: Path) -> None:
    report = build_report(warehouse, DF, as_of=AS_OF)
    assert [(r["node"], r["name"], r["kind"], r["frontier"]) for r in report.frontiers.to_dicts()] == [
        (0, "input", "source", "{(2)}"), (1, "op1", "target", "{(2)}"), (2, "op2", "target", "{(1)}")]
    epochs = {(r["node"], r["epoch"]): r["seconds"] for r in report.epochs.to_dicts()}
    # Epoch 0 was in the frontier from registration (T0), so it took 2 s; epoch 1 took 3 s at op1.
    assert epochs == {(1, 0): 2.0, (1, 1): 3.0, (1, 2): None, (2, 0): 2.0, (2, 1): None}
    stuck = report.stuck.to_dicts()
    assert [(r["node"], r["kind"], r["oldest"]) for r in stuck] == [(2, "target", [1]), (0, "source", [2]),
                                                                    (1, "target", [2])]
    assert stuck[0]["unchanged_seconds"] == 58.0  # last change at +2 s, report at +60 s
    assert report.throughput["batches"].to_list() == [1, 1, 1]
    assert report.throughput["updates"].sum() == 4


def test_cli_prints_the_figures(warehouse: Path) -> None:
    """The real command, in a fresh process, with no service and no Spark session."""
    out = subprocess.run(
        [sys.executable, "-m", "tracker.cli", "report", "--warehouse", str(warehouse), "--dataflow", DF,
         "--as-of", AS_OF.isoformat()], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "== Current frontier per operator ==" in out
    assert re.search(r"^\s*2\s+op2\s+0\s+target\s+\{\(1\)\}$", out, re.M), out
    # op1, epoch 1: appeared at +2 s, cleared at +5 s, 3 seconds.
    assert re.search(r"^\s*1\s+op1\s+1\s+2026-03-01 12:00:02\.000\s+2026-03-01 12:00:05\.000\s+3\.000$", out, re.M), out
    stuck = out.split("== Stuck locations")[1].splitlines()
    assert re.match(r"^\s*2\s+op2\s+0\s+target\s+\{\(1\)\}\s+\(1\)\s+2026-03-01 12:00:02\.000\s+58\.000$",
                    stuck[3]), out
    assert "3 batches, 4 updates over 3 active second(s)" in out


def test_cli_json_and_unknown_dataflow(warehouse: Path) -> None:
    ran = subprocess.run([sys.executable, "-m", "tracker.cli", "report", "--warehouse", str(warehouse),
                          "--dataflow", DF, "--json", "--as-of", AS_OF.isoformat()],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    data = json.loads(ran.stdout)
    assert data["epochs"][1] == {"node": 1, "name": "op1", "epoch": 1, "appeared_at": "2026-03-01T12:00:02+00:00",
                                 "cleared_at": "2026-03-01T12:00:05+00:00", "seconds": 3.0}
    missing = subprocess.run([sys.executable, "-m", "tracker.cli", "report", "--warehouse", str(warehouse),
                              "--dataflow", "nope"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "unknown dataflow 'nope'" in missing.stderr
    early = subprocess.run([sys.executable, "-m", "tracker.cli", "report", "--warehouse", str(warehouse),
                            "--dataflow", DF, "--as-of", (T0 + timedelta(seconds=3)).isoformat()],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    # The tables already hold changes from +5 s: "unchanged for" would be negative.
    assert early.returncode == 2 and "before what the tables already hold" in early.stderr
    assert "Traceback" not in early.stderr


def polars_examples() -> str:
    """Every ```python block of docs/tables.md's Polars section, joined."""
    text = (ROOT / "docs" / "tables.md").read_text()
    section = text.split("## Example queries: Polars", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 3, "docs/tables.md lost its Polars examples"
    return "\n".join(blocks)


def test_docs_polars_examples_run(warehouse: Path) -> None:
    """The documented Polars queries, run verbatim, give the same figures as the report."""
    scope: dict[str, Any] = {"WAREHOUSE": str(warehouse), "DATAFLOW": DF}
    exec(compile(polars_examples(), "docs/tables.md", "exec"), scope)
    current: pl.DataFrame = scope["current"]
    assert sorted(zip(current["node"], current["kind"], current["frontier"].to_list(), strict=True)) == [
        (0, "source", [[2]]), (1, "target", [[2]]), (2, "target", [[1]])]
    clear: pl.DataFrame = scope["clear"]
    assert sorted(zip(clear["node"], clear["epoch"], clear["seconds"], strict=True)) == [(1, 1, 3.0)]
    stuck: pl.DataFrame = scope["stuck"]
    assert [(r["node"], r["kind"], r["oldest"]) for r in stuck.to_dicts()] == [
        (2, "target", [1]), (0, "source", [2]), (1, "target", [2])]
    throughput: pl.DataFrame = scope["throughput"]
    report = build_report(warehouse, DF, as_of=AS_OF).throughput
    assert throughput.rows() == report.select("second", "batches", "updates").rows()


@pytest.mark.service
def test_report_on_tables_the_service_wrote(start_service: ServiceStarter) -> None:
    """Register and advance a loop through the real service, stop it, then report from Delta."""
    service = start_service(TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.2")
    try:
        dataflow, _token = register(service, loop_graph(3, name="reported"))
        with service.client() as client:
            for step in range(3):
                answer = client.post(f"/v1/dataflows/{dataflow}/progress", json={
                    "worker": "w0", "seq": step,
                    "updates": [update(0, 0, "source", [step], -1), update(0, 0, "source", [step + 1], 1)]})
                assert answer.status_code == 200, answer.text
        wh = Warehouse(service.warehouse)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # compaction is periodic: wait for version 3 to reach Delta
            if wh.exists("frontier_changes") and 3 in wh.read("frontier_changes", dataflow)["version"].to_pylist():
                break
            time.sleep(0.2)
    finally:
        service.stop()
    out = subprocess.run([sys.executable, "-m", "tracker.cli", "report", "--warehouse", str(service.warehouse),
                          "--dataflow", dataflow, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    data = json.loads(out)
    assert data["name"] == "reported"
    frontier = {(r["node"], r["port"], r["kind"]): r["frontier"] for r in data["frontiers"]}
    # The input holds time 3; op1's input from it, and the ring op1 -> op2 -> op3, see 3; the
    # feedback op3 -> op1 adds one.
    assert frontier[(0, 0, "source")] == "{(3)}"
    assert frontier[(1, 1, "target")] == "{(3)}" and frontier[(2, 0, "target")] == "{(3)}"
    assert frontier[(1, 0, "target")] == "{(4)}"
    cleared = {(r["node"], r["epoch"]) for r in data["epochs"] if r["seconds"] is not None}
    assert {(1, 0), (1, 1), (1, 2), (2, 0), (3, 2)} <= cleared
    assert sum(r["batches"] for r in data["throughput"]) == 3


def test_plot_has_the_expected_series(warehouse: Path, tmp_path: Path) -> None:
    """``--plot``: an SVG whose groups are the series (epochs cleared, one lag line per operator
    input) with every point drawn, and a PNG of the figure's size; the series' values are the
    hand-checked history's."""
    from spark_jobs.plot import epochs_cleared, lag_series

    report = build_report(warehouse, DF, as_of=AS_OF)
    assert epochs_cleared(report.epochs) == [(T0 + timedelta(seconds=2), 2), (T0 + timedelta(seconds=5), 3)]
    lags = lag_series(report.changes, report.created_at, AS_OF)  # type: ignore[arg-type]
    assert sorted(lags) == [((), 1), ((), 2)]
    # op2's input: {(0)} from registration, {(1)} from +2 s, never again: 58 s behind at +60 s.
    assert lags[((), 2)][-1] == (AS_OF, 58.0) and max(s for _, s in lags[((), 1)]) == 55.0
    svg, png = tmp_path / "report.svg", tmp_path / "report.png"
    for path in (svg, png):
        ran = subprocess.run([sys.executable, "-m", "tracker.cli", "report", "--warehouse", str(warehouse),
                              "--dataflow", DF, "--as-of", AS_OF.isoformat(), "--plot", str(path)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0 and f"wrote the plot of epochs cleared and lag over time to {path}" in ran.stderr
    import xml.etree.ElementTree as ET

    groups = {g.get("id"): g for g in ET.parse(svg).iter("{http://www.w3.org/2000/svg}g")}
    vertices = {}
    for gid in ("epochs-cleared", "lag--1", "lag--2"):
        paths = [p.get("d") or "" for p in groups[gid].iter("{http://www.w3.org/2000/svg}path")]
        assert len(paths) == 1, gid
        vertices[gid] = len(re.findall(r"[ML]", paths[0]))
    # A step line doubles its inner points: created, +2 s (2), +5 s (3), as of.
    assert vertices["epochs-cleared"] == 7
    assert vertices["lag--1"] == len(lags[((), 1)]) and vertices["lag--2"] == len(lags[((), 2)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(png) as image:
        assert image.size == (1000, 650)
    refused = subprocess.run([sys.executable, "-m", "tracker.cli", "report", "--warehouse", str(warehouse),
                              "--dataflow", DF, "--plot", str(tmp_path / "report.pdf")], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "name an .svg or a .png file" in refused.stderr


@pytest.mark.service
def test_report_names_stuck_locations_and_blockers_inside_nested_scopes(start_service: ServiceStarter) -> None:
    """A record held inside a loop scope: the report names it there (scope ``[1]``, operator
    ``step``, the worker that reported it), and the stuck locations inside the loop by their
    own names, not as the loop's scope node in the root."""
    service = start_service(TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.2")
    try:
        dataflow, _token = register(service, loop_then_stage("nested"))
        inside = {"scope": [1], "node": 1, "port": 0, "kind": "source"}
        with service.client() as client:
            answer = client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": "w1", "seq": 0, "updates": [
                {"location": inside, "time": [0, 3], "delta": 1}, update(0, 0, "source", [0], -1),
                update(0, 0, "source", [1], 1)]})
            assert answer.status_code == 200, answer.text
        wh = Warehouse(service.warehouse)
        wait_for("the inner pointstamp in Delta", lambda: wh.exists("pointstamps") and [1] in wh.read(
            "pointstamps", dataflow)["scope"].to_pylist(), timeout=60, interval=0.2)
    finally:
        service.stop()
    out = subprocess.run([sys.executable, "-m", "tracker.cli", "report", "--warehouse", str(service.warehouse),
                          "--dataflow", dataflow, "--json", "--limit", "20"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    data = json.loads(out)
    blockers = [(b["scope"], b["node"], b["name"], b["time"], b["worker"]) for b in data["blockers"]]
    assert blockers == [([1], 1, "step", [0, 3], "w1"), ([], 0, "input", [1], "w1")]  # epoch 0 first
    stuck = {(tuple(s["scope"]), s["node"], s["port"], s["kind"]): (s["name"], s["oldest"]) for s in data["stuck"]}
    # Inside the loop: the feedback's input and the step's second input wait on (0, 3) -> (0, 4).
    assert stuck[((1,), 2, 0, "target")] == ("feedback", [0, 3])
    assert stuck[((1,), 1, 1, "target")] == ("step", [0, 4])
    assert stuck[((1,), 0, 0, "target")][0] == "loop boundary"
    assert {s["scope"] for s in map(lambda r: {"scope": tuple(r["scope"])}, data["frontiers"])} >= {(), (1,)}
    text = subprocess.run([sys.executable, "-m", "tracker.cli", "report", "--warehouse", str(service.warehouse),
                           "--dataflow", dataflow], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True).stdout
    assert re.search(r"^\[1\]\s+1\s+step\s+0\s+source\s+\(0, 3\)\s+1\s+w1\s", text.split("== Blockers")[1], re.M), text
