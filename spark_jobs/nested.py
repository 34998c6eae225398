"""Nested dataflows checked and audited in a Spark session, from the in-memory graph (what the
service holds), with the answers in the native core's shapes, so the service compares them with
its own. The computation is the warehouse jobs' (:mod:`spark_jobs.scopes`): every scope a flat
graph keyed by its path, on the chosen graph engine (:func:`spark_jobs.session.graph_engine`).

* :func:`check_nested`: the registration check of many nested dataflows in one Spark job per
  scope depth: the transitions on non-incrementing cycles per scope, ``Psi`` within every scope
  and every nested scope's summaries as an operator.
* :func:`nested_frontiers`: every location's frontier from occurrence counts (an audit's
  from-scratch side).
* :func:`nested_verdict`: a check's answer against the native one, as ``(result, detail)``.

>>> NestedCheck(cycles=[], psi={}, scope_summaries={}).acceptable
True

Example (starts a JVM, so not run as a doctest)::

    checks = check_nested(get_spark(), {"df-1": nested})
    nested_verdict(nested, checks["df-1"])          # ('agreed', 'cycle check, 14 summaries ...')
    nested_frontiers(get_spark(), nested, counts)   # {ScopedLocation(...): [(0, 0)], ...}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from spark_jobs.frames import TIMES_SCHEMA, Progress, arrow_to_spark, decode_code, encode
from spark_jobs.rows import Psi, graph_rows
from spark_jobs.scopes import Structure, key_of, propagate_scoped, split, structure_from_tables, summarize_scoped
from spark_jobs.tables import TABLES, to_arrow
from tracker.antichain import Antichain
from tracker.graph import Transition
from tracker.scope import NestedGraph, ScopedLocation, ScopePath
from tracker.structure import path_summaries
from tracker.timestamp import PathSummary, Timestamp

ScopeSummaries = dict[ScopePath, dict[tuple[int, int], list[PathSummary]]]
"""Per nested scope, ``(input, output) -> summaries`` in the parent's time (sorted), as
:attr:`tracker.scope.NestedGraph.scope_summaries` holds them."""


@dataclass(frozen=True)
class NestedCheck:
    """One nested dataflow's answer: its cycles by scope, ``Psi`` within every scope (all
    scopes, whatever the cycles) and its nested scopes' summaries as operators."""

    cycles: list[tuple[ScopePath, Transition]]
    psi: dict[ScopePath, Psi]
    scope_summaries: ScopeSummaries

    @property
    def acceptable(self) -> bool:
        """True iff no scope has a non-incrementing cycle."""
        return not self.cycles


def structure_of(spark: SparkSession, graphs: Mapping[str, NestedGraph]) -> Structure:
    """The :class:`~spark_jobs.scopes.Structure` of in-memory nested graphs (by dataflow id),
    as the warehouse jobs read it from the tables."""
    tables: dict[str, list[dict]] = {"scopes": [], "nodes": [], "connections": [], "edges": []}
    for dataflow_id, graph in graphs.items():
        for table, rows in graph_rows(dataflow_id, graph).items():
            tables[table].extend(rows)
    frames = {t: arrow_to_spark(spark, to_arrow(t, rows), TABLES[t]) for t, rows in tables.items()}
    return structure_from_tables(frames["scopes"], frames["nodes"], frames["connections"], frames["edges"])


