"""Real timely-dataflow programs as clients of the real service, checked against timely itself.

The connector crate (``connectors/timely``) is built (debug) and its example programs run with
1 and 4 workers against a service started for real. Every run journals what each worker sent;
``timely-progress-check`` then replays, in the service's version order, exactly those updates
into timely's own ``reachability::Tracker``s (one per scope, wired as timely's subgraphs are)
and compares every location's frontier at every version with what the service published (the
snapshot of version 0 and every SSE ``changes`` event after it). The rules checked: every
frontier the service reported equals the one timely's trackers had for the same updates, none
is ahead of timely's, and at the end every frontier is empty in both, the dataflow
``complete`` with no negative count, and each worker's last ``seq`` the one it sent.
The check is shown to fail on a history or a journal that differs by one update.

Also: a program holding a capability on purpose is blamed on the right operator and worker
(``explain``, ``lag``), and a program whose service goes away and comes back keeps running,
says so once, and ends ``complete``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.timely import build, check, fetch_history, registered_id, run_example, start_example
from tests.helpers import ServiceProcess, ServiceStarter, wait_for

pytestmark = pytest.mark.service(TRACKER_SUBSCRIBER_QUEUE="1000000", TRACKER_SUBSCRIBER_BYTES=str(1 << 30),
                                 TRACKER_STALL_SECONDS="600")


@pytest.fixture(scope="module")
def binaries() -> Path:
    """The examples and the checker, built once (debug; the target directory is cached)."""
    return build(release=False)


def run_and_check(service: ServiceProcess, binaries: Path, workdir: Path, example: str, workers: int,
                  args: list[str]) -> dict[str, Any]:
    """Run ``example`` attached, then hold the service to timely at every version."""
    journal = workdir / f"journal-{example}-{workers}"
    name = f"{example}-{uuid.uuid4().hex[:8]}"
    # A short linger makes many small batches: more versions, more intermediate states checked.
    run = run_example(binaries, example, ["-w", str(workers), "--name", name, "--journal", str(journal),
                                          "--linger-ms", "1", *args], url=service.url)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "does not answer" not in run.stderr, run.stderr[-3000:]
    dataflow_id = registered_id(journal)
    with service.client() as client:
        dataflow = client.get(f"/v1/dataflows/{dataflow_id}").json()
        history = fetch_history(client, dataflow_id)
    status = dataflow["status"]
    assert status["state"] == "complete", status
    assert status["violations"] == [], status
    # Each worker's batches were all applied, once: its last seq is its batch count minus one.
    sent = {}
    for path in journal.glob("w*.jsonl"):
        seqs = [json.loads(line)["batch"]["seq"] for line in path.read_text().splitlines() if '"batch"' in line]
        sent[path.stem] = max(s for s in seqs if s is not None)
    assert status["workers"] == sent
    assert len(sent) == workers
    report = check(binaries, journal, history, workdir)
    assert report["error"] is None, report
    assert report["workers"] == workers
    assert report["versions"] == dataflow["version"] + 1, report  # every version, 0 included
    assert report["mismatches"] == 0 and report["ahead"] == 0, report["first_mismatches"]
    assert report["exact"] + report["intermediate"] == report["versions"]
    assert report["timely_final_empty"] and report["service_final_empty"], report
    assert report["timely_final_counts_zero"], report["nonzero_counts"]  # every update counted once
    assert report["exit"] == 0
    report["journal"] = str(journal)
    report["history"] = history
    return report


@pytest.fixture(scope="module")
def collatz(service: ServiceProcess, binaries: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The loop example with 4 workers, run and checked once for the module."""
    return run_and_check(service, binaries, tmp_path_factory.mktemp("collatz"), "collatz", 4,
                         ["--rounds", "12", "--records", "300"])


def test_a_loop_at_the_root_matches_timely_at_every_version(collatz: dict[str, Any]) -> None:
    # Checked by the fixture; here, that it checked something substantial.
    assert collatz["versions"] > 30, collatz
    assert collatz["locations"] >= 16  # the region's operators included


def test_bfs_in_an_iterative_scope_matches_timely_at_every_version(service: ServiceProcess, binaries: Path,
                                                                  tmp_path: Path) -> None:
    report = run_and_check(service, binaries, tmp_path, "bfs", 4,
                           ["--rounds", "10", "--nodes", "1000", "--edges", "3000"])
    assert report["versions"] > 30, report  # how many depends on timing; each was checked


