"""The graph tables of registered dataflows (``dataflows``, ``nodes``, ``edges``, ... and,
without a Spark check, the native ``summaries``), written in batches on the Delta thread, and
the ``dataflows.deleted_at`` of deleted ones.

Guarantees: a queued dataflow's tables are written once, with its ``dataflows`` row last, so a
crash half-way leaves it without that row and recovery queues it again; a burst of
registrations costs a few commits, not five each, and does not hold the progress flushes back
(they share the one Delta thread). Without Spark's check the native ``Psi`` fills
``summaries`` for graphs of up to :data:`NATIVE_PSI_MAX_LOCATIONS` locations (``Psi`` has up
to n^2 rows: beyond that it is Spark's job, not a side task of this thread).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from typing import Protocol

from api.metrics import Metrics
from api.store import Store
from api.sync import DeltaLag
from tracker.graph import Graph
from tracker.structure import path_summaries

log = logging.getLogger("tracker.graphs")
NATIVE_PSI_MAX_LOCATIONS = 1000


class Described(Protocol):
    """What the graph tables hold of a dataflow."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def graph(self) -> Graph: ...
    @property
    def created_at(self) -> str: ...
    @property
    def lag(self) -> DeltaLag: ...
    @property
    def deleted_at(self) -> float | None: ...


class GraphWriter:
    """A queue of dataflows whose graph tables are to be written, and the task writing them."""

    def __init__(self, store: Store | None, pool: Executor, metrics: Metrics, *, native_psi: bool) -> None:
        self.store = store
        self.pool = pool
        self.metrics = metrics
        self.native_psi = native_psi
        self._queued: list[Described] = []
        self._deleted: list[Described] = []
        self._task: asyncio.Task[None] | None = None

    def queue(self, dataflows: list[Described]) -> None:
        """Queue ``dataflows`` (on the event loop); a writer task starts if none runs."""
        if self.store is None or not dataflows:
            return
        self._queued.extend(dataflows)
        self._start()

    def queue_deleted(self, dataflows: list[Described]) -> None:
        """Queue setting ``deleted_at`` of deleted ``dataflows`` (after any graph write queued
        before; one whose graph tables are not written yet gets it with them)."""
        if self.store is None or not dataflows:
            return
        self._deleted.extend(dataflows)
        self._start()

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        # Whatever queued up while a batch was written goes into the next one.
        loop = asyncio.get_running_loop()
        while self._queued or self._deleted:
            batch, self._queued = self._queued, []
            if batch:
                await loop.run_in_executor(self.pool, self._write, batch)
            deleted, self._deleted = self._deleted, []
            if deleted:
                await loop.run_in_executor(self.pool, self._mark, deleted)

    def _mark(self, dataflows: list[Described]) -> None:
        assert self.store is not None
        try:
            self.store.mark_deleted({d.id: d.deleted_at for d in dataflows if d.deleted_at is not None})
        except Exception:
            self.metrics.delta_errors.inc()
            log.exception("marking dataflows deleted failed", extra={"dataflows": [d.id for d in dataflows]})

    def _write(self, dataflows: list[Described]) -> None:
        assert self.store is not None
        try:
            if self.native_psi:
                # Not cached on the dataflow: Psi has up to n^2 entries, and keeping them alive
                # made every full pass of the garbage collector tens of milliseconds longer.
                self.store.write_summaries({d.id: path_summaries(d.graph) for d in dataflows
                                            if len(d.graph.locations()) <= NATIVE_PSI_MAX_LOCATIONS})
            self.store.write_dataflows([(d.id, d.name, d.graph, d.created_at) for d in dataflows])
            for dataflow in dataflows:
                dataflow.lag.graph_stored = True
            self.store.mark_deleted({d.id: d.deleted_at for d in dataflows if d.deleted_at is not None})
        except Exception:
            self.metrics.delta_errors.inc()
            log.exception("writing the graph tables failed", extra={"dataflows": [d.id for d in dataflows]})
