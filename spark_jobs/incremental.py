"""Incremental frontiers in Spark: apply a batch of pointstamp changes, recompute only what it can
affect, and emit exactly the frontier changes.

A location ``L``'s frontier depends only on the active times at locations ``l`` with
``Psi[l, L]`` non-empty. So a batch that changes the active set at locations ``C`` can only move
the frontiers of ``{L : Psi[c, L] for some c in C}``; those are recomputed in one join of the new
active times with ``Psi`` restricted to them, and compared with their previous frontiers. The
result is exactly what a full recompute would give (the tests check it after series of batches).

Entry points: :func:`incremental` (DataFrames in and out, many dataflows at once, what the
``tracker jobs incremental`` command runs), :func:`update_frontiers` (one call, Python values in
and out) and :class:`SparkFrontierEngine` (keeps ``Psi``, counts and frontiers as checkpointed
DataFrames between micro-batches: what ``--engine spark`` should hold per dataflow).

>>> # engine = SparkFrontierEngine(get_spark(), graph); engine.apply([(Location.source(0, 0), (0,), 1)])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import graphx
from spark_jobs.frames import KEYS, all_arity_one, cut, decode_code, encode, locations_of, transitions_of
from spark_jobs.propagate import Counts, propagate_with_psi
from spark_jobs.summaries import summarize
from tracker.antichain import Antichain
from tracker.graph import Graph, Location, Update
from tracker.reachability import FrontierChange
from tracker.timestamp import PathSummary, Timestamp

POINTS_SCHEMA = "dataflow_id string, loc bigint, time array<bigint>, count bigint"
FRONTIER_SCHEMA = "dataflow_id string, loc bigint, time array<bigint>"
PSI_SCHEMA = "dataflow_id string, src bigint, dst bigint, summary array<bigint>"


class IncrementalResult(NamedTuple):
    """New consolidated counts, the frontier changes (``diff`` +1/-1) and the new frontiers."""

    points: DataFrame
    changes: DataFrame
    frontiers: DataFrame


def _active(points: DataFrame) -> DataFrame:
    return points.where(F.col("count") > 0).select(*KEYS, "time")


def incremental(
    psi: DataFrame | graphx.IndexedPsi, points: DataFrame, batch: DataFrame, frontiers: DataFrame,
    arity_one: bool = False, engine: graphx.Engine | None = None,
) -> IncrementalResult:
    """Apply ``batch`` (``dataflow_id, loc, time, delta``) to ``points`` (``..., count``) and
    update ``frontiers`` (``dataflow_id, loc, time``), touching only locations reachable from a
    location whose active set changed. Changes are exact: ``+1`` for a time entering a frontier,
    ``-1`` for one leaving it, nothing for frontiers that end up equal.

    ``engine`` (default ``TRACKER_GRAPH_ENGINE``): ``"graphx"`` runs the helper, each dataflow
    in one task, everything materialised in one Spark job; ``"dataframe"`` the joins below
    (broadcasts of the batch's and the affected locations, a few jobs). ``psi`` may be indexed
    once for many batches (:func:`spark_jobs.graphx.index_psi`): then the helper neither
    shuffles nor scans it again (what :class:`SparkFrontierEngine` keeps).
    """
    if (engine or graphx.engine_choice()) == "graphx":
        tagged = graphx.incremental(psi, points, batch, frontiers)
        tag = F.col("tag")
        return IncrementalResult(tagged.where(tag == "p").select(*KEYS, "time", F.col("value").alias("count")),
                                 tagged.where(tag == "c").select(*KEYS, "time", F.col("value").alias("diff")),
                                 tagged.where(tag == "f").select(*KEYS, "time"))
    if isinstance(psi, graphx.IndexedPsi):
        psi = psi.psi
    deltas = batch.select(*KEYS, "time", F.col("delta").alias("count"))
    new_points = (
        points.select(*KEYS, "time", "count")
        .unionByName(deltas)
        .groupBy(*KEYS, "time")
        .agg(F.sum("count").alias("count"))
        .where(F.col("count") != 0)
    )
    new_points = cut(new_points)
    new_active = _active(new_points)
    # Only locations named by the batch can have a different set of active times, so only their
    # successors' frontiers can move. (Some of them may not have changed at all, e.g. +1 then -1:
    # recomputing them costs a little and the diff below then reports nothing for them.)
    changed = batch.select(*KEYS).distinct()
    # Broadcast the small sides (a batch's locations, the locations it affects) so that Psi, the
    # big table, is only scanned, never shuffled.
    affected = (
        psi.join(F.broadcast(changed.withColumnRenamed("loc", "src")), ["dataflow_id", "src"], "left_semi")
        .select("dataflow_id", F.col("dst").alias("loc"))
        .distinct()
    )
    affected = cut(affected)
    relevant_psi = psi.join(F.broadcast(affected.withColumnRenamed("loc", "dst")), ["dataflow_id", "dst"], "left_semi")
    recomputed = cut(propagate_with_psi(relevant_psi, new_active, arity_one))
    before = frontiers.join(affected, KEYS, "left_semi")
    plus = recomputed.join(before, [*KEYS, "time"], "left_anti").withColumn("diff", F.lit(1).cast("long"))
    minus = before.join(recomputed, [*KEYS, "time"], "left_anti").withColumn("diff", F.lit(-1).cast("long"))
    changes = plus.unionByName(minus)  # read once by the caller: no need to materialise twice
    new_frontiers = cut(frontiers.join(affected, KEYS, "left_anti").unionByName(recomputed))
    return IncrementalResult(new_points, changes, new_frontiers)


def psi_frame(
    spark: SparkSession, psi: Mapping[tuple[Location, Location], Antichain], dataflow_id: str = "mem"
) -> DataFrame:
    """A ``Psi`` dict (as :func:`tracker.structure.path_summaries` returns) as a DataFrame."""
    rows = [(dataflow_id, encode(a), encode(b), list(s)) for (a, b), chain in psi.items() for s in chain]
    return spark.createDataFrame(rows, PSI_SCHEMA)


def _sorted(changes: Iterable[FrontierChange]) -> list[FrontierChange]:
    return sorted(changes, key=lambda c: (c.location.node, c.location.kind, c.location.port, c.time, c.diff))


def _changes_of(rows: DataFrame) -> list[FrontierChange]:
    return _sorted(FrontierChange(decode_code(r["loc"]), tuple(r["time"]), r["diff"])
                   for r in rows.toArrow().to_pylist())


def update_frontiers(
    spark: SparkSession,
    graph: Graph,
    psi: DataFrame | Mapping[tuple[Location, Location], Antichain],
    previous_frontiers: Mapping[Location, Iterable[Timestamp]],
    old_counts: Counts,
    count_changes: Iterable[Update],
) -> list[FrontierChange]:
    """The frontier changes caused by ``count_changes`` (``(location, time, delta)``), given the
    counts and frontiers before them and ``Psi`` (a dict, or a DataFrame from ``summarize`` with
    ``dataflow_id == "mem"``). Sorted by location, time, diff; exactly the difference between
    the frontiers before and after (a full recompute), computed by the Spark job above.

    >>> # update_frontiers(spark, g, path_summaries(g), {}, {}, [(Location.source(0, 0), (0,), 1)])
    """
    psi_df = psi if isinstance(psi, DataFrame) else psi_frame(spark, psi)
    points = spark.createDataFrame(
        [("mem", encode(loc), list(t), c) for (loc, t), c in old_counts.items() if c != 0], POINTS_SCHEMA
    )
    batch = spark.createDataFrame(
        [("mem", encode(loc), list(t), d) for loc, t, d in count_changes if d != 0], POINTS_SCHEMA
    ).withColumnRenamed("count", "delta")
    frontiers = spark.createDataFrame(
        [("mem", encode(loc), list(t)) for loc, ts in previous_frontiers.items() for t in ts], FRONTIER_SCHEMA
    )
    return _changes_of(incremental(psi_df, points, batch, frontiers, graph.arity == 1).changes)


class SparkFrontierEngine:
    """Frontier maintenance of one dataflow by Spark micro-batches, with the native tracker's
    interface: ``apply(batch) -> list[FrontierChange]``, ``frontiers()``, ``pointstamps()``.

    ``Psi`` is computed once (Spark ``summarize``) and cached. On the GraphX engine it is
    indexed in the executors (:func:`spark_jobs.graphx.index_psi`) with the counts and
    frontiers beside it (:class:`spark_jobs.graphx.IncrementalState`): a batch sends only its
    own rows from the driver and is one Spark stage. On the DataFrame path, counts and
    frontiers live as checkpointed DataFrames and each batch runs :func:`incremental`.

    >>> # engine = SparkFrontierEngine(spark, graph)
    >>> # engine.apply([(Location.source(0, 0), (0,), 1)])  -> [FrontierChange(...), ...]
    """

    def __init__(self, spark: SparkSession, graph: Graph, dataflow_id: str = "mem") -> None:
        self.spark, self.graph, self.dataflow_id = spark, graph, dataflow_id
        self._arity_one = all_arity_one(graph)
        self.psi = cut(
            summarize(
                transitions_of(spark, graph, dataflow_id), locations_of(spark, graph, dataflow_id), self._arity_one
            )
        )
        self._points = spark.createDataFrame([], POINTS_SCHEMA)
        self._frontiers = spark.createDataFrame([], FRONTIER_SCHEMA)
        self._state = (graphx.IncrementalState.start(graphx.index_psi(self.psi), self._points, self._frontiers)
                       if graphx.engine_choice() == "graphx" else None)
        self._current: dict[Location, set[Timestamp]] = {loc: set() for loc in graph.locations()}

    def apply(self, updates: Iterable[Update]) -> list[FrontierChange]:
        """Apply one atomic batch (validated against the graph); return its exact frontier changes.
        If it raises, the engine is as it was before the call."""
        checked = self.graph.check_updates(list(updates))
        rows = [(self.dataflow_id, encode(loc), list(t), d) for loc, t, d in checked if d != 0]
        if self._state is not None:
            state, found = self._state.apply(rows)
            changes = _sorted(FrontierChange(decode_code(loc), t, d) for _, loc, t, d in found)
            self._state.drop()  # the next state is computed and cached, its lineage cut
            self._state = state
        else:
            batch = self.spark.createDataFrame(rows, POINTS_SCHEMA).withColumnRenamed("count", "delta")
            result = incremental(self.psi, self._points, batch, self._frontiers, self._arity_one)
            changes = _changes_of(result.changes)  # first: a failure here leaves the engine as it was
            self._points, self._frontiers = result.points, result.frontiers
        for change in changes:
            (self._current[change.location].add if change.diff > 0 else self._current[change.location].discard)(
                change.time
            )
        return changes

    def frontiers(self) -> dict[Location, list[Timestamp]]:
        """Every location's current frontier (sorted; empty where nothing can arrive)."""
        return {loc: sorted(ts) for loc, ts in self._current.items()}

    def pointstamps(self) -> dict[tuple[Location, Timestamp], int]:
        """The non-zero occurrence counts."""
        points = self._state.points() if self._state is not None else self._points
        return {(decode_code(r["loc"]), tuple(r["time"])): r["count"] for r in points.toArrow().to_pylist()}

    def summaries(self) -> dict[tuple[Location, Location], Antichain[PathSummary]]:
        """The cached ``Psi``."""
        from spark_jobs.summaries import collect_psi

        return collect_psi(self.psi).get(self.dataflow_id, {})
