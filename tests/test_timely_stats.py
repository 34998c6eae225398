"""Why slow: a real timely program's statistics (``Attach::statistics``) as the service keeps them.

The connector crate's ``slow`` example (built once, as ``tests/test_timely_connector.py`` builds
the examples) runs with 4 workers against a service started for real: its ``Sleepy`` operator
sleeps for every message it receives, the others do almost nothing, and each worker sends a
known number of records. With statistics on, the route, the Delta tables and ``/metrics`` must
hold what the program did: ``Sleepy`` the busiest operator, busy at least as long as it slept,
and on each channel the records the program sent, summed over the workers; the statistics query
of ``docs/tables.md`` says the same. With statistics off, nothing is sent. The route's refusals
(a body without the report's shape, an operator or channel the dataflow does not have, a deleted
dataflow, another dataflow's token) change nothing; the window keeps the last 10 s of reports.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.live.activity import MAX_REPORTS, WINDOW_SECONDS, Activity, Shape
from api.schema.activity import ActivityReport
from bench.timely import build, run_example
from spark_jobs.storage import Warehouse
from tests.helpers import ServiceProcess, loop_then_stage, program_token, wait_for
from tracker.graph import Edge, Graph, Location, Node

pytestmark = pytest.mark.service(TRACKER_METRICS_PER_DATAFLOW="1")
ROUNDS, RECORDS, WORKERS, SLEEP_MS = 8, 25, 4, 30


@pytest.fixture(scope="module")
def binaries() -> Path:
    """The examples, built once (debug; cargo's target directory is cached)."""
    return build(release=False)


def _run_slow(service: ServiceProcess, binaries: Path, extra: list[str]) -> tuple[str, str]:
    """Runs ``slow`` to its end; its dataflow id and standard error."""
    name = f"slow-{uuid.uuid4().hex[:8]}"
    run = run_example(binaries, "slow", ["-w", str(WORKERS), "--name", name, "--rounds", str(ROUNDS), "--records",
                                         str(RECORDS), "--sleep-ms", str(SLEEP_MS), *extra],
                      url=service.url, token=program_token(service))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "refused" not in run.stderr, run.stderr[-3000:]
    with service.client() as client:
        listed = client.get("/v1/dataflows", params={"name": name}).json()
    return listed[0]["id"], run.stderr


def _channel(view: dict[str, Any], source: str, target: str) -> dict[str, Any]:
    found = [ch for ch in view["channels"] if ch["from"].startswith(source) and ch["to"].startswith(target)]
    assert len(found) == 1, view["channels"]
    return found[0]


def _accepted(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    found = re.search(r'^tracker_statistics_reports_total\{outcome="accepted"\} (\S+)$', text, re.M)
    assert found, text[-2000:]
    return float(found.group(1))


def test_statistics_name_the_sleeping_operator_and_count_every_record(service: ServiceProcess,
                                                                       binaries: Path) -> None:
    dataflow_id, stderr = _run_slow(service, binaries, ["--statistics-ms", "200"])
    sent_reports = sum(int(n) for n in re.findall(r"(\d+) statistics reports", stderr))
    assert sent_reports >= WORKERS, stderr[-3000:]  # each worker's last interval at least
    with service.client() as client:
        view = client.get(f"/v1/dataflows/{dataflow_id}/stats").json()
        metrics = client.get("/metrics").text
    assert view["reports"] == sent_reports, view
    assert view["workers"] == ["w0", "w1", "w2", "w3"]
    operators = [op for op in view["operators"] if not op["is_scope"]]
    assert operators[0]["name"] == "Sleepy", operators  # the hottest first
    sleepy = operators[0]
    into_sleepy = _channel(view, "Exchange", "Sleepy")
    # It slept SLEEP_MS for every message it received, so it was busy at least that long...
    slept = into_sleepy["total_messages"] * SLEEP_MS / 1000
    assert into_sleepy["total_messages"] >= ROUNDS, into_sleepy
    assert slept <= sleepy["total_busy_seconds"] < slept + 2.0, (sleepy, slept)
    # ... and far longer than every other operator together.
    others = sum(op["total_busy_seconds"] for op in operators[1:])
    assert others < sleepy["total_busy_seconds"] / 4, operators
    assert sleepy["total_schedules"] >= WORKERS and 0 < sleepy["busy_share"] <= 1
    # Every record each worker sent, summed over the workers, on each channel of the pipeline.
    for source, target in (("Input", "Exchange"), ("Exchange", "Sleepy"), ("Sleepy", "FlatMap")):
        assert _channel(view, source, target)["total_records"] == ROUNDS * RECORDS * WORKERS, view["channels"]
    assert _channel(view, "Input", "Exchange")["records_per_second"] > 0

    # The Delta tables hold the same reports, row by row (appended with the next flush).
    warehouse = Warehouse(service.warehouse)

    def in_delta() -> Any:
        channels = warehouse.read("channel_stats", dataflow_id).to_pylist()
        return channels if sum(row["records"] for row in channels) >= 3 * ROUNDS * RECORDS * WORKERS else None

    channels = wait_for("the statistics in Delta", in_delta, timeout=30)
    by_channel: dict[tuple[int, int], int] = {}
    for row in channels:
        key = (row["src_node"], row["dst_node"])
        by_channel[key] = by_channel.get(key, 0) + row["records"]
    assert sorted(by_channel.values())[-3:] == [ROUNDS * RECORDS * WORKERS] * 3, by_channel
    operator_rows = warehouse.read("operator_stats", dataflow_id).to_pylist()
    busy = sum(row["busy_ns"] for row in operator_rows if row["node"] == sleepy["node"])
    assert abs(busy / 1e9 - sleepy["total_busy_seconds"]) < 1e-5
    assert {row["worker"] for row in operator_rows} == {"w0", "w1", "w2", "w3"}
    # docs/tables.md's query over them says the same.
    text = (Path(__file__).parent.parent / "docs" / "tables.md").read_text()
    found = re.search(r"## Example queries: why slow \(Polars\).*?```python\n(.*?)```", text, re.S)
    assert found, "docs/tables.md lost its statistics query"
    scope: dict[str, Any] = {"WAREHOUSE": str(service.warehouse), "DATAFLOW": dataflow_id}
    exec(compile(found.group(1), "docs/tables.md", "exec"), scope)
    assert scope["busiest"]["name"][0] == "Sleepy" and 0 < scope["busiest"]["busy_share"][0] <= 1, scope["busiest"]
    assert scope["busiest_channels"]["records"][0] == ROUNDS * RECORDS * WORKERS, scope["busiest_channels"]

    # /metrics (this service labels series by dataflow, as --metrics-per-dataflow does).
    labelled = re.search(rf'^tracker_operator_busy_share{{dataflow="{dataflow_id}",operator="Sleepy #\d+"}} (\S+)$',
                         metrics, re.M)
    assert labelled and float(labelled.group(1)) == sleepy["busy_share"], metrics[-3000:]
    largest = re.search(r"^tracker_operator_busy_share_max (\S+)$", metrics, re.M)
    assert largest and float(largest.group(1)) >= sleepy["busy_share"]
    assert re.search(rf'^tracker_channel_records_per_second{{channel="Input #\d+:0 -> Exchange #\d+:0",'
                     rf'dataflow="{dataflow_id}"}} [1-9]', metrics, re.M), metrics[-3000:]


def test_statistics_off_send_nothing(service: ServiceProcess, binaries: Path) -> None:
    with service.client() as client:
        before = _accepted(client)
    dataflow_id, stderr = _run_slow(service, binaries, [])
    assert "statistics reports" not in stderr
    with service.client() as client:
        view = client.get(f"/v1/dataflows/{dataflow_id}/stats").json()
        after = _accepted(client)
        assert client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]["state"] == "complete"
    assert view["reports"] == 0 and view["channels"] == [] and after == before, view
    assert all(op["total_schedules"] == 0 for op in view["operators"])  # every operator listed, at zero
    assert Warehouse(service.warehouse).read("operator_stats", dataflow_id).num_rows == 0


def _report(**changes: Any) -> dict[str, Any]:
    return {"worker": "w0", "seconds": 1.0, "busy_ns": 10, "operators": [{"node": 0, "busy_ns": 10, "schedules": 1}],
            "channels": [{"scope": [1], "source": [0, 0], "target": [1, 0], "messages": 1, "records": 5}], **changes}


def test_refused_reports_change_nothing_and_the_program_token_may_report(service: ServiceProcess) -> None:
    with service.client(program_token(service)) as program:
        registered = program.post("/v1/dataflows", json=loop_then_stage(f"stats-{uuid.uuid4().hex[:8]}")).json()
        other = program.post("/v1/dataflows", json=loop_then_stage(f"stats-{uuid.uuid4().hex[:8]}")).json()
        path = f"/v1/dataflows/{registered['id']}/stats"
        refused = {
            "not JSON": (400, program.post(path, content=b"{", headers={"content-type": "application/json"})),
            "no interval": (422, program.post(path, json=_report(seconds=0))),
            "negative records": (422, program.post(path, json=_report(channels=[
                {"source": [0, 0], "target": [1, 0], "messages": 1, "records": -1}]))),
            "unknown operator": (422, program.post(path, json=_report(operators=[{"node": 7, "busy_ns": 1}]))),
            "unknown channel": (422, program.post(path, json=_report(channels=[
                {"scope": [1], "source": [2, 0], "target": [0, 0], "messages": 1, "records": 1}]))),
            "a scope's boundary": (422, program.post(path, json=_report(operators=[
                {"scope": [1], "node": 0, "busy_ns": 1}]))),
        }
        for what, (status, answer) in refused.items():
            assert answer.status_code == status, (what, answer.text)
            assert answer.json()["error"] in ("malformed_json", "invalid_request", "unknown_location"), answer.text
        assert program.get(path).json()["reports"] == 0  # nothing kept
        # The program token reports for the dataflows it registered; the dataflow's token too.
        assert program.post(path, json=_report()).json() == {"accepted": True, "reports": 1}
    with service.client(registered["token"]) as own, service.client(other["token"]) as stranger:
        assert own.post(path, json=_report(worker="w1")).json()["reports"] == 2
        assert stranger.post(path, json=_report()).status_code == 403
        view = own.get(path).json()
    assert view["reports"] == 2 and view["workers"] == ["w0", "w1"]
    assert [ch["total_records"] for ch in view["channels"]] == [10]
    assert view["channels"][0]["from"] == "loop #1 boundary" and view["channels"][0]["to"] == "[1] step #1"
    assert view["channels"][0]["records_per_second"] == 10.0  # 10 records in 1 s of each of two workers
    with service.client() as admin:
        assert admin.delete(f"/v1/dataflows/{registered['id']}").status_code == 204
        assert admin.post(path, json=_report()).status_code == 410
        assert admin.get(path).json()["reports"] == 2


def test_the_window_keeps_ten_seconds_and_the_totals_everything() -> None:
    graph = Graph.build(1, [Node(1, 0, 1, "Input"), Node(2, 1, 0, "Sink")],
                        [Edge(Location.source(1, 0), Location.target(2, 0))])
    activity = Activity(Shape.of([((), graph, frozenset())]))

    def report(busy: int, records: int) -> ActivityReport:
        return ActivityReport.model_validate({"worker": "w0", "seconds": 1.0, "operators": [
            {"node": 2, "busy_ns": busy}], "channels": [{"source": [1, 0], "target": [2, 0], "messages": 1,
                                                         "records": records}]})

    activity.add(report(900_000_000, 1000), at=0.0)  # busy, then quiet for longer than the window
    for second in range(1, 13):
        activity.add(report(100_000_000, 10), at=float(second))
    view = activity.view()
    sink = next(op for op in view["operators"] if op["name"] == "Sink")
    assert len(activity.window) == WINDOW_SECONDS + 1  # the reports of the last 10 s before the newest
    assert sink["busy_share"] == 0.1 and view["channels"][0]["records_per_second"] == 10.0
    assert sink["total_busy_seconds"] == 2.1 and view["channels"][0]["total_records"] == 1120
    for _ in range(MAX_REPORTS + 10):
        activity.add(report(1, 1), at=20.0)
    assert len(activity.window) == MAX_REPORTS and activity.reports == 13 + MAX_REPORTS + 10
