"""Nested scopes in Spark: every scope of every dataflow a flat graph of its own.

The frames of :mod:`spark_jobs.summaries`, :mod:`spark_jobs.cycles` and
:mod:`spark_jobs.propagate` group by their ``dataflow_id`` column. Here that column holds a
*scope key*, ``"<dataflow_id>/<scope path>"`` (``"df/"`` for the root, ``"df/3,1"`` for scope
``[3, 1]``), so those functions run per scope, unchanged, over every scope of every dataflow at
once; :func:`split_key` turns a key back into the tables' ``dataflow_id, scope`` columns. A flat
dataflow is one root scope, and then everything below is the flat computation.

* **Summaries** (:func:`summarize_scoped`), deepest scopes first: each depth's scopes are
  summarized (``Psi`` within the scope, its scope nodes carrying the summaries found one level
  below); then each scope's summary as an operator is read off its ``Psi`` (boundary outputs to
  boundary inputs, the loop counter dropped for an iterative scope) and becomes its scope node's
  connections in the parent. The cycle check runs per depth on the same transitions.
* **Frontiers** (:func:`propagate_scoped`), as :class:`tracker.scoped.ScopedTracker` computes
  them: *up*, deepest first, a scope's active times (its pointstamps and what its own child
  scopes project out) reach its outputs through ``Psi``, leave (egress) and are active times at
  the scope node's outputs in the parent; *down*, root first, a scope's frontier is one join of
  its active times and what its parent carries in with ``Psi``, and its frontier at a scope
  node's inputs is carried in (ingress) to that child's boundary outputs. Every path decomposes at
  its last entry into a scope, so this is the flattened graph's frontier (``docs/scopes.md``).

One Spark round per depth and direction, whatever the number of dataflows.

>>> key_of("df", (3, 1)), split("df/3,1"), split("df/")
('df/3,1', ('df', (3, 1)), ('df', ()))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.cycles import find_cycles
from spark_jobs.frames import (
    KEYS,
    PAIR_KEYS,
    TIMES_SCHEMA,
    TRANSITION_SCHEMA,
    Progress,
    add,
    code_col,
    cut,
    decode,
    envelope,
)
from spark_jobs.propagate import propagate_with_psi
from spark_jobs.summaries import summarize
from tracker.scope import ScopePath

SCOPE_INFO = ["dataflow_id", "parent", "node", "kind", "arity", "depth"]
"""The columns of :attr:`Structure.scopes`: a scope's key, its parent's key and its node id
there (null for a root), kind, arity and depth (0 for a root)."""


def key_of(dataflow_id: str, scope: Sequence[int]) -> str:
    """The scope key of a dataflow's scope (see the module docstring)."""
    return f"{dataflow_id}/{','.join(map(str, scope))}"


def split(key: str) -> tuple[str, ScopePath]:
    """``(dataflow_id, scope path)`` of a scope key (inverse of :func:`key_of`)."""
    dataflow_id, _, path = key.rpartition("/")
    return dataflow_id, tuple(int(p) for p in path.split(",")) if path else ()


def scope_key(dataflow_id: Column, scope: Column) -> Column:
    """Spark expression of :func:`key_of` over ``dataflow_id`` and ``scope ARRAY<INT>`` columns."""
    return F.concat(dataflow_id, F.lit("/"), F.array_join(scope, ","))


def split_key(key: Column) -> list[Column]:
    """``dataflow_id`` and ``scope`` columns of a scope key column (inverse of :func:`scope_key`)."""
    path = F.regexp_extract(key, r"/([0-9,]*)$", 1)
    scope = F.when(path == "", F.array().cast("array<int>")).otherwise(F.split(path, ",").cast("array<int>"))
    return [F.regexp_extract(key, r"^(.*)/[0-9,]*$", 1).alias("dataflow_id"), scope.alias("scope")]


def keyed(df: DataFrame) -> DataFrame:
    """A table's frame with ``dataflow_id`` replaced by the scope key of its ``scope`` column."""
    return df.withColumn("dataflow_id", scope_key(F.col("dataflow_id"), F.col("scope"))).drop("scope")


def _node(code: Column) -> Column:
    return F.shiftright(code, 32)


def _port(code: Column) -> Column:
    return F.shiftright(code.bitwiseAND(F.lit(0xFFFFFFFF)), 1)


def _is_source(code: Column) -> Column:
    return code.bitwiseAND(F.lit(1)) == 1


