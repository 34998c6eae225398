"""The Spark jobs over a warehouse: read the Delta tables, compute, write the results back.

Each job takes a list of dataflow ids and runs them together (one iteration for all, since a
Spark round costs a job whatever its width); results are written in one commit per table.

* :func:`cycles_job`: transitions on non-incrementing cycles, per dataflow (nothing written).
* :func:`summaries_job`: ``Psi`` into ``summaries``; returns the scope summaries too.
* :func:`propagate_job`: ``pointstamps`` -> ``frontiers`` (full recompute, semi-naive).
* :func:`incremental_job`: the ``progress`` log past each dataflow's watermark -> updated
  ``pointstamps`` and ``frontiers``, and the changes appended to ``frontier_changes``.

>>> # summaries_job(Warehouse("./warehouse", get_spark()), ["df-1"])
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.cycles import find_cycles, transition_key
from spark_jobs.frames import (
    KEYS,
    Progress,
    code_col,
    decode,
    decode_code,
    locations_from_tables,
    transitions_from_tables,
)
from spark_jobs.incremental import incremental
from spark_jobs.propagate import active_times, propagate, propagate_with_psi
from spark_jobs.storage import POINTSTAMPS_APP, UnknownDataflowError, Warehouse
from spark_jobs.summaries import boundary_of, summarize, summary_rows
from tracker.graph import Transition
from tracker.timestamp import PathSummary


@dataclass
class Inputs:
    """The graph of some dataflows as DataFrames, read from the warehouse."""

    ids: list[str]
    transitions: DataFrame
    locations: DataFrame
    arity: dict[str, int] = field(default_factory=dict)

    @property
    def arity_one(self) -> bool:
        return all(a == 1 for a in self.arity.values())


def read_inputs(wh: Warehouse, ids: list[str]) -> Inputs:
    """Transitions and locations of ``ids`` (each must be registered: ``UnknownDataflowError``)."""
    dataflows = wh.spark_read("dataflows", ids).localCheckpoint()
    arity = {r["dataflow_id"]: r["a"] for r in
             dataflows.groupBy("dataflow_id").agg(F.max("timestamp_arity").alias("a")).collect()}
    unknown = sorted(set(ids) - set(arity))
    if unknown:
        raise UnknownDataflowError(f"unknown dataflow {', '.join(unknown[:5])} in warehouse {wh.root}")
    transitions = transitions_from_tables(dataflows, wh.spark_read("connections", ids), wh.spark_read("edges", ids))
    locations = locations_from_tables(dataflows, wh.spark_read("nodes", ids))
    return Inputs(ids, transitions.localCheckpoint(), locations.localCheckpoint(), arity)


def _located(df: DataFrame) -> DataFrame:
    """``node, port, kind`` columns -> one ``loc`` code column."""
    return df.withColumn("loc", code_col(F.col("node"), F.col("port"), F.col("kind")))


def cycles_job(wh: Warehouse, ids: list[str], progress: Progress | None = None) -> dict[str, list[Transition]]:
    """Per dataflow, the transitions lying on non-incrementing cycles (empty: acceptable)."""
    inputs = read_inputs(wh, ids)
    found: dict[str, set[Transition]] = {i: set() for i in ids}
    for r in find_cycles(inputs.transitions, progress).collect():
        zero = PathSummary.zero(inputs.arity[r["dataflow_id"]])
        found[r["dataflow_id"]].add(Transition(decode_code(r["src"]), decode_code(r["dst"]), zero))
    return {i: sorted(ts, key=transition_key) for i, ts in found.items()}


def summaries_job(wh: Warehouse, ids: list[str], progress: Progress | None = None) -> tuple[int, DataFrame]:
    """Compute ``Psi`` of ``ids`` and replace their ``summaries`` rows in one commit.

    Returns ``(rows written, scope summaries)``; the scope summaries (``summarize``:
    every location to operator zero's inputs) are a checkpointed DataFrame ``(dataflow_id, src,
    dst, summary)``."""
    inputs = read_inputs(wh, ids)
    psi = summarize(inputs.transitions, inputs.locations, inputs.arity_one, progress=progress)
    wh.spark_write("summaries", summary_rows(psi), ids)
    # The scope summaries are Psi's pairs into the boundary: a join, not another fixed point.
    boundary = boundary_of(inputs.transitions).select("dataflow_id", F.col("loc").alias("dst"))
    scope = psi.join(boundary, ["dataflow_id", "dst"], "left_semi").select("dataflow_id", "src", "dst", "summary")
    return psi.count(), scope


def _psi(wh: Warehouse, inputs: Inputs) -> DataFrame:
    """``Psi`` from ``summaries`` when every dataflow has rows there, else computed now."""
    stored = _stored_psi(wh, inputs)
    return stored if stored is not None else summarize(inputs.transitions, inputs.locations, inputs.arity_one)


def _stored_psi(wh: Warehouse, inputs: Inputs) -> DataFrame | None:
    """``Psi`` of every dataflow of ``inputs`` from ``summaries``; ``None`` unless all have rows."""
    stored = wh.spark_read("summaries", inputs.ids).localCheckpoint()
    if {r["dataflow_id"] for r in stored.select("dataflow_id").distinct().collect()} == set(inputs.ids):
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

    ``method="auto"``: one join of the active times with ``Psi`` when ``summaries`` holds every
    dataflow's (depth-independent), else the semi-naive iteration (rounds follow the depth);
    ``"psi"`` or ``"semi-naive"`` force one."""
    inputs = read_inputs(wh, ids)
    times = active_times(_located(wh.spark_read("pointstamps", ids))).localCheckpoint()
    stored = _stored_psi(wh, inputs) if method in ("auto", "psi") else None
    if method == "psi" and stored is None:
        stored = summarize(inputs.transitions, inputs.locations, inputs.arity_one)
    if stored is not None:
        if progress is not None and progress.echo:
            print(f"[{progress.label}] one join over stored Psi", file=sys.stderr, flush=True)
        frontier = propagate_with_psi(stored, times, inputs.arity_one).localCheckpoint()
        if progress is not None:
            progress.round(frontier.count(), frontier)
    else:
        frontier = propagate(inputs.transitions, times, inputs.arity_one, progress)
    wh.spark_write("frontiers", frontier.select("dataflow_id", *decode(F.col("loc")), "time"), ids)
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
    logged = _max_versions(wh, "frontier_changes", ids)
    marks = {i: resume_after(wh, i, logged) for i in ids}
    ahead = {i: logged[i] for i, mark in marks.items() if i in logged and logged[i] > mark}
    inputs = read_inputs(wh, ids)
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
    rows = wh.spark_read("progress", ids)
    window = (F.col("version") > lower) & (upper.isNull() | (F.col("version") <= upper))
    pending = _located(rows.where(window)).localCheckpoint()
    last = {r["dataflow_id"]: r["v"] for r in pending.groupBy("dataflow_id").agg(F.max("version").alias("v")).collect()}
    if not last:
        return 0, 0
    batch = pending.select(*KEYS, "time", "delta")
    points = _located(wh.spark_read("pointstamps", ids)).select(*KEYS, "time", "count")
    frontiers = _located(wh.spark_read("frontiers", ids)).select(*KEYS, "time")
    result = incremental(_psi(wh, inputs), points, batch, frontiers, inputs.arity_one)
    applied = pending.count()
    # Materialise the changes before any write: with delta-spark the old frontiers are a lazy
    # read of the very table about to be replaced.
    version = F.lit(None).cast("long")
    for i, v in last.items():
        version = F.when(F.col("dataflow_id") == i, F.lit(v)).otherwise(version)
    changes = result.changes.select(
        "dataflow_id",
        version.alias("version"),
        *decode(F.col("loc")),
        "time",
        "diff",
        F.current_timestamp().alias("at"),
    ).localCheckpoint()
    changed = changes.count()
    touched = sorted(last)
    points_rows = (result.points.where(F.col("dataflow_id").isin(touched))
                   .select("dataflow_id", *decode(F.col("loc")), "time", "count"))
    frontier_rows = (result.frontiers.where(F.col("dataflow_id").isin(touched))
                     .select("dataflow_id", *decode(F.col("loc")), "time"))
    if append and changed:
        wh.spark_write("frontier_changes", changes)
    wh.spark_write("pointstamps", points_rows, touched, {POINTSTAMPS_APP + i: v for i, v in last.items()})
    wh.spark_write("frontiers", frontier_rows, touched)
    if progress is not None:
        progress.round(changed if append else 0)
    return applied, changed if append else 0
