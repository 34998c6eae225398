"""``tracker jobs cycles|summaries|propagate|incremental --warehouse PATH (--dataflow ID ... | --all) [--master URL]``.

One run covers every dataflow named (``--dataflow`` repeated, or comma-separated; an id, or a name
that only one dataflow has) or all of them (``--all``): the session start and the query planning
are paid once, each iteration runs over all of them together, and each table is written in one
commit.

What the job is doing goes to stderr as it runs, the first line at once ("checking the
warehouse...", "starting Spark...", then each step with the seconds elapsed); the result summary
goes to stdout. ``SPARK_LOCAL_IP`` defaults to 127.0.0.1 for a local master. Exit codes: 0 done
(``cycles``: the graph is acceptable), 1 ``cycles`` found some, 2 usage error (unknown dataflow
or a name several have, missing warehouse or table, Spark cannot start, the GraphX helper is not
built, or the warehouse is in use: the jobs that write, ``summaries``, ``propagate`` and
``incremental``, refuse to run while the service or another job holds it, see
:mod:`spark_jobs.ownership`), without a traceback.

>>> # run_job(argparse.Namespace(job="summaries", warehouse="./warehouse", dataflow="df-1", master=None))
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from typing import Any

from spark_jobs.ownership import WarehouseBusy, WarehouseLock, restrict
from spark_jobs.storage import Backend, LegacyWarehouseError, UnknownDataflowError, Warehouse, warehouse_problem

_GRAPH = ["dataflows", "scopes", "nodes", "edges"]
NEEDS = {"cycles": _GRAPH, "summaries": _GRAPH, "propagate": _GRAPH, "incremental": _GRAPH}
"""The tables each job cannot do without; the others (``connections``, ``pointstamps``,
``progress``, ...) are read as empty when they were never written."""

WRITES = {"summaries": "`summaries`", "propagate": "`frontiers`",
          "incremental": "`pointstamps`, `frontiers` and `frontier_changes`"}
"""The jobs that write tables, and what they write: they need the warehouse to themselves."""


def _fail(message: str) -> int:
    print(f"tracker jobs: error: {message}", file=sys.stderr)
    return 2


def run_job(args: argparse.Namespace) -> int:
    """Run one job for ``args.dataflow`` (comma-separated ids run together); return the exit code."""
    warehouse = str(args.warehouse)
    problem = warehouse_problem(warehouse)
    if problem:
        return _fail(f"warehouse {warehouse!r} {problem}")
    from spark_jobs.session import master_problem

    if args.master and (problem := master_problem(args.master)):
        return _fail(f"--master: {problem}")
    try:  # what the job writes is as private as what the service writes
        restrict(None, os.environ.get("TRACKER_FILE_MODE", "owner"))
    except ValueError as error:
        return _fail(str(error))
    starting = _SparkStart(args.master)  # the JVM starts while the warehouse is checked
    probe = Warehouse(warehouse)  # no Spark needed to tell an unknown dataflow apart
    try:
        probe.check_layout()
    except LegacyWarehouseError as error:
        return _fail(str(error))
    missing = [t for t in NEEDS[args.job] if not probe.exists(t)]
    if missing:
        return _fail(f"warehouse {warehouse!r} has no table {', '.join(missing)}: `{args.job}` reads it "
                     "(the service creates the tables when a dataflow registers)")
    rows = probe.read("dataflows").select(["dataflow_id", "name", "deleted_at"]).to_pylist()
    known = {r["dataflow_id"] for r in rows}
    given = getattr(args, "dataflow", None)
    if getattr(args, "all", False):
        ids = sorted(known)
    else:
        given = [given] if isinstance(given, str) else list(given or [])
        try:
            ids = list(dict.fromkeys(resolve(rows, i) for value in given for i in str(value).split(",") if i))
        except LookupError as error:
            return _fail(f"{error} in warehouse {warehouse!r}")
    unknown = [i for i in ids if i not in known]
    if unknown or not ids:
        listed = sorted(known)[:5]
        more = f" and {len(known) - len(listed)} more (see the `dataflows` table)" if len(known) > len(listed) else ""
        return _fail(
            f"unknown dataflow {', '.join(unknown[:5]) or '(none given)'} in warehouse {warehouse!r}"
            f" (known: {', '.join(listed) or 'none'}{more})"
        )
    lock = None
    if args.job in WRITES:
        try:
            lock = WarehouseLock.acquire_all(warehouse, f"tracker jobs {args.job}")
        except WarehouseBusy as busy:
            return _fail(f"{busy}. `{args.job}` writes {WRITES[args.job]}, which the live service keeps up to "
                         "date itself; stop the service first (its state is safe in the tables and its log), "
                         "or run `cycles`, which only reads")
    try:
        return _run(args, warehouse, ids, starting)
    finally:
        if lock is not None:
            lock.release()


def resolve(rows: list[dict[str, Any]], value: str) -> str:
    """The dataflow id ``value`` names: itself if it is an id of ``rows`` (the ``dataflows``
    table's), else the id of the one dataflow registered under that name (among those not
    deleted, if any is); an unknown value is returned as it is (the caller lists the known ones).

    Raises:
        LookupError: several dataflows have that name (one line listing their ids).

    >>> rows = [{"dataflow_id": "a1", "name": "wc", "deleted_at": None},
    ...         {"dataflow_id": "b2", "name": "wc", "deleted_at": None}, {"dataflow_id": "c3", "name": "cc"}]
    >>> resolve(rows, "c3"), resolve(rows, "cc"), resolve(rows, "nope")
    ('c3', 'c3', 'nope')
    >>> resolve(rows, "wc")
    Traceback (most recent call last):
    LookupError: 2 dataflows are named 'wc' (a1, b2): give one id
    """
    if any(r["dataflow_id"] == value for r in rows):
        return value
    named = sorted({r["dataflow_id"] for r in rows if r.get("name") == value})
    live = sorted({r["dataflow_id"] for r in rows if r.get("name") == value and r.get("deleted_at") is None})
    candidates = live or named
    if len(candidates) > 1:
        raise LookupError(f"{len(candidates)} dataflows are named {value!r} ({', '.join(candidates)}): give one id")
    return candidates[0] if candidates else value


def io_backend(master: str | None) -> Backend | None:
    """How a job reads and writes the warehouse: ``"delta-rs"`` (Arrow on the driver) for a
    local master, ``None`` (delta-spark when the session has Delta's classes: the executors do
    the IO) for a cluster's. ``TRACKER_JOBS_DELTA`` (``delta-rs`` or ``delta-spark``) overrides
    it; ``TRACKER_DRIVER_DELTA_RS=forbid`` rules delta-rs out.

    On a local master the executors share the driver's process and disk, and delta-spark pays
    Spark jobs per table read (the snapshot's state) and per commit that delta-rs does not: a
    one-dataflow ``propagate`` spent most of its time there (``docs/tables.md``).

    >>> io_backend("local[2]"), io_backend("spark://10.0.0.5:7077")
    ('delta-rs', None)
    """
    from spark_jobs.session import resolve_master

    forced = os.environ.get("TRACKER_JOBS_DELTA", "")
    if forced in ("delta-rs", "delta-spark"):
        return forced  # type: ignore[return-value]
    if forced:
        raise ValueError(f"TRACKER_JOBS_DELTA={forced!r}: use delta-rs or delta-spark")
    if os.environ.get("TRACKER_DRIVER_DELTA_RS") == "forbid":
        return None
    return "delta-rs" if resolve_master(master).startswith("local") else None


def local_ip_default(master: str | None) -> None:
    """Set ``SPARK_LOCAL_IP`` to 127.0.0.1 unless it is set or the master is another machine's:
    a local session then binds to loopback and Spark does not warn that the hostname resolves
    to a loopback address (it must not for a remote master, whose executors call back)."""
    url = master or os.environ.get("SPARK_MASTER") or "local[*]"
    if url.startswith("local") or re.match(r"spark://(127\.0\.0\.1|localhost)[:/]", url):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


class _SparkStart:
    """The Spark session, started on a thread as soon as the job's arguments are known, so the
    JVM's start overlaps the warehouse checks (an early exit leaves it to die with the process:
    see :func:`spark_jobs.session.tie_to_parent`)."""

    def __init__(self, master: str | None) -> None:
        self.master = master
        self.session: Any = None
        self.error: BaseException | None = None
        local_ip_default(master)
        self._thread = threading.Thread(target=self._start, name="spark-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            from spark_jobs.session import get_spark

            self.session = get_spark(self.master, quick_start=True)
        except BaseException as error:  # handed to the waiting caller
            self.error = error

    def wait(self) -> Any:
        """The session, or the exception its start raised."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.session


