"""The worker SDK in one process: occurrence counts per callback, protocol checks, and many
randomized runs of both examples against an in-process tracker (``LocalHub``) with random
delays on data messages, on progress batches and on frontier updates.

Every run checks the results against the sequential reference and the recorded callbacks
against notification safety (:func:`violations`); a deliberately unsafe scheduler shows the
check does catch early notifications.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from examples import components, wordcount
from tests.helpers import violations
from tracker.graph import Location
from tracker.timestamp import less_equal
from tracker.worker import Worker
from tracker.worker.link import Link, LocalHub
from tracker.worker.transport import Transport
from tracker.worker.vertex import Dataflow, ProgressError, Vertex


class RecordingLink(Link):
    """A link that only records the batches a worker hands it."""

    def __init__(self) -> None:
        super().__init__("w0")
        self.batches: list[list[tuple[Location, tuple[int, ...], int]]] = []

    def submit(self, updates: list[Any]) -> None:
        if updates:
            self.batches.append(list(updates))


class FanOut(Vertex):
    """Sends each message on both outputs and asks to be notified at its time."""

    def __init__(self) -> None:
        self.notified: list[tuple[int, ...]] = []

    def on_recv(self, edge: int, message: Any, time: tuple[int, ...]) -> None:
        self.send_by(0, message, time)
        self.send_by(1, message, time)
        self.notify_at(time)
        self.notify_at(time)  # coalesced: one capability, one on_notify
        if message == "late":
            self.send_by(0, message, (time[0] - 1, time[1]))

    def on_notify(self, time: tuple[int, ...]) -> None:
        self.notified.append(time)
        self.send_by(1, "done", time)


def small_flow() -> Dataflow:
    flow = Dataflow("fan", arity=2)
    flow.input("in")
    flow.stage("fan", lambda i, n: FanOut(), inputs=1, outputs=2)
    flow.feedback("fb")
    flow.stage("sink", lambda i, n: Vertex(), inputs=2, outputs=0)
    flow.connect((0, 0), (1, 0))
    flow.connect((1, 0), (2, 0))
    flow.connect((1, 1), (3, 0))
    flow.connect((2, 0), (3, 1))
    return flow


def test_callbacks_become_occurrence_count_batches() -> None:
    link = RecordingLink()
    worker = Worker(small_flow(), 0, 1, link)
    worker.deliver(1, 0, (2, 0), "m")
    worker._recv_one()
    t = (2, 0)
    assert link.batches[-1] == [
        (Location.target(1, 0), t, -1),  # the consumed message
        (Location.target(2, 0), t, 1), (Location.target(3, 0), t, 1),  # one per channel
        (Location.source(1, 0), t, 1), (Location.source(1, 1), t, 1),  # the notification, at outputs
    ]
    assert worker.requested[1] == {t}
    assert not worker.deliverable(1, t), "nothing is known about the frontier yet"
    worker.link.view.snapshot(1, [{"location": {"node": 1, "port": 0, "kind": "target"}, "frontier": [[2, 0]]}])
    assert not worker.deliverable(1, t)
    worker.link.view.apply(2, [{"location": {"node": 1, "port": 0, "kind": "target"}, "time": [2, 0], "diff": -1},
                               {"location": {"node": 1, "port": 0, "kind": "target"}, "time": [3, 0], "diff": 1}])
    worker.deliver(1, 0, (1, 0), "queued")  # buffered here at a time <= t: must hold t back
    assert not worker.deliverable(1, t)
    worker.queue.clear()
    worker.buffered.clear()
    assert worker.deliverable(1, t)
    assert worker._notify_ready()
    assert worker.vertices[1].notified == [t]  # type: ignore[attr-defined]
    assert link.batches[-1] == [(Location.source(1, 0), t, -1), (Location.source(1, 1), t, -1),
                                (Location.target(3, 0), t, 1)]


def test_protocol_violations_are_refused_before_counting() -> None:
    link = RecordingLink()
    worker = Worker(small_flow(), 0, 1, link)
    with pytest.raises(ProgressError):
        worker.vertices[1].notify_at((0, 0))  # outside any callback
    worker.deliver(1, 0, (2, 0), "late")
    with pytest.raises(ProgressError, match=r"^stage 'fan' holds \(2, 0\) \(recv\) and cannot send at"):
        worker._recv_one()  # sends at (1, 0) while holding (2, 0); the stage named as declared
    assert link.batches == []
    worker.deliver(2, 0, (0, 3), "x")  # the feedback stage adds one iteration
    worker._recv_one()
    assert (Location.target(3, 1), (0, 4), 1) in link.batches[-1]

    class Backwards(Vertex):
        def on_recv(self, edge: int, message: Any, time: tuple[int, ...]) -> None:
            self.send_by(0, message, time)  # a feedback vertex must add +1

    worker.vertices[2] = Backwards()
    worker.vertices[2].stage, worker.vertices[2]._scheduler = 2, worker
    worker.queue.clear()
    worker.deliver(2, 0, (0, 3), "x")
    with pytest.raises(ProgressError):
        worker._recv_one()

    class WrongArity(Vertex):
        def on_recv(self, edge: int, message: Any, time: tuple[int, ...]) -> None:
            self.send_by(0, message, (time[0],))

    worker.vertices[1] = WrongArity()
    worker.vertices[1].stage, worker.vertices[1]._scheduler = 1, worker
    worker.deliver(1, 0, (0, 3), "x")
    with pytest.raises(ProgressError, match="arity"):
        worker._recv_one()
    assert len(link.batches) == 1, "refused callbacks submit nothing"


def test_inputs_advance_and_close_in_single_batches() -> None:
    link = RecordingLink()
    worker = Worker(small_flow(), 0, 1, link)
    handle = worker.input(0)
    handle.send(["a"])
    handle.advance_to(3)
    handle.close()
    src = Location.source(0, 0)
    assert link.batches == [[(Location.target(1, 0), (0, 0), 1)], [(src, (3, 0), 1), (src, (0, 0), -1)],
                            [(src, (3, 0), -1)]]
    with pytest.raises(ProgressError):
        handle.advance_to(4)
    assert worker.queue[0] == (1, 0, (0, 0), "a")


async def _run_local(module: Any, config: dict[str, Any], peers: int, delay: float, seed: int,
                     worker_class: type[Worker] = Worker) -> tuple[list[dict[str, Any]], list[Any]]:
    flow = module.build(config)
    hub = LocalHub.for_dataflow(flow, peers, delay=delay, seed=seed)  # a ScopedTracker: scopes or not
    transports = [Transport(i, [("127.0.0.1", 0)] * peers, delay=delay, seed=seed + i) for i in range(peers)]
    for transport in transports:
        await transport.start()
    addresses = [t.addresses[i] for i, t in enumerate(transports)]
    for transport in transports:
        transport.addresses = list(addresses)
    trace: list[Any] = []
    workers = [worker_class(flow, i, peers, hub.link(f"w{i}"), transports[i], trace=trace) for i in range(peers)]
    try:
        await asyncio.wait_for(asyncio.gather(*(w.run(lambda w: module.drive(w, config), timeout=20)
                                                for w in workers)), 30)
    finally:
        for transport in transports:
            await transport.close()
    rows = sorted((r for w in workers for r in module.collect(w)), key=lambda r: r["epoch"])
    return rows, trace


RUNS = 40


@pytest.mark.parametrize("seed", range(RUNS))
def test_randomized_runs_are_correct_and_notification_safe(seed: int) -> None:
    rng = random.Random(seed)
    module = components if seed % 2 else wordcount
    peers = 1 + seed % 3
    delay = rng.choice([0.0, 0.001, 0.004])
    config = {**module.DEFAULTS, "seed": seed, "epochs": rng.randint(2, 5)}
    rows, trace = asyncio.run(_run_local(module, config, peers, delay, seed))
    assert violations(trace) == []
    assert rows == module.reference(config)
    assert sum(1 for e in trace if e[0] == "notify") >= config["epochs"]


class UnsafeWorker(Worker):
    """Ignores the frontier: notifies as soon as nothing is queued locally (the bug the
    safety check must catch)."""

    def deliverable(self, stage: int, time: tuple[int, ...]) -> bool:
        return not any(less_equal(t, time) for t in self.buffered.get(stage, ()))


def test_the_safety_check_catches_early_notifications() -> None:
    for seed in range(3):
        config = {**wordcount.DEFAULTS, "seed": seed, "epochs": 3}
        rows, trace = asyncio.run(_run_local(wordcount, config, 2, 0.003, seed, UnsafeWorker))
        assert violations(trace), f"seed {seed}: an unsafe scheduler went unnoticed"
        assert rows != wordcount.reference(config)
    assert violations([["notify", 1, 0, [3]], ["recv", 1, 0, 0, [2]]]) != []
    assert violations([["notify", 1, 0, [3]], ["recv", 1, 0, 0, [4]], ["recv", 2, 0, 0, [1]]]) == []


def test_merged_batches_keep_callback_boundaries_and_stay_bounded() -> None:
    from tracker.worker.link import MERGE_LIMIT

    link = RecordingLink()
    Link.submit(link, [(Location.target(1, 0), (0, 0), 1)] * 3)
    big = [(Location.target(1, 0), (0, i), 1) for i in range(MERGE_LIMIT)]
    Link.submit(link, big)
    Link.submit(link, [(Location.target(1, 0), (0, 0), -3)])
    first = json.loads(link._next_batch()[1])
    second = json.loads(link._next_batch()[1])
    assert first["seq"] == 0 and first["updates"] == [
        {"location": {"node": 1, "port": 0, "kind": "target"}, "time": [0, 0], "delta": 3}]
    assert second["seq"] == 1 and len(second["updates"]) == MERGE_LIMIT  # the big batch, whole and alone...
    third = json.loads(link._next_batch()[1])
    assert third["seq"] == 2 and third["updates"][0]["delta"] == -3
    Link.submit(link, [(Location.target(1, 0), (0, 0), 1)])
    Link.submit(link, [(Location.target(1, 0), (0, 0), -1)])
    assert link._next_batch() is None, "batches that cancel out need no seq at all"
    assert [seq for seq, _ in link.unacked] == [0, 1, 2] and link.next_seq == 3
