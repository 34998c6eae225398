"""Background work: Delta flushes and compaction, log rotation, Spark checks and audits.

Nothing here runs on the request path. Delta writes run on the single ``delta`` thread, Spark
jobs on the single ``spark`` thread, so neither ever blocks the event loop, and a slow Spark job
delays only other Spark jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spark_jobs.tables import TABLES
from tracker.graph import Location

if TYPE_CHECKING:
    from api.dataflows import Dataflow
    from api.service import Service

log = logging.getLogger("tracker.background")
NATIVE_PSI_MAX_LOCATIONS = 1000


# -- Spark ------------------------------------------------------------------------------------

def start_spark(service: Service) -> None:
    """Start the shared Spark session (about 5-10 s); runs on the spark thread at start-up."""
    try:
        from spark_jobs.session import get_spark

        started = time.perf_counter()
        service.spark = get_spark(service.settings.master)
        log.info("spark session ready", extra={"seconds": round(time.perf_counter() - started, 2)})
    except Exception as error:  # the service works without Spark; say so in the status
        service.spark_error = f"{type(error).__name__}: {error}"
        log.exception("spark session failed to start")


def _psi_rows(psi: Any) -> dict[tuple[Location, Location], list[tuple[int, ...]]]:
    return {key: sorted(tuple(s) for s in chain) for key, chain in psi.items() if len(chain)}


def spark_check(service: Service, dataflow: Dataflow) -> None:
    """Registration check through Spark: cycles and ``Psi``, compared with the native answer;
    writes Spark's ``Psi`` to the ``summaries`` table."""
    if service.spark is None:
        dataflow.spark_check, dataflow.spark_detail = "error", service.spark_error or "no Spark session"
        service.metrics.spark_checks.labels("error").inc()
        return
    try:
        from spark_jobs.cycles import find_cycles_for_graph
        from spark_jobs.summaries import summaries_for_graph

        started = time.perf_counter()
        cycles = find_cycles_for_graph(service.spark, dataflow.graph)
        psi = summaries_for_graph(service.spark, dataflow.graph)
        native = _psi_rows(dataflow.psi())
        spark = _psi_rows(psi)
        problems = []
        if cycles:
            problems.append(f"Spark found non-incrementing cycles the native check did not: {cycles[:5]}")
        if spark != native:
            missing = [k for k in native if native[k] != spark.get(k)][:3]
            extra = [k for k in spark if k not in native][:3]
            problems.append(f"Psi differs: {len(native)} native pairs, {len(spark)} Spark pairs; "
                            f"differing {missing}, Spark-only {extra}")
        if service.store is not None:
            service.store.write_summaries({dataflow.id: psi})
        dataflow.spark_check = "disagreed" if problems else "agreed"
        dataflow.spark_detail = "; ".join(problems) or (
            f"cycle check and {len(spark)} summaries agree ({time.perf_counter() - started:.1f} s)")
        service.remember_check(dataflow)
        service.metrics.spark_checks.labels(dataflow.spark_check).inc()
        (log.error if problems else log.info)("spark registration check", extra={
            "dataflow": dataflow.id, "result": dataflow.spark_check, "detail": dataflow.spark_detail})
    except Exception as error:
        dataflow.spark_check, dataflow.spark_detail = "error", f"{type(error).__name__}: {error}"
        service.metrics.spark_checks.labels("error").inc()
        log.exception("spark registration check failed", extra={"dataflow": dataflow.id})


