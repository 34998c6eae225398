"""``tracker example`` and ``tracker worker``: the worker SDK's commands, registered under the
``tracker.commands`` entry points.

Only :mod:`argparse` here; the runtime is imported when a command runs.

>>> import argparse
>>> commands = argparse.ArgumentParser(prog="tracker").add_subparsers()
>>> add_commands(commands)
>>> commands.choices["example"].parse_args(["wordcount"]).workers
2
"""

from __future__ import annotations

import argparse
import os


def _example(args: argparse.Namespace) -> int:
    from tracker.worker.cluster import example_main

    return example_main(args)


def _worker(args: argparse.Namespace) -> int:
    from tracker.worker.cluster import worker_main

    return worker_main(args)


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``example`` (an example on several worker processes) and ``worker`` (one process)."""
    url = os.environ.get("TRACKER_URL", "http://127.0.0.1:8000")
    example = commands.add_parser("example", help="run an example dataflow on worker processes against the service")
    example.add_argument("name", choices=["wordcount", "components", "digitroot"])
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
    worker.add_argument("name", choices=["wordcount", "components", "digitroot"])
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