def test_differential_iterate_matches_timely_at_every_version(service: ServiceProcess, binaries: Path,
                                                              tmp_path: Path) -> None:
    report = run_and_check(service, binaries, tmp_path, "dd_bfs", 4,
                           ["--rounds", "6", "--nodes", "300", "--edges", "600", "--changes", "10"])
    assert report["locations"] > 40, report  # differential's operators inside the loop


def test_one_worker_matches_timely_too(service: ServiceProcess, binaries: Path, tmp_path: Path) -> None:
    run_and_check(service, binaries, tmp_path, "bfs", 1, ["--rounds", "3", "--nodes", "300", "--edges", "600"])


def _rewrite_journal(source: Path, target: Path, edit: Any) -> None:
    target.mkdir()
    for path in source.glob("w*.jsonl"):
        lines = [edit(path.stem, json.loads(line)) for line in path.read_text().splitlines()]
        target.joinpath(path.name).write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_check_fails_on_one_update_more_or_less(collatz: dict[str, Any], binaries: Path, tmp_path: Path) -> None:
    history = collatz["history"]
    # The service's side: one published frontier element left out, as if the service had let a
    # time pass early; the check says the service was ahead.
    changes = [dict(event) for event in history["changes"]]
    middle = next(i for i in range(len(changes) // 2, len(changes))
                  if any(c["diff"] > 0 for c in changes[i]["changes"]))
    kept = list(changes[middle]["changes"])
    kept.remove(next(c for c in kept if c["diff"] > 0))
    changes[middle] = {**changes[middle], "changes": kept}
    report = check(binaries, Path(collatz["journal"]), {**history, "changes": changes}, tmp_path)
    assert report["exit"] == 1 and report["mismatches"] > 0 and report["ahead"] > 0, report

    # Timely's side: one update fewer, as a connector forgetting one (or counting one twice on
    # the other side) would make the two differ: a retirement (-1) lost leaves a capability
    # that holds frontiers for ever; an increment lost leaves a count that stays negative,
    # which no frontier shows but the final counts do.
    for sign in (-1, 1):
        dropped = {"done": False}

        def drop_one(worker: str, record: dict[str, Any], sign: int = sign,
                     dropped: dict[str, bool] = dropped) -> dict[str, Any]:
            batch = record.get("batch")
            if worker == "w1" and batch and not dropped["done"]:
                for index, update in enumerate(batch["raw"]):
                    if update[5] * sign > 0:  # [identifier, node, port, is_source, time, delta]
                        del batch["raw"][index]
                        dropped["done"] = True
                        break
            return record

        _rewrite_journal(Path(collatz["journal"]), tmp_path / f"dropped{sign}", drop_one)
        report = check(binaries, tmp_path / f"dropped{sign}", history, tmp_path)
        assert dropped["done"] and report["exit"] == 1, report
        assert report["timely_final_counts_zero"] is False and report["nonzero_counts"], report
        if sign < 0:
            assert report["mismatches"] > 0 and not report["timely_final_empty"], report

    # Forgetting the initial capabilities (each worker's tracker starts with one per worker).
    def one_peer(worker: str, record: dict[str, Any]) -> dict[str, Any]:
        if "registered" in record:
            record["registered"]["graph"]["peers"] = 1
        return record

    _rewrite_journal(Path(collatz["journal"]), tmp_path / "one-peer", one_peer)
    report = check(binaries, tmp_path / "one-peer", history, tmp_path)
    assert report["exit"] == 1 and report["mismatches"] > 0, report
    assert report["ahead"] == 0, report  # timely's side is the one ahead now


def _node(dataflow: dict[str, Any], name: str) -> int:
    return next(int(node["id"]) for node in dataflow["nodes"] if node["name"] == name)


def test_a_held_capability_is_blamed_on_its_operator_and_worker(service: ServiceProcess, binaries: Path) -> None:
    name = f"stuck-{uuid.uuid4().hex[:8]}"
    program = start_example(binaries, "stuck", ["-w", "4", "--name", name, "--hold-at", "3", "--holder", "2",
                                                "--hold-seconds", "12"], url=service.url)
    try:
        with service.client() as client:
            listed = wait_for("the dataflow registered", lambda: client.get("/v1/dataflows", params={"name": name})
                              .json() or None, timeout=60)
            dataflow_id = listed[0]["id"]
            dataflow = client.get(f"/v1/dataflows/{dataflow_id}").json()
            probe, hold = _node(dataflow, "Probe"), _node(dataflow, "Hold")

            def held_at_three() -> Any:
                answer = client.get(f"/v1/dataflows/{dataflow_id}/frontier",
                                    params={"node": probe, "port": 0, "kind": "target"}).json()
                return answer["locations"][0]["frontier"] == [[3]] or None

            wait_for("the probe held at epoch 3", held_at_three, timeout=60)
            explained = client.get(f"/v1/dataflows/{dataflow_id}/frontier/explain",
                                   params={"node": probe, "port": 0, "kind": "target", "time": "5"}).json()
            assert explained["safe_to_notify"] is False
            assert [(b["operator"], b["worker"], b["time"], b["location"]) for b in explained["blockers"]] == [
                ("Hold", "w2", [3], {"node": hold, "port": 0, "kind": "source"})], explained
            lag = client.get(f"/v1/dataflows/{dataflow_id}/lag").json()
            held = [row for row in lag["locations"]
                    if row["operator"] == "Hold" and row["location"]["kind"] == "source"]
            assert held and held[0]["oldest_pointstamp"]["worker"] == "w2", lag
            assert held[0]["oldest_pointstamp"]["time"] == [3]
        _, err = program.communicate(timeout=120)
        assert program.returncode == 0, err[-3000:]
        with service.client() as client:
            assert client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]["state"] == "complete"
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()