def audit(service: Service, dataflow: Dataflow, version: int, counts: dict, live: dict[Location, list]) -> None:
    """Compare Spark's from-scratch frontier (``propagate``) with the live one at ``version``."""
    try:
        from spark_jobs.propagate import frontiers_for

        started = time.perf_counter()
        spark = frontiers_for(service.spark, dataflow.graph, counts)
        spark_view = {loc: sorted(tuple(t) for t in ts) for loc, ts in spark.items() if ts}
        live_view = {loc: sorted(ts) for loc, ts in live.items() if ts}
        differing = sorted(set(spark_view) ^ set(live_view) | {
            loc for loc in spark_view.keys() & live_view.keys() if spark_view[loc] != live_view[loc]})
        ok = not differing
        dataflow.audit = {
            "version": version, "ok": ok, "at": datetime.now(UTC).isoformat(),
            "seconds": round(time.perf_counter() - started, 3),
            "locations": len(dataflow.graph.locations()),
            "mismatches": [{"location": str(loc), "live": live_view.get(loc, []), "spark": spark_view.get(loc, [])}
                           for loc in differing[:5]],
        }
        service.metrics.audit_ok.labels(dataflow.id).set(1 if ok else 0)
        service.metrics.audits.labels("ok" if ok else "mismatch").inc()
        (log.info if ok else log.error)("spark audit", extra={"dataflow": dataflow.id, "version": version,
                                                              "ok": ok, "mismatches": len(differing)})
    except Exception as error:
        dataflow.audit = {"version": version, "ok": None, "error": f"{type(error).__name__}: {error}",
                          "at": datetime.now(UTC).isoformat()}
        service.metrics.audits.labels("error").inc()
        log.exception("spark audit failed", extra={"dataflow": dataflow.id})


async def audit_loop(service: Service) -> None:
    """Audit every dataflow whose version moved since its last audit, every ``audit_seconds``."""
    audited: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(service.settings.audit_seconds)
        if service.spark is None:
            continue
        for dataflow in list(service.dataflows.values()):
            if not dataflow.ready or dataflow.frontier_version < 0 or audited.get(dataflow.id) == (
                    dataflow.frontier_version):
                continue
            await audit_now(service, dataflow, loop)
            audited[dataflow.id] = dataflow.frontier_version


async def audit_now(service: Service, dataflow: Dataflow, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """One audit: snapshot on the loop (consistent at the durable version), compute in Spark."""
    loop = loop or asyncio.get_running_loop()
    version = dataflow.frontier_version
    counts = service.snapshot_counts(dataflow)
    live = {loc: sorted(ts) for loc, ts in dataflow.published.items()}
    await loop.run_in_executor(service.spark_pool, audit, service, dataflow, version, counts, live)


# -- Delta ------------------------------------------------------------------------------------

async def write_graphs(service: Service) -> None:
    """Write the graph tables of every dataflow in ``service.graphs_to_write`` (registered, or
    recovered without them), in batches: whatever queued up while a batch was being written
    goes into the next one, so a burst of registrations costs a few commits, not five each,
    and does not hold the progress flushes back (they share the one Delta thread)."""
    loop = asyncio.get_running_loop()
    while service.graphs_to_write:
        batch, service.graphs_to_write = service.graphs_to_write, []
        await loop.run_in_executor(service.delta_pool, _write_graphs, service, batch)


def _write_graphs(service: Service, dataflows: list[Dataflow]) -> None:
    """``summaries`` first (when no Spark check will write them) and the ``dataflows`` rows
    last: recovery rewrites the tables of every logged dataflow that has no ``dataflows`` row,
    so a crash half-way through is repaired on the next start."""
    try:
        # Without the Spark check, the native Psi fills ``summaries`` (Psi has up to n^2 rows:
        # beyond a few thousand locations that is Spark's job, not a side task of this thread).
        if not (service.settings.spark and service.settings.spark_check):
            service.store.write_summaries({d.id: d.psi() for d in dataflows
                                           if len(d.graph.locations()) <= NATIVE_PSI_MAX_LOCATIONS})
        service.store.write_dataflows([(d.id, d.name, d.graph, d.created_at) for d in dataflows])
        for dataflow in dataflows:
            dataflow.graph_stored = True
    except Exception:
        service.metrics.delta_errors.inc()
        log.exception("writing the graph tables failed", extra={"dataflows": [d.id for d in dataflows]})


async def flush_loop(service: Service, stop: asyncio.Event) -> None:
    """Every ``flush_seconds``: durable batches to ``progress``; every ``compact_seconds``:
    ``pointstamps``, ``frontiers`` and ``frontier_changes``; then log rotation. When ``stop``
    is set, one last flush and compaction, then return (never cancelled mid-commit, so a
    commit's outcome is always known)."""
    last_compaction = last_tidy = time.monotonic()
    untidy: list[tuple[str, str, list[str]]] = []
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), service.settings.flush_seconds)
        try:
            await flush(service)
            if stop.is_set() or time.monotonic() - last_compaction >= service.settings.compact_seconds:
                last_compaction = time.monotonic()
                await compact(service)
            if not stop.is_set():
                await maybe_rotate(service)
            tidy_every = service.settings.tidy_seconds
            if not untidy and tidy_every > 0 and time.monotonic() - last_tidy >= tidy_every:
                last_tidy = time.monotonic()
                untidy = tidy_plan(service)
            if untidy and not stop.is_set():  # one small step per pass, so flushes keep their pace
                await tidy(service, *untidy.pop(0))
        except Exception:
            service.metrics.delta_errors.inc()
            log.exception("delta flush failed; will retry")


