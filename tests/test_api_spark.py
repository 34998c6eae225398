"""The service with Spark on: background registration check, audits (periodic and on demand),
nested dataflows checked and audited scope by scope, the graph engine in ``/healthz`` (and a
missing GraphX helper as a one-line set-up error there), Delta compaction, and the processes by
role (the hot path holds no Spark).

One service (with its own ``local[1]`` Spark session, started in the background) for the module.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import polars as pl
import pytest

from api.run.process import descendants
from tests.helpers import ServiceProcess, ServiceStarter, loop_graph, loop_then_stage, register, update, wait_for

pytestmark = [pytest.mark.service(spark=True, SPARK_MASTER="local[1]", TRACKER_AUDIT_SECONDS="1",
                                  TRACKER_SPARK_NICE="3", TRACKER_COMPACT_SECONDS="0.5",
                                  TRACKER_FLUSH_SECONDS="0.2"),
              pytest.mark.spark]


def test_registration_does_not_wait_for_spark_and_spark_agrees(service: ServiceProcess) -> None:
    started = time.perf_counter()
    dataflow_id, token = register(service, loop_graph(operators=4, arity=2))
    assert time.perf_counter() - started < 5.0, "registration waited for Spark"
    with service.client(token) as client:
        status = wait_for("the Spark check", lambda: (s := client.get(f"/v1/dataflows/{dataflow_id}").json()[
            "status"])["spark_check"] not in ("pending", "running") and s)
        assert status["spark_check"] == "agreed", status
    summaries = wait_for("the summaries table", lambda: (Path(service.warehouse) / "summaries").exists())
    assert summaries
    table = pl.read_delta(str(service.warehouse / "summaries")).filter(pl.col("dataflow_id") == dataflow_id)
    assert table.height > 0
    # (1,0,target) reaches itself around the loop only through the +[0,1] operator.
    pairs = table.filter((pl.col("from_node") == 1) & (pl.col("from_kind") == "target") & (pl.col("to_node") == 1)
                         & (pl.col("to_kind") == "target") & (pl.col("from_port") == 0))
    assert sorted(pairs["summary"].to_list()) == [[0, 0]]


def test_audit_compares_spark_with_the_live_frontier(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph(operators=3))
    with service.client(token) as client:
        for seq in range(3):
            answer = client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": seq, "updates": [
                update(0, 0, "source", [seq], -1), update(0, 0, "source", [seq + 1], 1),
                update(2, 0, "target", [seq + 5], 1)]})
            assert answer.status_code == 200
        audit = wait_for("an audit of version 3", lambda: (a := client.get(f"/v1/dataflows/{dataflow_id}").json()[
            "status"]["audit"]) and a.get("version") == 3 and a)
        assert audit["ok"] is True, audit
        assert audit["mismatches"] == []
    metrics = httpx.get(service.url + "/metrics").text
    assert "\ntracker_audit_ok 1.0" in metrics and dataflow_id not in metrics  # no dataflow ids by default
    assert 'tracker_audits_total{result="ok"}' in metrics


def test_compaction_writes_pointstamps_frontiers_and_changes(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph(operators=2))
    with service.client(token) as client:
        client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [0], -1), update(0, 0, "source", [4], 1)]})
        frontier = client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()

    def compacted() -> bool:
        try:
            changes = pl.read_delta(str(service.warehouse / "frontier_changes"))
        except Exception:
            return False
        return changes.filter((pl.col("dataflow_id") == dataflow_id) & (pl.col("version") == 1)).height > 0

    wait_for("compaction", compacted, timeout=30)
    time.sleep(1.0)  # the pointstamps/frontiers partitions are written in the same pass
    points = pl.read_delta(str(service.warehouse / "pointstamps")).filter(pl.col("dataflow_id") == dataflow_id)
    assert [(r["node"], r["kind"], r["time"], r["count"]) for r in points.to_dicts()] == [(0, "source", [4], 1)]
    fronts = pl.read_delta(str(service.warehouse / "frontiers")).filter(pl.col("dataflow_id") == dataflow_id)
    got = {(r["node"], r["port"], r["kind"], tuple(r["time"])) for r in fronts.to_dicts()}
    want = {(row["location"]["node"], row["location"]["port"], row["location"]["kind"], tuple(t))
            for row in frontier["locations"] for t in row["frontier"]}
    assert got == want
    # The incremental Spark job resumes from the version the pointstamps were written as of.
    from spark_jobs.storage import Warehouse

    assert Warehouse(service.warehouse).pointstamps_version(dataflow_id) == 1


def test_a_restart_reports_the_spark_check_without_running_it_again(service: ServiceProcess) -> None:
    """A concluded check is logged: after a restart the status says so at once, long before the
    restarted service's Spark session could have run the check again."""
    dataflow_id, token = register(service, loop_graph(operators=3, name="checked"))
    with service.client(token) as client:
        wait_for("the Spark check", lambda: client.get(f"/v1/dataflows/{dataflow_id}").json()[
            "status"]["spark_check"] == "agreed")
    service.stop()
    service.start()
    with service.client(token) as client:
        status = client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]
        spark = client.get("/healthz").json()["spark"]
    assert status["spark_check"] == "agreed" and "agree" in status["spark_detail"], status
    assert spark != "ready", "Spark was up already when the status was read: the test proves nothing"


