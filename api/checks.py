"""The Spark registration check: Spark's cycle search and ``Psi`` compared with the native ones.

Guarantees: runs on the spark thread after the registration was answered (it never delays
it); concludes with ``agreed``, ``disagreed`` (the detail says how) or ``error`` in the
dataflow's :class:`~api.spark.SparkState`, tells ``on_concluded`` (which logs the result, so a
restart reports it rather than running it again) except after an error, and writes Spark's
``Psi`` to the ``summaries`` table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from api.metrics import Metrics
from api.spark import Hosted, Spark
from api.store import Store
from tracker.graph import Location
from tracker.structure import path_summaries

log = logging.getLogger("tracker.checks")


def _psi_rows(psi: Any) -> dict[tuple[Location, Location], list[tuple[int, ...]]]:
    return {key: sorted(tuple(s) for s in chain) for key, chain in psi.items() if len(chain)}


def spark_check(spark: Spark, store: Store | None, metrics: Metrics, dataflow: Hosted,
                on_concluded: Callable[[Hosted], None]) -> None:
    """Check ``dataflow``'s registration in Spark (blocking: run it on ``spark.pool``)."""
    state = dataflow.spark
    if spark.session is None:
        state.check, state.detail = "error", spark.error or "no Spark session"
        metrics.spark_checks.labels("error").inc()
        return
    try:
        from spark_jobs.cycles import find_cycles_for_graph
        from spark_jobs.summaries import summaries_for_graph

        started = time.perf_counter()
        cycles = find_cycles_for_graph(spark.session, dataflow.graph)
        psi = summaries_for_graph(spark.session, dataflow.graph)
        native = _psi_rows(path_summaries(dataflow.graph))
        computed = _psi_rows(psi)
        problems = []
        if cycles:
            problems.append(f"Spark found non-incrementing cycles the native check did not: {cycles[:5]}")
        if computed != native:
            missing = [k for k in native if native[k] != computed.get(k)][:3]
            extra = [k for k in computed if k not in native][:3]
            problems.append(f"Psi differs: {len(native)} native pairs, {len(computed)} Spark pairs; "
                            f"differing {missing}, Spark-only {extra}")
        if store is not None:
            store.write_summaries({dataflow.id: psi})
        state.check = "disagreed" if problems else "agreed"
        state.detail = "; ".join(problems) or (
            f"cycle check and {len(computed)} summaries agree ({time.perf_counter() - started:.1f} s)")
        on_concluded(dataflow)
        metrics.spark_checks.labels(state.check).inc()
        (log.error if problems else log.info)("spark registration check", extra={
            "dataflow": dataflow.id, "result": state.check, "detail": state.detail})
    except Exception as error:
        state.check, state.detail = "error", f"{type(error).__name__}: {error}"
        metrics.spark_checks.labels("error").inc()
        log.exception("spark registration check failed", extra={"dataflow": dataflow.id})
