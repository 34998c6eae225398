"""The Prometheus alerting rules shipped in ``ops/prometheus/``: checked and unit-tested with
Debian's ``promtool`` (every alert fires, then resolves: ``alerts_test.yml``), written only
against series the service exports, and loaded by a real Prometheus (Debian's ``prometheus``)
that scrapes a running service and fires the violation alert when a dataflow is in violation.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.helpers import ROOT, ServiceStarter, free_port, loop_graph, register, update

RULES = ROOT / "ops" / "prometheus"


def tool(name: str) -> str:
    """Debian's ``prometheus`` package's binary ``name``; fails (not skips) when it is missing:
    bin/test installs it."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: run bin/test (it installs it) or `apt-get install -y prometheus`",
                    pytrace=False)
    return found


def test_the_rules_check_and_every_alert_fires_and_resolves_in_their_unit_tests() -> None:
    checked = subprocess.run([tool("promtool"), "check", "rules", "alerts.yml"], cwd=RULES, capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS: 11 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = subprocess.run([tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=RULES, capture_output=True,
                            text=True, timeout=60)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    config = subprocess.run([tool("promtool"), "check", "config", "prometheus.example.yml"], cwd=RULES,
                            capture_output=True, text=True, timeout=60)
    assert config.returncode == 0, config.stdout + config.stderr
    # Each alert has a test that expects it firing at some time and resolved at a later one.
    alerts = {rule["alert"] for group in yaml.safe_load((RULES / "alerts.yml").read_text())["groups"]
              for rule in group["rules"]}
    tests = yaml.safe_load((RULES / "alerts_test.yml").read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t["alert_rule_test"] if case["exp_alerts"]}
    resolved = {case["alertname"] for t in tests for case in t["alert_rule_test"]
                if not case["exp_alerts"] and any(c["alertname"] == case["alertname"] and c["exp_alerts"]
                                                  and _seconds(c["eval_time"]) < _seconds(case["eval_time"])
                                                  for c in t["alert_rule_test"])}
    assert fired == alerts and resolved == alerts, (alerts - fired, alerts - resolved)


def _seconds(duration: str) -> int:
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([hms])", duration))


def test_the_rules_use_only_series_the_service_exports(start_service: ServiceStarter) -> None:
    service = start_service(TRACKER_DELTA="0")
    exported = set(re.findall(r"^# TYPE (\w+) (\w+)", httpx.get(service.url + "/metrics").text, re.M))
    names = {name for name, kind in exported} | {f"{name}_total" for name, kind in exported if kind == "counter"}
    used = set()
    for group in yaml.safe_load((RULES / "alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            used |= set(re.findall(r"\b(tracker_\w+|up)\b", rule["expr"]))
    assert used - {"up"} <= names, used - names


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    """A function starting Debian's Prometheus on loopback with the shipped rules, scraping the
    given services every second; stopped at the test's end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*service_urls: str) -> str:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES / "alerts.yml")],
            "scrape_configs": [{"job_name": "tracker", "static_configs": [
                {"targets": [u.removeprefix("http://") for u in service_urls]}]}]}))
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - the child writes to it
        started.append(subprocess.Popen([tool("prometheus"), f"--config.file={config}",
                                         f"--storage.tsdb.path={tmp_path / 'data'}",
                                         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log))
        log.close()
        return f"http://127.0.0.1:{port}"

    try:
        yield start
    finally:
        for process in started:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def _until(what: str, probe: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = probe()
        except httpx.HTTPError:
            found = None
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_a_real_prometheus_scrapes_the_service_and_fires_the_violation_alert(
        start_service: ServiceStarter, prometheus: Any) -> None:
    service = start_service(TRACKER_DELTA="0")
    dataflow, token = register(service, loop_graph(3, name="alerting"))
    # The input drops its capability and a message nobody sent is retired at op2: a count of -1
    # that nothing live can explain.
    with service.client(token) as client:
        assert client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": "w", "seq": 0, "updates": [
            update(0, 0, "source", [0], -1), update(2, 0, "target", [4], -1)]}).status_code == 200
    url = prometheus(service.url)

    def query(expr: str) -> list[dict[str, Any]]:
        answer = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=5).json()
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    up = _until("Prometheus scrapes the service", lambda: query('up{job="tracker"} == 1'))
    assert up[0]["metric"]["instance"] == service.url.removeprefix("http://")
    violations = _until("the scraped state gauge shows the violation",
                        lambda: query('tracker_dataflows_in_state{state="violation"} == 1'))
    assert violations[0]["metric"]["job"] == "tracker"
    firing = _until("the violation alert fires", lambda: [
        a for a in httpx.get(url + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        if a["labels"]["alertname"] == "TrackerProtocolViolation" and a["state"] == "firing"])
    assert firing[0]["labels"]["severity"] == "critical"
    assert "1 dataflow(s)" in firing[0]["annotations"]["summary"]
    # The rules' evaluation is healthy: every rule of the group evaluated without error.
    groups = httpx.get(url + "/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert [r["health"] for g in groups for r in g["rules"]] == ["ok"] * 11


def test_a_real_prometheus_scraping_fresh_idle_services_fires_nothing(start_service: ServiceStarter,
                                                                     prometheus: Any) -> None:
    """A fresh service, with Spark starting and then ready, and one with Spark off: no audit has
    concluded on either, and no alert fires or is even pending."""
    services = [start_service(spark=True), start_service(TRACKER_SPARK="0")]
    url = prometheus(*(s.url for s in services))

    def query(expr: str) -> list[dict[str, Any]]:
        answer = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=5).json()
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    _until("Prometheus scrapes both services", lambda: len(query('up{job="tracker"} == 1')) == 2)
    states = _until("both services' Spark states", lambda: {
        r["metric"]["state"] for r in query("tracker_spark_state == 1")} >= {"disabled"} and query(
        "tracker_spark_state == 1"))
    assert len(states) == 2, states
    assert [r["value"][1] for r in query("tracker_audit_mismatched_dataflows")] == ["0", "0"]
    time.sleep(10)  # ten rule evaluations over the fresh services
    alerts = httpx.get(url + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    assert alerts == [], alerts
