"""The graph tables of registered dataflows (``dataflows``, ``scopes``, ``nodes``, ``edges``,
... and the native ``summaries``), written in batches on the Delta thread, and the
``dataflows.deleted_at`` of deleted ones.

Guarantees: a queued dataflow's tables are written once, with its ``dataflows`` row last, so a
crash half-way leaves it without that row and recovery queues it again; a write that fails is
retried (after 1 s, then twice as long each time, at most :data:`RETRY_MAX_SECONDS`) until it
lands, as is a failed ``deleted_at`` (each write replaces its dataflows' partitions, so a
retry after a partial failure writes nothing twice); a burst of
registrations costs a few commits (up to :data:`GRAPHS_PER_WRITE` dataflows per commit of each
graph table, one ``summaries`` commit per :data:`PSI_ROWS_PER_WRITE` rows), not six each, and
does not hold the progress flushes back
(they share the one Delta thread). The native ``Psi`` of every scope fills ``summaries`` in the
same step, before the ``dataflows`` row, so a listed dataflow has its summaries, for dataflows
whose scopes have up to :data:`NATIVE_PSI_MAX_LOCATIONS` locations each (``Psi`` has up to n^2
rows: beyond that it is the Spark check's job, not a side task of this thread).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Executor
from typing import Protocol

import pyarrow as pa

from api.delta.store import Store
from api.delta.sync import DeltaLag
from api.live.scopes import Hosting
from api.metrics import Metrics
from spark_jobs.rows import Psi
from spark_jobs.storage import summary_table
from spark_jobs.tables import with_dataflow_id
from tracker.graph import Graph
from tracker.scope import NestedGraph, ScopePath
from tracker.structure import path_summaries

log = logging.getLogger("tracker.graphs")
NATIVE_PSI_MAX_LOCATIONS = 1000
PSI_ROWS_PER_WRITE = 400_000
"""At most about this many ``summaries`` rows per commit, at least one dataflow's: a batch of
graphs writes its summaries in several commits, so the Delta thread never holds the rows of
hundreds of graphs at once."""
GRAPHS_PER_WRITE = 256
"""At most this many dataflows per write of the graph tables. A commit to a table of thousands
of partitions costs ~0.1 s whatever it adds: at ten dataflows per write (when the ``Psi`` bound
set the batch), a burst of 2,500 registrations made 1,500 commits and kept each shard's Delta
thread busy for minutes after it."""
SHAPES_KEPT = 8
"""Graph shapes whose ``summaries`` rows :class:`Shapes` keeps (each up to a few MB)."""
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


def native_psis(graph: Graph | NestedGraph) -> dict[ScopePath, Psi] | None:
    """``Psi`` of every scope of ``graph`` (scope nodes carrying their scope summaries), by scope
    path; ``None`` if some scope has more than :data:`NATIVE_PSI_MAX_LOCATIONS` locations."""
    scopes = {(): graph} if isinstance(graph, Graph) else {p: s.graph for p, s in graph.scopes.items()}
    if any(len(g.locations()) > NATIVE_PSI_MAX_LOCATIONS for g in scopes.values()):
        return None
    return {path: path_summaries(g) for path, g in scopes.items()}


class Shapes:
    """The ``summaries`` rows of the last few graph shapes written (:data:`SHAPES_KEPT`), as Arrow
    tables whose ``dataflow_id`` is to be set: the same program registered many times (one
    dataflow per job, per tenant, per test run) computes its ``Psi`` once. ``Psi`` in Python
    takes about half a second for a ring of 100 operators (40,000 pairs) on the Delta thread,
    holding the GIL the event loop needs; a graph never seen before still pays it.

    >>> from tracker.graph import Edge, Graph, Location, Node
    >>> g = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
    >>> shapes = Shapes()
    >>> shapes.rows(g).num_rows, shapes.rows(g) is shapes.rows(g), shapes.computed
    (3, True, 1)
    """

    def __init__(self) -> None:
        self._kept: OrderedDict[Graph | NestedGraph, pa.Table | None] = OrderedDict()
        self.computed = 0
        """Shapes whose ``Psi`` was computed (not found here)."""

    def rows(self, graph: Graph | NestedGraph) -> pa.Table | None:
        """``graph``'s ``summaries`` rows (``dataflow_id`` empty), ``None`` if a scope is larger
        than :data:`NATIVE_PSI_MAX_LOCATIONS`. Flat graphs only are kept (a nested graph holds
        mappings: it has no hash)."""
        flat = isinstance(graph, Graph)
        if flat and graph in self._kept:
            self._kept.move_to_end(graph)
            return self._kept[graph]
        psis = native_psis(graph)
        rows = None if psis is None else summary_table({"": psis})
        self.computed += 1
        if not flat:
            return rows
        self._kept[graph] = rows
        if len(self._kept) > SHAPES_KEPT:
            self._kept.popitem(last=False)
        return rows


def _chunks(found: list[tuple[str, pa.Table]], limit: int) -> Iterator[pa.Table]:
    """The ``summaries`` rows of ``(dataflow_id, shape rows)``, each shape's rows given the
    dataflow's id, in tables of at most about ``limit`` rows (at least one dataflow each).

    >>> rows = pa.table({"dataflow_id": ["", ""], "x": [1, 2]})
    >>> [t.column("dataflow_id").to_pylist() for t in _chunks([("a", rows), ("b", rows), ("c", rows)], 4)]
    [['a', 'a', 'b', 'b'], ['c', 'c']]
    """
    chunk: list[pa.Table] = []
    size = 0
    for dataflow_id, rows in found:
        if chunk and size + rows.num_rows > limit:
            yield pa.concat_tables(chunk)
            chunk, size = [], 0
        chunk.append(with_dataflow_id(rows, dataflow_id))
        size += rows.num_rows
    if chunk:
        yield pa.concat_tables(chunk)


class GraphWriter:
    """A queue of dataflows whose graph tables are to be written, and the task writing them."""

    def __init__(self, store: Store | None, pool: Executor, metrics: Metrics) -> None:
        self.store = store
        self.pool = pool
        self.metrics = metrics
        self._queued: list[Described] = []
        self._deleted: list[Described] = []
        self._task: asyncio.Task[None] | None = None
        self.shapes = Shapes()

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
            batch = self._queued[:GRAPHS_PER_WRITE]
            self._queued = self._queued[len(batch):]
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
            # made every full pass of the garbage collector tens of milliseconds longer. Its
            # Arrow rows (no Python object per row) are cached per graph shape instead.
            found = [(i, rows) for i, _, graph, _ in graphs if (rows := self.shapes.rows(graph)) is not None]
            self.store.write_dataflows(graphs, _chunks(found, PSI_ROWS_PER_WRITE))
            for dataflow in dataflows:
                dataflow.lag.graph_stored = True
            self.store.mark_deleted({d.id: d.deleted_at for d in dataflows if d.deleted_at is not None})
            return True
        except Exception:
            self.metrics.delta_errors.inc()
            log.exception("writing the graph tables failed; will retry", extra={"dataflows": [d.id for d in dataflows]})
            return False