@dataclass
class Structure:
    """The graphs of some dataflows, one flat graph per scope, keyed by scope key."""

    scopes: DataFrame
    """:data:`SCOPE_INFO` rows, one per scope."""
    transitions: DataFrame
    """Real operators' connections and edges, ``(dataflow_id = key, src, dst, summary)``; scope
    nodes have none here (:func:`summarize_scoped` supplies theirs)."""
    locations: DataFrame
    """Every port ``(dataflow_id = key, loc, arity)``, boundaries included."""
    depth: int
    """The deepest scope's depth (0: every dataflow is flat)."""
    arity_one: bool
    """Every scope's times have one coordinate (envelopes may use ``min``)."""
    arity: dict[str, int] = field(default_factory=dict)
    """Each scope key's arity (every scope of :attr:`scopes`)."""


def structure_from_tables(scopes: DataFrame, nodes: DataFrame, connections: DataFrame, edges: DataFrame
                          ) -> Structure:
    """The :class:`Structure` of the ``scopes``, ``nodes``, ``connections`` and ``edges`` rows
    given (any number of dataflows)."""
    size = F.size("scope")
    info = scopes.select(
        scope_key(F.col("dataflow_id"), F.col("scope")).alias("dataflow_id"),
        F.when(size > 0, scope_key(F.col("dataflow_id"), F.slice("scope", 1, size - 1))).alias("parent"),
        F.when(size > 0, F.element_at("scope", -1)).cast("int").alias("node"),
        "kind",
        F.col("arity").cast("int").alias("arity"),
        size.alias("depth"),
    ).localCheckpoint()
    # One row per scope: what the jobs need to know of them comes to the driver in one go.
    known = info.select("dataflow_id", "arity", "depth").collect()
    arities = {r["dataflow_id"]: int(r["arity"]) for r in known}
    arity = info.select("dataflow_id", "arity")
    internal = keyed(connections).select(
        "dataflow_id",
        code_col(F.col("node"), F.col("input_port"), "target").alias("src"),
        code_col(F.col("node"), F.col("output_port"), "source").alias("dst"),
        "summary",
    )
    channel = keyed(edges).join(arity, "dataflow_id").select(
        "dataflow_id",
        code_col(F.col("src_node"), F.col("src_port"), "source").alias("src"),
        code_col(F.col("dst_node"), F.col("dst_port"), "target").alias("dst"),
        F.array_repeat(F.lit(0).cast("long"), F.col("arity")).alias("summary"),
    )

    def ports(count: str, kind: str) -> DataFrame:
        # sequence(0, -1) would be [0, -1], not empty: guard the port-less case explicitly.
        indices = F.when(F.col(count) > 0, F.sequence(F.lit(0), F.col(count) - 1)).otherwise(
            F.array().cast("array<int>"))
        return keyed(nodes).select("dataflow_id", "node", F.explode(indices).alias("port"), F.lit(kind).alias("kind"))

    locations = ports("inputs", "target").unionByName(ports("outputs", "source")).join(arity, "dataflow_id").select(
        "dataflow_id", code_col(F.col("node"), F.col("port"), F.col("kind")).alias("loc"), "arity")
    return Structure(info, internal.unionByName(channel).localCheckpoint(), locations.localCheckpoint(),
                     max((int(r["depth"]) for r in known), default=0), max(arities.values(), default=1) == 1,
                     arities)


def _at_depth(df: DataFrame, st: Structure, depth: int) -> DataFrame:
    return df.join(F.broadcast(st.scopes.where(F.col("depth") == depth).select("dataflow_id")), "dataflow_id",
                   "left_semi")


def as_operators(psi: DataFrame, st: Structure) -> DataFrame:
    """Each nested scope's summaries as an operator, from its ``Psi``: transitions
    ``(parent key, scope node's input, scope node's output, summary)`` in the parent's time."""
    inner = psi.where((_node(F.col("src")) == 0) & _is_source(F.col("src"))
                      & (_node(F.col("dst")) == 0) & ~_is_source(F.col("dst")))
    scopes = st.scopes.where(F.col("depth") > 0).select("dataflow_id", "parent", "node", "kind")
    summary = F.when(F.col("kind") == "iterative", F.slice("summary", 1, F.size("summary") - 1)).otherwise(
        F.col("summary"))
    rows = inner.join(F.broadcast(scopes), "dataflow_id").select(
        F.col("parent").alias("dataflow_id"),
        code_col(F.col("node"), _port(F.col("src")), "target").alias("src"),
        code_col(F.col("node"), _port(F.col("dst")), "source").alias("dst"),
        summary.alias("summary"),
    )
    return envelope(rows, PAIR_KEYS, "summary", st.arity_one)


def _union(frames: list[DataFrame], empty: DataFrame) -> DataFrame:
    return reduce(DataFrame.unionByName, frames, empty)