def test_registrations_waiting_together_share_one_spark_check(service: ServiceProcess) -> None:
    """Registrations made while Spark is busy (or starting) are checked by one batched job."""
    registered = [register(service, loop_graph(operators=2 + i, name=f"burst-{i}")) for i in range(3)]
    details = []
    for dataflow_id, token in registered:
        with service.client(token) as client:
            path = f"/v1/dataflows/{dataflow_id}"
            status = wait_for("the Spark check", lambda c=client, p=path: (s := c.get(p).json()["status"])[
                "spark_check"] not in ("pending", "running") and s)
        assert status["spark_check"] == "agreed", status
        details.append(status["spark_detail"])
    shared = [int(d.split("one Spark job for ")[1].split(" ")[0]) for d in details]
    assert max(shared) >= 2, details  # the first may go alone; the others wait for it and go together


def _nice(pid: int) -> int:
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[16])


def test_processes_by_role_the_hot_path_holds_no_spark(service: ServiceProcess) -> None:
    """``GET /v1/processes`` reads the hot-path process's own ``sys.modules``: no pyspark, no
    py4j, no JVM under it; the Spark process holds the JVM and runs ``TRACKER_SPARK_NICE`` nicer."""
    wait_for("the Spark session", lambda: httpx.get(service.url + "/healthz").json()["spark"] == "ready", 600)
    processes = {p["role"]: p for p in service.processes()}
    assert set(processes) == {"supervisor", "hot", "spark"}
    assert service.process is not None and processes["supervisor"]["pid"] == service.process.pid
    hot, spark = processes["hot"], processes["spark"]
    assert hot["pyspark"] is False and hot["py4j"] is False and hot["jvm"] is None
    assert not [p for p in descendants(hot["pid"]) if b"java" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert spark["pyspark"] is True and spark["jvm"] in descendants(spark["pid"])
    assert spark["master"] == "local[1]"
    assert _nice(spark["pid"]) == min(19, _nice(hot["pid"]) + 3) == spark["nice"]
    with httpx.Client(base_url=service.url) as client:
        assert client.get("/v1/processes").status_code == 401


def test_an_audit_on_demand(service: ServiceProcess) -> None:
    dataflow_id, token = register(service, loop_graph(operators=2, name="on-demand"))
    with service.client(token) as client:
        client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [0], -1), update(0, 0, "source", [7], 1)]})
        refused = client.post(f"/v1/dataflows/{dataflow_id}/audit")
        assert refused.status_code == 403, refused.text
    wait_for("the Spark session", lambda: httpx.get(service.url + "/healthz").json()["spark"] == "ready", 600)
    with service.client() as admin:
        def queue() -> httpx.Response | None:  # the periodic audits (every second here) may be in flight
            answer = admin.post(f"/v1/dataflows/{dataflow_id}/audit")
            assert answer.status_code in (202, 409), answer.text
            if answer.status_code == 409:
                assert answer.json()["error"] == "audit_in_flight", answer.text
                return None
            return answer

        queued = wait_for("an audit queued on demand", queue, 600)
        assert queued.json() == {"queued": "audit", "dataflow": dataflow_id, "version": 1}
        audit = wait_for("the audit", lambda: (a := admin.get(f"/v1/dataflows/{dataflow_id}").json()["status"][
            "audit"]) and a.get("version") == 1 and a)
        assert audit["ok"] is True, audit


