"""The Spark jobs over a warehouse: read the Delta tables, compute, write the results back.

Each job takes a list of dataflow ids and runs them together (one iteration for all, since a
Spark round costs a job whatever its width); results are written in one commit per table.
Dataflows with nested scopes are read scope by scope (:mod:`spark_jobs.scopes`): every scope is
a flat graph of its own, and the jobs' answers are those of the flattened dataflow.

* :func:`cycles_job`: transitions on non-incrementing cycles, per dataflow and scope (nothing
  written).
* :func:`summaries_job`: ``Psi`` within every scope into ``summaries``; returns the nested
  scopes' summaries as operators too.
* :func:`propagate_job`: ``pointstamps`` -> ``frontiers`` (full recompute).
* :func:`incremental_job`: the ``progress`` log past each dataflow's watermark -> updated
  ``pointstamps`` and ``frontiers``, and the changes appended to ``frontier_changes``.

>>> # summaries_job(Warehouse("./warehouse", get_spark()), ["df-1"])
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs import graphx
from spark_jobs.cycles import transition_key
from spark_jobs.frames import KEYS, Progress, code_col, cut, decode, decode_code
from spark_jobs.incremental import IncrementalResult, incremental
from spark_jobs.propagate import active_times, propagate
from spark_jobs.scopes import (
    Structure,
    keyed,
    propagate_scoped,
    split,
    split_key,
    structure_from_tables,
    summarize_scoped,
    unkeyed,
)
from spark_jobs.storage import POINTSTAMPS_APP, UnknownDataflowError, Warehouse
from spark_jobs.summaries import summary_rows
from tracker.graph import Transition
from tracker.scope import ScopePath
from tracker.timestamp import PathSummary


@dataclass
class Inputs:
    """The graph of some dataflows as DataFrames, read from the warehouse: one flat graph per
    scope, keyed by scope key (:mod:`spark_jobs.scopes`)."""

    ids: list[str]
    structure: Structure
    arity: dict[str, int] = field(default_factory=dict)
    """Each scope key's arity."""

    @property
    def transitions(self) -> DataFrame:
        return self.structure.transitions

    @property
    def locations(self) -> DataFrame:
        return self.structure.locations

    @property
    def arity_one(self) -> bool:
        return self.structure.arity_one

    @property
    def nested(self) -> bool:
        """Some dataflow has nested scopes."""
        return self.structure.depth > 0


def _say(progress: Progress | None, what: str) -> None:
    if progress is not None:
        progress.step(what)


def read_inputs(wh: Warehouse, ids: list[str], progress: Progress | None = None) -> Inputs:
    """Scopes, transitions and locations of ``ids`` (each must be registered:
    ``UnknownDataflowError``)."""
    _say(progress, f"reading the graphs of {len(ids)} dataflow(s)")
    known = {r["dataflow_id"] for r in wh.spark_read("dataflows", ids).select("dataflow_id").distinct().collect()}
    unknown = sorted(set(ids) - known)
    if unknown:
        raise UnknownDataflowError(f"unknown dataflow {', '.join(unknown[:5])} in warehouse {wh.root}")
    structure = structure_from_tables(wh.spark_read("scopes", ids), wh.spark_read("nodes", ids),
                                      wh.spark_read("connections", ids), wh.spark_read("edges", ids))
    without = sorted(set(ids) - {split(key)[0] for key in structure.arity})
    if without:
        raise UnknownDataflowError(f"dataflow {', '.join(without[:5])} has no rows in the `scopes` table of "
                                   f"warehouse {wh.root}")
    return Inputs(ids, structure, dict(structure.arity))


def _located(df: DataFrame) -> DataFrame:
    """A table's ``dataflow_id, scope`` -> scope key, ``node, port, kind`` -> one ``loc`` code."""
    return keyed(df).withColumn("loc", code_col(F.col("node"), F.col("port"), F.col("kind")))


