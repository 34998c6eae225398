"""Lag and blame against the real service: ``GET .../lag``, the blockers of ``explain`` naming
operator, worker and age, the lag gauges of ``/metrics`` (labelled by dataflow only when asked
for), and ``tracker watch --once``."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import ADMIN_TOKEN, ServiceProcess, loop_graph, register, update
from tracker.cli import main

pytestmark = pytest.mark.service(TRACKER_DELTA="0", TRACKER_METRICS_PER_DATAFLOW="1")


def _stall(service: ServiceProcess) -> tuple[str, str]:
    """A three-operator loop whose input worker ``feeder`` moved to epoch 1 and whose ``op2``
    holds a message at epoch 1 reported by worker ``w-2``; nothing moves afterwards."""
    dataflow, token = register(service, loop_graph(3, name="stalled"))
    with service.client(token) as client:
        for seq, (worker, updates) in enumerate([
            ("feeder", [update(0, 0, "source", [0], -1), update(0, 0, "source", [1], 1)]),
            ("w-2", [update(2, 0, "source", [1], 1)]),
        ]):
            answer = client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": worker, "seq": 0,
                                                                               "updates": updates})
            assert answer.status_code == 200, (seq, answer.text)
    return dataflow, token


def _row(report: dict[str, Any], node: int, port: int, kind: str) -> dict[str, Any]:
    return next(r for r in report["locations"] if r["location"] == {"node": node, "port": port, "kind": kind})


def test_lag_grows_while_stalled_and_blame_names_operator_worker_and_age(service: ServiceProcess) -> None:
    dataflow, token = _stall(service)
    with service.client(token) as client:
        first = client.get(f"/v1/dataflows/{dataflow}/lag").json()
        time.sleep(1.2)
        later = client.get(f"/v1/dataflows/{dataflow}/lag").json()
        explained = client.get(f"/v1/dataflows/{dataflow}/frontier/explain",
                               params={"node": 3, "port": 0, "kind": "target", "time": "1"}).json()
    assert later["version"] == first["version"] == 2
    op3 = _row(later, 3, 0, "target")
    assert op3["operator"] == "op3" and op3["port"] == "in 0" and op3["frontier"] == [[1]]
    # Its frontier moved to (1) with the feeder's batch and not since: the lag is the wall time since.
    assert op3["lag_seconds"] >= 1.2 and op3["lag_seconds"] - _row(first, 3, 0, "target")["lag_seconds"] >= 1.1
    assert later["max_lag_seconds"] >= op3["lag_seconds"]
    # Each location's oldest live pointstamp: the feeder's capability at (1) and w-2's message.
    held = _row(later, 2, 0, "source")["oldest_pointstamp"]
    assert held["time"] == [1] and held["worker"] == "w-2" and held["age_seconds"] >= 1.2
    assert _row(later, 0, 0, "source")["oldest_pointstamp"]["worker"] == "feeder"
    assert _row(later, 3, 0, "target")["oldest_pointstamp"] is None  # nothing is held at op3's input itself
    # explain: both blockers named with their operator, port, worker and age.
    blockers = {b["worker"]: b for b in explained["blockers"]}
    assert set(blockers) == {"feeder", "w-2"}
    assert blockers["w-2"]["operator"] == "op2" and blockers["w-2"]["port"] == "out 0"
    assert blockers["feeder"]["operator"] == "input" and blockers["feeder"]["age_seconds"] >= 1.2
    assert "last reported by worker w-2" in blockers["w-2"]["text"]
    # w-2 retires its message and the feeder moves on: the pointstamp leaves the blame, and
    # op3's frontier moves to (2), so its lag starts again from zero.
    with service.client(token) as client:
        for worker, seq, updates in [("w-2", 1, [update(2, 0, "source", [1], -1)]),
                                     ("feeder", 1, [update(0, 0, "source", [1], -1), update(0, 0, "source", [2], 1)])]:
            answer = client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": worker, "seq": seq,
                                                                               "updates": updates})
            assert answer.status_code == 200, answer.text
        after = client.get(f"/v1/dataflows/{dataflow}/lag").json()
    assert _row(after, 2, 0, "source")["oldest_pointstamp"] is None
    assert _row(after, 3, 0, "target")["frontier"] == [[2]] and _row(after, 3, 0, "target")["lag_seconds"] < 1.0
    assert _row(after, 0, 0, "source")["oldest_pointstamp"]["age_seconds"] < 1.0  # (2) is a new pointstamp


def test_each_blocker_says_which_of_the_three_stalls_it_is(service: ServiceProcess) -> None:
    """Three stalls that look alike from outside, told apart: the input holds its capability
    (``held_capability``); a message at op2's input that every worker has reported since, and
    that stays (``undrained_count``: kept unread, or counted once too many); a message at op1's
    input sent after worker ``b`` last reported (``unconsumed_messages``: ``b`` may not have
    had it yet). Said by ``explain``'s blockers, the lag report's oldest pointstamps and the
    dashboard's frame."""
    dataflow, token = register(service, loop_graph(3, name="three-stalls"))
    with service.client(token) as client:
        for worker, seq, updates in [("a", 0, [update(2, 0, "target", [2], 1)]), ("b", 0, []), ("a", 1, []),
                                     ("a", 2, [update(1, 0, "target", [1], 1)])]:
            time.sleep(0.02)  # each batch arrives strictly after the one before
            answer = client.post(f"/v1/dataflows/{dataflow}/progress", json={"worker": worker, "seq": seq,
                                                                               "updates": updates})
            assert answer.status_code == 200, answer.text
        explained = client.get(f"/v1/dataflows/{dataflow}/frontier/explain",
                               params={"node": 3, "port": 0, "kind": "target", "time": "5"}).json()
        lag = client.get(f"/v1/dataflows/{dataflow}/lag").json()
        frame = client.get(f"/dashboard/api/dataflows/{dataflow}/frame").json()
    kinds = {(b["location"]["node"], b["location"]["kind"], tuple(b["time"])): b["stall_kind"]
             for b in explained["blockers"]}
    assert kinds == {(0, "source", (0,)): "held_capability", (2, "target", (2,)): "undrained_count",
                     (1, "target", (1,)): "unconsumed_messages"}, explained["blockers"]
    texts = {b["stall_kind"]: b["text"] for b in explained["blockers"]}
    assert "input out 0: a capability held" in texts["held_capability"]
    assert "op2 in 0: a count that does not drain" in texts["undrained_count"]
    assert "op1 in 0: messages not yet consumed" in texts["unconsumed_messages"]
    assert _row(lag, 0, 0, "source")["oldest_pointstamp"]["stall_kind"] == "held_capability"
    assert _row(lag, 2, 0, "target")["oldest_pointstamp"]["stall_kind"] == "undrained_count"
    assert _row(lag, 1, 0, "target")["oldest_pointstamp"]["stall_kind"] == "unconsumed_messages"
    # The frame's held rows explain each location at its earliest frontier time (0: the input's).
    framed = {(b["location"]["node"], b["location"]["kind"], tuple(b["time"])): b["stall_kind"]
              for row in frame["held"] for b in row["blockers"]}
    assert framed and framed.items() <= kinds.items() and (0, "source", (0,)) in framed, frame["held"]