async def flush(service: Service) -> None:
    """Append every durable, unflushed batch to ``progress`` in one Delta commit.

    After a failed commit its outcome is unknown (the commit may have landed before the error),
    so the next attempt first asks the table which versions it holds and drops those: appending
    a batch twice would make recovery apply it twice.
    """
    loop = asyncio.get_running_loop()
    if service.store is not None and service.delta_uncertain:
        for dataflow in list(service.dataflows.values()):
            if dataflow.unflushed:
                held = await loop.run_in_executor(service.delta_pool, service.store.max_progress_version, dataflow.id)
                dataflow.unflushed = [item for item in dataflow.unflushed if item[0] > held]
                dataflow.delta_version = max(dataflow.delta_version, held)
        service.delta_uncertain = False
    taken: list[tuple[Dataflow, list]] = []
    rows = []
    for dataflow in list(service.dataflows.values()):
        if not dataflow.unflushed:
            continue
        batch, dataflow.unflushed = dataflow.unflushed, []
        if service.store is None:
            continue
        taken.append((dataflow, batch))
        rows.extend((dataflow.id, dataflow.graph, *item) for item in batch)
    if not rows:
        return
    try:
        await loop.run_in_executor(service.delta_pool, service.store.append_progress, rows)
    except BaseException:
        for dataflow, batch in taken:  # put them back, in order, before anything newer
            dataflow.unflushed[:0] = batch
        service.delta_uncertain = True
        raise
    for dataflow, batch in taken:
        dataflow.delta_version = max(dataflow.delta_version, max(item[0] for item in batch))
    service.metrics.flush_lag.set(sum(d.durable_version - d.delta_version for d in service.dataflows.values()))


async def compact(service: Service) -> None:
    """Append the new ``frontier_changes`` of every changed dataflow, then write the consolidated
    ``pointstamps`` and current ``frontiers`` of all of them (each as of its durable version):
    three commits in all, whatever the number of dataflows.

    The changes go first: a crash between the commits then leaves ``frontier_changes`` ahead of
    the ``pointstamps`` snapshot, never behind it. Recovery starts from the snapshot and skips
    replayed changes the table already holds; the other order would lose the changes between
    the old and the new snapshot for good.
    """
    if service.store is None:
        return
    loop = asyncio.get_running_loop()
    due = [d for d in service.dataflows.values() if d.frontier_version >= 0 and (
        d.uncompacted or d.compacted_state != d.frontier_version)]
    # Everything below is read on the loop, so counts, frontiers and changes agree on a version.
    states = [(d, d.frontier_version, service.snapshot_counts(d),
               {loc: sorted(ts) for loc, ts in d.published.items() if ts}) for d in due]
    changes = []
    for dataflow in due:
        changes.extend((dataflow, item) for item in dataflow.uncompacted)
        dataflow.uncompacted = []
    if changes:
        rows = [(d.id, version, encoded, at) for d, (version, encoded, at) in changes]
        try:
            await loop.run_in_executor(service.delta_pool, service.store.append_changes, rows)
        except Exception:
            for dataflow, item in reversed(changes):
                dataflow.uncompacted.insert(0, item)
            raise
        for dataflow, (version, _, _) in changes:
            dataflow.compacted_version = max(dataflow.compacted_version, version)
    if states:
        await loop.run_in_executor(service.delta_pool, service.store.write_states,
                                   {d.id: (version, counts, frontiers) for d, version, counts, frontiers in states})
        for dataflow, version, _, _ in states:
            dataflow.compacted_state = version