def cycles_job(wh: Warehouse, ids: list[str], progress: Progress | None = None
               ) -> dict[str, list[tuple[ScopePath, Transition]]]:
    """Per dataflow, the transitions lying on non-incrementing cycles with their scope paths
    (empty: acceptable); in each scope, scope nodes carry their computed summaries."""
    inputs = read_inputs(wh, ids, progress)
    _say(progress, "finding the cycles that do not advance time")
    _, _, cycles = summarize_scoped(inputs.structure, progress, cycles=True)
    assert cycles is not None
    found: dict[str, set[tuple[ScopePath, Transition]]] = {i: set() for i in ids}
    for r in cycles.collect():
        dataflow_id, scope = split(r["dataflow_id"])
        zero = PathSummary.zero(inputs.arity[r["dataflow_id"]])
        found[dataflow_id].add((scope, Transition(decode_code(r["src"]), decode_code(r["dst"]), zero)))
    return {i: sorted(ts, key=lambda st: (st[0], transition_key(st[1]))) for i, ts in found.items()}


def summaries_job(wh: Warehouse, ids: list[str], progress: Progress | None = None) -> tuple[int, DataFrame]:
    """Compute ``Psi`` within every scope of ``ids`` and replace their ``summaries`` rows in one
    commit.

    Returns ``(rows written, scope summaries)``: every nested scope's summaries as an operator
    in its parent's time, ``(dataflow_id, scope, node, input_port, output_port, summary)`` with
    ``scope`` the parent's path and ``node`` the scope node (no rows for a flat dataflow)."""
    inputs = read_inputs(wh, ids, progress)
    _say(progress, "computing Psi")
    psi, operators, _ = summarize_scoped(inputs.structure, progress)
    rows = summary_rows(psi)
    _say(progress, "writing `summaries`")
    wh.spark_write("summaries", rows.select(*split_key(F.col("dataflow_id")), *rows.columns[1:]), ids)
    scope = operators.select(*split_key(F.col("dataflow_id")), F.shiftright("src", 32).cast("int").alias("node"),
                             F.shiftright(F.col("src").bitwiseAND(F.lit(0xFFFFFFFF)), 1).cast("int")
                             .alias("input_port"),
                             F.shiftright(F.col("dst").bitwiseAND(F.lit(0xFFFFFFFF)), 1).cast("int")
                             .alias("output_port"), "summary").localCheckpoint()
    return psi.count(), scope


def _psi(wh: Warehouse, inputs: Inputs) -> DataFrame:
    """``Psi`` from ``summaries`` when every dataflow has rows there, else computed now."""
    stored = _stored_psi(wh, inputs)
    return stored if stored is not None else summarize_scoped(inputs.structure)[0]


def _stored_psi(wh: Warehouse, inputs: Inputs) -> DataFrame | None:
    """``Psi`` of every scope of every dataflow of ``inputs`` from ``summaries`` (keyed);
    ``None`` unless every scope has rows there."""
    stored = keyed(wh.spark_read("summaries", inputs.ids)).localCheckpoint()
    have = {r["dataflow_id"] for r in stored.select("dataflow_id").distinct().collect()}
    if have == set(inputs.arity):
        return stored.select(
            "dataflow_id",
            code_col(F.col("from_node"), F.col("from_port"), F.col("from_kind")).alias("src"),
            code_col(F.col("to_node"), F.col("to_port"), F.col("to_kind")).alias("dst"),
            "summary",
        ).localCheckpoint()
    return None