def test_lag_route_uses_the_same_auth(service: ServiceProcess) -> None:
    dataflow, _ = register(service, loop_graph(2, name="mine"))
    _, other = register(service, loop_graph(2, name="other"))
    url = f"{service.url}/v1/dataflows/{dataflow}/lag"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {other}"}).status_code == 403
    missing = httpx.get(f"{service.url}/v1/dataflows/nope/lag", headers=service.admin_headers)
    assert missing.status_code == 404 and missing.json()["error"] == "unknown_dataflow"


def _gauge(text: str, dataflow: str, operator: str) -> float:
    found = re.search(rf'tracker_frontier_lag_seconds{{dataflow="{dataflow}",operator="{operator}",port="in 0"}} '
                      r"([0-9.e+-]+)", text)
    assert found, text
    return float(found.group(1))


def test_lag_gauges_move_with_per_dataflow_labels(service: ServiceProcess) -> None:
    dataflow, _ = _stall(service)
    before = _gauge(httpx.get(service.url + "/metrics").text, dataflow, "op3 #3")
    time.sleep(0.6)
    text = httpx.get(service.url + "/metrics").text
    assert _gauge(text, dataflow, "op3 #3") >= before + 0.5
    assert _unlabelled(text, "tracker_frontier_lag_max_seconds") >= before + 0.5
    assert _unlabelled(text, "tracker_pointstamp_age_max_seconds") >= 0.6


