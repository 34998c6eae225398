"""The ``tracker`` command line: the one place that reaches into the service and the Spark jobs.

Each command imports what it needs lazily, inside the command, so ``tracker --help`` is instant
and the pure core never imports Spark or FastAPI.

    tracker serve [--host 127.0.0.1] [--port 8000] [--warehouse ./warehouse] [--engine native|spark]
    tracker jobs cycles|summaries|propagate|incremental --warehouse PATH --dataflow ID [--master URL]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def _serve(args: argparse.Namespace) -> int:
    from api.server import serve

    return serve(args)


def _jobs(args: argparse.Namespace) -> int:
    from spark_jobs.cli import run_job

    return run_job(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command (also used by the docs and the tests)."""
    parser = argparse.ArgumentParser(prog="tracker", description="Progress tracking for timely dataflow, as a service.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the service (FastAPI + uvicorn)")
    serve.add_argument("--host", default=os.environ.get("TRACKER_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("TRACKER_PORT", "8000")))
    serve.add_argument("--warehouse", default=os.environ.get("TRACKER_WAREHOUSE", "./warehouse"),
                       help="directory (or URI) holding the Delta tables (env TRACKER_WAREHOUSE)")
    serve.add_argument("--engine", choices=["native", "spark"], default=os.environ.get("TRACKER_ENGINE", "native"),
                       help="who maintains frontiers on the hot path (env TRACKER_ENGINE)")
    serve.add_argument("--master", default=os.environ.get("SPARK_MASTER"),
                       help="Spark master URL (env SPARK_MASTER; default local[*])")
    serve.set_defaults(func=_serve)

    jobs = commands.add_parser("jobs", help="run one Spark job over the Delta tables")
    jobs.add_argument("job", choices=["cycles", "summaries", "propagate", "incremental"])
    jobs.add_argument("--warehouse", default=os.environ.get("TRACKER_WAREHOUSE", "./warehouse"))
    jobs.add_argument("--dataflow", required=True, help="dataflow id")
    jobs.add_argument("--master", default=os.environ.get("SPARK_MASTER"),
                      help="Spark master URL (env SPARK_MASTER; default local[*])")
    jobs.set_defaults(func=_jobs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tracker`` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
