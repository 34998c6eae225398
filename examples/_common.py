"""What the bundled examples share: feeding a worker's input one epoch at a time, and reading
the rows its sink recorded.

Two keys of an example's config are read here: ``pace`` (seconds to wait after each epoch; 0:
just yield to the other tasks) and ``lockstep`` (feed epoch ``e + 1`` only once the sink has
seen all of epoch ``e``).

>>> import asyncio
>>> from examples import wordcount
>>> from tracker.worker import LocalHub
>>> flow = wordcount.build({})
>>> worker = Worker(flow, 0, 1, LocalHub.for_dataflow(flow, workers=1).link("w0"))
>>> async def drive(worker: Worker) -> None:
...     handle = worker.input(wordcount.INPUT)
...     async for _, lines in epochs(worker, handle, wordcount.SINK, [["a b", "b"], ["c"]], {"lockstep": True}):
...         handle.send(lines)
>>> _ = asyncio.run(worker.run(drive))
>>> sink_rows(worker, wordcount.SINK)
[{'epoch': 0, 'counts': [['a', 1], ['b', 2]]}, {'epoch': 1, 'counts': [['c', 1]]}]
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol, TypeVar, runtime_checkable

from tracker.worker import InputHandle, Worker

_Input = TypeVar("_Input")


async def epochs(worker: Worker, handle: InputHandle, sink: int, inputs: Iterable[_Input],
                 config: dict[str, Any]) -> AsyncIterator[tuple[int, _Input]]:
    """``(e, inputs[e])`` for each epoch ``e``, for the caller to send this worker's share at
    ``e``; after each, ``handle`` advances to ``e + 1`` (so its messages are at ``e``), then the
    worker waits ``config["pace"]`` seconds and, with ``config["lockstep"]``, until stage
    ``sink`` can no longer receive anything at ``e``. ``handle`` is closed after the last epoch
    (else the dataflow never ends: its capability would hold every frontier back)."""
    for epoch, data in enumerate(inputs):
        yield epoch, data
        handle.advance_to(epoch + 1)
        await asyncio.sleep(config.get("pace", 0.0))
        if config.get("lockstep"):
            await worker.probe(sink, (epoch,))
    handle.close()


@runtime_checkable
class _RowSink(Protocol):
    rows: list[dict[str, Any]]


def sink_rows(worker: Worker, sink: int) -> list[dict[str, Any]]:
    """A copy of the rows stage ``sink``'s vertex on ``worker`` recorded (its ``rows``)."""
    vertex = worker.vertices[sink]
    assert isinstance(vertex, _RowSink)
    return list(vertex.rows)
