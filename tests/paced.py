"""A paced dataflow for the dashboard's browser test, run as a user would run theirs:
``tracker run tests.paced --workers 2``. It is the guide's ``numbers -> square -> total``
(``examples/mine.py``) over 40 epochs, its input moving to the next epoch every 0.25 s on a
schedule of absolute times, so that the dashboard has a steady pace to draw; it declares its
last epoch, so the service estimates when each stage is done.
"""

from __future__ import annotations

import asyncio

from examples.mine import Square, Total, numbers
from tracker.worker import Dataflow, Worker

EPOCHS = 40
PACE = 0.25
"""Seconds per epoch."""

flow = Dataflow("paced", last_epoch=EPOCHS - 1)
source = flow.input("numbers")
square = flow.stage("square", lambda index, peers: Square(), inputs=1, outputs=1)
total = flow.stage("total", lambda index, peers: Total(), inputs=1, outputs=0)
flow.connect((source, 0), (square, 0), partition=lambda n: n)
flow.connect((square, 0), (total, 0), partition=lambda n: 0)


async def drive(worker: Worker) -> None:
    """This worker's share of each epoch, one epoch every :data:`PACE` seconds, then close."""
    handle = worker.input(source)
    clock = asyncio.get_running_loop()
    started = clock.time()
    for epoch in range(EPOCHS):
        handle.send(n for n in numbers(epoch) if n % worker.peers == worker.index)
        handle.advance_to(epoch + 1)
        await asyncio.sleep(max(0.0, started + PACE * (epoch + 1) - clock.time()))
    handle.close()