def _run(args: argparse.Namespace, warehouse: str, ids: list[str], starting: _SparkStart) -> int:
    from spark_jobs import jobs
    from spark_jobs.frames import Progress
    from spark_jobs.session import graph_engine

    started = time.perf_counter()
    progress = Progress(label=args.job, echo=True)
    progress.step(f"starting Spark ({args.master or os.environ.get('SPARK_MASTER') or 'local[*]'})...")
    try:
        spark = starting.wait()
        engine = graph_engine(spark)
    except Exception as error:  # a wrong --master, no Java, no GraphX helper: one line, no traceback
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return _fail(f"cannot start Spark (master {args.master or 'local[*]'}): {first}")
    try:
        wh = Warehouse(warehouse, spark, backend=io_backend(args.master))
    except ValueError as error:
        return _fail(str(error))
    from spark_jobs.quickstart import describe

    jvm = describe(spark.sparkContext.getConf().get("spark.driver.extraJavaOptions", ""))
    progress.step(f"Spark ready; graph engine: {engine}; tables read and written by {wh.backend}; JVM: {jvm}")
    try:
        if args.job == "cycles":
            found = jobs.cycles_job(wh, ids, progress)
            bad = {i: ts for i, ts in found.items() if ts}
            for i, ts in found.items():
                print(
                    f"{i}: "
                    + (
                        "no non-incrementing cycle"
                        if not ts
                        else f"{len(ts)} transitions on non-incrementing cycles: "
                    + ", ".join(f"{list(scope)}{t}" if scope else str(t) for scope, t in ts)
                    )
                )
            code = 1 if bad else 0
        elif args.job == "summaries":
            rows, scope = jobs.summaries_job(wh, ids, progress)
            print(f"summaries: {rows} rows written for {len(ids)} dataflow(s); nested scopes' summaries as "
                  f"operators: {scope.count()} rows")
            code = 0
        elif args.job == "propagate":
            rows = jobs.propagate_job(wh, ids, progress)
            print(f"frontiers: {rows} rows written for {len(ids)} dataflow(s) after {progress.rounds} iterations")
            code = 0
        else:
            applied, changes = jobs.incremental_job(wh, ids, progress)
            print(f"incremental: {applied} progress rows applied, {changes} frontier changes appended")
            code = 0
    except UnknownDataflowError as error:
        return _fail(str(error))
    print(f"[{args.job}] done in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
    return code
