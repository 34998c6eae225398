"""``summarize`` in Spark: ``Psi``, the antichains of minimal path summaries between locations.

Two iterations reach the same fixed point (join with transitions, ``followed_by``,
lower envelope per pair, until nothing changes):

* ``linear``: extend known paths by one transition per round; rounds follow
  the longest shortest path (about twice the operator depth).
* ``doubling`` (default): join new pairs with all known pairs on both sides, so path lengths
  double each round and rounds follow ``log2(depth)`` (7 instead of ~100 at depth 50).

Also the scope summary: summaries from every location to operator zero's inputs (the
dataflow's outputs to the world), flowing backwards, and its restriction to operator zero's
outputs, which is how a whole dataflow presents itself as one operator.

>>> # summaries_for_graph(get_spark(), graph) == tracker.structure.path_summaries(graph)
"""

from __future__ import annotations

from typing import Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import graphx
from spark_jobs.frames import (
    PAIR_KEYS,
    Graphs,
    Progress,
    add,
    all_arity_one,
    decode,
    decode_code,
    envelope,
    locations_of,
    transitions_of,
)
from spark_jobs.iteration import fixed_point
from tracker.antichain import Antichain
from tracker.graph import Graph, Location
from tracker.timestamp import PathSummary

Method = Literal["doubling", "linear"]


def _identity(locations: DataFrame) -> DataFrame:
    """``(l, l, zero)`` for every location: the empty path."""
    return locations.select(
        "dataflow_id",
        F.col("loc").alias("src"),
        F.col("loc").alias("dst"),
        F.array_repeat(F.lit(0).cast("long"), F.col("arity")).alias("summary"),
    )


def _compose(left: DataFrame, right: DataFrame) -> DataFrame:
    """Paths ``left`` then ``right``: ``(a, c, s1 followed_by s2)`` for ``(a, b, s1)``, ``(b, c, s2)``."""
    lhs = left.select("dataflow_id", "src", F.col("dst").alias("mid"), F.col("summary").alias("s1"))
    rhs = right.select("dataflow_id", F.col("src").alias("mid"), "dst", F.col("summary").alias("s2"))
    return lhs.join(rhs, ["dataflow_id", "mid"]).select(
        "dataflow_id", "src", "dst", add(F.col("s1"), F.col("s2")).alias("summary")
    )


def summarize(
    transitions: DataFrame,
    locations: DataFrame,
    arity_one: bool = False,
    method: Method = "doubling",
    progress: Progress | None = None,
    engine: graphx.Engine | None = None,
) -> DataFrame:
    """``Psi`` as rows ``(dataflow_id, src, dst, summary)``: for each connected pair (``(l, l)``
    included, zero summary), its minimal path summaries. The graph must pass the cycle check.

    ``locations``: ``(dataflow_id, loc, arity)``; ``arity_one`` only if every arity is 1.
    ``engine`` (default ``TRACKER_GRAPH_ENGINE``): ``"graphx"`` runs the helper (each
    dataflow's ``Psi`` in one task); ``"dataframe"`` iterates by ``method``.
    """
    progress = progress or Progress(label=f"summaries/{method}")
    if (engine or graphx.engine_choice()) == "graphx":
        psi = graphx.psi(transitions, locations)
        progress.round(psi.count(), psi)
        return psi
    identity = _identity(locations)
    if method == "linear":
        return fixed_point(
            identity,
            identity,
            lambda delta, _state: _compose(delta, F.broadcast(transitions)),
            PAIR_KEYS,
            "summary",
            arity_one,
            progress,
        )
    state = envelope(identity.unionByName(transitions.select(*PAIR_KEYS, "summary")), PAIR_KEYS, "summary", arity_one)

    def step(delta: DataFrame, state: DataFrame) -> DataFrame:
        return _compose(delta, state).unionByName(_compose(state, delta))

    return fixed_point(state, state, step, PAIR_KEYS, "summary", arity_one, progress)


