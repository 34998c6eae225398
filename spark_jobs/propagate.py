"""``propagate`` in Spark: every location's minimal reachable times.

Two ways to the same answer:

* :func:`propagate`: the iteration, semi-naive: each round pushes only the times that
  newly entered some location's envelope one transition forward, merges them into the per-location
  lower envelope and cuts the lineage; rounds follow the depth of the dataflow.
* :func:`propagate_with_psi`: with ``Psi`` precomputed (``summarize``), one join of active times
  with ``Psi`` and one envelope, whatever the depth; this is what the incremental job uses.

>>> # frontiers_for(get_spark(), graph, {(Location.source(0, 0), (0,)): 1}) == tracker.oracle.frontiers(...)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import graphx
from spark_jobs.frames import (
    KEYS,
    TIMES_SCHEMA,
    Graphs,
    Progress,
    add,
    all_arity_one,
    decode_code,
    encode,
    envelope,
    locations_of,
    transitions_of,
)
from spark_jobs.iteration import fixed_point
from tracker.graph import Graph, Location
from tracker.timestamp import Timestamp


def active_times(pointstamps: DataFrame) -> DataFrame:
    """``(dataflow_id, loc, time)`` of positive consolidated counts, from ``(dataflow_id, loc, time, count)``."""
    return (
        pointstamps.groupBy("dataflow_id", "loc", "time")
        .agg(F.sum("count").alias("count"))
        .where(F.col("count") > 0)
        .select(*KEYS, "time")
    )


def propagate(
    transitions: DataFrame, times: DataFrame, arity_one: bool = False, progress: Progress | None = None,
    engine: graphx.Engine | None = None, method: graphx.Method = "local",
) -> DataFrame:
    """``(dataflow_id, loc, time)`` rows, the lower envelope of every time
    reachable from ``times`` along ``transitions``.

    ``times``: ``(dataflow_id, loc, time)`` active times. Locations reached by nothing are absent.
    ``engine`` (default ``TRACKER_GRAPH_ENGINE``): ``"graphx"`` runs the helper (``method``
    ``"local"``, each dataflow's fixed point in one task, or ``"pregel"``); ``"dataframe"`` the
    semi-naive iteration, each round's lineage cut.
    """
    progress = progress or Progress(label="propagate")
    if (engine or graphx.engine_choice()) == "graphx":
        frontier = graphx.propagate(transitions, times, method)
        progress.round(frontier.count(), frontier)
        return frontier
    start = envelope(times, KEYS, "time", arity_one)
    steps = transitions.select("dataflow_id", F.col("src").alias("loc"), "dst", "summary")

    def step(delta: DataFrame, _state: DataFrame) -> DataFrame:
        return delta.join(F.broadcast(steps), KEYS).select(
            "dataflow_id", F.col("dst").alias("loc"), add(F.col("time"), F.col("summary")).alias("time")
        )

    return fixed_point(start, start, step, KEYS, "time", arity_one, progress)


def propagate_with_psi(
    psi: DataFrame, times: DataFrame, arity_one: bool = False, broadcast_times: bool = True
) -> DataFrame:
    """The same frontiers in one join: ``envelope{ t + s : (l, t) active, s in Psi[l, L] }``.

    ``psi``: ``(dataflow_id, src, dst, summary)`` as produced by ``summarize`` (identity included).
    ``broadcast_times``: ship the active times to every task instead of shuffling ``Psi`` (right
    whenever the active pointstamps are far fewer than ``Psi``'s rows, the usual case).
    """
    active = times.withColumnRenamed("loc", "src")
    reached = (
        (F.broadcast(active) if broadcast_times else active)
        .join(psi, ["dataflow_id", "src"])
        .select("dataflow_id", F.col("dst").alias("loc"), add(F.col("time"), F.col("summary")).alias("time"))
    )
    return envelope(reached, KEYS, "time", arity_one)


Counts = Mapping[tuple[Location, Timestamp], int]


def times_of(spark: SparkSession, counts: Mapping[str, Counts]) -> DataFrame:
    """Active times ``(dataflow_id, loc, time)`` of count dicts by dataflow id (positive counts only)."""
    rows = [(i, encode(loc), list(t)) for i, cs in counts.items() for (loc, t), c in cs.items() if c > 0]
    return spark.createDataFrame(rows, TIMES_SCHEMA)


def collect_frontiers(graphs: Graphs, frontier: DataFrame) -> dict[str, dict[Location, list[Timestamp]]]:
    """Frontier rows collected per dataflow and location; every location of each graph present
    (empty list where nothing can arrive), times sorted."""
    result: dict[str, dict[Location, list[Timestamp]]] = {
        i: {loc: [] for loc in g.locations()} for i, g in graphs.items()
    }
    for row in frontier.toArrow().to_pylist():
        result[row["dataflow_id"]][decode_code(row["loc"])].append(tuple(row["time"]))
    return {i: {loc: sorted(ts) for loc, ts in fs.items()} for i, fs in result.items()}


def frontiers_for(
    spark: SparkSession,
    graph: Graph,
    counts: Counts,
    method: Literal["semi-naive", "psi"] = "semi-naive",
    progress: Progress | None = None,
    engine: graphx.Engine | None = None,
) -> dict[Location, list[Timestamp]]:
    """Every location's frontier computed by Spark (empty list where nothing can arrive); only
    positive counts are active. Equal to :func:`tracker.oracle.frontiers`.

    >>> # frontiers_for(spark, g, {(Location.source(0, 0), (3,)): 1})[Location.target(1, 0)] == [(3,)]
    """
    return frontiers_for_graphs(spark, {"mem": graph}, {"mem": counts}, method, progress, engine)["mem"]


def frontiers_for_graphs(
    spark: SparkSession,
    graphs: Graphs,
    counts: Mapping[str, Counts],
    method: Literal["semi-naive", "psi"] = "semi-naive",
    progress: Progress | None = None,
    engine: graphx.Engine | None = None,
) -> dict[str, dict[Location, list[Timestamp]]]:
    """:func:`frontiers_for` for many graphs (counts by dataflow id) in one Spark job;
    ``"semi-naive"`` means :func:`propagate` on ``engine``."""
    times = times_of(spark, counts)
    transitions = transitions_of(spark, graphs)
    arity_one = all_arity_one(graphs)
    if method == "psi":
        from spark_jobs.summaries import summarize

        psi = summarize(transitions, locations_of(spark, graphs), arity_one, progress=progress)
        return collect_frontiers(graphs, propagate_with_psi(psi, times, arity_one))
    return collect_frontiers(graphs, propagate(transitions, times, arity_one, progress, engine))
