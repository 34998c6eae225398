"""Spark audits: the live frontier compared with one Spark computes from scratch.

Guarantees: an audit compares states of one version (counts and frontier are read together on
the event loop, then Spark computes on the spark thread, at the dataflow's turn of
:mod:`api.spark.turns`); each dataflow is audited again only after its frontier moved; the result
lands in the dataflow's :class:`~api.spark.session.SparkState` (``status.audit``) and in the metrics,
never on the request path. An audit bounded by the time limit (``TRACKER_SPARK_TIMEOUT``) that
runs over it is cancelled, and that dataflow is not audited again until a restart; a graph over
the size limit is never audited.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from api.live.state import Counts
from api.metrics import Metrics
from api.spark.session import Hosted, Spark, TimedOut
from api.spark.turns import SparkQueue
from tracker.graph import Location
from tracker.timestamp import Timestamp

log = logging.getLogger("tracker.audit")


def _frontiers(spark: Spark, dataflow: Hosted, counts: Counts) -> dict[Location, list[Timestamp]]:
    from spark_jobs.frames import Progress
    from spark_jobs.propagate import frontiers_for

    return frontiers_for(spark.session, dataflow.graph, counts,
                         progress=Progress(label="audit", callback=spark.check_cancelled))


async def audit(spark: Spark, metrics: Metrics, dataflow: Hosted, version: int, counts: Counts,
                live: dict[Location, list[Timestamp]]) -> None:
    """Compare Spark's from-scratch frontier (``propagate``) with ``live`` at ``version``."""
    try:
        started = time.perf_counter()
        computed = await spark.run(f"audit of {dataflow.id}", _frontiers, spark, dataflow, counts)
        spark_view = {loc: sorted(tuple(t) for t in ts) for loc, ts in computed.items() if ts}
        live_view = {loc: sorted(ts) for loc, ts in live.items() if ts}
        differing = sorted(set(spark_view) ^ set(live_view) | {
            loc for loc in spark_view.keys() & live_view.keys() if spark_view[loc] != live_view[loc]})
        ok = not differing
        dataflow.spark.audit = {
            "version": version, "ok": ok, "at": datetime.now(UTC).isoformat(),
            "seconds": round(time.perf_counter() - started, 3),
            "locations": len(dataflow.graph.locations()),
            "mismatches": [{"location": str(loc), "live": live_view.get(loc, []), "spark": spark_view.get(loc, [])}
                           for loc in differing[:5]],
        }
        metrics.audit_result(dataflow.id, ok)
        metrics.audits.labels("ok" if ok else "mismatch").inc()
        (log.info if ok else log.error)("spark audit", extra={"dataflow": dataflow.id, "version": version,
                                                              "ok": ok, "mismatches": len(differing)})
    except TimedOut as error:
        dataflow.spark.audited = False
        dataflow.spark.audit = {"version": version, "ok": None, "error": f"{error}; not audited again until a restart",
                                "at": datetime.now(UTC).isoformat()}
        metrics.audits.labels("timed_out").inc()
        log.warning("spark audit timed out", extra={"dataflow": dataflow.id, "version": version})
    except Exception as error:
        dataflow.spark.audit = {"version": version, "ok": None, "error": f"{type(error).__name__}: {error}",
                                "at": datetime.now(UTC).isoformat()}
        metrics.audits.labels("error").inc()
        log.exception("spark audit failed", extra={"dataflow": dataflow.id})


async def audit_now(spark: Spark, turns: SparkQueue, metrics: Metrics, dataflow: Hosted) -> int:
    """One audit at ``dataflow``'s turn: a consistent snapshot on the loop, the computation in
    Spark; the version audited."""
    async with turns.turn(dataflow.id):
        version = dataflow.publication.frontier_version
        counts = dataflow.counts()
        live = {loc: sorted(ts) for loc, ts in dataflow.publication.published.items()}
        await audit(spark, metrics, dataflow, version, counts, live)
    return version


async def audit_loop(spark: Spark, turns: SparkQueue, metrics: Metrics, dataflows: Mapping[str, Hosted],
                     seconds: float) -> None:
    """Every ``seconds``, audit every dataflow whose frontier moved since its last audit."""
    audited: dict[str, int] = {}
    while True:
        await asyncio.sleep(seconds)
        if spark.session is None:
            continue
        for dataflow in list(dataflows.values()):
            version = dataflow.publication.frontier_version
            if not dataflow.ready or not dataflow.spark.audited or version < 0 or audited.get(dataflow.id) == version:
                continue
            audited[dataflow.id] = await audit_now(spark, turns, metrics, dataflow)