def propagate_job(wh: Warehouse, ids: list[str], progress: Progress | None = None,
                  method: str = "auto") -> int:
    """Recompute the frontiers of ``ids`` from ``pointstamps`` and replace their ``frontiers``
    rows in one commit; returns the number of frontier rows.

    ``method="auto"``: on the GraphX engine, the helper's propagation (each dataflow's fixed
    point in one task; no ``Psi`` needed); on the DataFrame engine, one join of the active times
    with ``Psi``, read from ``summaries`` when it holds every dataflow's, else computed by path
    doubling (rounds follow ``log2`` of the depth). ``"psi"``, ``"graphx"`` or ``"semi-naive"``
    (the DataFrame iteration, rounds follow the depth) force one. Nested dataflows always go
    through ``Psi``, one join per scope depth and direction
    (:func:`spark_jobs.scopes.propagate_scoped`)."""
    inputs = read_inputs(wh, ids, progress)
    _say(progress, "reading `pointstamps`")
    times = active_times(_located(wh.spark_read("pointstamps", ids))).localCheckpoint()
    if method == "auto":
        method = "graphx" if graphx.engine_choice() == "graphx" and not inputs.nested else "psi"
    if method == "psi" or inputs.nested:
        stored = _stored_psi(wh, inputs)
        if stored is None:
            _say(progress, "computing Psi (`summaries` does not hold every dataflow's)")
            stored = summarize_scoped(inputs.structure, progress)[0]
        _say(progress, f"joining the active times with Psi, {inputs.structure.depth + 1} scope level(s)")
        frontier = propagate_scoped(inputs.structure, stored, times).localCheckpoint()
        if progress is not None:
            progress.round(frontier.count(), frontier)
    else:
        engine: graphx.Engine = "graphx" if method == "graphx" else "dataframe"
        _say(progress, f"propagating ({'GraphX helper' if engine == 'graphx' else 'semi-naive iteration'})")
        frontier = propagate(inputs.transitions, times, inputs.arity_one, progress, engine)
    _say(progress, "writing `frontiers`")
    wh.spark_write("frontiers", unkeyed(frontier, "time"), ids)
    return frontier.count()


def _max_versions(wh: Warehouse, table: str, ids: list[str]) -> dict[str, int]:
    """The largest ``version`` of each dataflow's rows in ``table`` (absent: no rows), one query."""
    rows = wh.spark_read(table, ids).groupBy("dataflow_id").agg(F.max("version").alias("v")).collect()
    return {r["dataflow_id"]: r["v"] for r in rows}


def resume_after(wh: Warehouse, dataflow_id: str, logged: dict[str, int] | None = None) -> int:
    """The last ``progress`` version already in ``pointstamps``: the recorded watermark; failing
    that (a writer that did not record one), the last version in ``frontier_changes``
    (``logged``, if already known); failing that, 0 if ``pointstamps`` holds rows (the
    registration's initial pointstamps) else -1."""
    mark = wh.pointstamps_version(dataflow_id)
    if mark is not None:
        return mark
    versions = logged if logged is not None else _max_versions(wh, "frontier_changes", [dataflow_id])
    if dataflow_id in versions:
        return versions[dataflow_id]
    return 0 if wh.read("pointstamps", dataflow_id).num_rows else -1


def incremental_job(wh: Warehouse, ids: list[str], progress: Progress | None = None) -> tuple[int, int]:
    """Apply the ``progress`` rows past each dataflow's watermark as one batch per dataflow.

    Writes, in order: the changes to ``frontier_changes`` tagged with the batch's last version,
    ``pointstamps`` (with the new watermark in the same commit, so a batch is never applied
    twice), then ``frontiers``. Returns ``(progress rows applied, frontier changes)``.

    ``frontier_changes`` may already hold changes past the watermark: the service appends its
    changes before it writes ``pointstamps``, and so does this job, so a crash between the two
    commits leaves them there. Those versions are folded in first without appending anything,
    so that no change is ever appended twice. A crash after the last commit but one leaves
    ``frontiers`` stale; ``propagate`` (or the next run) repairs it.
    """
    _say(progress, "reading the watermarks")
    logged = _max_versions(wh, "frontier_changes", ids)
    marks = {i: resume_after(wh, i, logged) for i in ids}
    ahead = {i: logged[i] for i, mark in marks.items() if i in logged and logged[i] > mark}
    inputs = read_inputs(wh, ids, progress)
    applied = 0
    if ahead:  # catch up to what frontier_changes holds, appending nothing
        applied += _incremental_step(wh, inputs, {i: marks[i] for i in ahead}, ahead, None, append=False)[0]
        marks.update(ahead)
    done, changes = _incremental_step(wh, inputs, marks, {}, progress, append=True)
    return applied + done, changes


