"""A costly dataflow's own lane: a thread that propagates its batches off the event loop.

Most batches propagate in microseconds and are applied on the event loop, where ordering them
needs no lock. A batch that moves thousands of frontiers (a long chain's input, a graph whose
path summaries are wide, many incomparable times at once) can take milliseconds or seconds,
and on the event loop every other dataflow would wait for it. So a batch whose estimated cost
(:mod:`api.live.cost`) is over :data:`~api.live.cost.LANE_UNITS`, and every batch after one
that took longer than :data:`LANE_SECONDS` on the event loop, is propagated by its dataflow's
:class:`Lane`, one thread of its own, in the order admitted (the compiled engine runs without
the GIL there; another engine holds it in slices of the interpreter's switch interval); the
event loop meanwhile serves everyone else. The lane is left again once it is idle and its
batches have become cheap (under a quarter of the threshold, so that a dataflow near it does
not switch at every batch). The threshold is ``TRACKER_LANE_MS`` (0: every batch after the
first goes to the lane, which the tests use to run everything through it).

Guarantees: batches propagate one at a time, in the order submitted; :meth:`Lane.holding`
gives the version the engine holds exactly, with no propagation running while held (so counts
read then are never of a half-applied batch); :meth:`Lane.held` never waits (the event loop
reads through it: a busy lane answers ``None``, and the reader uses what was published).

>>> lane = Lane(lambda updates: [(u, 1) for u in updates], version=4)
>>> done = lane.submit(5, ["a"], lambda changes: None)
>>> done.result()
[('a', 1)]
>>> with lane.holding() as version:
...     version
5
>>> lane.close()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("tracker.lane")

LANE_SECONDS = 0.001
"""A batch that took longer than this to propagate on the event loop sends its dataflow's next
batches to the dataflow's lane: at 1 ms, the isolation bound (another dataflow's p99 within 5
ms) keeps room for a few such batches queued before one cheap one."""


class Lane:
    """The thread that propagates one dataflow's batches while they are costly.

    Args:
        propagate: applies one validated batch to the dataflow's engine, off the event loop
            (:meth:`api.live.state.LiveState.propagate`); its result is the future's.
        version: the version the engine holds now (every batch admitted so far is applied).
    """

    def __init__(self, propagate: Callable[[Any], Any], version: int) -> None:
        self.propagate = propagate
        self.applied_through = version
        """The version of the last batch the engine holds (read it under :meth:`holding`)."""
        self.last_seconds = 0.0
        """How long the last batch took to propagate, in the lane."""
        self.queued = 0
        """Batches submitted and not yet propagated."""
        self._lock = threading.Lock()
        self._counting = threading.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="lane")

    def submit(self, version: int, updates: Any, then: Callable[[Any], None]) -> Future[Any]:
        """Propagate the validated batch of ``version`` after every batch submitted before it,
        then call ``then(result)`` on the lane's thread (e.g. to encode the changes; if it raises,
        that is logged and the result stands); a future of :attr:`propagate`'s result."""
        def propagate() -> Any:
            try:
                with self._lock:
                    started = time.perf_counter()
                    result = self.propagate(updates)
                    self.applied_through = version
                    self.last_seconds = time.perf_counter() - started
            finally:
                with self._counting:
                    self.queued -= 1
            try:
                then(result)
            except Exception:  # what `then` prepares is optional; the batch is applied either way
                log.exception("preparing a propagated batch failed; it is published without",
                              extra={"version": version})
            return result

        with self._counting:
            self.queued += 1
        return self._executor.submit(propagate)

    @contextmanager
    def holding(self) -> Iterator[int]:
        """No propagation runs inside: yields the version the engine holds. A propagation under
        way is waited for (one batch at most: the lane takes the lock per batch); never on the
        event loop (see :meth:`held`)."""
        with self._lock:
            yield self.applied_through

    @contextmanager
    def held(self) -> Iterator[int | None]:
        """As :meth:`holding` if no propagation runs now, else yields ``None`` at once."""
        if not self._lock.acquire(blocking=False):
            yield None
            return
        try:
            yield self.applied_through
        finally:
            self._lock.release()

    def close(self) -> None:
        """Let the thread end once the batches submitted are propagated (the dataflow is
        deleted: no batch comes after)."""
        self._executor.shutdown(wait=False)
