"""Delta storage: the warehouse, one Delta table per name, partitioned by dataflow.

Every write is one Delta commit (atomic: readers see all of it or none of it) and returns the
table's new version; reads can travel back to any past version. Two backends produce the same
standard tables:

* ``delta-spark`` when the session has Delta's JVM classes: Spark reads and writes the tables
  itself (:meth:`Warehouse.spark_read`, :meth:`Warehouse.spark_write`), so on a cluster the
  executors do the IO; the driver only commits the log (:mod:`spark_jobs.commits`). Every read
  and write of such a warehouse goes through Spark, delta-rs is not called.
* ``delta-rs`` (the ``deltalake`` package) otherwise, which needs no Spark at all, so the
  service can write on its request path without a JVM; Spark jobs then read and write through
  Arrow on the driver.

``TRACKER_DRIVER_DELTA_RS=forbid`` makes a ``delta-spark`` warehouse raise on any delta-rs call
(the cluster tests use it to show the jobs' IO is Spark's).

Long because: it is the one reader and writer of the warehouse for both delta-rs and
delta-spark; every table's reads, commits and retries in one place keeps the partitioning and
the exactly-once commit rules in one reading.

>>> import tempfile
>>> wh = Warehouse(tempfile.mkdtemp())
>>> wh.append("edges", [{"dataflow_id": "d", "src_node": 0, "src_port": 0, "dst_node": 1, "dst_port": 0}])
0
>>> wh.read("edges", "d").num_rows, wh.dataflow_ids()
(1, [])
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from spark_jobs.rows import (
    AnyLocation,
    Birth,
    Loc,
    Psi,
    dataflow_row,
    frontier_columns,
    frontier_rows,
    graph_rows,
    pointstamp_columns,
    pointstamp_rows,
    read_location,
)
from spark_jobs.tables import ADDED_COLUMNS, TABLES, Rows, missing_columns, schema_of, to_arrow, with_dataflow_id
from tracker.antichain import Antichain
from tracker.graph import Connection, Edge, Graph, Location, Node
from tracker.scope import NestedGraph, ScopePath
from tracker.timestamp import PathSummary, Timestamp

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Backend = Literal["delta-spark", "delta-rs"]
log = logging.getLogger("tracker.storage")

_LOCKS: dict[str, threading.Lock] = defaultdict(threading.Lock)
POINTSTAMPS_APP = "tracker-pointstamps:"
"""Prefix of the Delta app id under which ``pointstamps`` commits record the progress version
they include (one app id per dataflow): see :meth:`Warehouse.pointstamps_version`."""


COMMIT_ATTEMPTS = 8
"""How many times one delta-rs write is tried when other writers' commits conflict with it."""
_T = TypeVar("_T")


def _columnar(table: str, columns: dict[str, list[Any]]) -> pa.Table:
    """``columns`` (named as ``table``'s schema, which gives their types) as an Arrow table."""
    schema = schema_of(table)
    return pa.table({name: pa.array(values, schema.field(name).type) for name, values in columns.items()})


def _retrying(commit: Callable[[], _T]) -> _T:
    """``commit()`` (one delta-rs write), tried again after a short random pause while it fails
    because another writer committed first in a way delta-rs does not reconcile by itself:
    several processes (the shards, the Spark process) share the warehouse, and the first
    writes to a new table race to create it. delta-rs raises these before its commit exists
    (``CommitFailedError``; "already exists" for a table created meanwhile), so the write is
    not in the table and trying again can neither lose nor duplicate a row. Appends to
    different partitions, and replacements of disjoint partitions, are reconciled by delta-rs
    itself (its own retries over newer versions)."""
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return commit()
        except (CommitFailedError, DeltaError) as error:
            created = not isinstance(error, CommitFailedError) and "already exists" in str(error)
            if attempt == COMMIT_ATTEMPTS or not (isinstance(error, CommitFailedError) or created):
                raise
            time.sleep(random.uniform(0.005, 0.02) * attempt)
    raise AssertionError("unreachable")


def _forbid_delta_rs(backend: str) -> None:
    if backend == "delta-spark" and os.environ.get("TRACKER_DRIVER_DELTA_RS") == "forbid":
        raise RuntimeError("delta-rs called on the driver of a delta-spark warehouse (TRACKER_DRIVER_DELTA_RS=forbid)")