def _incremental_step(wh: Warehouse, inputs: Inputs, after: dict[str, int], upto: dict[str, int],
                      progress: Progress | None, *, append: bool) -> tuple[int, int]:
    """One incremental batch per dataflow of ``after``: its ``progress`` rows with a version in
    ``(after[id], upto[id]]`` (no upper bound where ``upto`` has none)."""
    ids = sorted(after)
    lower, upper = F.lit(-1), F.lit(None).cast("long")
    for i in ids:
        lower = F.when(F.col("dataflow_id") == i, F.lit(after[i])).otherwise(lower)
        if i in upto:
            upper = F.when(F.col("dataflow_id") == i, F.lit(upto[i])).otherwise(upper)
    _say(progress, "reading `progress` past the watermarks")
    rows = wh.spark_read("progress", ids)
    window = (F.col("version") > lower) & (upper.isNull() | (F.col("version") <= upper))
    window_rows = rows.where(window).localCheckpoint()
    last = {r["dataflow_id"]: r["v"]
            for r in window_rows.groupBy("dataflow_id").agg(F.max("version").alias("v")).collect()}
    pending = _located(window_rows)
    if not last:
        return 0, 0
    batch = pending.select(*KEYS, "time", "delta")
    points = _located(wh.spark_read("pointstamps", ids)).select(*KEYS, "time", "count")
    frontiers = _located(wh.spark_read("frontiers", ids)).select(*KEYS, "time")
    _say(progress, "applying the batch")
    result = _apply(inputs, _psi(wh, inputs), points, batch, frontiers)
    applied = pending.count()
    # Materialise the changes before any write: with delta-spark the old frontiers are a lazy
    # read of the very table about to be replaced.
    version = F.lit(None).cast("long")
    for i, v in last.items():
        version = F.when(F.col("dataflow_id") == i, F.lit(v)).otherwise(version)
    changes = result.changes.select(
        *split_key(F.col("dataflow_id")),
        *decode(F.col("loc")),
        "time",
        "diff",
        F.current_timestamp().alias("at"),
    )
    changes = changes.where(changes.dataflow_id.isin(sorted(last)))
    changes = changes.withColumn("version", version).localCheckpoint()
    changed = changes.count()
    touched = sorted(last)
    points_rows = unkeyed(result.points, "time", "count")
    points_rows = points_rows.where(points_rows.dataflow_id.isin(touched))
    frontier_rows = unkeyed(result.frontiers, "time")
    frontier_rows = frontier_rows.where(frontier_rows.dataflow_id.isin(touched))
    _say(progress, "writing `frontier_changes`, `pointstamps` and `frontiers`")
    if append and changed:
        wh.spark_write("frontier_changes", changes)
    wh.spark_write("pointstamps", points_rows, touched, {POINTSTAMPS_APP + i: v for i, v in last.items()})
    wh.spark_write("frontiers", frontier_rows, touched)
    if progress is not None:
        progress.round(changed if append else 0)
    return applied, changed if append else 0


def _apply(inputs: Inputs, psi: DataFrame, points: DataFrame, batch: DataFrame, frontiers: DataFrame
           ) -> IncrementalResult:
    """:func:`spark_jobs.incremental.incremental` over keyed frames; with nested scopes, where a
    batch inside a scope moves frontiers in its ancestors and siblings too, the new frontiers
    are :func:`spark_jobs.scopes.propagate_scoped` of the new counts and the changes their
    difference from the old ones (exact either way)."""
    if not inputs.nested:
        return incremental(psi, points, batch, frontiers, inputs.arity_one)
    new_points = cut(
        points.select(*KEYS, "time", "count")
        .unionByName(batch.select(*KEYS, "time", F.col("delta").alias("count")))
        .groupBy(*KEYS, "time").agg(F.sum("count").alias("count"))
        .where(F.col("count") != 0))
    recomputed = cut(propagate_scoped(inputs.structure, psi, active_times(new_points)))
    plus = recomputed.join(frontiers, [*KEYS, "time"], "left_anti").withColumn("diff", F.lit(1).cast("long"))
    minus = frontiers.join(recomputed, [*KEYS, "time"], "left_anti").withColumn("diff", F.lit(-1).cast("long"))
    return IncrementalResult(new_points, plus.unionByName(minus), recomputed)

