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

Held programs under both of timely's progress modes: ``Hold`` in an iterative scope keeps a
capability, on one worker and on two, while records go round the loop between workers behind
it. Under ``Demand`` (timely's default) the workers defer the ``+1`` s those records make while
they cannot change any frontier, so the service sees the receivers' ``-1`` s first: negative
counts for as long as the capability is held. Neither mode is a violation; both are ``stalled``
with the held capabilities blamed. The journal of such a run, posted again batch by batch, is
never a violation at any version; the same journal with one message consumed twice is one.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.timely import build, check, fetch_history, registered_id, run_example, start_example
from tests.helpers import ServiceProcess, ServiceStarter, program_token, wait_for

pytestmark = pytest.mark.service(TRACKER_SUBSCRIBER_QUEUE="1000000", TRACKER_SUBSCRIBER_BYTES=str(1 << 30),
                                 TRACKER_STALL_SECONDS="2")
HOLD_SECONDS = 8
"""How long the held programs hold their capabilities (long enough to be seen stalled)."""


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
                                          "--linger-ms", "1", *args], url=service.url,
                      token=program_token(service))
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
                                                "--hold-seconds", "12"], url=service.url,
                            token=program_token(service))
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
                            url=lone_service.url, token=program_token(lone_service))
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


def _scoped_node(dataflow: dict[str, Any], name: str) -> tuple[list[int], int]:
    """``(scope path, node id)`` of the operator named ``name``, in whichever scope."""
    def search(nodes: list[dict[str, Any]], path: list[int]) -> tuple[list[int], int] | None:
        for node in nodes:
            if node.get("name") == name:
                return path, int(node["id"])
            if "scope" in node:
                found = search(node["scope"]["nodes"], [*path, int(node["id"])])
                if found is not None:
                    return found
        return None

    found = search(dataflow["nodes"], [])
    assert found is not None, f"no operator {name}"
    return found


class HeldRun:
    """A nested ``stuck`` program holding capabilities on ``holders`` workers, watched while it runs."""

    def __init__(self, service: ServiceProcess, binaries: Path, mode: str, holders: int, journal: Path | None) -> None:
        self.service, self.holders, self.journal = service, holders, journal
        self.name = f"held-{mode}-{holders}-{uuid.uuid4().hex[:6]}"
        args = ["-w", "4", "--name", self.name, "--progress-mode", mode, "--nested", "1", "--holder", "3",
                "--holders", str(holders), "--hold-at", "3", "--hold-seconds", str(HOLD_SECONDS), "--rounds", "6",
                "--records", "5", "--round-ms", "300"]
        if journal is not None:
            args += ["--journal", str(journal)]
        self.program = start_example(binaries, "stuck", args, url=service.url, token=program_token(service))
        self.id: str | None = None
        self.states: set[str] = set()
        self.negative_polls = 0
        self.stalled: dict[str, Any] | None = None
        self.explained: dict[str, Any] | None = None
        self.lag: dict[str, Any] | None = None

    def poll(self, client: httpx.Client) -> None:
        if self.id is None:
            listed = client.get("/v1/dataflows", params={"name": self.name}).json()
            self.id = listed[0]["id"] if listed else None
            return
        status = client.get(f"/v1/dataflows/{self.id}").json()["status"]
        self.states.add(status["state"])
        assert status["violations"] == [] and status["regression_count"] == 0, status
        counts = client.get(f"/v1/dataflows/{self.id}/pointstamps").json()
        self.negative_polls += any(row["count"] < 0 for row in counts)
        if status["state"] == "stalled" and self.stalled is None and self.program.poll() is None:
            dataflow = client.get(f"/v1/dataflows/{self.id}").json()
            probe = _node(dataflow, "Probe")
            self.stalled = dataflow
            self.explained = client.get(f"/v1/dataflows/{self.id}/frontier/explain",
                                        params={"node": probe, "port": 0, "kind": "target", "time": "9"}).json()
            self.lag = client.get(f"/v1/dataflows/{self.id}/lag").json()

    def check_blame(self) -> None:
        """The capabilities blamed are exactly the held ones: ``Hold``'s output in its scope, at
        ``(3 + j, 0)`` on worker ``w(3 - j)``."""
        assert self.stalled is not None and self.explained is not None and self.lag is not None, self.states
        path, hold = _scoped_node(self.stalled, "Hold")
        where = {"scope": path, "node": hold, "port": 0, "kind": "source"}
        expected = {(f"w{3 - j}", (3 + j, 0)) for j in range(self.holders)}
        explained = self.explained
        assert explained["safe_to_notify"] is False, explained
        sources = [b for b in explained["blockers"] if b["location"]["kind"] == "source"]
        assert {(b["worker"], tuple(b["time"])) for b in sources} == expected, explained["blockers"]
        assert all(b["location"] == where and b["operator"] == "Hold" and b["count"] == 1
                   and b["stall_kind"] == "held_capability" for b in sources), sources
        rows = [row for row in self.lag["locations"] if row["location"] == where]
        assert rows and rows[0]["frontier"] == [[3, 0]], rows
        oldest = rows[0]["oldest_pointstamp"]
        assert (oldest["worker"], tuple(oldest["time"])) in expected, rows

    def finish(self, client: httpx.Client) -> dict[str, Any]:
        _, err = self.program.communicate(timeout=120)
        assert self.program.returncode == 0, err[-3000:]
        assert self.id is not None
        status = client.get(f"/v1/dataflows/{self.id}").json()["status"]
        assert status["state"] == "complete" and status["violations"] == [], status
        return status