TIDY_SLICE = 8
"""Dataflows whose partitions one ``OPTIMIZE`` step merges: the Delta thread also carries the
flushes, so a pass over every partition at once (tens of thousands of files after ten minutes
of a hundred busy dataflows) held them back for tens of seconds; a busy dataflow adds one file
per flush (60 a minute), so a step merges about 500."""


def tidy_plan(service: Service) -> list[tuple[str, str, list[str]]]:
    """The steps of one tidy pass, ``(action, table, dataflow ids)``: ``OPTIMIZE`` of the
    append-only tables a slice of dataflows at a time (the tables whose partitions are replaced
    keep one file per partition anyway), then ``VACUUM`` of every table."""
    ids = sorted(service.dataflows)
    steps = [("optimize", table, ids[i:i + TIDY_SLICE])
             for table in ("progress", "frontier_changes") for i in range(0, len(ids), TIDY_SLICE)]
    return steps + [("vacuum", table, []) for table in sorted(TABLES)]


async def tidy(service: Service, action: str, table: str, dataflow_ids: list[str]) -> None:
    """One step of :func:`tidy_plan` on the Delta thread
    (:meth:`~spark_jobs.storage.Warehouse.optimize`, :meth:`~spark_jobs.storage.Warehouse.vacuum`)."""
    if service.store is None:
        return
    loop = asyncio.get_running_loop()
    warehouse = service.store.warehouse
    started = time.perf_counter()
    if action == "optimize":
        files = await loop.run_in_executor(service.delta_pool, warehouse.optimize, table, dataflow_ids)
    else:  # the first vacuum of a table after a start also looks for files a crash left behind
        full = table not in service.vacuumed_fully
        deleted = await loop.run_in_executor(service.delta_pool, warehouse.vacuum, table,
                                             service.settings.vacuum_hours, full)
        service.vacuumed_fully.add(table)
        files = {"deleted": deleted, "full": full}
    log.info("delta table tidied", extra={"action": action, "table": table, "dataflows": len(dataflow_ids),
                                          **files, "seconds": round(time.perf_counter() - started, 3)})


async def maybe_rotate(service: Service) -> None:
    """Start a new log segment when the current one is large, and delete old segments once
    every batch in them is in the Delta ``progress`` table."""
    if service.store is None:
        return
    if service.rotation is not None:
        segment, versions = service.rotation
        if all(service.dataflows[d].delta_version >= v for d, v in versions.items() if d in service.dataflows):
            removed = service.wal.delete_segments_before(segment)
            log.info("wal segments removed", extra={"removed": removed, "segment": segment})
            service.rotation = None
        return
    path = service.wal.directory / f"wal-{service.wal.segment:06d}.log"
    try:
        size = os.path.getsize(path)
    except OSError:
        return
    if size < service.settings.segment_bytes:
        return
    versions = {d.id: d.version for d in service.dataflows.values()}
    segment = await service.wal.rotate(service.log_header())
    service.rotation = (segment, versions)
    log.info("wal rotated", extra={"segment": segment})