def _scan(delta: DeltaTable, filters: list[tuple[str, str, Any]], columns: list[str] | None = None) -> pa.Table:
    """Rows matching every ``(column, "=" | ">" | "in", value)``. The ``dataflow_id`` conditions
    also choose the files before any is opened: with a row filter alone delta-rs builds a dataset
    over every file of the table, about a second per read once it holds a thousand files."""
    prune = [f for f in filters if f[0] == "dataflow_id"]
    dataset = delta.to_pyarrow_dataset(file_pruning_predicate=prune or None)
    where = None
    for column, op, value in filters:
        field = pc.field(column)
        condition = field.isin(value) if op == "in" else field == value if op == "=" else field > value
        where = condition if where is None else where & condition
    return dataset.to_table(columns=columns, filter=where)


def warehouse_problem(warehouse: str) -> str | None:
    """Why ``warehouse`` cannot be read (``"does not exist"`` or ``"is not a directory"``), or
    ``None``; URIs are not checked here. Readers use it so as never to create a warehouse."""
    if "://" in warehouse or Path(warehouse).is_dir():
        return None
    return "is not a directory" if Path(warehouse).exists() else "does not exist"


class UnknownDataflowError(LookupError):
    """The warehouse holds no dataflow with this id."""


class LegacyWarehouseError(ValueError):
    """A table of the warehouse was written by an older layout (before scopes: no ``scope``
    column); it is refused rather than guessed at."""


