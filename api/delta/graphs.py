"""The graph tables of registered dataflows (``dataflows``, ``scopes``, ``nodes``, ``edges``,
... and the native ``summaries``), written in batches on the Delta thread, and the
``dataflows.deleted_at`` of deleted ones.

Guarantees: a queued dataflow's tables are written once, with its ``dataflows`` row last, so a
crash half-way leaves it without that row and recovery queues it again; a write that fails is
retried (after 1 s, then twice as long each time, at most :data:`RETRY_MAX_SECONDS`) until it
lands, as is a failed ``deleted_at`` (each write replaces its dataflows' partitions, so a
retry after a partial failure writes nothing twice); a burst of
registrations costs a few commits, not six each, and does not hold the progress flushes back
(they share the one Delta thread). The native ``Psi`` of every scope fills ``summaries`` in the
same step, before the ``dataflows`` row, so a listed dataflow has its summaries, for dataflows
whose scopes have up to :data:`NATIVE_PSI_MAX_LOCATIONS` locations each (``Psi`` has up to n^2
rows: beyond that it is the Spark check's job, not a side task of this thread).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from typing import Protocol

from api.delta.store import Store
from api.delta.sync import DeltaLag
from api.live.scopes import Hosting
from api.metrics import Metrics
from tracker.graph import Graph
from tracker.scope import NestedGraph, ScopePath
from tracker.structure import path_summaries

log = logging.getLogger("tracker.graphs")
NATIVE_PSI_MAX_LOCATIONS = 1000
RETRY_MAX_SECONDS = 60.0
"""The longest wait between two attempts at a failed graph-table write."""


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
    def hosting(self) -> Hosting | None: ...
    @property
    def deleted_at(self) -> float | None: ...


def native_psis(graph: Graph | NestedGraph) -> dict[ScopePath, object] | None:
    """``Psi`` of every scope of ``graph`` (scope nodes carrying their scope summaries), by scope
    path; ``None`` if some scope has more than :data:`NATIVE_PSI_MAX_LOCATIONS` locations."""
    scopes = {(): graph} if isinstance(graph, Graph) else {p: s.graph for p, s in graph.scopes.items()}
    if any(len(g.locations()) > NATIVE_PSI_MAX_LOCATIONS for g in scopes.values()):
        return None
    return {path: path_summaries(g) for path, g in scopes.items()}


class GraphWriter:
    """A queue of dataflows whose graph tables are to be written, and the task writing them."""

    def __init__(self, store: Store | None, pool: Executor, metrics: Metrics) -> None:
        self.store = store
        self.pool = pool
        self.metrics = metrics
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
        # Whatever queued up while a batch was written goes into the next one; a batch that
        # failed goes back in front of it, after a pause.
        loop = asyncio.get_running_loop()
        pause = 1.0
        while self._queued or self._deleted:
            batch, self._queued = self._queued, []
            written = not batch or await loop.run_in_executor(self.pool, self._write, batch)
            if not written:
                self._queued[:0] = batch
            deleted, self._deleted = self._deleted, []
            marked = not deleted or await loop.run_in_executor(self.pool, self._mark, deleted)
            if not marked:
                self._deleted[:0] = deleted
            if written and marked:
                pause = 1.0
                continue
            await asyncio.sleep(pause)
            pause = min(2 * pause, RETRY_MAX_SECONDS)

    def _mark(self, dataflows: list[Described]) -> bool:
        assert self.store is not None
        try:
            self.store.mark_deleted({d.id: d.deleted_at for d in dataflows if d.deleted_at is not None})
            return True
        except Exception:
            self.metrics.delta_errors.inc()
            log.exception("marking dataflows deleted failed; will retry",
                          extra={"dataflows": [d.id for d in dataflows]})
            return False

    def _write(self, dataflows: list[Described]) -> bool:
        assert self.store is not None
        try:
            graphs = [(d.id, d.name, d.graph if d.hosting is None else d.hosting.nested, d.created_at)
                      for d in dataflows]
            # Not cached on the dataflow: Psi has up to n^2 entries, and keeping them alive
            # made every full pass of the garbage collector tens of milliseconds longer.
            psis = {i: psi for i, _, graph, _ in graphs if (psi := native_psis(graph)) is not None}
            self.store.write_dataflows(graphs, psis)
            for dataflow in dataflows:
                dataflow.lag.graph_stored = True
            self.store.mark_deleted({d.id: d.deleted_at for d in dataflows if d.deleted_at is not None})
            return True
        except Exception:
            self.metrics.delta_errors.inc()
            log.exception("writing the graph tables failed; will retry", extra={"dataflows": [d.id for d in dataflows]})
            return False
