"""The ``tracker`` command line: the one place that reaches into the service and the Spark jobs.

Each command imports what it needs lazily, inside the command, so ``tracker --help`` is instant
and the pure core never imports Spark or FastAPI.

    tracker serve [--host 127.0.0.1] [--port 8000] [--warehouse ./warehouse] [--engine native|spark]
    tracker jobs cycles|summaries|propagate|incremental --warehouse PATH (--dataflow ID ... | --all) [--master URL]
    tracker report --warehouse PATH --dataflow ID [--json] [--as-of ISO] [--limit N]
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


def _report(args: argparse.Namespace) -> int:
    from spark_jobs.report import run_report

    return run_report(args)


def _example(args: argparse.Namespace) -> int:
    from tracker.cluster import example_main

    return example_main(args)


def _worker(args: argparse.Namespace) -> int:
    from tracker.cluster import worker_main

    return worker_main(args)


def _add_worker_commands(commands: argparse._SubParsersAction) -> None:
    """``example`` (run an example on several worker processes) and ``worker`` (one process)."""
    url = os.environ.get("TRACKER_URL", "http://127.0.0.1:8000")
    example = commands.add_parser("example", help="run an example dataflow on worker processes against the service")
    example.add_argument("name", choices=["wordcount", "components"])
    example.add_argument("--url", default=url, help="service URL (env TRACKER_URL)")
    example.add_argument("--token", help="admin token (default: env TRACKER_ADMIN_TOKEN)")
    example.add_argument("--workers", type=int, default=2, help="worker processes")
    example.add_argument("--epochs", type=int, help="input epochs (default: the example's)")
    example.add_argument("--seed", type=int, help="input seed (default: the example's)")
    example.add_argument("--delay", type=float, default=0.0, help="random delay of each data message, seconds")
    example.add_argument("--timeout", type=float, default=120.0)
    example.add_argument("--link", choices=["ws", "sse"], default="ws",
                         help="how workers talk to the service: one WebSocket, or POST + SSE")
    example.add_argument("--check", action="store_true",
                         help="compare with the sequential reference (exit 1 if not equal)")
    example.add_argument("--stats", action="store_true", help="print the workers' statistics as JSON")
    example.set_defaults(func=_example)

    worker = commands.add_parser("worker", help="run one worker process of an example (used by `example`)")
    worker.add_argument("name", choices=["wordcount", "components"])
    worker.add_argument("--url", default=url)
    worker.add_argument("--dataflow", required=True)
    worker.add_argument("--token", required=True, help="the dataflow's token")
    worker.add_argument("--index", type=int, required=True)
    worker.add_argument("--addresses", required=True, help="host:port of every worker, comma-separated, in order")
    worker.add_argument("--config", default="{}", help="the example's config as JSON")
    worker.add_argument("--delay", type=float, default=0.0)
    worker.add_argument("--progress-delay", type=float, default=0.0)
    worker.add_argument("--seed", type=int, default=0)
    worker.add_argument("--timeout", type=float, default=120.0)
    worker.add_argument("--trace", help="write every callback (recv/notify) to this JSON-lines file")
    worker.add_argument("--link", choices=["ws", "sse"], default="ws")
    worker.set_defaults(func=_worker)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command (also used by the docs and the tests)."""
    parser = argparse.ArgumentParser(prog="tracker", description="Progress tracking for timely dataflow, as a service.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the service (FastAPI + uvicorn)")
    serve.add_argument("--host", default=os.environ.get("TRACKER_HOST", "127.0.0.1"),
                       help="interface to listen on (env TRACKER_HOST; default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=os.environ.get("TRACKER_PORT", "8000"),
                       help="TCP port (env TRACKER_PORT; default 8000)")
    serve.add_argument("--warehouse", default=os.environ.get("TRACKER_WAREHOUSE", "./warehouse"),
                       help="directory (or URI) holding the Delta tables (env TRACKER_WAREHOUSE)")
    serve.add_argument("--engine", choices=["native", "spark"], default=os.environ.get("TRACKER_ENGINE", "native"),
                       help="who maintains frontiers on the hot path (env TRACKER_ENGINE)")
    serve.add_argument("--master", default=os.environ.get("SPARK_MASTER"),
                       help="Spark master URL (env SPARK_MASTER; default local[*])")
    serve.set_defaults(func=_serve)

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
    jobs.add_argument("--warehouse", default=os.environ.get("TRACKER_WAREHOUSE", "./warehouse"),
                      help="directory (or URI) holding the Delta tables (env TRACKER_WAREHOUSE)")
    which = jobs.add_mutually_exclusive_group(required=True)
    which.add_argument("--dataflow", action="append",
                       help="dataflow id; repeat it (or separate ids by commas) to run several in one job")
    which.add_argument("--all", action="store_true", help="every dataflow of the warehouse, in one job")
    jobs.add_argument("--master", default=os.environ.get("SPARK_MASTER"),
                      help="Spark master URL (env SPARK_MASTER; default local[*])")
    jobs.set_defaults(func=_jobs)

    report = commands.add_parser("report", help="print a dataflow's frontiers, epoch clear times and stuck "
                                 "locations from the Delta tables alone (no service, no Spark)")
    report.add_argument("--warehouse", default=os.environ.get("TRACKER_WAREHOUSE", "./warehouse"),
                        help="directory (or URI) holding the Delta tables (env TRACKER_WAREHOUSE)")
    report.add_argument("--dataflow", required=True, help="dataflow id")
    report.add_argument("--json", action="store_true", help="print JSON instead of text tables")
    report.add_argument("--as-of", default=None, help="ISO time the durations are measured at, not before the "
                        "tables' last entry (default: now, UTC); the tables are read as they are now")
    report.add_argument("--limit", type=int, default=10, help="how many stuck locations to list")
    report.set_defaults(func=_report)
    _add_worker_commands(commands)
    return parser


def _port(text: str) -> int:
    """A TCP port, 1 to 65535 (argparse applies this to the TRACKER_PORT default too)."""
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
        raise argparse.ArgumentTypeError(f"must be a TCP port from 1 to 65535 (also TRACKER_PORT), got {text!r}")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tracker`` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `tracker report ... | head`: the reader left, which is no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        return 0


if __name__ == "__main__":
    sys.exit(main())