def boundary_summaries(
    transitions: DataFrame, boundary: DataFrame, arity_one: bool = False, progress: Progress | None = None
) -> DataFrame:
    """Minimal summaries from every location to each boundary location,
    flowing backwards from ``boundary`` (``(dataflow_id, loc, arity)``, normally operator zero's
    inputs). Rows ``(dataflow_id, src, dst, summary)`` with ``dst`` in ``boundary``."""
    progress = progress or Progress(label="summaries/scope")
    start = _identity(boundary)
    backwards = transitions.select(
        "dataflow_id", F.col("dst").alias("mid"), F.col("src").alias("origin"), F.col("summary").alias("s1")
    )

    def step(delta: DataFrame, _state: DataFrame) -> DataFrame:
        d = delta.select("dataflow_id", F.col("src").alias("mid"), "dst", F.col("summary").alias("s2"))
        return d.join(backwards, ["dataflow_id", "mid"]).select(
            "dataflow_id", F.col("origin").alias("src"), "dst", add(F.col("s1"), F.col("s2")).alias("summary")
        )

    return fixed_point(start, start, step, PAIR_KEYS, "summary", arity_one, progress)


def operator_summary(scope: DataFrame) -> DataFrame:
    """The dataflow as one operator: scope summaries from operator zero's outputs to its inputs."""
    return scope.where((F.shiftright("src", 32) == 0) & (F.col("src").bitwiseAND(F.lit(1)) == 1))


def boundary_of(transitions: DataFrame) -> DataFrame:
    """Operator zero's inputs that some edge enters, as
    ``(dataflow_id, loc, arity)``, from transitions ``(dataflow_id, src, dst, summary)``."""
    return (
        transitions.where((F.shiftright("dst", 32) == 0) & (F.col("dst").bitwiseAND(F.lit(1)) == 0))
        .select("dataflow_id", F.col("dst").alias("loc"), F.size("summary").alias("arity"))
        .distinct()
    )


def summary_rows(psi: DataFrame) -> DataFrame:
    """``Psi`` in the ``summaries`` table's columns (locations decoded)."""
    return psi.select("dataflow_id", *decode(F.col("src"), "from_"), *decode(F.col("dst"), "to_"), "summary")


def collect_psi(psi: DataFrame) -> dict[str, dict[tuple[Location, Location], Antichain[PathSummary]]]:
    """``Psi`` rows collected per dataflow id into the dict shape of
    :func:`tracker.structure.path_summaries`."""
    result: dict[str, dict[tuple[Location, Location], Antichain[PathSummary]]] = {}
    for row in psi.toArrow().to_pylist():
        key = (decode_code(row["src"]), decode_code(row["dst"]))
        result.setdefault(row["dataflow_id"], {}).setdefault(key, Antichain()).insert(PathSummary(row["summary"]))
    return result


def summaries_for_graph(
    spark: SparkSession, graph: Graph, method: Method = "doubling", progress: Progress | None = None,
    engine: graphx.Engine | None = None,
) -> dict[tuple[Location, Location], Antichain[PathSummary]]:
    """``Psi`` of ``graph`` computed by Spark; equal to :func:`tracker.structure.path_summaries`
    (``(l, l)`` included with the zero summary).

    >>> # summaries_for_graph(spark, g)[(Location.target(0, 0), Location.source(0, 0))] == Antichain([(0,)])
    """
    return summaries_for_graphs(spark, {"mem": graph}, method, progress, engine)["mem"]


def summaries_for_graphs(
    spark: SparkSession, graphs: Graphs, method: Method = "doubling", progress: Progress | None = None,
    engine: graphx.Engine | None = None,
) -> dict[str, dict[tuple[Location, Location], Antichain[PathSummary]]]:
    """:func:`summaries_for_graph` for many graphs (by dataflow id) in one Spark job."""
    psi = summarize(transitions_of(spark, graphs), locations_of(spark, graphs), all_arity_one(graphs), method, progress,
                    engine)
    collected = collect_psi(psi)
    return {i: collected.get(i, {}) for i in graphs}