def check_nested(spark: SparkSession, graphs: Mapping[str, NestedGraph], progress: Progress | None = None
                 ) -> dict[str, NestedCheck]:
    """The Spark check of every nested dataflow (by id), in one run: see the module docstring."""
    if not graphs:
        return {}
    st = structure_of(spark, graphs)
    psi, operators, cycles = summarize_scoped(st, progress, cycles=True)
    assert cycles is not None
    found: dict[str, set[tuple[ScopePath, Transition]]] = {i: set() for i in graphs}
    for r in cycles.collect():
        dataflow_id, scope = split(r["dataflow_id"])
        zero = PathSummary.zero(graphs[dataflow_id].arity_of(scope))
        found[dataflow_id].add((scope, Transition(decode_code(r["src"]), decode_code(r["dst"]), zero)))
    psis: dict[str, dict[ScopePath, Psi]] = {
        i: {path: {} for path in g.scopes} for i, g in graphs.items()}
    for r in psi.toArrow().to_pylist():
        dataflow_id, scope = split(r["dataflow_id"])
        pair = (decode_code(r["src"]), decode_code(r["dst"]))
        within = psis[dataflow_id][scope]
        assert isinstance(within, dict)
        within.setdefault(pair, Antichain()).insert(PathSummary(r["summary"]))
    summaries: dict[str, ScopeSummaries] = {i: {p: {} for p in g.scopes if p} for i, g in graphs.items()}
    for r in operators.toArrow().to_pylist():
        dataflow_id, parent = split(r["dataflow_id"])
        src, dst = decode_code(r["src"]), decode_code(r["dst"])
        summaries[dataflow_id][(*parent, src.node)].setdefault((src.port, dst.port), []).append(
            PathSummary(r["summary"]))
    return {i: NestedCheck(sorted(found[i], key=lambda st_: (st_[0], str(st_[1]))), psis[i],
                           {p: {k: sorted(v) for k, v in s.items()} for p, s in summaries[i].items()})
            for i in graphs}


def nested_verdict(graph: NestedGraph, check: NestedCheck) -> tuple[str, str]:
    """``("agreed" | "disagreed", detail)``: Spark's check of ``graph`` against the native one
    (a built :class:`~tracker.scope.NestedGraph` has no cycle, ``Psi`` per scope from
    :func:`tracker.structure.path_summaries`, the scope summaries it computed bottom-up)."""
    problems = []
    if check.cycles:
        problems.append(f"Spark found non-incrementing cycles the native check did not: {check.cycles[:5]}")
    differing = [p for p, scope in graph.scopes.items() if check.psi.get(p) != path_summaries(scope.graph)]
    if differing:
        problems.append(f"Psi differs in scope(s) {[list(p) for p in differing[:5]]}")
    native = {p: {k: sorted(v) for k, v in s.items()} for p, s in graph.scope_summaries.items()}
    if native != check.scope_summaries:
        problems.append("the scopes' summaries as operators differ")
    if problems:
        return "disagreed", "; ".join(problems)
    pairs = sum(len(psi) for psi in check.psi.values())
    return "agreed", f"cycle check, {pairs} summaries in {len(check.psi)} scope(s) and the scope summaries agree"


def times_frame(spark: SparkSession, dataflow_id: str, counts: Mapping[tuple[ScopedLocation, Timestamp], int]
                ) -> DataFrame:
    """Active times (positive counts) keyed by scope key, ``(key, loc, time)``."""
    rows = [(key_of(dataflow_id, loc.scope), encode(loc.local), list(t)) for (loc, t), c in counts.items() if c > 0]
    return spark.createDataFrame(rows, TIMES_SCHEMA)


def nested_frontiers(spark: SparkSession, graph: NestedGraph, counts: Mapping[tuple[ScopedLocation, Timestamp], int],
                     progress: Progress | None = None) -> dict[ScopedLocation, list[Timestamp]]:
    """Every location's frontier over the flattened dataflow (empty list where nothing can
    arrive, times sorted), from the occurrence counts (only positive ones are active); equal to
    :func:`tracker.scoped_oracle.frontiers` and the live :class:`tracker.scoped.ScopedTracker`."""
    st = structure_of(spark, {"mem": graph})
    psi, _, _ = summarize_scoped(st, progress)
    frontier = propagate_scoped(st, psi, times_frame(spark, "mem", counts))
    result: dict[ScopedLocation, list[Timestamp]] = {loc: [] for loc in graph.locations()}
    for r in frontier.toArrow().to_pylist():
        _, scope = split(r["dataflow_id"])
        result[ScopedLocation(scope, *decode_code(r["loc"]))].append(tuple(r["time"]))
    return {loc: sorted(ts) for loc, ts in result.items()}
