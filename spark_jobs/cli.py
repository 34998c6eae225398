"""``tracker jobs cycles|summaries|propagate|incremental --warehouse PATH --dataflow ID [--master URL]``.

Progress (iteration, new rows, elapsed) goes to stderr as the job runs; the result summary goes
to stdout. Exit codes: 0 done (``cycles``: the graph is acceptable), 1 ``cycles`` found some,
2 usage error (unknown dataflow, missing warehouse), without a traceback.

>>> # run_job(argparse.Namespace(job="summaries", warehouse="./warehouse", dataflow="df-1", master=None))
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from spark_jobs.storage import UnknownDataflowError, Warehouse


def _fail(message: str) -> int:
    print(f"tracker jobs: error: {message}", file=sys.stderr)
    return 2


def run_job(args: argparse.Namespace) -> int:
    """Run one job for ``args.dataflow`` (comma-separated ids run together); return the exit code."""
    warehouse = str(args.warehouse)
    if "://" not in warehouse and not Path(warehouse).is_dir():
        return _fail(f"warehouse {warehouse!r} does not exist")
    ids = [i for i in str(args.dataflow).split(",") if i]
    probe = Warehouse(warehouse)  # no Spark needed to tell an unknown dataflow apart
    known = set(probe.dataflow_ids())
    unknown = [i for i in ids if i not in known]
    if unknown or not ids:
        return _fail(
            f"unknown dataflow {', '.join(unknown) or '(none given)'} in warehouse {warehouse!r}"
            f" (known: {', '.join(sorted(known)) or 'none'})"
        )

    from spark_jobs import jobs
    from spark_jobs.frames import Progress
    from spark_jobs.session import get_spark

    started = time.perf_counter()
    print(f"[{args.job}] starting Spark ({args.master or 'SPARK_MASTER or local[*]'})", file=sys.stderr, flush=True)
    wh = Warehouse(warehouse, get_spark(args.master))
    progress = Progress(label=args.job, echo=True)
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
                        else f"{len(ts)} transitions on non-incrementing cycles: " + ", ".join(map(str, ts))
                    )
                )
            code = 1 if bad else 0
        elif args.job == "summaries":
            rows, scope = jobs.summaries_job(wh, ids, progress)
            print(f"summaries: {rows} rows written for {len(ids)} dataflow(s); scope summaries: {scope.count()} rows")
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
