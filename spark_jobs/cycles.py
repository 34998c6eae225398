"""``find_cycles`` in Spark: which transitions lie on a cycle that does not advance timestamps.

A zero-summary transition ``a -> b`` is on such a cycle iff ``b`` reaches ``a`` along
zero-summary transitions. The default path computes that reachability by path doubling over the
zero subgraph, so its rounds follow ``log2`` of the longest zero path; the classic alternative
(``method="prune"``) keeps only transitions with a kept one into their source and one out of
their destination until nothing changes, then closes the remaining core semi-naively, one round
per transition peeled off. On the GraphX engine (the default, :mod:`spark_jobs.graphx`) the
helper finds the strongly connected components instead, each dataflow's in one task
(``method="local"``) or by GraphX's own SCC (``"pregel"``). All agree with
``tracker.structure.find_cycles``.

>>> # find_cycles_for_graph(get_spark(), graph) == tracker.structure.find_cycles(graph)
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import graphx
from spark_jobs.frames import Graphs, Progress, cut, decode_code, is_zero, transitions_of
from tracker.graph import Graph, Transition
from tracker.timestamp import PathSummary


def prune(zero: DataFrame, progress: Progress | None = None) -> DataFrame:
    """The pruning, both ways, to a fixed point: ``(dataflow_id, src, dst)`` of the core.

    Every transition on a non-incrementing cycle survives; acyclic graphs prune to nothing.
    """
    progress = progress or Progress(label="cycles/prune")
    kept = cut(zero.select("dataflow_id", "src", "dst").distinct())
    size = kept.count()
    while size:
        into = kept.select("dataflow_id", F.col("dst").alias("src")).distinct()
        out_of = kept.select("dataflow_id", F.col("src").alias("dst")).distinct()
        pruned = cut(
            kept.join(into, ["dataflow_id", "src"], "left_semi").join(out_of, ["dataflow_id", "dst"], "left_semi")
        )
        new_size = pruned.count()
        progress.round(new_size, pruned)
        kept = pruned
        if new_size == size:
            break
        size = new_size
    return kept


def _closure_cycles(core: DataFrame, progress: Progress) -> DataFrame:
    """Core transitions ``a -> b`` such that ``b`` reaches ``a`` within the core."""
    steps = core.select("dataflow_id", F.col("src").alias("mid"), F.col("dst").alias("end"))
    reach = cut(core.select("dataflow_id", F.col("src").alias("start"), F.col("dst").alias("end")))
    delta = reach
    pending = delta.count()
    while pending:
        longer = (
            delta.withColumnRenamed("end", "mid")
            .join(steps, ["dataflow_id", "mid"])
            .select("dataflow_id", "start", "end")
        ).distinct()
        delta = cut(longer.join(reach, ["dataflow_id", "start", "end"], "left_anti"))
        reach = cut(reach.unionByName(delta))
        pending = delta.count()
        progress.round(pending, reach)
    back = reach.select("dataflow_id", F.col("end").alias("src"), F.col("start").alias("dst"))
    return core.join(back, ["dataflow_id", "src", "dst"], "left_semi")


def _doubling_cycles(zero: DataFrame, progress: Progress) -> DataFrame:
    """Zero transitions ``a -> b`` such that ``b`` reaches ``a`` along zero transitions, from the
    transitive closure of the zero subgraph by path doubling: each round composes the known
    pairs with themselves, so rounds follow ``log2`` of the longest zero path (the pruning
    above needs one round per transition peeled off such a path: ~200 for a 100-operator ring)."""
    steps = cut(zero.select("dataflow_id", "src", "dst").distinct())
    reach = steps
    size = reach.count()
    while True:
        left = reach.select("dataflow_id", "src", F.col("dst").alias("mid"))
        right = reach.select("dataflow_id", F.col("src").alias("mid"), "dst")
        longer = left.join(right, ["dataflow_id", "mid"]).select("dataflow_id", "src", "dst")
        grown = cut(reach.unionByName(longer).distinct())
        new_size = grown.count()
        progress.round(new_size - size, grown, longer)
        reach = grown
        if new_size == size:
            break
        size = new_size
    back = reach.select("dataflow_id", F.col("dst").alias("src"), F.col("src").alias("dst"))
    return steps.join(back, ["dataflow_id", "src", "dst"], "left_semi")


def find_cycles(
    transitions: DataFrame, progress: Progress | None = None, engine: graphx.Engine | None = None,
    method: str | None = None,
) -> DataFrame:
    """``(dataflow_id, src, dst)`` of every zero-summary transition on a non-incrementing cycle.

    ``engine`` (default: :func:`spark_jobs.graphx.engine_choice`, ``TRACKER_GRAPH_ENGINE``)
    ``"graphx"`` takes ``method`` ``"local"`` (default) or ``"pregel"`` (GraphX's SCC);
    ``"dataframe"`` takes ``"doubling"`` (closure by path doubling, default) or ``"prune"``
    (prune both ways, then a semi-naive closure of what is left). All paths agree.
    """
    progress = progress or Progress(label="cycles")
    zero = transitions.where(is_zero(F.col("summary")))
    engine = engine or graphx.engine_choice()
    if engine == "graphx":
        found = graphx.cycles(zero, "pregel" if method == "pregel" else "local")
        progress.round(found.count(), found)
        return found
    if method in (None, "doubling"):
        return _doubling_cycles(zero, progress)
    return _closure_cycles(prune(zero, progress), progress)


def find_cycles_for_graph(spark: SparkSession, graph: Graph, progress: Progress | None = None,
                          engine: graphx.Engine | None = None, method: str | None = None) -> list[Transition]:
    """The transitions of ``graph`` on non-incrementing cycles, computed by Spark; sorted, and
    equal to :func:`tracker.structure.find_cycles`. Empty iff the graph is acceptable.

    >>> # find_cycles_for_graph(spark, loop_without_increment) -> [(0,0,source) -> (0,0,target) +(0,), ...]
    """
    return find_cycles_for_graphs(spark, {"mem": graph}, progress, engine, method)["mem"]


def find_cycles_for_graphs(
    spark: SparkSession, graphs: Graphs, progress: Progress | None = None, engine: graphx.Engine | None = None,
    method: str | None = None,
) -> dict[str, list[Transition]]:
    """:func:`find_cycles_for_graph` for many graphs (by dataflow id) in one Spark job
    (``engine`` and ``method`` as :func:`find_cycles`)."""
    rows = find_cycles(transitions_of(spark, graphs), progress, engine, method).collect()
    found: dict[str, set[Transition]] = {i: set() for i in graphs}
    for r in rows:
        zero = PathSummary.zero(graphs[r["dataflow_id"]].arity)
        found[r["dataflow_id"]].add(Transition(decode_code(r["src"]), decode_code(r["dst"]), zero))
    return {i: sorted(ts, key=transition_key) for i, ts in found.items()}


def transition_key(t: Transition) -> tuple:
    """The sort order of :func:`tracker.structure.find_cycles`'s answer."""
    return (t.src.node, t.src.kind, t.src.port, t.dst.node, t.dst.kind, t.dst.port, tuple(t.summary))