def _watch_held(service: ServiceProcess, binaries: Path, mode: str, journal: Path | None = None) -> list[HeldRun]:
    """One program holding on one worker and one holding on two, at once; polled until both end."""
    runs = [HeldRun(service, binaries, mode, 1, journal), HeldRun(service, binaries, mode, 2, None)]
    try:
        with service.client() as client:
            deadline = time.monotonic() + 120
            while any(run.program.poll() is None for run in runs) and time.monotonic() < deadline:
                for run in runs:
                    run.poll(client)
                time.sleep(0.2)
            for run in runs:
                run.finish(client)
    finally:
        for run in runs:
            if run.program.poll() is None:
                run.program.kill()
                run.program.wait()
    for run in runs:
        assert "violation" not in run.states and "stalled" in run.states, (run.name, run.states)
        run.check_blame()
    return runs


def test_held_capabilities_under_demand_are_stalled_not_violations(service: ServiceProcess, binaries: Path,
                                                                   tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    runs = _watch_held(service, binaries, "demand", journal)
    # The case in point: negative counts (the receivers' -1 before the senders' deferred +1)
    # were there while the capability was held.
    assert runs[0].negative_polls + runs[1].negative_polls >= 3, [(r.name, r.negative_polls) for r in runs]
    assert runs[0].id is not None
    _replay_journal(service, binaries, journal, runs[0].id, tmp_path)


def test_held_capabilities_under_eager_are_stalled_not_violations(service: ServiceProcess, binaries: Path) -> None:
    _watch_held(service, binaries, "eager")


def _bodies(binaries: Path, journal: Path, dataflow_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    result = subprocess.run([str(binaries / "timely-progress-replay"), "--journal", str(journal), "--dataflow",
                             dataflow_id], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return lines[0]["registration"], lines[1:]


def _post_all(service: ServiceProcess, registration: dict[str, Any], batches: list[dict[str, Any]], name: str
              ) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """Register ``registration`` anew and post ``batches`` in order; after each, the state and how
    many negative counts there are; and the final status."""
    seen = []
    with service.client() as client:
        answer = client.post("/v1/dataflows", json={**registration, "name": name})
        assert answer.status_code == 201, answer.text
        dataflow_id = answer.json()["id"]
        for batch in batches:
            posted = client.post(f"/v1/dataflows/{dataflow_id}/progress", json=batch["body"])
            assert posted.status_code == 200 and posted.json()["applied"], posted.text
            state = client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]["state"]
            counts = client.get(f"/v1/dataflows/{dataflow_id}/pointstamps").json()
            seen.append((state, sum(row["count"] < 0 for row in counts)))
        return seen, client.get(f"/v1/dataflows/{dataflow_id}").json()["status"]


def _replay_journal(service: ServiceProcess, binaries: Path, journal: Path, dataflow_id: str, workdir: Path) -> None:
    """The run's journal posted again, batch by batch: never a violation, though counts go
    negative; then with one message consumed twice: a violation naming it by the end, not before."""
    registration, batches = _bodies(binaries, journal, dataflow_id)
    seen, final = _post_all(service, registration, batches, f"replayed-{uuid.uuid4().hex[:6]}")
    assert [state for state, _ in seen if state == "violation"] == [], seen
    assert sum(negative > 0 for _, negative in seen) >= 1, seen
    assert final["state"] == "complete", final

    # A message retired twice: one consumption at Hold's input repeated in the same batch.
    doctored = {"done": False, "what": None}

    def consume_twice(worker: str, record: dict[str, Any]) -> dict[str, Any]:
        batch = record.get("batch")
        if batch and batch["id"] == dataflow_id and not doctored["done"] and batch["seq"] is not None:
            for update in batch["raw"]:  # [identifier, node, port, is_source, time, delta]
                if not update[3] and update[1] != 0 and update[5] < 0 and len(update[4]) == 2:
                    update[5] -= 1
                    doctored.update(done=True, what=(worker, batch["version"], update[4]))
                    break
        return record

    _rewrite_journal(journal, workdir / "doctored", consume_twice)
    assert doctored["done"], "no consumption in the journal"
    registration, batches = _bodies(binaries, workdir / "doctored", dataflow_id)
    seen, final = _post_all(service, registration, batches, f"doctored-{uuid.uuid4().hex[:6]}")
    _, version, when = doctored["what"]  # type: ignore[misc]
    at = next(i for i, batch in enumerate(batches) if batch["version"] == version)
    assert all(state != "violation" for state, _ in seen[:at]), seen[:at]
    assert seen[-1][0] == "violation" and final["state"] == "violation", (seen, final)
    assert [(v["time"], v["count"]) for v in final["violations"]] == [(when, -1)], final