def summarize_scoped(st: Structure, progress: Progress | None = None, cycles: bool = False
                     ) -> tuple[DataFrame, DataFrame, DataFrame | None]:
    """``(Psi, operators, cycles)``: ``Psi`` within every scope ``(key, src, dst, summary)``,
    every nested scope's summaries as an operator (:func:`as_operators`, keyed by the parent)
    and, if ``cycles``, the transitions on non-incrementing cycles ``(key, src, dst)`` of every
    scope (scope nodes carrying their summaries), else ``None``. Deepest scopes first."""
    spark = st.transitions.sparkSession
    operators = spark.createDataFrame([], TRANSITION_SCHEMA)
    psis: list[DataFrame] = []
    found: list[DataFrame] = []
    for depth in range(st.depth, -1, -1):
        transitions = cut(_at_depth(st.transitions, st, depth).unionByName(_at_depth(operators, st, depth)))
        if cycles:
            found.append(cut(find_cycles(transitions, progress)))
        psi = cut(summarize(transitions, _at_depth(st.locations, st, depth), st.arity_one, progress=progress))
        psis.append(psi)
        if depth > 0:
            operators = cut(operators.unionByName(as_operators(psi, st)))
    empty_cycles = spark.createDataFrame([], "dataflow_id string, src bigint, dst bigint")
    return (_union(psis, spark.createDataFrame([], TRANSITION_SCHEMA)), operators,
            _union(found, empty_cycles) if cycles else None)


def _egress(time: Column, kind: Column) -> Column:
    return F.when(kind == "iterative", F.slice(time, 1, F.size(time) - 1)).otherwise(time)


def _ingress(time: Column, kind: Column) -> Column:
    return F.when(kind == "iterative", F.concat(time, F.array(F.lit(0).cast("long")))).otherwise(time)


def propagate_scoped(st: Structure, psi: DataFrame, times: DataFrame) -> DataFrame:
    """Every location's frontier ``(key, loc, time)`` over the flattened dataflows, from the
    active times ``(key, loc, time)`` and ``Psi`` within every scope (:func:`summarize_scoped`);
    locations reached by nothing are absent."""
    spark = psi.sparkSession
    empty = spark.createDataFrame([], TIMES_SCHEMA)
    scopes = st.scopes.where(F.col("depth") > 0)
    up = empty
    for depth in range(st.depth, 0, -1):
        active = _at_depth(times, st, depth).unionByName(_at_depth(up, st, depth))
        exits = _at_depth(psi, st, depth).where((_node(F.col("dst")) == 0) & ~_is_source(F.col("dst")))
        reached = F.broadcast(active.withColumnRenamed("loc", "src")).join(exits, ["dataflow_id", "src"]).select(
            "dataflow_id", "dst", add(F.col("time"), F.col("summary")).alias("time"))
        out = reached.join(F.broadcast(scopes.select("dataflow_id", "parent", "node", "kind")), "dataflow_id").select(
            F.col("parent").alias("dataflow_id"),
            code_col(F.col("node"), _port(F.col("dst")), "source").alias("loc"),
            _egress(F.col("time"), F.col("kind")).alias("time"))
        up = cut(up.unionByName(envelope(out, KEYS, "time", st.arity_one)))
    down = empty
    frontiers: list[DataFrame] = []
    for depth in range(0, st.depth + 1):
        active = (_at_depth(times, st, depth).unionByName(_at_depth(up, st, depth))
                  .unionByName(_at_depth(down, st, depth)))
        frontier = cut(propagate_with_psi(_at_depth(psi, st, depth), active, st.arity_one))
        frontiers.append(frontier)
        if depth < st.depth:
            children = scopes.where(F.col("depth") == depth + 1).select(
                F.col("dataflow_id").alias("child"), F.col("parent").alias("dataflow_id"), "node", "kind")
            into = frontier.where(~_is_source(F.col("loc"))).withColumn("node", _node(F.col("loc")).cast("int")).join(
                F.broadcast(children), ["dataflow_id", "node"]).select(
                F.col("child").alias("dataflow_id"),
                code_col(F.lit(0), _port(F.col("loc")), "source").alias("loc"),
                _ingress(F.col("time"), F.col("kind")).alias("time"))
            down = cut(down.unionByName(into))
    return _union(frontiers, empty)


def unkeyed(df: DataFrame, *columns: str) -> DataFrame:
    """A keyed frame with a ``loc`` column back in the tables' columns: ``dataflow_id, scope,
    node, port, kind`` then ``columns``."""
    return df.select(*split_key(F.col("dataflow_id")), *decode(F.col("loc")), *columns)
