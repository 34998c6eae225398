"""A dataflow's lifecycle: the ``state`` of its status, and its deletion.

The one place the status model lives: :func:`assess` turns what the service knows of a
dataflow (its occurrence counts, when its frontier last changed and when its last batch
arrived) into the ``status`` fields ``state``, ``violations``,
``last_frontier_change_at`` and ``deleted_at``. The states, first match wins:

* ``deleted``: ``DELETE /v1/dataflows/{id}`` was answered; progress is refused (410);
* ``violation``: some update moved a frontier backwards (a pointstamp at a time its location's
  frontier did not allow: nothing held could have produced it, so some worker broke the
  protocol; the status names the first ones, and the state stays), or some occurrence count is
  negative and *unexplained*: no live pointstamp (positive count) could-result-in it, i.e. its
  time is not at or above its location's frontier. A negative count that a live pointstamp
  can explain is expected, under both of timely's progress modes: the matching ``+1`` may be
  held back by its worker (timely's default ``Demand`` mode defers updates that cannot change
  any frontier) or still on its way, and a live pointstamp upstream stands in for it. One that
  nothing live explains can never be repaired by protocol-following batches (the ``+1`` that
  would cancel it would itself move a frontier backwards): a message consumed twice, a
  capability dropped twice. So it is a violation as soon as it is seen, and it also catches
  every negative count that outlives the program's last batch from every worker (nothing is
  live then). ``docs/core.md`` ("Negative counts and violations") gives the argument. The status names each
  such location, time and count;
* ``complete``: every frontier is empty, i.e. no pointstamp is live: nothing can happen any
  more (every capability dropped, every message received);
* ``stalled``: some frontier is not empty and no frontier changed for ``stall_seconds``: live
  pointstamps that do not move (an input never closed, a capability held, a worker gone, a
  notification never taken); a hint, since a slow source looks the same. Explained negative
  counts (deferred ``+1`` s) do not stop a dataflow from being reported stalled;
* ``running``: anything else.

Guarantee: :func:`assess` is a pure function of its arguments (no clock of its own), so a
status is reproducible; it never reports ``complete`` while a count is negative.

``explained(location, time)`` says whether a negative count there is explained; for a dataflow
it is :func:`frontier_explains` over the frontier as of the counts' version (the frontier is
computed from positive counts only, so a negative count is explained iff some element of its
location's frontier is ``<=`` its time).

>>> from tracker.graph import Location
>>> source, here = Location.source(0, 0), Location.target(1, 0)
>>> rules = Rules(stall_seconds=60)
>>> assess(rules, {}, last_change=0.0, last_batch=0.0, now=1.0)["state"]
'complete'
>>> assess(rules, {(here, (3,)): 1}, last_change=0.0, last_batch=0.0, now=61.0)["state"]
'stalled'

A capability at ``(2,)`` upstream explains ``-5`` at ``(3,)`` (its ``+5`` may be deferred), not
at ``(1,)``:

>>> held = frontier_explains({here: [(2,)], source: [(2,)]}.get)
>>> counts = {(source, (2,)): 1, (here, (3,)): -5}
>>> assess(rules, counts, last_change=0.0, last_batch=0.0, now=61.0, explained=held)["state"]
'stalled'
>>> status = assess(rules, {(source, (2,)): 1, (here, (1,)): -5}, last_change=0.0, last_batch=0.0, now=1.0,
...                 explained=held)
>>> status["state"], status["violations"]
('violation', [{'location': {'node': 1, 'port': 0, 'kind': 'target'}, 'time': [1], 'count': -5}])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from api.schema import models
from tracker.graph import Location
from tracker.timestamp import Timestamp, less_equal

STATES = ("running", "complete", "stalled", "violation", "deleted")
"""Every ``status.state`` a dataflow can be in (``GET /v1/dataflows?state=`` takes these)."""
MAX_LISTED = 20
"""Violations named in a status at most (``violation_count`` says how many there are)."""


@dataclass(frozen=True)
class Rules:
    """The thresholds of :func:`assess` (``TRACKER_STALL_SECONDS``)."""

    stall_seconds: float = 60.0


Explained = Callable[[Location, Timestamp], bool]
"""``(location, time) -> whether a live pointstamp could-result-in it`` (see the module docstring)."""


def frontier_explains(frontier: Callable[[Location], Iterable[Timestamp] | None]) -> Explained:
    """:data:`Explained` over a frontier computed from positive counts only (``frontier(location)``:
    its elements, ``None`` or empty when nothing can reach it): ``(l, t)`` is explained iff some
    element ``f`` of ``l``'s frontier has ``f <= t``.

    >>> explains = frontier_explains({Location.target(1, 0): [(2, 5), (4, 0)]}.get)
    >>> explains(Location.target(1, 0), (3, 5)), explains(Location.target(1, 0), (3, 4))
    (True, False)
    """
    def explained(location: Location, time: Timestamp) -> bool:
        return any(less_equal(f, time) for f in frontier(location) or ())

    return explained


def _nothing_live(location: Location, time: Timestamp) -> bool:
    return False


def iso(at: float | None) -> str | None:
    """POSIX seconds as ISO 8601 in UTC (``None`` stays ``None``).

    >>> iso(0.0)
    '1970-01-01T00:00:00+00:00'
    """
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat()


def assess(rules: Rules, counts: Mapping[tuple[Location, Timestamp], int], *, last_change: float,
           last_batch: float | None, now: float, deleted_at: float | None = None,
           location_json: Callable[[Location], dict[str, Any]] | None = None,
           regressions: Sequence[tuple[Location, Timestamp, int]] = (), regression_count: int = 0,
           explained: Explained | None = None) -> dict[str, Any]:
    """The lifecycle fields of a status (see the module docstring for the rules).

    Args:
        counts: the non-zero occurrence counts (every frontier is empty iff none is positive).
        last_change: when a frontier last changed (or the dataflow was registered), POSIX seconds.
        last_batch: when the last progress batch arrived, or ``None`` if none ever did.
        deleted_at: when the dataflow was deleted, if it was.
        location_json: a location's JSON (a nested dataflow's carries its scope).
        regressions: the first updates that moved a frontier backwards, ``(location, time,
            version)``, of ``regression_count`` in all.
        explained: whether a live pointstamp explains a negative count (:data:`Explained`, as of
            the counts' version); ``None``: nothing explains any (every negative count is a violation).
    """
    as_json = location_json or models.location_json
    explains = explained or _nothing_live
    negative = [key for key, count in counts.items() if count < 0]
    unexplained = sorted((key for key in negative if not explains(*key)), key=_order)
    if deleted_at is not None:
        state = "deleted"
    elif regression_count or unexplained:
        state = "violation"
    elif not counts:
        state = "complete"
    elif len(negative) < len(counts) and now - last_change >= rules.stall_seconds:
        state = "stalled"
    else:
        state = "running"
    return {
        "state": state,
        "deleted_at": iso(deleted_at),
        "last_frontier_change_at": iso(last_change),
        "last_batch_at": iso(last_batch),
        "violation_count": len(unexplained) if state == "violation" else 0,
        "violations": [{"location": as_json(loc), "time": list(t), "count": counts[(loc, t)]}
                       for loc, t in unexplained[:MAX_LISTED]] if state == "violation" else [],
        "regression_count": regression_count,
        "regressions": [{"location": as_json(loc), "time": list(t), "version": version}
                        for loc, t, version in regressions[:MAX_LISTED]],
    }


def _order(key: tuple[Location, Timestamp]) -> tuple[int, str, int, Timestamp]:
    location, time = key
    return location.node, location.kind, location.port, time


