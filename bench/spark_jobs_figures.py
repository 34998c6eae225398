"""Figures of the Spark jobs as users run them: the batched registration check, ``tracker jobs``
wall times (1 vs 100 dataflows, local vs a standalone cluster, :func:`cluster`), summarize rounds against
``ceil(log2(depth)) + 3``, and delta-spark against delta-rs on the same tables.

>>> ring(4).arity, len(ring(4).nodes)
(1, 4)
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.spark_workloads import dataflows, location_count, pointstamps
from tracker.graph import Connection, Edge, Graph, Location, Node
from tracker.timestamp import PathSummary

ROOT = Path(__file__).resolve().parent.parent


def ring(size: int) -> Graph:
    """``size`` one-in one-out operators in a cycle, the last one adding 1 (acceptable)."""
    inc = (Connection(0, 0, (PathSummary((1,)),)),)
    nodes = [Node(i, 1, 1, f"op{i}", inc if i == size - 1 else ()) for i in range(size)]
    edges = [Edge(Location.source(i, 0), Location.target((i + 1) % size, 0)) for i in range(size)]
    return Graph.build(1, nodes, edges)


def _timed(fn: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def registration(spark: Any) -> dict[str, float]:
    """The batched registration check of a 100-operator ring (session already up)."""
    from spark_jobs.registration import check_graphs

    check_graphs(spark, {"warm": ring(10)})
    checks, seconds = _timed(lambda: check_graphs(spark, {"ring": ring(100)}))
    from tracker.structure import path_summaries

    return {"registration_ring100_s": seconds,
            "registration_ring100_equal_native": float(checks["ring"].psi == path_summaries(ring(100)))}


def summarize_rounds(spark: Any, graphs: dict[str, Graph]) -> dict[str, float]:
    """The DataFrame path's path-doubling rounds on the workload against ``ceil(log2(max depth)) + 3``."""
    from spark_jobs.frames import Progress, all_arity_one, locations_of, transitions_of
    from spark_jobs.summaries import summarize

    progress = Progress(label="summarize")
    summarize(transitions_of(spark, graphs), locations_of(spark, graphs), all_arity_one(graphs), "doubling", progress,
              "dataframe")
    depth = max(len(g.nodes) for g in graphs.values())
    return {"summarize_rounds_doubling": progress.rounds, "summarize_round_bound": math.ceil(math.log2(depth)) + 3}


def backends(spark: Any, graphs: dict[str, Graph]) -> dict[str, float]:
    """Write then read the ``frontiers`` rows of the workload with delta-spark and with delta-rs."""
    from spark_jobs.rows import frontier_rows
    from spark_jobs.storage import Warehouse
    from tracker import oracle

    counts = pointstamps(graphs)
    rows = [r for i, g in graphs.items() for r in frontier_rows(i, oracle.frontiers(g, counts[i]))]
    figures: dict[str, float] = {"backend_rows": len(rows)}
    for backend in ("delta-spark", "delta-rs"):
        wh = Warehouse(tempfile.mkdtemp(prefix="bench-wh-"), spark, backend=backend)
        wh.append("frontiers", rows[:10])  # table creation is not what is measured
        _, figures[f"{backend}_write_s"] = _timed(lambda wh=wh: wh.replace_partitions("frontiers", list(graphs), rows))
        read, figures[f"{backend}_read_s"] = _timed(lambda wh=wh: wh.read("frontiers", list(graphs)))
        figures[f"{backend}_read_rows"] = read.num_rows
    figures["delta_spark_over_rs_write"] = figures["delta-spark_write_s"] / figures["delta-rs_write_s"]
    figures["delta_spark_over_rs_read"] = figures["delta-spark_read_s"] / figures["delta-rs_read_s"]
    return figures