def _audit_on_demand(service: ServiceProcess, dataflow_id: str, version: int) -> dict:
    """Queue an audit of ``dataflow_id`` (retrying while a periodic one is in flight) and wait for
    the audit of ``version`` to land."""
    with service.client() as admin:
        def queue() -> httpx.Response | None:
            answer = admin.post(f"/v1/dataflows/{dataflow_id}/audit")
            assert answer.status_code in (202, 409), answer.text
            return answer if answer.status_code == 202 else None

        assert wait_for("an audit queued on demand", queue, 600).json()["version"] == version
        return wait_for("the audit", lambda: (a := admin.get(f"/v1/dataflows/{dataflow_id}").json()["status"][
            "audit"]) and a.get("version") == version and a)


def test_a_nested_dataflow_is_checked_and_audited_scope_by_scope(service: ServiceProcess) -> None:
    """The Spark process builds the nested graph from the registration it is told of: its check
    covers every scope (``agreed``, ``Psi`` of both scopes in ``summaries``), and an audit
    recomputes the frontier of all 11 locations from the counts the hot path sent in scoped
    form, equal to the live one."""
    dataflow_id, token = register(service, loop_then_stage("nested-spark"))
    with service.client(token) as client:
        status = wait_for("the Spark check", lambda: (s := client.get(f"/v1/dataflows/{dataflow_id}").json()[
            "status"])["spark_check"] not in ("pending", "running") and s)
        assert status["spark_check"] == "agreed", status
        assert "in 2 scope(s) and the scope summaries agree" in status["spark_detail"], status
        # The input moves on to 3 and a record waits inside the loop at (2, 1): frontiers inside
        # and after the loop depend on both, across the scope boundary.
        inside = {"scope": [1], "node": 1, "port": 0, "kind": "source"}
        answer = client.post(f"/v1/dataflows/{dataflow_id}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [0], -1), update(0, 0, "source", [3], 1),
            {"location": inside, "time": [2, 1], "delta": 1}]})
        assert answer.status_code == 200, answer.text
        after = [r["frontier"] for r in client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()["locations"]
                 if r["location"] == {"node": 2, "port": 0, "kind": "target"}]
        assert after == [[[2]]]
    wait_for("the Spark session", lambda: httpx.get(service.url + "/healthz").json()["spark"] == "ready", 600)
    audit = _audit_on_demand(service, dataflow_id, 1)
    assert audit["ok"] is True and audit["mismatches"] == [] and audit["locations"] == 11, audit
    summaries = pl.read_delta(str(service.warehouse / "summaries")).filter(pl.col("dataflow_id") == dataflow_id)
    assert sorted({tuple(scope) for scope in summaries["scope"].to_list()}) == [(), (1,)]


def test_healthz_names_the_graph_engine(service: ServiceProcess) -> None:
    health = wait_for("the Spark session", lambda: (h := httpx.get(service.url + "/healthz").json())[
        "spark"] == "ready" and h, 600)
    assert health["graph_engine"] == "graphx", health
    spark = next(p for p in service.processes() if p["role"] == "spark")
    assert spark["graph_engine"].startswith("graphx (helper ") and spark["graph_engine"].endswith(".jar)"), spark


def test_a_missing_graphx_helper_is_a_one_line_setup_error(start_service: ServiceStarter, tmp_path: Path) -> None:
    """No helper built (an empty cache): the Spark process does not start a session, says why in
    one line, and ``/healthz`` shows it, with when it is tried again (a set-up error: after a
    minute); the service serves without Spark (nothing falls back to the DataFrame path silently)."""
    service = start_service(spark=True, XDG_CACHE_HOME=str(tmp_path / "empty-cache"))
    health = wait_for("the Spark process's verdict", lambda: (h := httpx.get(service.url + "/healthz").json())[
        "spark"] == "down" and "spark_retry_in_seconds" in h and h, 300)
    assert health["spark_reason"].startswith("set-up error: the GraphX helper is not built"), health
    assert 30 < health["spark_retry_in_seconds"] <= 60, health
    assert "\n" not in health["spark_reason"] and health["graph_engine"] is None and health["status"] == "ok", health
    logged = [line for line in service.log_path.read_text().splitlines() if "spark session not started" in line]
    assert len(logged) == 1 and "Traceback" not in service.log_path.read_text(), logged
