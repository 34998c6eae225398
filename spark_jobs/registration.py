"""The registration check of many graphs at once: cycle check, then ``Psi`` of the acceptable ones.

Guarantees: one Spark job for the cycle check of every graph and one for the summaries of all
that pass, whatever their number (a burst of registrations pays the query planning and the
per-round task overhead once); the answers equal :func:`tracker.structure.find_cycles` and
:func:`tracker.structure.path_summaries` per graph. A graph with a non-incrementing cycle gets
its cycle transitions and no ``Psi`` (it would have no fixed point).

>>> RegistrationCheck(cycles=[], psi={}).acceptable
True

Example (starts a JVM, so not run as a doctest)::

    checks = check_graphs(get_spark(), {"df-1": graph_1, "df-2": graph_2})
    checks["df-1"].acceptable, len(checks["df-1"].psi)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import SparkSession

from spark_jobs.cycles import find_cycles_for_graphs
from spark_jobs.frames import Progress
from spark_jobs.summaries import summaries_for_graphs
from tracker.antichain import Antichain
from tracker.graph import Graph, Location, Transition
from tracker.timestamp import PathSummary

Psi = dict[tuple[Location, Location], Antichain[PathSummary]]


@dataclass(frozen=True)
class RegistrationCheck:
    """One graph's answer: the transitions on non-incrementing cycles, and ``Psi`` if none."""

    cycles: list[Transition]
    psi: Psi

    @property
    def acceptable(self) -> bool:
        """True iff the graph has no non-incrementing cycle."""
        return not self.cycles


def check_graphs(spark: SparkSession, graphs: Mapping[str, Graph],
                 progress: Progress | None = None) -> dict[str, RegistrationCheck]:
    """The registration check of every graph (by dataflow id), batched as the module says."""
    if not graphs:
        return {}
    cycles = find_cycles_for_graphs(spark, graphs, progress)
    acceptable = {i: g for i, g in graphs.items() if not cycles[i]}
    psis = summaries_for_graphs(spark, acceptable, progress=progress) if acceptable else {}
    return {i: RegistrationCheck(cycles[i], psis.get(i, {})) for i in graphs}
