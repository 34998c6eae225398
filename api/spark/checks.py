"""The Spark registration check: Spark's cycle search and ``Psi`` compared with the native ones,
for many registrations at once.

Guarantees: runs after the registration was answered (it never delays it). Registrations
waiting for their check are checked together, in one :func:`spark_jobs.registration.check_graphs`
call (one cycle job and one summaries job for the lot), when the first of them gets its turn at
Spark (:mod:`api.spark.turns`); a batch holds at most ``Spark.max_locations`` locations. A
dataflow with nested scopes is checked scope by scope (:func:`spark_jobs.nested.check_nested`:
cycles and ``Psi`` within every scope, and every scope's summaries as an operator, against the
native ones). Each
check concludes with ``agreed``, ``disagreed`` (the detail says how, and an error is logged: the
alarm), ``timed_out`` or ``error``, told to ``on_concluded`` (which answers the hot-path process
hosting the dataflow; that process logs every result but an error, so a restart reports it
rather than running it again: a check that timed out is not retried forever); ``on_running``
is told when a batch starts.
A batch that runs over the time limit is cancelled and its dataflows are checked one by one,
so only a graph that times out alone is marked ``timed_out``. Spark's ``Psi`` goes to the
``summaries`` table.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from api.delta.store import Store
from api.spark.known import Known
from api.spark.session import Spark, TimedOut
from api.spark.turns import SparkQueue
from tracker.graph import Location
from tracker.structure import path_summaries

log = logging.getLogger("tracker.checks")


def _psi_rows(psi: Any) -> dict[tuple[Location, Location], list[tuple[int, ...]]]:
    return {key: sorted(tuple(s) for s in chain) for key, chain in psi.items() if len(chain)}


def verdict(dataflow: Known, cycles: list[Any], psi: Any) -> tuple[str, str]:
    """``(result, detail)`` of Spark's answer for ``dataflow`` against the native one."""
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
    if problems:
        return "disagreed", "; ".join(problems)
    return "agreed", f"cycle check and {len(computed)} summaries agree"


class Checker:
    """Registrations waiting for their Spark check, checked in batches at their turn."""

    def __init__(self, spark: Spark, turns: SparkQueue, store: Store | None,
                 on_running: Callable[[list[Known]], None], on_concluded: Callable[[Known, str, str], None]) -> None:
        self.spark = spark
        self.turns = turns
        self.store = store
        self.on_running = on_running
        self.on_concluded = on_concluded
        self._pending: dict[str, Known] = {}
        self._alone: set[str] = set()  # in a batch that timed out: checked alone next time
        self._tasks: set[asyncio.Task[None]] = set()

    def request(self, dataflow: Known) -> None:
        """Queue ``dataflow``'s check (from the event loop); it runs at its turn, with whatever
        else is waiting then."""
        self._pending[dataflow.id] = dataflow
        task = asyncio.get_running_loop().create_task(self._turn(dataflow.id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, dataflow: Known) -> None:
        """Drop ``dataflow``'s waiting check (its hot-path process went away; it asks again)."""
        if self._pending.get(dataflow.id) is dataflow:
            del self._pending[dataflow.id]

    def cancel(self) -> None:
        """Give up every queued and running check (at shutdown)."""
        for task in list(self._tasks):
            task.cancel()

    async def _turn(self, owner: str) -> None:
        async with self.turns.turn(owner):
            batch = self._take(owner)
            if batch:
                await self._check(batch)

    def _take(self, owner: str) -> list[Known]:
        """``owner`` (if still waiting) and others waiting, up to the size limit; a dataflow
        of a batch that timed out goes alone."""
        first = self._pending.pop(owner, None)
        if first is None:
            return []  # an earlier batch checked it
        batch, size = [first], first.size
        if owner in self._alone:
            return batch
        for other in list(self._pending.values()):
            more = other.size
            if other.id in self._alone or (self.spark.max_locations and size + more > self.spark.max_locations):
                continue
            batch.append(self._pending.pop(other.id))
            size += more
        return batch

    def _run(self, batch: list[Known]) -> dict[str, tuple[str, str]]:
        """On the spark thread: the batch's check (flat dataflows in one run, those with nested
        scopes in another, scope by scope), its ``Psi`` stored, each verdict."""
        from spark_jobs.frames import Progress
        from spark_jobs.nested import check_nested, nested_verdict
        from spark_jobs.registration import check_graphs

        progress = Progress(label="registration check", callback=self.spark.check_cancelled)
        flat = {d.id: d.graph for d in batch if d.nested is None}
        nested = {d.id: d.nested for d in batch if d.nested is not None}
        checks = check_graphs(self.spark.session, flat, progress)
        scoped = check_nested(self.spark.session, nested, progress)
        if self.store is not None:
            self.store.write_summaries({**{i: {(): c.psi} for i, c in checks.items() if c.acceptable},
                                        **{i: c.psi for i, c in scoped.items() if c.acceptable}})
        verdicts = {i: nested_verdict(nested[i], c) for i, c in scoped.items()}
        return {**verdicts, **{i: verdict(d, checks[i].cycles, checks[i].psi) for d in batch
                               if (i := d.id) in checks}}

    async def _check(self, batch: list[Known]) -> None:
        await self.spark.started.wait()  # "running" means Spark works on it, not that it waits for Spark
        self.on_running(batch)
        started = time.perf_counter()
        try:
            verdicts = await self.spark.run(f"registration check of {len(batch)} dataflow(s)", self._run, batch)
        except TimedOut as error:
            if len(batch) > 1:  # one graph may hold up the rest: check each alone
                log.info("spark registration check batch timed out; checking its dataflows one by one",
                         extra={"dataflows": len(batch)})
                for dataflow in batch:
                    self._alone.add(dataflow.id)
                    self.request(dataflow)
                return
            self._conclude(batch[0], "timed_out", f"{error}; not retried (TRACKER_SPARK_TIMEOUT bounds a check)")
            return
        except Exception as error:
            for dataflow in batch:
                self.on_concluded(dataflow, "error", f"{type(error).__name__}: {error}")
            log.exception("spark registration check failed", extra={"dataflows": [d.id for d in batch]})
            return
        seconds = time.perf_counter() - started
        for dataflow in batch:
            result, detail = verdicts[dataflow.id]
            self._conclude(dataflow, result, f"{detail} ({seconds:.1f} s, one Spark job for {len(batch)} "
                                             f"dataflow(s))")

    def _conclude(self, dataflow: Known, result: str, detail: str) -> None:
        self._alone.discard(dataflow.id)
        self.on_concluded(dataflow, result, detail)
        level = {"agreed": logging.INFO, "timed_out": logging.WARNING}.get(result, logging.ERROR)
        log.log(level, "spark registration check", extra={
            "dataflow": dataflow.id, "result": result, "detail": detail})