@pytest.fixture
def lone_service(start_service: ServiceStarter) -> Iterator[ServiceProcess]:
    """A service of this test's own, to stop and start again."""
    yield start_service()


def test_the_program_outlives_an_outage_and_catches_up(lone_service: ServiceProcess, binaries: Path) -> None:
    name = f"outage-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    program = start_example(binaries, "stuck", ["-w", "4", "--name", name, "--hold-at", "3", "--hold-seconds", "10"],
                            url=lone_service.url)
    try:
        with lone_service.client() as client:
            listed = wait_for("the dataflow registered", lambda: client.get("/v1/dataflows", params={"name": name})
                              .json() or None, timeout=60)
        dataflow_id = listed[0]["id"]
        lone_service.stop()
        stopped = time.monotonic()
        assert stopped - started < 10, "the service must go away before the capability is released"
        # The capability is released (10 s after the start) and the workers finish meanwhile.
        time.sleep(max(0.0, started + 13 - time.monotonic()))
        assert program.poll() is None, "the program must wait for its last batches, not give up or crash"
        lone_service.restart()
        _, err = program.communicate(timeout=120)
        assert program.returncode == 0, err[-3000:]
        # Each worker says it once, at most (a worker with nothing to send meanwhile says
        # nothing); the holder, which released its capability during the outage, said both.
        for worker in range(4):
            said = [line for line in err.splitlines() if line.startswith(f"timely-progress-service (worker {worker})")]
            unreachable = sum("does not answer" in line for line in said)
            assert unreachable <= 1 and sum("answers again" in line for line in said) == unreachable, said
            if worker == 3:
                assert unreachable == 1, said
        with lone_service.client() as client:
            status = client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]
            frontier = client.get(f"/v1/dataflows/{dataflow_id}/frontier").json()
        assert status["state"] == "complete" and status["violations"] == [], status
        assert all(entry["frontier"] == [] for entry in frontier["locations"])
        assert set(status["workers"]) == {"w0", "w1", "w2", "w3"}
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()


def test_a_dataflow_the_service_refuses_does_not_stop_the_program(service: ServiceProcess, binaries: Path) -> None:
    # A token the service does not know: registration is refused (401), which the connector
    # says once per worker; the program still runs to completion.
    run = run_example(binaries, "collatz", ["-w", "2", "--rounds", "2", "--records", "50", "--name",
                                            f"refused-{uuid.uuid4().hex[:8]}"], url=service.url, token="wrong")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stderr.splitlines()
    assert any(line.startswith("timely-progress-service (worker 0)") and "registration refused with HTTP 401" in line
               for line in lines), run.stderr
    assert any(line.startswith("timely-progress-service (worker 1)") and "worker 0 could not register it" in line
               for line in lines), run.stderr
    with httpx.Client(base_url=service.url, headers=service.admin_headers) as client:
        assert all(not d["name"].startswith("refused-") for d in client.get("/v1/dataflows").json())
