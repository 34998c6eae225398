"""A dataflow's lifecycle: the ``state`` of its status, and its deletion.

The one place the status model lives: :func:`assess` turns what the service knows of a
dataflow (its occurrence counts, when its frontier last changed and when its last batch
arrived) into the ``status`` fields ``state``, ``violations``,
``last_frontier_change_at`` and ``deleted_at``. The states, first match wins:

* ``deleted``: ``DELETE /v1/dataflows/{id}`` was answered; progress is refused (410);
* ``violation``: some update moved a frontier backwards (a pointstamp at a time its location's
  frontier did not allow: nothing held could have produced it, so some worker broke the
  protocol; the status names the first ones, and the state stays), or some occurrence count is
  negative and no batch arrived for ``violation_seconds``: a negative count is legal for a
  moment (one worker's ``-1`` may reach the service before another worker's ``+1``), but one
  that outlives every worker's last batch is a protocol violation (a message consumed twice, a
  capability dropped twice); the status names each such location, time and count;
* ``complete``: every frontier is empty, i.e. no pointstamp is live: nothing can happen any
  more (every capability dropped, every message received);
* ``stalled``: some frontier is not empty and no frontier changed for ``stall_seconds``: live
  pointstamps that do not move (an input never closed, a worker gone, a notification never
  taken); a hint, since a slow source looks the same;
* ``running``: anything else.

Guarantee: :func:`assess` is a pure function of its arguments (no clock of its own), so a
status is reproducible; it never reports ``complete`` while a count is negative.

>>> from tracker.graph import Location
>>> here = Location.target(1, 0)
>>> rules = Rules(stall_seconds=60, violation_seconds=5)
>>> assess(rules, {}, last_change=0.0, last_batch=0.0, now=1.0)["state"]
'complete'
>>> assess(rules, {(here, (3,)): 1}, last_change=0.0, last_batch=0.0, now=61.0)["state"]
'stalled'
>>> status = assess(rules, {(here, (3,)): -5}, last_change=0.0, last_batch=0.0, now=6.0)
>>> status["state"], status["violations"]
('violation', [{'location': {'node': 1, 'port': 0, 'kind': 'target'}, 'time': [3], 'count': -5}])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from api.schema import models
from tracker.graph import Location
from tracker.timestamp import Timestamp

STATES = ("running", "complete", "stalled", "violation", "deleted")
"""Every ``status.state`` a dataflow can be in (``GET /v1/dataflows?state=`` takes these)."""
MAX_LISTED = 20
"""Violations named in a status at most (``violation_count`` says how many there are)."""


@dataclass(frozen=True)
class Rules:
    """The thresholds of :func:`assess` (``TRACKER_STALL_SECONDS``, ``TRACKER_VIOLATION_SECONDS``)."""

    stall_seconds: float = 60.0
    violation_seconds: float = 5.0


def iso(at: float | None) -> str | None:
    """POSIX seconds as ISO 8601 in UTC (``None`` stays ``None``).

    >>> iso(0.0)
    '1970-01-01T00:00:00+00:00'
    """
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat()


def assess(rules: Rules, counts: Mapping[tuple[Location, Timestamp], int], *, last_change: float,
           last_batch: float | None, now: float, deleted_at: float | None = None,
           location_json: Callable[[Location], dict[str, Any]] | None = None,
           regressions: Sequence[tuple[Location, Timestamp, int]] = (), regression_count: int = 0) -> dict[str, Any]:
    """The lifecycle fields of a status (see the module docstring for the rules).

    Args:
        counts: the non-zero occurrence counts (every frontier is empty iff none is positive).
        last_change: when a frontier last changed (or the dataflow was registered), POSIX seconds.
        last_batch: when the last progress batch arrived, or ``None`` if none ever did.
        deleted_at: when the dataflow was deleted, if it was.
        location_json: a location's JSON (a nested dataflow's carries its scope).
        regressions: the first updates that moved a frontier backwards, ``(location, time,
            version)``, of ``regression_count`` in all.
    """
    as_json = location_json or models.location_json
    negative = sorted((key for key, count in counts.items() if count < 0), key=_order)
    quiet_since = last_batch if last_batch is not None else last_change
    if deleted_at is not None:
        state = "deleted"
    elif regression_count or (negative and now - quiet_since >= rules.violation_seconds):
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
        "violation_count": len(negative) if state == "violation" else 0,
        "violations": [{"location": as_json(loc), "time": list(t), "count": counts[(loc, t)]}
                       for loc, t in negative[:MAX_LISTED]] if state == "violation" else [],
        "regression_count": regression_count,
        "regressions": [{"location": as_json(loc), "time": list(t), "version": version}
                        for loc, t, version in regressions[:MAX_LISTED]],
    }


def _order(key: tuple[Location, Timestamp]) -> tuple[int, str, int, Timestamp]:
    location, time = key
    return location.node, location.kind, location.port, time


