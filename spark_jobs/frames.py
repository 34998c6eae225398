"""Shared DataFrame vocabulary of the Spark jobs: location codes, transitions, envelopes, lineage cuts.

Locations travel through joins as one BIGINT, ``node << 32 | port << 1 | is_source``, because
one long key shuffles and hashes faster than three columns; :func:`decode` turns it back into
the ``node, port, kind`` columns of the Delta tables. Every frame also carries ``dataflow_id``,
so one job runs over many dataflows at once.

Envelopes (lower antichains under the product order) stay in Spark SQL: a plain ``min`` when
every dataflow has arity 1 (then the product order is total), else ``collect_set`` per key and
a higher-order ``filter``/``exists``/``forall(zip_with(...))`` that drops dominated elements.

>>> encode(Location.source(3, 1)), decode_code(encode(Location.source(3, 1)))
(12884901891, Location(node=3, port=1, kind='source'))
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tracker.graph import Graph, Location

KEYS = ["dataflow_id", "loc"]
PAIR_KEYS = ["dataflow_id", "src", "dst"]
TRANSITION_SCHEMA = "dataflow_id string, src bigint, dst bigint, summary array<bigint>"
TIMES_SCHEMA = "dataflow_id string, loc bigint, time array<bigint>"


def encode(location: Location) -> int:
    """The BIGINT code of a location (see the module docstring)."""
    return (location.node << 32) | (location.port << 1) | (1 if location.kind == "source" else 0)


def decode_code(code: int) -> Location:
    """The location of a BIGINT code (inverse of :func:`encode`)."""
    return Location(code >> 32, (code & 0xFFFFFFFF) >> 1, "source" if code & 1 else "target")


def code_col(node: Column, port: Column, kind: Column | str) -> Column:
    """Spark expression of :func:`encode` over ``node, port, kind`` columns (or a literal kind)."""
    kind_col = F.lit(kind) if isinstance(kind, str) else kind
    return (
        F.shiftleft(node.cast("long"), 32)
        + F.shiftleft(port.cast("long"), 1)
        + F.when(kind_col == "source", F.lit(1)).otherwise(F.lit(0)).cast("long")
    )


def decode(code: Column, prefix: str = "") -> list[Column]:
    """``node, port, kind`` columns (names prefixed) decoded from a location code column."""
    return [
        F.shiftright(code, 32).cast("int").alias(prefix + "node"),
        F.shiftright(code.bitwiseAND(F.lit(0xFFFFFFFF)), 1).cast("int").alias(prefix + "port"),
        F.when(code.bitwiseAND(F.lit(1)) == 1, F.lit("source")).otherwise(F.lit("target")).alias(prefix + "kind"),
    ]


def add(time: Column, summary: Column) -> Column:
    """``results_in``: coordinate-wise ``time + summary`` (also ``followed_by`` for summaries)."""
    return F.zip_with(time, summary, lambda a, b: a + b)


def is_zero(summary: Column) -> Column:
    """True iff every increment of the summary is 0."""
    return F.forall(summary, lambda x: x == 0)


def envelope(df: DataFrame, keys: Sequence[str], col: str, arity_one: bool) -> DataFrame:
    """Per key, the minimal values of ``col`` under the product order (the lower antichain).

    ``arity_one`` may only be true when every array has one element: then ``min`` is exact.
    """
    if arity_one:
        return df.groupBy(*keys).agg(F.min(col).alias(col))
    dominated = "exists(_s, u -> u != t AND forall(zip_with(u, t, (a, b) -> a <= b), x -> x))"
    return (
        df.groupBy(*keys)
        .agg(F.collect_set(col).alias("_s"))
        .select(*keys, F.explode(F.expr(f"filter(_s, t -> NOT {dominated})")).alias(col))
    )


def cut(df: DataFrame) -> DataFrame:
    """Materialise ``df`` and drop its lineage (eager local checkpoint), so iterations stay flat."""
    return df.localCheckpoint(eager=True)


def plan_size(df: DataFrame) -> int:
    """Lines of the analysed logical plan: constant across rounds iff lineage is being cut."""
    return len(df._jdf.queryExecution().analyzed().treeString().splitlines())


@dataclass
class Progress:
    """Per-round statistics of an iteration, optionally echoed to stderr as it runs.

    ``plan_sizes[i]`` is :func:`plan_size` of the state after round ``i`` and ``query_sizes[i]``
    that of the query round ``i`` ran; the tests and the benchmark check neither grows with the
    round count (each round starts from checkpointed frames, so its query has a fixed shape).
    """

    label: str = "job"
    echo: bool = False
    rounds: int = 0
    rows: list[int] = field(default_factory=list)
    plan_sizes: list[int] = field(default_factory=list)
    query_sizes: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    callback: Callable[[str, int, int, float], None] | None = None

    def step(self, what: str) -> None:
        """Say what the job starts doing now, with the seconds since it started (when echoing)."""
        if self.echo:
            print(f"[{self.label}] {what} ({time.perf_counter() - self.started:.1f}s)", file=sys.stderr, flush=True)

    def round(self, new_rows: int, state: DataFrame | None = None, query: DataFrame | None = None) -> None:
        """Record one finished round that produced ``new_rows`` new rows; ``state`` is what the
        round left behind, ``query`` the work it ran (both plans are recorded)."""
        self.rounds += 1
        self.rows.append(new_rows)
        if state is not None:
            self.plan_sizes.append(plan_size(state))
        if query is not None:
            self.query_sizes.append(plan_size(query))
        elapsed = time.perf_counter() - self.started
        if self.echo:
            print(
                f"[{self.label}] iteration {self.rounds}: {new_rows} new rows, {elapsed:.1f}s elapsed",
                file=sys.stderr,
                flush=True,
            )
        if self.callback is not None:
            self.callback(self.label, self.rounds, new_rows, elapsed)


def arrow_to_spark(spark: SparkSession, data: pa.Table, schema: pa.Schema | None = None) -> DataFrame:
    """An Arrow table as a Spark DataFrame (works for empty tables too)."""
    if data.num_rows == 0:
        return spark.createDataFrame([], _spark_schema(schema or data.schema))
    return spark.createDataFrame(data)


def with_defaults(df: DataFrame, table: str) -> DataFrame:
    """``df`` with the columns of ``table`` that have defaults added where missing: ``scope``
    ``[]`` (the root), ``deleted_at`` null, ``is_scope`` false, and the ages a Spark job does not
    know (``born_at``, ``worker``, ``since``) null."""
    from spark_jobs.tables import TABLES

    defaults = {"scope": F.array().cast("array<int>"), "deleted_at": F.lit(None).cast("timestamp"),
                "is_scope": F.lit(False), "born_at": F.lit(None).cast("timestamp"),
                "since": F.lit(None).cast("timestamp")}
    if table == "pointstamps":
        defaults["worker"] = F.lit(None).cast("string")
    for name in TABLES[table].names:
        if name in defaults and name not in df.columns:
            df = df.withColumn(name, defaults[name])
    return df


def _spark_schema(schema: pa.Schema) -> T.StructType:
    mapping = {
        pa.int32(): T.IntegerType(),
        pa.int64(): T.LongType(),
        pa.string(): T.StringType(),
        pa.bool_(): T.BooleanType(),
        pa.timestamp("us", tz="UTC"): T.TimestampType(),
    }
    fields = []
    for f in schema:
        spark_type = T.ArrayType(mapping[f.type.value_type]) if pa.types.is_list(f.type) else mapping[f.type]
        fields.append(T.StructField(f.name, spark_type, True))
    return T.StructType(fields)


Graphs = Mapping[str, Graph]
"""Several graphs by dataflow id: every job runs over many dataflows at once."""


def transitions_of(spark: SparkSession, graphs: Graphs | Graph, dataflow_id: str = "mem") -> DataFrame:
    """Transitions ``(dataflow_id, src, dst, summary)`` of one graph or of several (by id)."""
    graphs = {dataflow_id: graphs} if isinstance(graphs, Graph) else graphs
    rows = [(i, encode(t.src), encode(t.dst), list(t.summary)) for i, g in graphs.items() for t in g.transitions()]
    return spark.createDataFrame(rows, TRANSITION_SCHEMA)


def locations_of(spark: SparkSession, graphs: Graphs | Graph, dataflow_id: str = "mem") -> DataFrame:
    """Every location ``(dataflow_id, loc, arity)`` of one graph or of several (by id)."""
    graphs = {dataflow_id: graphs} if isinstance(graphs, Graph) else graphs
    rows = [(i, encode(loc), g.arity) for i, g in graphs.items() for loc in g.locations()]
    return spark.createDataFrame(rows, "dataflow_id string, loc bigint, arity int")


def all_arity_one(graphs: Graphs | Graph) -> bool:
    """True iff every graph has arity 1 (then envelopes may use ``min``)."""
    return graphs.arity == 1 if isinstance(graphs, Graph) else all(g.arity == 1 for g in graphs.values())


def transitions_from_tables(dataflows: DataFrame, connections: DataFrame, edges: DataFrame) -> DataFrame:
    """Transitions from the ``connections`` and ``edges`` tables; edges get the zero summary of
    their dataflow's arity (read from ``dataflows``)."""
    internal = connections.select(
        "dataflow_id",
        code_col(F.col("node"), F.col("input_port"), "target").alias("src"),
        code_col(F.col("node"), F.col("output_port"), "source").alias("dst"),
        F.col("summary"),
    )
    arity = dataflows.groupBy("dataflow_id").agg(F.max("timestamp_arity").alias("arity"))
    channel = edges.join(arity, "dataflow_id").select(
        "dataflow_id",
        code_col(F.col("src_node"), F.col("src_port"), "source").alias("src"),
        code_col(F.col("dst_node"), F.col("dst_port"), "target").alias("dst"),
        F.array_repeat(F.lit(0).cast("long"), F.col("arity")).alias("summary"),
    )
    return internal.unionByName(channel)
