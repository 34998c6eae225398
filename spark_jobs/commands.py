"""``tracker jobs`` and ``tracker report``, registered under the ``tracker.commands`` entry points.

Only :mod:`argparse` here; Spark, delta-rs and Polars are imported when a command runs.

>>> import argparse
>>> commands = argparse.ArgumentParser(prog="tracker").add_subparsers()
>>> add_commands(commands)
>>> commands.choices["jobs"].parse_args(["cycles", "--dataflow", "d1"]).job
'cycles'
"""

from __future__ import annotations

import argparse
import os
import sys


def _jobs(args: argparse.Namespace) -> int:
    # Said at once: the imports below (Arrow, delta-rs) and the warehouse checks take a moment.
    print(f"[{args.job}] checking the warehouse {args.warehouse}...", file=sys.stderr, flush=True)
    if getattr(args, "graph_engine", None):
        os.environ["TRACKER_GRAPH_ENGINE"] = args.graph_engine  # read by the session and every job
    try:
        from spark_jobs.cli import run_job
    except ImportError as error:
        from tracker.cli import needs_extra

        return needs_extra("jobs", "spark", error)
    return run_job(args)


def _report(args: argparse.Namespace) -> int:
    try:
        from spark_jobs.report import run_report
    except ImportError as error:
        from tracker.cli import needs_extra

        return needs_extra("report", "spark", error)
    return run_report(args)


def _warehouse(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--warehouse", default=os.environ.get("TRACKER_WAREHOUSE", "./warehouse"),
                        help="directory (or URI) holding the Delta tables (env TRACKER_WAREHOUSE)")


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``jobs`` and ``report`` to the ``tracker`` command's sub-parsers."""
    jobs = commands.add_parser(
        "jobs", help="run one Spark job over the Delta tables", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run one Spark job over the Delta tables of a warehouse:\n"
                    "  cycles       list the transitions on non-incrementing cycles (reads only; exit 1 if any)\n"
                    "  summaries    compute Psi, the minimal path summaries, into `summaries`\n"
                    "  propagate    recompute `frontiers` from `pointstamps` from scratch\n"
                    "  incremental  fold the `progress` rows past the `pointstamps` watermark into `pointstamps`\n"
                    "               and `frontiers`, appending the net frontier changes to `frontier_changes`\n"
                    "               (tagged with the last version folded in)\n"
                    "The jobs that write refuse to run while the service (or another job) holds the warehouse.")
    jobs.add_argument("job", choices=["cycles", "summaries", "propagate", "incremental"])
    _warehouse(jobs)
    which = jobs.add_mutually_exclusive_group(required=True)
    which.add_argument("--dataflow", action="append",
                       help="dataflow id or name (a name must be one dataflow's); repeat it (or separate "
                            "them by commas) to run several in one job")
    which.add_argument("--all", action="store_true", help="every dataflow of the warehouse, in one job")
    jobs.add_argument("--master", default=os.environ.get("SPARK_MASTER"),
                      help="Spark master URL (env SPARK_MASTER; default local[*])")
    jobs.add_argument("--graph-engine", choices=["graphx", "dataframe"], default=None,
                      help="what runs the cycle check, Psi and propagation: the GraphX helper (default) or "
                           "Spark SQL joins (env TRACKER_GRAPH_ENGINE)")
    jobs.set_defaults(func=_jobs)

    report = commands.add_parser("report", help="print a dataflow's frontiers, epoch clear times and stuck "
                                 "locations from the Delta tables alone (no service, no Spark)")
    _warehouse(report)
    report.add_argument("--dataflow", required=True, help="dataflow id, or name if only one dataflow has it")
    report.add_argument("--json", action="store_true", help="print JSON instead of text tables")
    report.add_argument("--as-of", default=None, help="ISO time the durations are measured at, not before the "
                        "tables' last entry (default: now, UTC); the tables are read as they are now")
    report.add_argument("--limit", type=int, default=10, help="how many stuck locations and blockers to list")
    report.add_argument("--plot", default=None, metavar="FILE.svg|FILE.png",
                        help="also draw epochs cleared and lag over time into this SVG or PNG file (matplotlib)")
    report.set_defaults(func=_report)