def summary_table(psis: Mapping[str, Mapping[ScopePath, Psi]]) -> pa.Table:
    """The ``summaries`` rows of ``dataflow_id -> scope -> Psi`` as one Arrow table, built column
    by column: a ring of 100 operators has 40,000 rows, and a dict per row held ~20 MB of
    short-lived objects per dataflow, which a burst of registrations left behind in the
    allocator's arenas.

    >>> from tracker.graph import Location
    >>> psi = {(Location.source(0, 0), Location.target(1, 0)): Antichain([PathSummary((0, 1)), PathSummary((1, 0))])}
    >>> [row["summary"] for row in summary_table({"d": {(): psi}}).to_pylist()]
    [[0, 1], [1, 0]]
    """
    names = [f.name for f in schema_of("summaries")]
    cols: dict[str, list[Any]] = {name: [] for name in names}
    ids, scopes, summaries = cols["dataflow_id"], cols["scope"], cols["summary"]
    fn, fp, fk, tn, tp, tk = (cols[n] for n in ("from_node", "from_port", "from_kind", "to_node", "to_port", "to_kind"))
    for dataflow_id, by_scope in psis.items():
        for scope, psi in by_scope.items():
            path = list(scope)
            for (a, b), chain in psi.items():
                for s in chain:
                    ids.append(dataflow_id)
                    scopes.append(path)
                    fn.append(a.node)
                    fp.append(a.port)
                    fk.append(a.kind)
                    tn.append(b.node)
                    tp.append(b.port)
                    tk.append(b.kind)
                    summaries.append(s)
    schema = schema_of("summaries")
    return pa.Table.from_arrays([pa.array(cols[f.name], type=f.type) for f in schema], schema=schema)


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class Warehouse:
    """A directory of Delta tables, created on first write.

    ``spark`` is optional: without it (or without Delta's JVM classes in it) every read and write
    goes through delta-rs; with Delta's classes, every read and write goes through delta-spark
    (the same standard tables either way). ``backend`` forces one (``"delta-rs"`` with a Delta
    session, to compare the two; ``"delta-spark"`` fails without Delta's classes).

    >>> import tempfile
    >>> wh = Warehouse(tempfile.mkdtemp())
    >>> wh.backend
    'delta-rs'
    """

    def __init__(self, root: str | Path, spark: SparkSession | None = None, backend: Backend | None = None) -> None:
        self.root = str(root)
        self.spark = spark
        self._pinned: dict[str, DeltaTable] | None = None  # see pinned()
        self.backend: Backend = "delta-rs"
        if spark is not None and backend != "delta-rs":
            from spark_jobs.session import has_delta_jvm

            if has_delta_jvm(spark):
                self.backend = "delta-spark"
        if backend == "delta-spark" and self.backend != "delta-spark":
            raise ValueError("backend 'delta-spark' needs a Spark session with Delta's JVM classes")
        if "://" not in self.root:
            Path(self.root).mkdir(parents=True, exist_ok=True)

    # -- paths and versions -------------------------------------------------------------------

    def path(self, table: str) -> str:
        """The table's location: ``<root>/<table>``."""
        schema_of(table)
        return f"{self.root.rstrip('/')}/{table}"

    def exists(self, table: str) -> bool:
        """True iff the table has been created (some write happened)."""
        if self.backend == "delta-spark":
            from spark_jobs.commits import table_exists

            return table_exists(self._session(), self.path(table))
        _forbid_delta_rs(self.backend)
        return DeltaTable.is_deltatable(self.path(table))

    def stored_columns(self, table: str) -> list[str] | None:
        """The column names the table has on disk (``None`` before its first write)."""
        if not self.exists(table):
            return None
        if self.backend == "delta-spark":
            return list(self._session().read.format("delta").load(self.path(table)).schema.names)
        return list(pa.schema(DeltaTable(self.path(table)).schema().to_arrow()).names)

    def check_layout(self) -> None:
        """Refuse a warehouse whose existing tables lack columns of :data:`TABLES` (one written
        by an older version of this project, before scopes).

        Raises:
            LegacyWarehouseError: one line naming the first such table and what it lacks.
        """
        for table in TABLES:
            stored = self.stored_columns(table)
            missing = [] if stored is None else missing_columns(table, stored)
            added = [name for name in missing if name in ADDED_COLUMNS.get(table, ())]
            if added and added == missing:
                self._add_columns(table, added)
            elif missing:
                raise LegacyWarehouseError(
                    f"warehouse {self.root!r}: table {table!r} has the layout of an older version (no column "
                    f"{', '.join(missing)}); this version reads and writes the scoped layout only: use a new "
                    "warehouse (or re-register the dataflows there)")

    def _add_columns(self, table: str, names: list[str]) -> None:
        """Add the nullable ``names`` (:data:`~spark_jobs.tables.ADDED_COLUMNS`) to a table
        written before them, in one commit; its rows read them as null."""
        from deltalake import Field
        from deltalake.schema import PrimitiveType

        kinds = {pa.timestamp("us", tz="UTC"): "timestamp", pa.string(): "string"}
        fields = [Field(name, PrimitiveType(kinds[TABLES[table].field(name).type]), nullable=True) for name in names]
        with _LOCKS[self.path(table)]:
            if missing_columns(table, self.stored_columns(table) or []):  # not done meanwhile by another process
                DeltaTable(self.path(table)).alter.add_columns(fields)
        log.info("table upgraded: columns added", extra={"table": table, "columns": names})

    def version(self, table: str) -> int | None:
        """The table's current Delta version, ``None`` before its first write."""
        if self.backend == "delta-spark":
            from spark_jobs.commits import table_version

            return table_version(self._session(), self.path(table))
        if not self.exists(table):
            return None
        return DeltaTable(self.path(table)).version()

    # -- writes ---------------------------------------------------------------------------------

    def append(self, table: str, rows: Rows) -> int:
        """Append rows in one atomic commit; return the table's new version.

        >>> import tempfile
        >>> wh = Warehouse(tempfile.mkdtemp())
        >>> wh.append("pointstamps", [{"dataflow_id": "d", "node": 0, "port": 0, "kind": "source",
        ...                            "time": [0], "count": 1}])
        0
        """
        data = to_arrow(table, rows)
        if self.backend == "delta-spark":
            return self.spark_write(table, self._spark_df(data, table))
        _forbid_delta_rs(self.backend)
        path = self.path(table)
        with _LOCKS[path]:
            _retrying(lambda: write_deltalake(path, data, mode="append", partition_by=["dataflow_id"]))
            return DeltaTable(path).version()

    def replace_partition(self, table: str, dataflow_id: str, rows: Rows) -> int:
        """Atomically replace every row of ``dataflow_id`` by ``rows`` (one commit); new version.

        Rows of other dataflows are untouched; ``rows`` must all belong to ``dataflow_id``.
        """
        return self.replace_partitions(table, [dataflow_id], rows)

    def replace_partitions(
        self, table: str, dataflow_ids: Iterable[str], rows: Rows, watermarks: Mapping[str, int] | None = None
    ) -> int:
        """Atomically replace the rows of several dataflows (one commit); new version.

        ``watermarks`` (app id -> version) are recorded in the same commit as Delta application
        transactions (``txn`` actions), readable with :meth:`watermark`: a job that records what
        it consumed this way can never apply the same input twice.
        """
        ids = sorted(set(dataflow_ids))
        data = to_arrow(table, rows)
        stray = set(pc.unique(data.column("dataflow_id")).to_pylist()) - set(ids)
        if stray:
            raise ValueError(f"replace_partitions({table!r}, {ids!r}) got rows of {sorted(stray)}")
        predicate = "dataflow_id IN (" + ", ".join(_quote(i) for i in ids) + ")" if ids else "false"
        path = self.path(table)
        if self.backend == "delta-spark":
            return self.spark_write(table, self._spark_df(data, table), ids, watermarks)
        commit = CommitProperties(app_transactions=[Transaction(a, v) for a, v in (watermarks or {}).items()])

        def replace() -> None:
            if data.num_rows == 0 and DeltaTable.is_deltatable(path):
                DeltaTable(path).delete(predicate, commit_properties=commit)
            elif data.num_rows == 0:
                DeltaTable.create(path, TABLES[table], partition_by=["dataflow_id"], commit_properties=commit)
            else:
                write_deltalake(path, data, mode="overwrite", predicate=predicate, partition_by=["dataflow_id"],
                                commit_properties=commit)

        with _LOCKS[path]:
            _retrying(replace)
            return DeltaTable(path).version()

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Within the block, reads open each table once and keep reading that version.

        Opening a Delta table replays its log from the last checkpoint; a restart reading a
        dozen things about each of hundreds of dataflows spent minutes doing just that. Only for
        a reader that knows nobody writes meanwhile (recovery, before the service serves)."""
        self._pinned = {}
        try:
            yield
        finally:
            self._pinned = None

    def _open(self, path: str, version: int | None = None) -> DeltaTable:
        _forbid_delta_rs(self.backend)
        if self._pinned is None:
            return DeltaTable(path, version=version) if version is not None else DeltaTable(path)
        delta = self._pinned.get(path)
        if delta is None:
            delta = self._pinned[path] = DeltaTable(path)
        if version is not None and version != delta.version():
            return DeltaTable(path, version=version)
        return delta

    def optimize(self, table: str, dataflow_ids: list[str]) -> dict[str, int]:
        """Merge the small files of these dataflows' partitions into large ones (Delta
        ``OPTIMIZE``): an append of many dataflows leaves one small file per partition per
        commit, which every later read has to open. Rows and application transactions (the
        ``pointstamps`` watermarks) are untouched; the replaced files stay on disk, for readers
        of older versions, until :meth:`vacuum`. Returns the files added and removed."""
        path = self.path(table)
        if not DeltaTable.is_deltatable(path) or not dataflow_ids:
            return {"added": 0, "removed": 0}
        with _LOCKS[path]:
            merged = _retrying(lambda: DeltaTable(path).optimize.compact(
                partition_filters=[("dataflow_id", "in", list(dataflow_ids))]))
        return {"added": int(merged.get("numFilesAdded", 0)), "removed": int(merged.get("numFilesRemoved", 0))}

    def vacuum(self, table: str, retention_hours: float = 24, full: bool = False) -> int:
        """Delete the table's files that no version of the last ``retention_hours`` refers to
        (Delta ``VACUUM``); versions inside the retention stay readable (time travel). The
        removals the log records are found from the log; ``full`` also lists the directory, to
        find files a crashed write left without ever committing them (costly on a directory of
        many files: once after a restart is enough). Only for the warehouse's one writer (see
        :mod:`spark_jobs.ownership`): a write in progress elsewhere would lose its files.
        Returns how many files were deleted."""
        path = self.path(table)
        if not DeltaTable.is_deltatable(path):
            return 0
        with _LOCKS[path]:
            deleted = DeltaTable(path).vacuum(retention_hours=math.ceil(retention_hours), dry_run=False,
                                              enforce_retention_duration=False, full=full)
        return len(deleted)

    def watermark(self, table: str, app_id: str) -> int | None:
        """The last version recorded under ``app_id`` by :meth:`replace_partitions`, or ``None``."""
        if self.backend == "delta-spark":
            from spark_jobs.commits import transaction_version

            return transaction_version(self._session(), self.path(table), app_id)
        if not self.exists(table):
            return None
        return self._open(self.path(table)).transaction_version(app_id)

    def _session(self) -> SparkSession:
        if self.spark is None:
            from spark_jobs.session import get_spark

            self.spark = get_spark()
        return self.spark

    def _spark_df(self, data: pa.Table, table: str) -> DataFrame:
        from spark_jobs.frames import arrow_to_spark

        # Rows from the driver: one task writes them (one file per dataflow), which measured
        # twice as fast as the default parallelism's one file per dataflow per task.
        return arrow_to_spark(self._session(), data, TABLES[table]).coalesce(1)

    # -- reads ----------------------------------------------------------------------------------

    def read(self, table: str, dataflow_id: str | list[str] | None = None, version: int | None = None) -> pa.Table:
        """The table's rows (one dataflow's, or a list's, if given), now or as of ``version``
        (time travel).

        Before the first write, an empty table of the right schema.
        """
        schema = schema_of(table)
        path = self.path(table)
        if self.backend == "delta-spark":
            if version is not None and not self.exists(table):
                raise ValueError(f"table {table!r} has no version {version}: it was never written")
            return to_arrow(table, self.spark_read(table, dataflow_id, version).toArrow())
        if not DeltaTable.is_deltatable(path):
            if version is not None:
                raise ValueError(f"table {table!r} has no version {version}: it was never written")
            return schema.empty_table()
        delta = self._open(path, version)
        filters: list[tuple[str, str, Any]] = []
        if isinstance(dataflow_id, str):
            filters = [("dataflow_id", "=", dataflow_id)]
        elif dataflow_id is not None:
            if not list(dataflow_id):
                return schema.empty_table()
            filters = [("dataflow_id", "in", list(dataflow_id))]
        return to_arrow(table, _scan(delta, filters))

    def columns(self, table: str, dataflow_id: str, names: list[str], after_version: int | None = None) -> pa.Table:
        """Only the named columns of ``dataflow_id``'s rows (with a ``version`` above
        ``after_version``, if given), as stored; the filters reach the Parquet reader."""
        path = self.path(table)
        if self.backend == "delta-spark":
            df = self.spark_read(table, dataflow_id)
            if after_version is not None:
                df = df.where(df.version > after_version)
            return df.select(*names).toArrow()
        if not DeltaTable.is_deltatable(path):
            return schema_of(table).empty_table().select(names)
        filters: list[tuple[str, str, Any]] = [("dataflow_id", "=", dataflow_id)]
        if after_version is not None:
            filters.append(("version", ">", after_version))
        return _scan(self._open(path), filters, names)

    def max_of(self, table: str, dataflow_id: str, column: str) -> int | None:
        """The largest ``column`` value among ``dataflow_id``'s rows (``None`` if it has none),
        reading that one column only."""
        data = self.columns(table, dataflow_id, [column])
        return pc.max(data.column(column)).as_py() if data.num_rows else None

    def spark_read(
        self, table: str, dataflow_id: str | list[str] | None = None, version: int | None = None
    ) -> DataFrame:
        """The table as a Spark DataFrame: read by Spark's tasks with delta-spark, else through
        Arrow on the driver. Before the first write, an empty frame of the table's schema."""
        spark = self._session()
        if self.backend == "delta-spark":
            if not self.exists(table):
                from spark_jobs.frames import arrow_to_spark

                return arrow_to_spark(spark, schema_of(table).empty_table(), TABLES[table])
            reader = spark.read.format("delta")
            if version is not None:
                reader = reader.option("versionAsOf", version)
            df = reader.load(self.path(table))
            if dataflow_id is not None:
                ids = [dataflow_id] if isinstance(dataflow_id, str) else list(dataflow_id)
                df = df.where(df.dataflow_id.isin(ids))
            return df.select(*TABLES[table].names)
        from spark_jobs.frames import arrow_to_spark

        return arrow_to_spark(spark, self.read(table, dataflow_id, version), TABLES[table])

    def spark_write(
        self,
        table: str,
        df: DataFrame,
        dataflow_ids: str | Iterable[str] | None = None,
        watermarks: Mapping[str, int] | None = None,
    ) -> int:
        """Write a Spark DataFrame in one commit: replace the rows of ``dataflow_ids`` if given
        (recording ``watermarks`` as :meth:`replace_partitions` does), else append. With
        delta-spark the frame is never collected: its tasks write the files. Columns with a
        default (``scope``: the root, ``deleted_at``, ``is_scope``) may be left out."""
        from spark_jobs.frames import with_defaults

        data = with_defaults(df, table).select(*TABLES[table].names)
        if self.backend != "delta-spark":
            rows = data.toArrow()
            if dataflow_ids is None:
                return self.append(table, rows)
            ids = [dataflow_ids] if isinstance(dataflow_ids, str) else list(dataflow_ids)
            return self.replace_partitions(table, ids, rows, watermarks)
        from spark_jobs import commits

        path = self.path(table)
        if data._jdf.rdd().getNumPartitions() > 1:
            # Each task writes one file per dataflow it holds: gather each dataflow's rows in one
            # task first (fewer, larger files; measured 1.5x faster for small tables).
            data = data.repartition("dataflow_id")
        with _LOCKS[path]:
            if dataflow_ids is None:
                return commits.append(self._session(), path, data)
            ids = [dataflow_ids] if isinstance(dataflow_ids, str) else sorted(set(dataflow_ids))
            return commits.replace(self._session(), path, data, ids, watermarks)

    # -- graphs ---------------------------------------------------------------------------------

    def write_dataflow(self, dataflow_id: str, name: str, graph: Graph | NestedGraph, graph_version: int = 1,
                       created_at: datetime | None = None) -> None:
        """Write one dataflow's graph tables: see :meth:`write_dataflows`."""
        self.write_dataflows([(dataflow_id, name, graph, created_at or datetime.now(UTC))], graph_version)

    def write_dataflows(self, graphs: Iterable[tuple[str, str, Graph | NestedGraph, datetime]],
                        graph_version: int = 1, psis: Mapping[str, Mapping[ScopePath, Psi]] | None = None,
                        summaries: pa.Table | Iterable[pa.Table] | None = None) -> None:
        """Write the graphs of ``(dataflow_id, name, graph, created_at)``: scopes, nodes,
        connections and edges (and ``summaries`` from ``psis``, ``dataflow_id -> scope -> Psi``,
        or the rows of ``summaries``: a table or several, a commit each), then the ``dataflows``
        rows last, so whoever sees a dataflow listed finds its whole graph (Delta commits are
        atomic per table, not across tables). One commit per table however many dataflows: a
        burst of registrations costs a few commits, not a few each."""
        graphs = list(graphs)
        if not graphs:
            return
        ids = [dataflow_id for dataflow_id, _, _, _ in graphs]
        tables: dict[str, list[pa.Table]] = {"scopes": [], "nodes": [], "connections": [], "edges": []}
        # Rows built once per graph shape in the batch (one program registered as many
        # dataflows), then given each dataflow's id: rows as dicts cost ~2.6 ms per 100-operator
        # ring of the Delta thread's GIL, which a restarted shard's event loop needs.
        shapes: dict[Graph, dict[str, pa.Table]] = {}
        for dataflow_id, _, graph, _ in graphs:
            built = shapes.get(graph) if isinstance(graph, Graph) else None
            if built is None:
                built = {table: to_arrow(table, rows) for table, rows in graph_rows("", graph).items()}
                if isinstance(graph, Graph):
                    shapes[graph] = built
            for table, rows in built.items():
                tables[table].append(with_dataflow_id(rows, dataflow_id))
        for table, parts in tables.items():
            self.replace_partitions(table, ids, pa.concat_tables(parts))
        if psis:
            self.write_scoped_summaries(psis)
        for chunk in [summaries] if isinstance(summaries, pa.Table) else summaries or ():
            if chunk.num_rows:  # built already (summary_table's rows): a commit each
                self.replace_partitions("summaries", pc.unique(chunk.column("dataflow_id")).to_pylist(), chunk)
        self.replace_partitions("dataflows", ids, [dataflow_row(dataflow_id, name, graph, graph_version, created_at)
                                                   for dataflow_id, name, graph, created_at in graphs])

    def mark_deleted(self, deleted: Mapping[str, datetime]) -> None:
        """Set ``dataflows.deleted_at`` of each ``dataflow_id -> when`` (one commit); every other
        row and table is kept. Dataflows without a ``dataflows`` row are skipped."""
        if not deleted or not self.exists("dataflows"):
            return
        rows = self.read("dataflows", sorted(deleted)).to_pylist()
        for row in rows:
            row["deleted_at"] = deleted[row["dataflow_id"]]
        if rows:
            self.replace_partitions("dataflows", sorted({r["dataflow_id"] for r in rows}), rows)

    def dataflow_ids_named(self, name: str) -> list[tuple[str, datetime | None]]:
        """``(dataflow_id, deleted_at)`` of every dataflow registered as ``name``, oldest first."""
        if not self.exists("dataflows"):
            return []
        rows = [r for r in self.read("dataflows").to_pylist() if r["name"] == name]
        return [(r["dataflow_id"], r.get("deleted_at")) for r in sorted(rows, key=lambda r: r["created_at"])]

    def dataflow_row(self, dataflow_id: str) -> dict[str, Any]:
        """The ``dataflows`` row of ``dataflow_id``; :class:`UnknownDataflowError` if none."""
        rows = self.read("dataflows", dataflow_id).to_pylist()
        if not rows:
            raise UnknownDataflowError(f"unknown dataflow {dataflow_id!r} in warehouse {self.root}")
        return max(rows, key=lambda r: r["graph_version"])

    def read_graph(self, dataflow_id: str) -> Graph:
        """The graph written by :meth:`write_dataflow` (connections explicit, same transitions);
        ``ValueError`` for a dataflow with nested scopes (:meth:`read_nested` reads those)."""
        arity = self.dataflow_row(dataflow_id)["timestamp_arity"]
        nodes = self.read("nodes", dataflow_id).to_pylist()
        if any(r["scope"] or r["is_scope"] for r in nodes):
            raise ValueError(f"dataflow {dataflow_id!r} has nested scopes: read it with read_nested")
        grouped: dict[tuple[int, int, int], list[PathSummary]] = defaultdict(list)
        for row in self.read("connections", dataflow_id).to_pylist():
            grouped[(row["node"], row["input_port"], row["output_port"])].append(PathSummary(row["summary"]))
        built = []
        for row in sorted(nodes, key=lambda r: r["node"]):
            conns = tuple(Connection(i, o, tuple(s)) for (n, i, o), s in sorted(grouped.items()) if n == row["node"])
            built.append(Node(row["node"], row["inputs"], row["outputs"], row["name"] or "", conns))
        edges = [
            Edge(Location.source(r["src_node"], r["src_port"]), Location.target(r["dst_node"], r["dst_port"]))
            for r in self.read("edges", dataflow_id).to_pylist()
        ]
        return Graph.build(arity, built, edges)

    def read_nested(self, dataflow_id: str) -> NestedGraph:
        """The dataflow as a :class:`~tracker.scope.NestedGraph`, rebuilt from the ``scopes``,
        ``nodes``, ``connections`` and ``edges`` rows alone (scope summaries recomputed), for a
        flat dataflow too (one root scope)."""
        arity = self.dataflow_row(dataflow_id)["timestamp_arity"]
        kinds = {tuple(r["scope"]): r["kind"] for r in self.read("scopes", dataflow_id).to_pylist()}
        nodes: dict[ScopePath, list[dict[str, Any]]] = defaultdict(list)
        for row in self.read("nodes", dataflow_id).to_pylist():
            nodes[tuple(row["scope"])].append(row)
        conns: dict[tuple[ScopePath, int], dict[tuple[int, int], list[list[int]]]] = defaultdict(
            lambda: defaultdict(list))
        for row in self.read("connections", dataflow_id).to_pylist():
            conns[(tuple(row["scope"]), row["node"])][(row["input_port"], row["output_port"])].append(row["summary"])
        edges: dict[ScopePath, list[dict[str, Any]]] = defaultdict(list)
        for row in self.read("edges", dataflow_id).to_pylist():
            edges[tuple(row["scope"])].append({"source": {"node": row["src_node"], "port": row["src_port"]},
                                               "target": {"node": row["dst_node"], "port": row["dst_port"]}})

        def body(path: ScopePath) -> dict[str, Any]:
            listed = []
            for row in sorted(nodes[path], key=lambda r: r["node"]):
                if path and row["node"] == 0:
                    continue  # the boundary: implied by the scope node's ports
                node: dict[str, Any] = {"id": row["node"], "name": row["name"] or "", "inputs": row["inputs"],
                                        "outputs": row["outputs"]}
                if row["is_scope"]:
                    node["scope"] = {"kind": kinds.get((*path, row["node"]), "region"), **body((*path, row["node"]))}
                else:
                    node["connections"] = [{"input": i, "output": o, "summaries": s}
                                           for (i, o), s in sorted(conns[(path, row["node"])].items())]
                listed.append(node)
            return {"nodes": listed, "edges": edges[path]}

        return NestedGraph.from_json(arity, body(()))

    def dataflow_ids(self) -> list[str]:
        """Every registered dataflow id, sorted."""
        data = self.read("dataflows")
        return sorted(set(data.column("dataflow_id").to_pylist()))

    # -- derived tables -------------------------------------------------------------------------

    def write_summaries(self, dataflow_id: str, psi: Mapping[tuple[Location, Location], Antichain]) -> None:
        """Replace ``dataflow_id``'s ``summaries`` by ``psi``, one row per minimal summary."""
        self.write_many_summaries({dataflow_id: psi})

    def write_many_summaries(self, psis: Mapping[str, Mapping[tuple[Location, Location], Antichain]]) -> None:
        """Replace the ``summaries`` of several flat dataflows (``dataflow_id -> Psi``) in one commit."""
        self.write_scoped_summaries({dataflow_id: {(): psi} for dataflow_id, psi in psis.items()})

    def write_scoped_summaries(self, psis: Mapping[str, Mapping[ScopePath, Psi]]) -> None:
        """Replace the ``summaries`` of several dataflows (``dataflow_id -> scope -> Psi`` within
        that scope) in one commit."""
        if not psis:
            return
        self.replace_partitions("summaries", psis.keys(), summary_table(psis))

    def read_summaries(
        self, dataflow_id: str, version: int | None = None, scope: ScopePath = ()
    ) -> dict[tuple[Location, Location], Antichain]:
        """``Psi`` of one scope (the root by default) as stored in ``summaries``."""
        return self.read_scoped_summaries(dataflow_id, version).get(scope, {})

    def read_scoped_summaries(
        self, dataflow_id: str, version: int | None = None
    ) -> dict[ScopePath, dict[tuple[Location, Location], Antichain]]:
        """``Psi`` of every scope that has rows in ``summaries``, by scope path."""
        result: dict[ScopePath, dict[tuple[Location, Location], Antichain]] = {}
        for r in self.read("summaries", dataflow_id, version).to_pylist():
            key = (
                Location(r["from_node"], r["from_port"], r["from_kind"]),
                Location(r["to_node"], r["to_port"], r["to_kind"]),
            )
            result.setdefault(tuple(r["scope"]), {}).setdefault(key, Antichain()).insert(PathSummary(r["summary"]))
        return result

    def write_pointstamps(
        self, dataflow_id: str, counts: Mapping[tuple[Loc, Timestamp], int], as_of_version: int | None = None
    ) -> int:
        """Replace ``dataflow_id``'s consolidated counts (zero counts dropped); new version.

        ``as_of_version``: the last ``progress`` version these counts include, recorded in the same
        commit (:meth:`pointstamps_version`), so the incremental Spark job knows where to resume.
        """
        marks = None if as_of_version is None else {POINTSTAMPS_APP + dataflow_id: as_of_version}
        return self.replace_partitions("pointstamps", [dataflow_id], pointstamp_rows(dataflow_id, counts), marks)

    def write_states(
        self,
        states: Mapping[str, tuple[int, Mapping[tuple[Any, Timestamp], int],
                                   Mapping[Any, Iterable[Timestamp]] | None]],
        ages: Mapping[str, tuple[Mapping[tuple[Any, Timestamp], Birth], Mapping[Any, float]]] | None = None,
    ) -> tuple[int, int | None]:
        """Replace the ``pointstamps`` (and, where given, ``frontiers``) of many dataflows at once:
        ``dataflow_id -> (as_of_version, counts, frontiers or None)``. One commit per table
        whatever the number of dataflows (a commit costs about as much for one partition as for
        hundreds), each dataflow's ``as_of_version`` recorded in the ``pointstamps`` commit.
        ``ages`` (``dataflow_id -> (births, since)``, see :func:`spark_jobs.rows.pointstamp_columns`
        and :func:`spark_jobs.rows.frontier_columns`) fill ``born_at``, ``worker`` and ``since``:
        null where not given. Returns the two tables' new versions (``None`` for ``frontiers``
        when none was given).
        """
        births = {i: b for i, (b, _) in (ages or {}).items()}
        points = _columnar("pointstamps", pointstamp_columns({i: counts for i, (_, counts, _) in states.items()},
                                                             births))
        marks = {POINTSTAMPS_APP + i: version for i, (version, _, _) in states.items()}
        version = self.replace_partitions("pointstamps", states.keys(), points, marks)
        with_frontiers = {i: f for i, (_, _, f) in states.items() if f is not None}
        if not with_frontiers:
            return version, None
        since = {i: moved for i, (_, moved) in (ages or {}).items()}
        return version, self.replace_partitions("frontiers", with_frontiers.keys(),
                                                _columnar("frontiers", frontier_columns(with_frontiers, since)))

    def pointstamps_version(self, dataflow_id: str) -> int | None:
        """The ``progress`` version the stored ``pointstamps`` of ``dataflow_id`` include, as
        recorded by a writer that said so; ``None`` if no writer did."""
        return self.watermark("pointstamps", POINTSTAMPS_APP + dataflow_id)

    def read_pointstamps(self, dataflow_id: str, version: int | None = None, scoped: bool = False
                         ) -> dict[tuple[AnyLocation, Timestamp], int]:
        """Consolidated counts from ``pointstamps``, keyed by root ``Location`` s (a row of a
        nested scope is a ``ValueError`` then) or, if ``scoped``, by ``ScopedLocation`` s."""
        counts: dict[tuple[AnyLocation, Timestamp], int] = defaultdict(int)
        for r in self.read("pointstamps", dataflow_id, version).to_pylist():
            counts[(read_location(r, scoped), tuple(r["time"]))] += r["count"]
        return {k: c for k, c in counts.items() if c != 0}

    def read_frontiers(self, dataflow_id: str, version: int | None = None, scoped: bool = False
                       ) -> dict[AnyLocation, list[Timestamp]]:
        """Frontiers from ``frontiers`` (only locations with a non-empty frontier appear);
        ``scoped`` as :meth:`read_pointstamps`."""
        result: dict[AnyLocation, list[Timestamp]] = defaultdict(list)
        for r in self.read("frontiers", dataflow_id, version).to_pylist():
            result[read_location(r, scoped)].append(tuple(r["time"]))
        return {loc: sorted(ts) for loc, ts in result.items()}

    def write_frontiers(self, dataflow_id: str, frontiers: Mapping[Loc, Iterable[Timestamp]]) -> int:
        """Replace ``dataflow_id``'s current frontiers; new version."""
        return self.replace_partition("frontiers", dataflow_id, frontier_rows(dataflow_id, frontiers))