def _warehouse(graphs: dict[str, Graph], summaries: bool = True) -> str:
    """A warehouse holding ``graphs``, their pointstamps and (if ``summaries``) their
    ``summaries`` (delta-rs)."""
    from spark_jobs.storage import Warehouse
    from tracker.structure import path_summaries

    root = tempfile.mkdtemp(prefix="bench-jobs-")
    wh = Warehouse(root)
    from datetime import UTC, datetime

    wh.write_dataflows([(i, "bench", g, datetime.now(UTC)) for i, g in graphs.items()])
    counts = pointstamps(graphs)
    wh.write_states({i: (0, counts[i], None) for i in graphs})
    if summaries:
        wh.write_many_summaries({i: path_summaries(g) for i, g in graphs.items()})
    return root


def _job(job: str, root: str, master: str, *which: str, **env: str) -> float:
    return _run_job(job, root, master, *which, **env)[0]


def _run_job(job: str, root: str, master: str, *which: str, **env: str) -> tuple[float, str]:
    """``tracker jobs JOB`` in a subprocess: its wall time and its standard output."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tracker.cli", "jobs", job, "--warehouse", root, *which,
                           "--master", master], cwd=ROOT, env={**os.environ, "PYSPARK_PYTHON": sys.executable, **env},
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tracker jobs {job} failed: {done.stderr[-2000:]}")
    seconds = time.perf_counter() - started
    setting = " ".join(f"{k}={v}" for k, v in env.items())
    print(f"  [jobs] {time.strftime('%H:%M:%S')} tracker jobs {job} on {master} of {root} {setting}: {seconds:.1f}s",
          flush=True)
    return seconds, done.stdout + done.stderr


def first_words(job: str, root: str) -> tuple[float, str]:
    """Seconds from starting ``tracker jobs JOB`` to its first line on stderr, and that line
    (the run then completes)."""
    started = time.perf_counter()
    with subprocess.Popen([sys.executable, "-m", "tracker.cli", "jobs", job, "--warehouse", root, "--all",
                           "--master", "local[2]"], cwd=ROOT, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as run:
        assert run.stderr is not None
        line = run.stderr.readline().strip()
        seconds = time.perf_counter() - started
        run.communicate()
    return seconds, line


def _rounds(stdout: str) -> float:
    """The iterations a ``propagate`` run reports (``... after N iterations``)."""
    found = re.search(r"after (\d+) iterations", stdout)
    return float(found.group(1)) if found else float("nan")


STEPS = {"spark_ready": "Spark ready", "graphs_read": "reading `pointstamps`", "computed": "writing `frontiers`"}
"""Where a ``propagate`` run's time goes: the figure, and the step line whose elapsed seconds
mark its end (the CLI's own output)."""


def steps(output: str, prefix: str) -> dict[str, float]:
    """The seconds elapsed at each of :data:`STEPS` in a run's output, as ``{prefix}_{name}_s``.

    >>> steps("[propagate] Spark ready; ... (3.5s)\\n[propagate] writing `frontiers` (9.0s)", "p")
    {'p_spark_ready_s': 3.5, 'p_computed_s': 9.0}
    """
    found: dict[str, float] = {}
    for name, line in STEPS.items():
        hit = re.search(re.escape(line) + r".*\((\d+\.\d+)s\)", output)
        if hit:
            found[f"{prefix}_{name}_s"] = float(hit.group(1))
    return found


def cli() -> dict[str, float]:
    """``tracker jobs propagate`` wall times (session start included), 1 vs 100 dataflows, and
    its rounds where ``summaries`` holds no Psi (each engine)."""
    figures: dict[str, float] = {}
    many = dataflows(100, seed=5)
    one_root, many_root = _warehouse({"df00000": many["df00000"]}), _warehouse(many)
    # Alternated, so both see the same load: the quick start (quick JIT, class-data archive:
    # spark_jobs/quickstart.py) on, as users run it, and off (the JVM's defaults).
    for _ in range(2):
        seconds, out = _run_job("propagate", one_root, "local[2]", "--all")
        if seconds < figures.get("jobs_propagate_1_df_s", float("inf")):
            figures.update({"jobs_propagate_1_df_s": seconds, **steps(out, "jobs_propagate_1_df")})
        seconds, out = _run_job("propagate", one_root, "local[2]", "--all", TRACKER_JOBS_QUICK_START="0")
        if seconds < figures.get("jobs_propagate_1_df_default_jvm_s", float("inf")):
            figures.update({"jobs_propagate_1_df_default_jvm_s": seconds,
                            **steps(out, "jobs_propagate_1_df_default_jvm")})
    figures["jobs_propagate_1_df_default_jvm_over_quick"] = (figures["jobs_propagate_1_df_default_jvm_s"]
                                                             / figures["jobs_propagate_1_df_s"])
    # The same run with the tables read and written by delta-spark (a cluster's IO) instead of
    # delta-rs on the driver (a local master's default).
    figures["jobs_propagate_1_df_delta_spark_s"] = _job("propagate", one_root, "local[2]", "--all",
                                                        TRACKER_JOBS_DELTA="delta-spark")
    figures["jobs_propagate_1_df_delta_spark_over_rs"] = (figures["jobs_propagate_1_df_delta_spark_s"]
                                                          / figures["jobs_propagate_1_df_s"])
    figures["jobs_propagate_100_df_s"] = _job("propagate", many_root, "local[2]", "--all")
    figures["jobs_100_over_1"] = figures["jobs_propagate_100_df_s"] / figures["jobs_propagate_1_df_s"]
    # Where `summaries` holds no Psi: GraphX propagates without it; the DataFrame engine computes
    # it by path doubling, then joins (it iterated once per level of depth before).
    figures["jobs_first_output_s"], _ = first_words("cycles", one_root)
    bare = _warehouse({"df00000": many["df00000"]}, summaries=False)
    seconds, out = _run_job("propagate", bare, "local[2]", "--all")
    figures["jobs_propagate_rounds_without_psi"] = _rounds(out)
    figures["jobs_propagate_1_df_without_psi_s"] = seconds
    seconds, out = _run_job("propagate", bare, "local[2]", "--all", TRACKER_GRAPH_ENGINE="dataframe")
    figures["jobs_propagate_rounds_without_psi_dataframe"] = _rounds(out)
    figures["jobs_propagate_1_df_without_psi_dataframe_s"] = seconds
    return figures


def cluster(count: int) -> dict[str, float]:
    """``tracker jobs propagate`` of ``count`` dataflows (1,650: ~100,000 locations) on local[2]
    against a two-worker standalone cluster (one core each: the machine's two cores, as local[2]
    has them), delta-spark IO on both, as a cluster's run must: the comparison is of where Spark
    runs."""
    figures: dict[str, float] = {}
    big = dataflows(count, seed=3)
    figures["cluster_workload_locations"] = location_count(big)
    root = _warehouse(big)
    print(f"  [cluster] {time.strftime('%H:%M:%S')} {figures['cluster_workload_locations']:,} locations on local[2]",
          flush=True)
    figures["jobs_propagate_big_local2_s"] = _job("propagate", root, "local[2]", "--all",
                                                  TRACKER_JOBS_DELTA="delta-spark")
    from spark_jobs.cluster import start

    print(f"  [cluster] {time.strftime('%H:%M:%S')} the same on a 2-worker standalone cluster", flush=True)
    cluster = start(Path(tempfile.mkdtemp(prefix="bench-cluster-")), sys.executable, cores=1, workers=2)
    try:
        figures["jobs_propagate_big_cluster_s"] = _job("propagate", root, cluster.url, "--all")
    finally:
        cluster.stop()
    figures["cluster_over_local2"] = figures["jobs_propagate_big_cluster_s"] / figures["jobs_propagate_big_local2_s"]
    return figures
