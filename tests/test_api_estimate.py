"""Progress estimates against the real service: ``GET .../progress-estimate`` and ``/metrics``.

An input whose capability advances one epoch every 100 ms (on a schedule of absolute times, so
the posts' own latency does not slow it) must be estimated at 10 epochs per second within 20%
after 2 s, with the expected time to its declared last epoch; an input advancing in bursts
must be "unknown"; closing the inputs makes the last epoch known without a declaration.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.helpers import ServiceProcess, loop_then_stage, register, update

pytestmark = pytest.mark.service(TRACKER_DELTA="0", TRACKER_METRICS_PER_DATAFLOW="1")


def pipeline(name: str, last_epoch: int | None = None) -> dict[str, Any]:
    """input 0 -> map 1 -> sink 2 (no loop: closing the input bounds the epochs)."""
    body: dict[str, Any] = {"name": name, "nodes": [
        {"id": 0, "name": "input", "inputs": 0, "outputs": 1}, {"id": 1, "name": "map", "inputs": 1, "outputs": 1},
        {"id": 2, "name": "sink", "inputs": 1, "outputs": 0}], "edges": [
        {"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}},
        {"source": {"node": 1, "port": 0}, "target": {"node": 2, "port": 0}}]}
    if last_epoch is not None:
        body["last_epoch"] = last_epoch
    return body


class Input:
    """The input's worker: moves its capability from epoch to epoch over REST."""

    def __init__(self, service: ServiceProcess, dataflow: str, token: str) -> None:
        self.client = service.client(token)
        self.dataflow, self.seq, self.epoch = dataflow, 0, 0

    def post(self, updates: list[dict[str, Any]]) -> None:
        answer = self.client.post(f"/v1/dataflows/{self.dataflow}/progress",
                                  json={"worker": "input", "seq": self.seq, "updates": updates})
        assert answer.status_code == 200, answer.text
        self.seq += 1

    def advance(self, epochs: int = 1) -> None:
        self.post([update(0, 0, "source", [self.epoch], -1), update(0, 0, "source", [self.epoch + epochs], 1)])
        self.epoch += epochs

    def estimate(self) -> dict[str, Any]:
        answer = self.client.get(f"/v1/dataflows/{self.dataflow}/progress-estimate")
        assert answer.status_code == 200, answer.text
        return answer.json()