def _unlabelled(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, text
    return float(found.group(1))


class Watch:
    """``tracker watch`` run through the ``tracker`` command's entry point, in this process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        self.monkeypatch, self.capsys = monkeypatch, capsys

    def __call__(self, *args: str, token: str | None = ADMIN_TOKEN) -> tuple[int, str, str]:
        """``(exit code, stdout, stderr)``; ``token`` in ``TRACKER_TOKEN`` (``None``: no token in the environment)."""
        self.monkeypatch.delenv("TRACKER_ADMIN_TOKEN", raising=False)
        if token is None:
            self.monkeypatch.delenv("TRACKER_TOKEN", raising=False)
        else:
            self.monkeypatch.setenv("TRACKER_TOKEN", token)
        self.capsys.readouterr()
        code = main(["watch", *args])
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Watch:
    return Watch(monkeypatch, capsys)


def test_tracker_watch_once_prints_the_view(service: ServiceProcess, watch: Watch, tmp_path: Path) -> None:
    dataflow, token = _stall(service)
    time.sleep(0.3)
    code, out, err = watch(dataflow, "--url", service.url, "--once", token=token)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"stalled  {dataflow}  version 2")
    op3 = next(line for line in lines if line.startswith("op3 #3"))
    # op3's input waits at (1), held back by the feeder's capability and w-2's message, with their ages.
    assert re.search(r"in 0\s+\{\(1\)\}\s+\d+\.\d s", op3), op3
    assert "input out 0 (0,0,source)@(1) · worker feeder · " in op3 and "op2 out 0 (2,0,source)@(1) · worker w-2" in op3
    # By name (with the admin token, read from a warehouse's token file), the same view.
    (tmp_path / "admin-token").write_text(ADMIN_TOKEN + "\n")
    unique = register(service, loop_graph(2, name="watch-by-name"))[0]
    code, out, err = watch("watch-by-name", "--url", service.url, "--once", "--warehouse", str(tmp_path), token=None)
    assert code == 0 and unique in out.splitlines()[0], err


def test_tracker_watch_errors_are_one_line_and_exit_2(service: ServiceProcess, watch: Watch) -> None:
    dataflow, _ = register(service, loop_graph(2, name="errors"))
    for args, token, says in [
        ((dataflow, "--url", "http://127.0.0.1:9", "--once"), ADMIN_TOKEN, "cannot reach the service"),
        ((dataflow, "--url", service.url, "--once"), "wrong", "the token was refused (401)"),
        (("no-such-dataflow", "--url", service.url, "--once"), ADMIN_TOKEN, "no dataflow with id or name"),
    ]:
        code, out, err = watch(*args, token=token)
        assert code == 2 and out == "", (args, out)
        assert err.count("\n") == 1 and err.startswith("tracker watch: error: ") and says in err, err


def test_tracker_watch_finds_its_token_as_the_client_commands_do(service: ServiceProcess, watch: Watch,
                                                                  tmp_path: Path) -> None:
    """``--token`` over ``TRACKER_TOKEN``; with neither (nor ``TRACKER_ADMIN_TOKEN``), the
    warehouse's token file, else the client's one-line error and exit code 2."""
    dataflow, _ = register(service, loop_graph(2, name="token-order"))
    code, out, err = watch(dataflow, "--url", service.url, "--once", "--token", ADMIN_TOKEN, token="wrong")
    assert code == 0 and dataflow in out.splitlines()[0], err
    code, out, err = watch(dataflow, "--url", service.url, "--once", "--warehouse", str(tmp_path / "none"),
                           token=None)
    assert code == 2 and out == "", out
    assert err.count("\n") == 1 and err.startswith("tracker watch: error: no admin token: "), err
    assert str(tmp_path / "none" / "admin-token") in err
