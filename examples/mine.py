"""The dataflow of ``docs/guide.md`` ("Write and run your own dataflow"): sums of squares per epoch.

``numbers -> square (exchanged by value) -> total (all on worker 0)``. ``square`` squares each
number at its epoch; ``total`` adds up an epoch's squares and, notified once nothing of that
epoch can arrive any more (on any worker), prints one line. Run it against the service with
``tracker run examples.mine --workers 2``: ``tracker run`` imports this module in every worker
process, takes its ``flow`` and calls its ``drive``.

The guarantee: each epoch's line is printed once, with the sum of the squares of every number
every worker sent at that epoch (:func:`expected`).

>>> expected(3)
['epoch 0: 5 numbers, sum of squares 55', 'epoch 1: 5 numbers, sum of squares 330', \
'epoch 2: 5 numbers, sum of squares 855']
"""

from __future__ import annotations

from typing import Any

from tracker.timestamp import Timestamp
from tracker.worker import Dataflow, Vertex, Worker

EPOCHS = 3


def numbers(epoch: int) -> list[int]:
    """The numbers of ``epoch`` (all workers together)."""
    return [5 * epoch + i for i in range(1, 6)]


class Square(Vertex):
    """Squares each number, at the number's time."""

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        self.send_by(0, message * message, time)


class Total(Vertex):
    """Adds up each epoch's squares; prints the total when the epoch is complete."""

    def __init__(self) -> None:
        self.totals: dict[Timestamp, list[int]] = {}

    def on_recv(self, edge: int, message: Any, time: Timestamp) -> None:
        self.totals.setdefault(time, []).append(message)
        self.notify_at(time)  # on_notify(time) once no message at a time <= `time` can arrive

    def on_notify(self, time: Timestamp) -> None:
        squares = self.totals.pop(time)
        print(f"epoch {time[0]}: {len(squares)} numbers, sum of squares {sum(squares)}", flush=True)


flow = Dataflow("mine", last_epoch=EPOCHS - 1)  # declared: the service then estimates when each stage is done
source = flow.input("numbers")
square = flow.stage("square", lambda index, peers: Square(), inputs=1, outputs=1)
total = flow.stage("total", lambda index, peers: Total(), inputs=1, outputs=0)
flow.connect((source, 0), (square, 0), partition=lambda n: n)  # worker n % peers squares n
flow.connect((square, 0), (total, 0), partition=lambda n: 0)  # every square to worker 0


async def drive(worker: Worker) -> None:
    """Feed this worker's share of each epoch, then close the input (else the dataflow never
    ends: its capability would hold every frontier back)."""
    handle = worker.input(source)
    for epoch in range(EPOCHS):
        handle.send(n for n in numbers(epoch) if n % worker.peers == worker.index)
        handle.advance_to(epoch + 1)
    handle.close()


def expected(epochs: int = EPOCHS) -> list[str]:
    """The lines ``total`` prints, computed sequentially."""
    return [f"epoch {e}: {len(numbers(e))} numbers, sum of squares {sum(n * n for n in numbers(e))}"
            for e in range(epochs)]
