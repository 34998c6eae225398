"""Every example query of docs/tables.md, run verbatim on a warehouse the real service wrote, for
a flat dataflow and a nested one: the Spark SQL ones on the suite's shared Spark session (the
``spark`` fixture), the Polars ones (both sections) in this process, the SQL ones through the
service's ``POST /v1/sql``. Each answer is checked against the service's own REST answers (the
live frontier, the pointstamps, the lag) or ``tracker report``'s figures.

The nested dataflow (``tests.helpers.loop_then_stage``) has a node 1 in the root (the loop's
scope node) and another inside the loop (``step``), both with a target port 0, so a query that
groups or joins on ``node`` without ``scope`` mixes them and fails here.
"""

from __future__ import annotations

import re
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from api.run.process import ServiceProcess
from spark_jobs.report import build_report
from spark_jobs.storage import Warehouse
from tests.helpers import ROOT, loop_graph, loop_then_stage, register, update, wait_for

pytestmark = pytest.mark.service(TRACKER_FLUSH_SECONDS="0.2", TRACKER_COMPACT_SECONDS="0.2")

Place = tuple[tuple[int, ...], int, int, str]
"""A location as (scope, node, port, kind)."""


def section(title: str) -> str:
    """The text of docs/tables.md under the heading ``title`` (up to the next heading of its level)."""
    text = (ROOT / "docs" / "tables.md").read_text()
    marker = re.search(rf"^(#+) {re.escape(title)}\n", text, re.M)
    assert marker, f"docs/tables.md has no section {title!r}"
    rest = text[marker.end():]
    end = re.search(rf"^#{{1,{len(marker.group(1))}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def blocks(title: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section(title), re.S)


def place(location: dict[str, Any]) -> Place:
    return tuple(location.get("scope") or ()), location["node"], location["port"], location["kind"]


def drive_nested(service: ServiceProcess, dataflow: str) -> None:
    """A record loops in scope [1] at epoch 0 (iterations 0 and 1) and leaves; the input moves on
    to epoch 3 while a record of epoch 2 stays inside the loop at iteration 5."""
    held = {"scope": [1], "node": 1, "port": 0, "kind": "source"}

    def moved(old: int, new: int) -> list[dict[str, Any]]:
        return [update(0, 0, "source", [old], -1), update(0, 0, "source", [new], 1)]

    batches = [
        [{"location": held, "time": [0, 0], "delta": 1}, *moved(0, 1)],
        [{"location": held, "time": [0, 0], "delta": -1}, {"location": held, "time": [0, 1], "delta": 1}],
        [{"location": held, "time": [0, 1], "delta": -1}, *moved(1, 2)],
        [{"location": held, "time": [2, 5], "delta": 1}, *moved(2, 3)],
    ]
    with service.client() as client:
        for seq, updates in enumerate(batches):
            answer = client.post(f"/v1/dataflows/{dataflow}/progress",
                                 json={"worker": "w1", "seq": seq, "updates": updates})
            assert answer.status_code == 200, answer.text
            time.sleep(0.3)  # epochs take measurable time to clear


def drive_flat(service: ServiceProcess, dataflow: str) -> None:
    with service.client() as client:
        for step in range(3):
            answer = client.post(f"/v1/dataflows/{dataflow}/progress", json={
                "worker": "w0", "seq": step,
                "updates": [update(0, 0, "source", [step], -1), update(0, 0, "source", [step + 1], 1)]})
            assert answer.status_code == 200, answer.text
            time.sleep(0.3)


def live_frontier(service: ServiceProcess, dataflow: str) -> dict[Place, list[list[int]]]:
    with service.client() as client:
        answer = client.get(f"/v1/dataflows/{dataflow}/frontier")
    assert answer.status_code == 200, answer.text
    return {place(r["location"]): sorted(r["frontier"]) for r in answer.json()["locations"] if r["frontier"]}


@pytest.fixture(scope="module")
def flows(service: ServiceProcess) -> dict[str, dict[str, Any]]:
    """``flat`` (a 3-operator ring moved three epochs) and ``nested`` (:func:`drive_nested`), each
    with its live frontier, its names and its report once the Delta tables hold its last version."""
    found: dict[str, dict[str, Any]] = {}
    for name, body, drive, batches in (("flat", loop_graph(3, name="flat"), drive_flat, 3),
                                       ("nested", loop_then_stage("nested"), drive_nested, 4)):
        dataflow, _token = register(service, body)
        drive(service, dataflow)
        found[name] = {"id": dataflow, "frontier": live_frontier(service, dataflow), "batches": batches}
    wh = Warehouse(service.warehouse)

    def stored(dataflow: str) -> dict[Place, list[list[int]]]:
        rows: dict[Place, list[list[int]]] = defaultdict(list)
        for r in wh.read("frontiers", dataflow).to_pylist():
            rows[(tuple(r["scope"]), r["node"], r["port"], r["kind"])].append(r["time"])
        return {k: sorted(v) for k, v in rows.items()}

    for flow in found.values():
        wait_for("the live frontier in Delta", lambda flow=flow: wh.exists("frontiers")
                 and stored(flow["id"]) == flow["frontier"], timeout=60, interval=0.2)
        last = max(wh.read("progress", flow["id"])["version"].to_pylist())
        wait_for("every version in frontier_changes", lambda flow=flow, last=last: last in wh.read(
            "frontier_changes", flow["id"])["version"].to_pylist(), timeout=60, interval=0.2)
        flow["report"] = build_report(service.warehouse, flow["id"], limit=100)
        names = wh.read("nodes", flow["id"]).to_pylist()
        flow["names"] = {(tuple(r["scope"]), r["node"]): r["name"] for r in names}
    assert found["nested"]["names"][((), 1)] == "loop" and found["nested"]["names"][((1,), 1)] == "step"
    return found


def cleared(flow: dict[str, Any]) -> dict[tuple[tuple[int, ...], int, int], float]:
    """``tracker report``'s epoch clear times: (scope, node, epoch) -> seconds, cleared ones only."""
    return {(tuple(r.get("scope") or ()), r["node"], r["epoch"]): r["seconds"]
            for r in flow["report"].epochs.to_dicts() if r["seconds"] is not None}


def since_of(flow: dict[str, Any]) -> dict[Place, float]:
    """Each location's last frontier change (``tracker report``'s stuck table), as a POSIX time."""
    return {(tuple(r.get("scope") or ()), r["node"], r["port"], r["kind"]): r["since"].timestamp()
            for r in flow["report"].stuck.to_dicts()}


def check_epochs(flow: dict[str, Any], found: dict[tuple[tuple[int, ...], int, int], float]) -> None:
    expected = cleared(flow)
    assert set(found) == set(expected)
    for key, seconds in found.items():
        assert seconds == pytest.approx(expected[key], abs=2e-3), key


def check_stuck(flow: dict[str, Any], rows: list[tuple[Place, list[int], float]], limit: int) -> None:
    """The rows (location, oldest time, since) are the ``limit`` locations with the oldest
    frontier time, then the longest unchanged, in that order, each with its right figures."""
    frontier, since = flow["frontier"], since_of(flow)
    assert len(rows) == min(limit, len(frontier))
    for where, oldest, at in rows:
        assert oldest == frontier[where][0], where
        assert at == pytest.approx(since[where], abs=2e-3), where
    keys = [(oldest, at) for _, oldest, at in rows]
    assert keys == sorted(keys)
    shown = {where for where, _, _ in rows}
    assert all((frontier[w][0], since[w]) >= keys[-1] for w in frontier if w not in shown)


def check_throughput(flow: dict[str, Any], rows: list[tuple[datetime, int, int]]) -> None:
    report = flow["report"].throughput
    assert [(s.timestamp(), b, u) for s, b, u in rows] == [
        (r["second"].timestamp(), r["batches"], r["updates"]) for r in report.to_dicts()]
    assert sum(b for _, b, _ in rows) == flow["batches"]


@pytest.mark.spark
def test_spark_sql_examples(spark: Any, service: ServiceProcess, flows: dict[str, dict[str, Any]]) -> None:
    """docs/tables.md's Spark SQL blocks, on delta-spark, for both dataflows."""
    queries = blocks("Example queries: Spark SQL", "sql")
    assert len(queries) == 4, "docs/tables.md's Spark SQL examples changed: update this test"
    current, clear, stuck, throughput = queries
    assert "collect_list" in current and "ANTI JOIN" in clear and "last_change" in stuck and "progress" in throughput

    def run(query: str, dataflow: str) -> list[Any]:
        text = query.replace("${wh}", str(service.warehouse)).replace("${id}", dataflow).strip().rstrip(";")
        return spark.sql(text).collect()  # type: ignore[no-any-return]

    for flow in flows.values():
        rows = run(current, flow["id"])
        assert {(tuple(r["scope"]), r["node"], r["port"], r["kind"]): [list(t) for t in r["frontier"]]
                for r in rows} == flow["frontier"]
        assert all(r["name"] == flow["names"][(tuple(r["scope"]), r["node"])] for r in rows)
        check_epochs(flow, {(tuple(r["scope"]), r["node"], r["epoch"]): r["seconds"] for r in run(clear, flow["id"])})
        check_stuck(flow, [((tuple(r["scope"]), r["node"], r["port"], r["kind"]), list(r["oldest"]),
                            r["since"].timestamp()) for r in run(stuck, flow["id"])], 10)
        check_throughput(flow, [(r["second"], r["batches"], r["updates"]) for r in run(throughput, flow["id"])])


def polars_examples(flow: dict[str, Any], warehouse: Path) -> dict[str, Any]:
    """Both Polars sections' blocks run verbatim (the first block's ``table`` helper shared), for
    ``flow``; ``INNER`` is the loop's scope."""
    code = "\n".join(blocks("Example queries: Polars", "python") + blocks("Example queries: Polars, nested scopes",
                                                                         "python"))
    env: dict[str, Any] = {"WAREHOUSE": str(warehouse), "DATAFLOW": flow["id"], "INNER": [1]}
    exec(compile(code, "docs/tables.md", "exec"), env)
    return env


def test_polars_examples(service: ServiceProcess, flows: dict[str, dict[str, Any]]) -> None:
    for name, flow in flows.items():
        env = polars_examples(flow, service.warehouse)
        current: pl.DataFrame = env["current"]
        assert {(tuple(r["scope"]), r["node"], r["port"], r["kind"]): r["frontier"]
                for r in current.to_dicts()} == flow["frontier"]
        assert all(r["name"] == flow["names"][(tuple(r["scope"]), r["node"])] for r in current.to_dicts())
        check_epochs(flow, {(tuple(r["scope"]), r["node"], r["epoch"]): r["seconds"] for r in env["clear"].to_dicts()})
        check_stuck(flow, [((tuple(r["scope"]), r["node"], r["port"], r["kind"]), r["oldest"], r["since"].timestamp())
                           for r in env["stuck"].to_dicts()], 10)
        check_throughput(flow, [(r["second"], r["batches"], r["updates"]) for r in env["throughput"].to_dicts()])
        scopes = env["scopes"].rows()
        if name == "flat":
            assert scopes == [([], "root", 1)] and env["inside"].is_empty()  # no scope [1] in a flat dataflow
            continue
        assert scopes == [([], "root", 1), ([1], "iterative", 2)]
        assert {(r["node"], r["port"], r["kind"]): r["frontier"] for r in env["inside"].to_dicts()} == {
            (node, port, kind): times for (scope, node, port, kind), times in flow["frontier"].items() if scope == (1,)}
        assert {r["name"] for r in env["inside"].to_dicts()} == {"boundary", "step", "feedback"}
        assert {(r["port"], r["kind"]): r["frontier"] for r in env["at_scope_node"].to_dicts()} == {
            (port, kind): times for (scope, node, port, kind), times in flow["frontier"].items()
            if scope == () and node == 1}


def test_polars_helper_reads_one_partition(service: ServiceProcess, flows: dict[str, dict[str, Any]],
                                           tmp_path: Path) -> None:
    """The helper's claim: only the dataflow's own partition is read. In a copy of the tables
    with the flat dataflow's files gone, the nested one's rows still read whole (an eager
    ``read_delta`` of the same table fails on the missing files)."""
    copy = tmp_path / "warehouse"
    shutil.copytree(service.warehouse, copy, ignore=shutil.ignore_patterns("_wal", "*.lock", "*token*"))
    gone = list((copy / "frontiers").glob(f"dataflow_id={flows['flat']['id']}/*.parquet"))
    assert gone
    for path in gone:
        path.unlink()
    helper = blocks("Example queries: Polars", "python")[0]
    env: dict[str, Any] = {"WAREHOUSE": str(copy), "DATAFLOW": flows["nested"]["id"]}
    exec(compile(helper, "docs/tables.md", "exec"), env)
    table: Callable[[str], pl.DataFrame] = env["table"]
    rows = table("frontiers")
    assert {(tuple(r["scope"]), r["node"], r["port"], r["kind"]) for r in rows.to_dicts()} == set(
        flows["nested"]["frontier"])
    with pytest.raises(FileNotFoundError):
        pl.read_delta(str(copy / "frontiers")).filter(pl.col("dataflow_id") == flows["nested"]["id"])


def sql(service: ServiceProcess, query: str, **params: Any) -> list[dict[str, Any]]:
    with service.client() as client:
        answer = client.post("/v1/sql", json={"query": query, "params": params}, timeout=60)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    names = [c["name"] for c in body["columns"]]
    return [dict(zip(names, row, strict=True)) for row in body["rows"]]


def test_sql_examples_inside_nested_scopes(service: ServiceProcess, flows: dict[str, dict[str, Any]]) -> None:
    """The SQL section's queries (``tests/test_sql.py`` holds them to the flat dataflows) on the
    nested one: every row names its scope, and agrees with the REST answers and the report."""
    queries = {b.splitlines()[0].removeprefix("-- ").strip(): b for b in blocks("SQL: `tracker sql` and `POST /v1/sql`",
                                                                                  "sql")}
    assert set(queries) >= {"stuck operators now", "lag per operator over the last hour", "epochs cleared per minute",
                            "dataflows not moved since", "oldest pointstamps now"}
    flow = flows["nested"]
    dataflow = flow["id"]
    with service.client() as client:
        lag = client.get(f"/v1/dataflows/{dataflow}/lag").json()["locations"]
        pointstamps = client.get(f"/v1/dataflows/{dataflow}/pointstamps").json()
        status = client.get(f"/v1/dataflows/{dataflow}").json()["status"]

    stuck = [r for r in sql(service, queries["stuck operators now"], stuck_seconds=0) if r["dataflow_id"] == dataflow]
    expected = [(place(r["location"])[:2], r["operator"], r["port"], r["frontier"],
                 (r["oldest_pointstamp"] or {}).get("time")) for r in lag
                if r["location"]["kind"] == "target" and r["frontier"]]
    assert sorted(((tuple(r["scope"]), r["node"]), r["operator"], r["port_name"], r["frontier"], r["oldest_time"])
                  for r in stuck) == sorted(expected)
    assert {(tuple(r["scope"]), r["node"], r["operator"]) for r in stuck} >= {((), 1, "loop"), ((1,), 1, "step")}

    per_minute: dict[tuple[str, tuple[int, ...], int], int] = defaultdict(int)
    for r in flow["report"].epochs.to_dicts():
        if r["cleared_at"] is not None:
            per_minute[(r["cleared_at"].replace(second=0, microsecond=0).isoformat(), tuple(r["scope"]),
                        r["node"])] += 1
    found = sql(service, queries["epochs cleared per minute"], id=dataflow)
    assert {(datetime.fromisoformat(r["minute"]).isoformat(), tuple(r["scope"]), r["node"]): r["epochs_cleared"]
            for r in found} == dict(per_minute)
    assert {r["operator"] for r in found} == {flow["names"][(tuple(r["scope"]), r["node"])] for r in found}
    assert any(r["scope"] == [1] for r in found)

    lagged = sql(service, queries["lag per operator over the last hour"], id=dataflow)
    since = since_of(flow)
    now: dict[tuple[tuple[int, ...], int], dict[str, Any]] = {}
    for r in lagged:  # the last sample of each operator is "now"
        key = (tuple(r["scope"]), r["node"])
        assert r["operator"] == flow["names"][key]
        if key not in now or r["sampled_at"] > now[key]["sampled_at"]:
            now[key] = r
    assert {(s, n) for (s, n, _, k) in flow["frontier"] if k == "target"} <= set(now)
    assert {((), 1), ((1,), 1)} <= set(now)  # the loop's scope node and the step inside it, apart
    for key, r in now.items():
        waits = [datetime.fromisoformat(r["sampled_at"]).timestamp() - at for where, at in since.items()
                 if where[:2] == key and where[3] == "target" and where in flow["frontier"]]
        assert r["lag_seconds"] == (pytest.approx(max(waits), abs=5e-3) if waits else None), key

    moved = sql(service, queries["dataflows not moved since"], since=datetime.now().astimezone().isoformat())
    assert [r["last_frontier_change_at"] for r in moved if r["dataflow_id"] == dataflow] == [
        status["last_frontier_change_at"]]

    oldest = [r for r in sql(service, queries["oldest pointstamps now"]) if r["dataflow_id"] == dataflow]
    assert sorted(((tuple(r["scope"]), r["node"], r["port"], r["kind"]), r["time"], r["count"]) for r in oldest
                  ) == sorted((place(p["location"]), p["time"], p["count"]) for p in pointstamps)
    assert {(tuple(r["scope"]), r["operator"], tuple(r["time"])) for r in oldest} == {((1,), "step", (2, 5)),
                                                                                    ((), "input", (3,))}