def operator(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(o for o in report["operators"] if o["operator"] == name)


def test_a_steady_input_is_estimated_within_20_percent_after_two_seconds(service: ServiceProcess) -> None:
    dataflow, token = register(service, pipeline("steady", last_epoch=60))
    feed = Input(service, dataflow, token)
    started = time.monotonic()
    for k in range(1, 21):  # epoch k at 0.1 k s: 10 epochs per second
        time.sleep(max(0.0, started + 0.1 * k - time.monotonic()))
        feed.advance()
    report = feed.estimate()
    assert report["last_epoch"] == 60 and report["last_epoch_source"] == "declared"
    assert 1.9 <= report["window_seconds"] <= 3.0  # since the registration: younger than the 10 s window
    for name in ("map", "sink"):
        row = operator(report, name)
        assert row["state"] == "estimated" and row["reason"] is None, row
        assert row["epoch"] == 20
        assert 8.0 <= row["epochs_per_second"] <= 12.0, row
        # Epochs 20 .. 60 are still to clear: 41 epochs at the measured rate.
        assert row["eta_seconds"] == pytest.approx(41 / row["epochs_per_second"], rel=0.01)
        assert 41 / 12.0 <= row["eta_seconds"] <= 41 / 8.0
    feed.client.close()


def test_an_erratic_input_is_unknown(service: ServiceProcess) -> None:
    dataflow, token = register(service, pipeline("erratic", last_epoch=500))
    feed = Input(service, dataflow, token)
    feed.advance(12)       # a burst of 12 epochs at once,
    time.sleep(0.9)
    feed.advance(1)        # one more,
    time.sleep(1.1)        # a long pause,
    feed.advance(12)       # and another burst
    time.sleep(0.3)
    report = feed.estimate()
    for name in ("map", "sink"):
        row = operator(report, name)
        assert row["epoch"] == 25
        assert row["state"] == "unknown" and row["epochs_per_second"] is None and row["eta_seconds"] is None, row
        assert row["reason"] == "rate unsteady over the window"
    feed.client.close()


def test_closing_the_inputs_makes_the_last_epoch_known(service: ServiceProcess) -> None:
    dataflow, token = register(service, pipeline("closing"))
    feed = Input(service, dataflow, token)
    started = time.monotonic()
    for k in range(1, 16):
        time.sleep(max(0.0, started + 0.1 * k - time.monotonic()))
        feed.advance()
    before = feed.estimate()
    assert before["last_epoch"] is None and operator(before, "map")["state"] == "estimated"
    assert operator(before, "map")["eta_seconds"] is None and "last epoch" in operator(before, "map")["reason"]
    # The map holds work at epochs 15 and 16 (two capabilities); the input closes.
    feed.post([update(1, 0, "source", [15], 1), update(1, 0, "source", [16], 1), update(0, 0, "source", [15], -1)])
    closed = feed.estimate()
    assert closed["last_epoch"] == 16 and closed["last_epoch_source"] == "inputs closed"
    sink = operator(closed, "sink")
    assert sink["epoch"] == 15 and sink["state"] == "estimated"
    assert sink["eta_seconds"] == pytest.approx(2 / sink["epochs_per_second"], rel=0.01)  # epochs 15 and 16 to go
    # Its input frontier is empty, but it holds work at 15: not done (it was called done before).
    assert operator(closed, "map")["epoch"] == 15 and operator(closed, "map")["state"] != "done"
    feed.client.close()


def test_estimates_reach_the_metrics(service: ServiceProcess) -> None:
    dataflow, token = register(service, pipeline("metered", last_epoch=1000))
    feed = Input(service, dataflow, token)
    started = time.monotonic()
    for k in range(1, 16):
        time.sleep(max(0.0, started + 0.1 * k - time.monotonic()))
        feed.advance()
    text = httpx.get(service.url + "/metrics").text
    rate = float(text.split(f'tracker_operator_epochs_per_second{{dataflow="{dataflow}",operator="sink #2"}} ')[1]
                 .split()[0])
    eta = float(text.split(f'tracker_operator_eta_seconds{{dataflow="{dataflow}",operator="sink #2"}} ')[1].split()[0])
    assert 7.0 <= rate <= 13.0 and eta == pytest.approx((1000 + 1 - 15) / rate, rel=0.05)
    assert float(text.split("\ntracker_progress_eta_max_seconds ")[1].split()[0]) >= eta
    assert 'tracker_dataflows_in_state{state="running"}' in text
    feed.client.close()


def test_a_bad_last_epoch_is_refused(service: ServiceProcess) -> None:
    with service.client() as client:
        for bad in (-1, "3", 2**62):
            answer = client.post("/v1/dataflows", json={**pipeline("bad"), "last_epoch": bad})
            assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == "body.last_epoch", answer.text
        listed = client.get("/v1/dataflows", params={"name": "bad"}).json()
    assert listed == []  # nothing registered


def test_a_stuck_iterative_scope_is_never_done(service: ServiceProcess) -> None:
    """The input closes while ``step``, inside the iterative scope ``loop``, keeps a capability at
    ``(2, 0)``: no record enters the scope any more (its input frontier is empty), but it holds
    epoch 2, and so does everything after it. No operator is ``done``: ``loop`` and ``step`` are
    at epoch 2, not advancing. Once ``step`` lets go, all are done."""
    dataflow, token = register(service, loop_then_stage("stuck-loop"))
    inside = {"scope": [1], "node": 1, "port": 0, "kind": "source"}
    held = Input(service, dataflow, token)
    held.post([update(0, 0, "source", [0], -1), {"location": inside, "time": [2, 0], "delta": 1}])
    report = held.estimate()
    states = {o["operator"]: (o["epoch"], o["state"]) for o in report["operators"]}
    assert all(state != "done" for _, state in states.values()), states
    assert states["loop"][0] == 2 and states["step"][0] == 2 and states["after"][0] == 2, states
    held.post([{"location": inside, "time": [2, 0], "delta": -1}])
    finished = held.estimate()
    assert {o["operator"]: (o["epoch"], o["state"]) for o in finished["operators"]} == {
        name: (None, "done") for name in states}, finished
