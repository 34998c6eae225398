"""Per-second counts of one dataflow's durable batches, kept in memory for the last minutes.

The Delta ``progress`` table holds every batch, but only once the next flush has written it;
this ring holds what arrived since this process began hosting the dataflow (older seconds
drop off after :data:`KEPT_SECONDS`), so that a reader joining the two has no gap: Delta's
seconds before :attr:`Throughput.since`, these from it on.

Guarantee: :meth:`Throughput.add` is a few comparisons and additions (it runs on the hot path,
once per durable batch); seconds without batches have no entry.

>>> rate = Throughput(since=100.0)
>>> for at, updates in [(100.2, 2), (100.7, 4), (103.1, 1)]:
...     rate.add(at, updates)
>>> rate.rows(), rate.rows(after=101)
([(100, 2, 6), (103, 1, 1)], [(103, 1, 1)])
"""

from __future__ import annotations

from collections import deque

KEPT_SECONDS = 600
"""Seconds with batches kept (older ones are in Delta by then: it is flushed every second or so)."""


class Throughput:
    """``(second, batches, updates)`` of the seconds since :attr:`since` in which batches arrived."""

    __slots__ = ("_rows", "since")

    def __init__(self, since: float) -> None:
        self.since = int(since)
        """The first second counted here (whole seconds, POSIX); earlier ones are Delta's."""
        self._rows: deque[list[int]] = deque()

    def add(self, at: float, updates: int) -> None:
        """A durable batch of ``updates`` updates that arrived at ``at`` (POSIX seconds)."""
        second = int(at)
        rows = self._rows
        if rows and rows[-1][0] >= second:  # the same second (or a clock stepped back): the last row
            last = rows[-1]
            last[1] += 1
            last[2] += updates
            return
        if second < self.since:  # replayed at recovery: Delta has (or will have) it
            return
        rows.append([second, 1, updates])
        if second - rows[0][0] > KEPT_SECONDS:
            dropped = rows.popleft()
            self.since = dropped[0] + 1

    def rows(self, after: float | None = None) -> list[tuple[int, int, int]]:
        """``(second, batches, updates)`` of every counted second (after ``after``, if given), oldest first."""
        return [(s, b, u) for s, b, u in self._rows if after is None or s > after]
