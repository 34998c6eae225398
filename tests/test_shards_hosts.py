"""Shards on other hosts: two network namespaces stand for two machines, each with its own
address on a veth pair to this one, each running ``tracker shard K``; ``tracker serve`` here runs
shard 0, the front and HAProxy, and lists them in ``--shard-hosts``. All three share one Delta
warehouse (one file system, as a shared volume would be).

What is checked: registration spreads over the three hosts and each dataflow's routes reach its
shard through the proxy, its ``endpoint`` naming the other host's address; a Spark job reads
every shard's rows from the one warehouse, each acknowledged batch exactly once; when one host
is gone (its shard killed, its link down) its dataflows answer 503 ``shard_unavailable`` naming
the shard while the other hosts' dataflows keep answering.

The test makes the namespaces and removes them (it needs root and ``ip``: it fails, naming
what is missing, otherwise).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest

from api.shards.ids import shard_of
from bench.hosts import Host
from tests.helpers import ServiceStarter, loop_graph, update, wait_for

pytestmark = pytest.mark.service


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[list[Host]]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("network namespaces need root and iproute2's `ip` (apt-get install iproute2)", pytrace=False)
    made: list[Host] = []
    try:
        for shard in (1, 2):
            made.append(Host(shard, tmp_path / "warehouse", tmp_path / f"shard-{shard}.log"))
        yield made
    finally:
        for host in made:
            host.remove()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_shards_on_two_other_hosts_share_the_warehouse_and_one_host_gone_is_named(
        hosts: list[Host], start_service: ServiceStarter, spark: Any) -> None:
    for host in hosts:
        wait_for(f"shard {host.shard} at {host.url}", lambda h=host: _answers(h.url), 60, interval=0.2)  # type: ignore[misc]
    service = start_service(shards=1, shard_hosts=",".join(f"{h.shard}={h.url}" for h in hosts),
                            TRACKER_FLUSH_SECONDS="0.2")
    assert str(service.warehouse) == hosts[0].process.args[-1]  # one warehouse for the three hosts
    wait_for("every shard up at the front", lambda: httpx.get(service.url + "/healthz").json()["status"] == "ok",
             30, interval=0.2)
    made: list[dict[str, Any]] = []
    with service.client() as client:
        for i in range(3):
            answer = client.post("/v1/dataflows", json=loop_graph(operators=3, name=f"hosted-{i}"))
            assert answer.status_code == 201, answer.text
            made.append(answer.json())
    by_shard = {shard_of(m["id"]): m for m in made}
    assert sorted(by_shard) == [0, 1, 2]
    for host in hosts:
        assert by_shard[host.shard]["endpoint"] == host.url
    batches = 5
    for m in made:
        for seq in range(batches):
            answer = httpx.post(f"{service.url}/v1/dataflows/{m['id']}/progress",
                                headers={"Authorization": f"Bearer {m['token']}"},
                                json={"worker": "w", "seq": seq, "updates": [update(0, 0, "source", [seq + 1], 1)]})
            assert answer.status_code == 200 and answer.json()["version"] == seq + 1, answer.text
    gone = by_shard[2]

    def flushed() -> bool:  # shard 2's rows are in the shared tables before its host goes
        rows = pl.read_delta(str(service.warehouse / "progress")).filter(pl.col("dataflow_id") == gone["id"])
        return rows.filter(pl.col("version") > 0).height == batches

    wait_for("shard 2's rows in the warehouse", flushed, 30, interval=0.2)
    hosts[1].gone()

    seen: list[str] = []

    def refused() -> dict[str, Any] | None:
        answer = httpx.get(f"{service.url}/v1/dataflows/{gone['id']}/frontier", headers=service.admin_headers,
                           timeout=10)
        seen.append(f"{answer.status_code} {answer.text[:200]}")
        return answer.json() if answer.status_code == 503 else None

    try:
        body = wait_for("shard 2's dataflow to answer 503", refused, 20, interval=0.2)
    except AssertionError:
        raise AssertionError(f"shard 2's dataflow never answered 503; its last answers: {seen[-3:]}") from None
    assert body["error"] == "shard_unavailable" and body["shard"] == 2 and hosts[1].url in body["detail"]
    for shard in (0, 1):  # the other hosts' dataflows keep answering
        m = by_shard[shard]
        answer = httpx.post(f"{service.url}/v1/dataflows/{m['id']}/progress",
                            headers={"Authorization": f"Bearer {m['token']}"},
                            json={"worker": "w", "seq": batches, "updates": [update(0, 0, "source", [9], 1)]})
        assert answer.status_code == 200 and answer.json()["version"] == batches + 1
    health = httpx.get(service.url + "/healthz").json()
    assert health["status"] == "degraded" and [s["status"] for s in health["shards"]] == ["ok", "ok", "unavailable"]
    service.stop()  # graceful: shard 0's last flush
    hosts[0].remove()  # and shard 1's
    # Spark reads every shard's rows from the one warehouse: each acknowledged batch once.
    progress = spark.read.format("delta").load(str(service.warehouse / "progress"))  # type: ignore[attr-defined]
    rows = progress.filter("version > 0").select("dataflow_id", "worker", "seq").collect()
    found = {(r["dataflow_id"], r["worker"], r["seq"]) for r in rows}
    assert len(rows) == len(found)  # none twice
    expected = {(m["id"], "w", s) for m in made for s in range(batches)}
    expected |= {(by_shard[k]["id"], "w", batches) for k in (0, 1)}
    assert found == expected


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None:
        pytest.fail("network namespaces need root, iproute2's `ip` and `iptables` (apt-get install iproute2 iptables)",
                    pytrace=False)
    made = Host(1, tmp_path / "warehouse", tmp_path / "shard-1.log")
    try:
        yield made
    finally:
        made.remove()


def test_a_host_dropping_packets_costs_registrations_seconds_and_none_is_registered_twice(
        host: Host, start_service: ServiceStarter) -> None:
    """Shard 1's host drops every packet for its port: every registration still succeeds, on
    shard 0, within a few seconds (connect and answer timeouts at the front, not a 503 naming
    shard 1); the list and ``/healthz`` answer within a few seconds naming shard 1; once the
    packets flow again shard 1 takes registrations again, and no registration exists twice."""
    wait_for(f"shard 1 at {host.url}", lambda: _answers(host.url), 60, interval=0.2)
    service = start_service(shards=1, shard_hosts=f"1={host.url}")
    wait_for("both shards up at the front", lambda: httpx.get(service.url + "/healthz").json()["status"] == "ok",
             30, interval=0.2)
    names = [f"dropped-{i}" for i in range(8)]
    with service.client() as client:
        assert client.post("/v1/dataflows", json=loop_graph(operators=3, name="before")).status_code == 201
        host.drop()
        try:
            for name in names:
                began = time.monotonic()
                answer = client.post("/v1/dataflows", json=loop_graph(operators=3, name=name))
                assert answer.status_code == 201, answer.text
                assert time.monotonic() - began < 6 and shard_of(answer.json()["id"]) == 0, answer.json()
            began = time.monotonic()
            listed = client.get("/v1/dataflows")
            assert time.monotonic() - began < 6 and listed.headers["x-tracker-shards-unavailable"] == "1"
            health = client.get("/healthz").json()
            assert health["status"] == "degraded" and health["shards"][1]["status"] == "unavailable", health
        finally:
            host.drop(on=False)
        wait_for("shard 1 up again", lambda: client.get("/healthz").json()["status"] == "ok", 30, interval=0.2)
        again = client.post("/v1/dataflows", json=loop_graph(operators=3, name="after"))
        assert again.status_code == 201 and shard_of(again.json()["id"]) == 1, again.json()  # the least loaded
        time.sleep(1.0)
        found = sorted(d["name"] for d in client.get("/v1/dataflows").json())
    assert found == sorted(["before", *names, "after"]), found
