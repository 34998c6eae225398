"""Spark audits: the live frontier compared with one Spark computes from scratch.

Guarantees: an audit compares states of one version (the hot-path process read counts and
frontier together on its event loop and sent them); Spark computes on the spark thread, at the
dataflow's turn of :mod:`api.spark.turns`; the result is the ``status.audit`` object. An audit
that runs over the time limit (``TRACKER_SPARK_TIMEOUT``) is cancelled and says that the
dataflow is not to be audited again until a restart. A dataflow with nested scopes is audited
over its real (scoped) locations: :func:`spark_jobs.nested.nested_frontiers` against the live
frontier the hot path sent in scoped form.

>>> from tracker.graph import Location
>>> a, b = Location(0, 0, "source"), Location(1, 0, "target")
>>> differences({a: [(0,)], b: [(1,)]}, {a: [(0,)], b: []})
[Location(node=1, port=0, kind='target')]
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from api.spark.known import Known
from api.spark.session import Spark, TimedOut
from api.spark.turns import SparkQueue
from tracker.graph import Location
from tracker.scope import ScopedLocation
from tracker.timestamp import Timestamp

log = logging.getLogger("tracker.audit")
AnyLocation = Location | ScopedLocation
Counts = dict[tuple[AnyLocation, Timestamp], int]
Frontier = dict[AnyLocation, list[Timestamp]]


def _frontiers(spark: Spark, dataflow: Known, counts: Counts) -> Frontier:
    from spark_jobs.frames import Progress
    from spark_jobs.nested import nested_frontiers
    from spark_jobs.propagate import frontiers_for

    progress = Progress(label="audit", callback=spark.check_cancelled)
    if dataflow.nested is not None:
        return dict(nested_frontiers(spark.session, dataflow.nested, counts, progress))  # type: ignore[arg-type]
    return dict(frontiers_for(spark.session, dataflow.graph, counts, progress=progress))  # type: ignore[arg-type]


def differences(spark_view: Frontier, live_view: Frontier) -> list[AnyLocation]:
    """The locations whose (non-empty) frontiers differ, sorted."""
    spark_view = {loc: sorted(ts) for loc, ts in spark_view.items() if ts}
    live_view = {loc: sorted(ts) for loc, ts in live_view.items() if ts}
    return sorted(set(spark_view) ^ set(live_view) | {
        loc for loc in spark_view.keys() & live_view.keys() if spark_view[loc] != live_view[loc]})


async def audit(spark: Spark, turns: SparkQueue, dataflow: Known, version: int, counts: Counts,
                live: Frontier) -> tuple[dict[str, Any], bool]:
    """Spark's from-scratch frontier (``propagate``) of ``counts`` against ``live``, at
    ``dataflow``'s turn: the ``status.audit`` object, and whether to stop auditing it."""
    async with turns.turn(dataflow.id):
        try:
            started = time.perf_counter()
            computed = await spark.run(f"audit of {dataflow.id}", _frontiers, spark, dataflow, counts)
            spark_view = {loc: sorted(tuple(t) for t in ts) for loc, ts in computed.items() if ts}
            live_view = {loc: sorted(ts) for loc, ts in live.items() if ts}
            differing = differences(spark_view, live_view)
            ok = not differing
            (log.info if ok else log.error)("spark audit", extra={"dataflow": dataflow.id, "version": version,
                                                                  "ok": ok, "mismatches": len(differing)})
            return {
                "version": version, "ok": ok, "at": datetime.now(UTC).isoformat(),
                "seconds": round(time.perf_counter() - started, 3),
                "locations": dataflow.size,
                "mismatches": [{"location": str(loc), "live": live_view.get(loc, []),
                                "spark": spark_view.get(loc, [])} for loc in differing[:5]],
            }, False
        except TimedOut as error:
            log.warning("spark audit timed out", extra={"dataflow": dataflow.id, "version": version})
            return {"version": version, "ok": None, "error": f"{error}; not audited again until a restart",
                    "at": datetime.now(UTC).isoformat()}, True
        except Exception as error:
            log.exception("spark audit failed", extra={"dataflow": dataflow.id})
            return {"version": version, "ok": None, "error": f"{type(error).__name__}: {error}",
                    "at": datetime.now(UTC).isoformat()}, False
