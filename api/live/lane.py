"""A costly dataflow's own lane: a thread that propagates its batches off the event loop.

Most batches propagate in microseconds and are applied on the event loop, where ordering them
needs no lock. A batch that moves thousands of frontiers (a long chain's input, a graph whose
path summaries are wide) can take milliseconds, and on the event loop every other dataflow
would wait for it. So once one of a dataflow's batches took longer than
:data:`LANE_SECONDS`, its next batches are propagated by its :class:`Lane`, one thread of its
own, in the order they were admitted, with the compiled engine running without the GIL; the
event loop meanwhile serves everyone else. The lane is left again once it is idle and its
batches have become cheap (under a quarter of the threshold, so that a dataflow near it does
not switch at every batch). The threshold is ``TRACKER_LANE_MS`` (0: every batch after the
first goes to the lane, which the tests use to run everything through it).

Guarantees: batches propagate one at a time, in the order submitted; :meth:`Lane.holding`
gives the version the engine holds exactly, with no propagation running while held (so counts
read then are never of a half-applied batch).

>>> from concurrent.futures import Future
>>> class Engine:  # stands in for the compiled engine
...     def apply_indexed(self, locations, times, deltas, *, release_gil=False):
...         return list(zip(locations, deltas))
>>> from api.schema.parsing import Indexed
>>> lane = Lane(Engine(), version=4)
>>> done = lane.submit(5, Indexed(["a"], 1, [0], [7], [1]), lambda changes: None)
>>> done.result()
[(0, 1)]
>>> with lane.holding() as version:
...     version
5
>>> lane.close()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from api.schema.parsing import Indexed

LANE_SECONDS = 0.001
"""A batch that took longer than this to propagate on the event loop sends its dataflow's next
batches to the dataflow's lane: at 1 ms, the isolation bound (another dataflow's p99 within 5
ms) keeps room for a few such batches queued before one cheap one."""


class Lane:
    """The thread that propagates one dataflow's batches while it is costly.

    Args:
        native: the dataflow's compiled engine (``progress_engine.Engine``).
        version: the version the engine holds now (every batch admitted so far is applied).
    """

    def __init__(self, native: Any, version: int) -> None:
        self.native = native
        self.applied_through = version
        """The version of the last batch the engine holds (read it under :meth:`holding`)."""
        self.last_seconds = 0.0
        """How long the last batch took to propagate, in the lane."""
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="lane")

    def submit(self, version: int, updates: Indexed, then: Callable[[Any], None]) -> Future[Any]:
        """Propagate the validated batch of ``version`` after every batch submitted before it,
        then call ``then(changes)`` on the lane's thread (e.g. to encode them); a future of the
        ``ChangeBatch``."""
        def propagate() -> Any:
            with self._lock:
                started = time.perf_counter()
                changes = self.native.apply_indexed(updates.locations, updates.times, updates.deltas,
                                                    release_gil=True)
                self.applied_through = version
                self.last_seconds = time.perf_counter() - started
            then(changes)
            return changes

        return self._executor.submit(propagate)

    @contextmanager
    def holding(self) -> Iterator[int]:
        """No propagation runs inside: yields the version the engine holds. A propagation under
        way is waited for (one batch at most: the lane takes the lock per batch)."""
        with self._lock:
            yield self.applied_through

    def close(self) -> None:
        """Let the thread end once the batches submitted are propagated (the dataflow is
        deleted: no batch comes after)."""
        self._executor.shutdown(wait=False)
