"""Figures of the graph engines on the same workloads: the GraphX helper against the DataFrame
path for the cycle check, ``Psi`` and propagation at about 1,000, 10,000 and 100,000 locations
(``bench/spark_workloads.py``: 17, 165 and 1,650 dataflows), each answer checked equal across
engines on the way; GraphX's own algorithms (SCC, Pregel) at the smallest size.

>>> SIZES["1k"], SIZES["100k"]
(17, 1650)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import functions as F

from bench.spark_workloads import dataflows, location_count, pointstamps
from spark_jobs import graphx
from spark_jobs.cycles import find_cycles
from spark_jobs.frames import Progress, is_zero, locations_of, transitions_of
from spark_jobs.propagate import propagate, times_of
from spark_jobs.summaries import summarize

SIZES = {"1k": 17, "10k": 165, "100k": 1650}


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((r[0], r[1], *(tuple(x) if isinstance(x, list) else x for x in r[2:])) for r in df.collect())


def engines(spark: Any, sizes: list[str]) -> dict[str, float]:
    """GraphX against the DataFrame path at each of ``sizes`` (labels of :data:`SIZES`)."""
    figures: dict[str, float] = {}
    for label in sizes:
        figures.update(one_size(spark, label, SIZES[label]))
    return figures


def _say(label: str, what: str, figures: dict[str, float] | None = None) -> None:
    """A progress line; with ``figures``, the timings measured since the last line, so that a run
    stopped part-way still shows them."""
    done = ""
    if figures:
        fresh = [k for k in figures if k.endswith("_s") and k not in _said]
        _said.update(fresh)
        done = " (" + ", ".join(f"{k} {figures[k]:.2f}" for k in fresh) + ")" if fresh else ""
    print(f"  [engines {label}] {time.strftime('%H:%M:%S')}{done} {what}", flush=True)


_said: set[str] = set()


def one_size(spark: Any, label: str, count: int) -> dict[str, float]:
    """The figures of one size (``label``), on ``count`` dataflows."""
    figures: dict[str, float] = {}
    graphs = dataflows(count, seed=3)
    figures[f"engines_{label}_locations"] = location_count(graphs)
    transitions = transitions_of(spark, graphs).localCheckpoint()
    locations = locations_of(spark, graphs).localCheckpoint()
    times = times_of(spark, pointstamps(graphs)).localCheckpoint()

    _say(label, f"{figures[f'engines_{label}_locations']:,} locations: cycle check, GraphX then DataFrame path")
    cycles, figures[f"cycles_graphx_{label}_s"] = _timed(lambda: find_cycles(transitions, engine="graphx"))
    df, figures[f"cycles_dataframe_{label}_s"] = _timed(
        lambda: find_cycles(transitions, engine="dataframe").localCheckpoint())
    figures[f"cycles_equal_{label}"] = float(_rows(cycles) == _rows(df))

    _say(label, "Psi, GraphX then DataFrame path", figures)
    gx, figures[f"psi_graphx_{label}_s"] = _timed(lambda: summarize(transitions, locations, engine="graphx"))
    df, figures[f"psi_dataframe_{label}_s"] = _timed(
        lambda: summarize(transitions, locations, engine="dataframe").localCheckpoint())
    figures[f"psi_rows_{label}"] = gx.count()
    figures[f"psi_equal_{label}"] = float(_rows(gx) == _rows(df))

    _say(label, "propagation, GraphX then DataFrame path", figures)
    gx, figures[f"propagate_graphx_{label}_s"] = _timed(lambda: propagate(transitions, times, engine="graphx"))
    rounds = Progress(label="propagate")
    df, figures[f"propagate_dataframe_{label}_s"] = _timed(
        lambda: propagate(transitions, times, progress=rounds, engine="dataframe"))
    figures[f"propagate_dataframe_rounds_{label}"] = rounds.rounds
    figures[f"propagate_equal_{label}"] = float(_rows(gx) == _rows(df))
    for what in ("cycles", "psi", "propagate"):
        figures[f"{what}_dataframe_over_graphx_{label}"] = (
            figures[f"{what}_dataframe_{label}_s"] / figures[f"{what}_graphx_{label}_s"])
    _say(label, "ratios: " + ", ".join(f"{w} {figures[f'{w}_dataframe_over_graphx_{label}']:.1f}x"
                                       for w in ("cycles", "psi", "propagate")), figures)
    if label == "1k":  # GraphX's own algorithms: supersteps follow the depth, so only here
        zero = transitions.where(is_zero(F.col("summary")))
        pregel, figures["cycles_graphx_pregel_1k_s"] = _timed(lambda: graphx.cycles(zero, "pregel"))
        figures["cycles_pregel_equal_1k"] = float(_rows(pregel) == _rows(cycles))
        pregel, figures["propagate_graphx_pregel_1k_s"] = _timed(
            lambda: graphx.propagate(transitions, times, "pregel"))
        figures["propagate_pregel_equal_1k"] = float(_rows(pregel) == _rows(gx))
    return figures
