"""The worker SDK's commands, registered under the ``tracker.commands`` entry points:
``tracker run`` (your own dataflow), ``tracker example`` (a bundled one), ``tracker dataflows``
(list), ``tracker delete``, and the worker processes they start (``tracker worker``,
``tracker run-worker``).

The client commands find the service from ``--url`` / ``TRACKER_URL`` / ``<--warehouse>/service-url``
and their token (:mod:`tracker.worker.client`): ``run`` and ``example`` the program token
(``--token`` / ``TRACKER_PROGRAM_TOKEN`` / ``<--warehouse>/program-token``), ``dataflows`` and
``delete`` the admin token (``--token`` / ``TRACKER_ADMIN_TOKEN`` / ``<--warehouse>/admin-token``);
they fail with one line and exit code 2 when there is none, the service is unreachable or it
refuses the token. Only :mod:`argparse` here; the runtime is
imported when a command runs.

>>> import argparse
>>> commands = argparse.ArgumentParser(prog="tracker").add_subparsers()
>>> add_commands(commands)
>>> commands.choices["example"].parse_args(["wordcount"]).workers
2
>>> commands.choices["run"].parse_args(["examples.mine", "--workers", "3"]).workers
3
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from tracker.worker.client import Admin

_STATES = ["running", "complete", "stalled", "violation", "deleted", "damaged"]


def _client(name: str, body: Callable[[argparse.Namespace, Admin], int], role: str = "admin"
            ) -> Callable[[argparse.Namespace], int]:
    """A command that first connects to the service with the ``role`` token; any ``ClientError``
    or ``ProgramError`` is its one line, exit code 2."""

    def command(args: argparse.Namespace) -> int:
        from tracker.worker.client import ClientError, connect
        from tracker.worker.program import ProgramError

        try:
            return body(args, connect(args.url, args.token, args.warehouse, role=role))
        except (ClientError, ProgramError) as error:
            print(f"tracker {name}: error: {error}", file=sys.stderr)
            return 2

    return command


def _example(args: argparse.Namespace, admin: Admin) -> int:
    from tracker.worker.cluster import example_main

    return example_main(args, admin)


def _run(args: argparse.Namespace, admin: Admin) -> int:
    from tracker.worker.program import load_program, run

    if args.workers < 1:
        print(f"tracker run: error: --workers must be at least 1, got {args.workers}", file=sys.stderr)
        return 2
    return run(load_program(args.program), admin, args.workers, timeout=args.timeout, link=args.link)


def _run_worker(args: argparse.Namespace) -> int:
    from tracker.worker.program import worker_main

    return worker_main(args)


def _dataflows(args: argparse.Namespace, admin: Admin) -> int:
    found = admin.dataflows(state=args.state, name=args.name)
    rows = [("NAME", "ID", "STATE", "VERSION")] + [
        (d["name"] or "?", d["id"], d["state"], "-" if d["version"] is None else str(d["version"])) for d in found]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3])
    for d in found:  # why each damaged one was refused (its routes answer 503 until it is repaired)
        if d["state"] == "damaged":
            print(f"damaged {d['id']} ({d['name'] or 'name unknown'}): {d.get('detail')}")
    return 0


def _delete(args: argparse.Namespace, admin: Admin) -> int:
    dataflow_id = admin.resolve(args.dataflow)
    admin.delete(dataflow_id)
    print(f"deleted {dataflow_id}")
    return 0


def _service_options(parser: argparse.ArgumentParser, role: str = "admin") -> None:
    parser.add_argument("--url", help="the service (default: env TRACKER_URL, else the URL a running tracker serve "
                        "wrote to <warehouse>/service-url, else http://127.0.0.1:8000)")
    what = "the program token (registers dataflows, nothing else)" if role == "program" else "the admin token"
    parser.add_argument("--token", help=f"{what} (default: env TRACKER_{role.upper()}_TOKEN, else "
                        f"<warehouse>/{role}-token)")
    parser.add_argument("--warehouse", help=f"the service's warehouse, for its service-url and {role}-token files "
                        "(default: env TRACKER_WAREHOUSE, else ./warehouse)")


def _worker(args: argparse.Namespace) -> int:
    from tracker.worker.cluster import worker_main

    return worker_main(args)


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``run``, ``example``, ``dataflows``, ``delete`` and the worker processes' commands."""
    url = os.environ.get("TRACKER_URL", "http://127.0.0.1:8000")
    run = commands.add_parser("run", help="run your own dataflow (MODULE[:NAME]) on worker processes against the "
                              "service", description="Register the Dataflow NAME (default: flow) of MODULE (imported "
                              "from the current directory or PYTHONPATH; it needs an 'async def drive(worker)' if the "
                              "dataflow has inputs), print its id, run it on --workers processes and print its state "
                              "at the end. See docs/guide.md.")
    run.add_argument("program", metavar="MODULE[:NAME]", help="e.g. examples.mine or mypackage.flows:wordcount")
    run.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    run.add_argument("--timeout", type=float, default=120.0, help="seconds before a worker gives up, saying what it "
                     "still holds (default 120)")
    run.add_argument("--link", choices=["ws", "sse"], default="ws",
                     help="how workers talk to the service: one WebSocket, or POST + SSE")
    _service_options(run, "program")
    run.set_defaults(func=_client("run", _run, "program"))

    worker_of = commands.add_parser("run-worker")  # no help: hidden, started by `tracker run`
    worker_of.add_argument("program")
    for option in ("--url", "--dataflow", "--token", "--addresses"):
        worker_of.add_argument(option, required=True)
    worker_of.add_argument("--index", type=int, required=True)
    worker_of.add_argument("--timeout", type=float, default=120.0)
    worker_of.add_argument("--link", choices=["ws", "sse"], default="ws")
    worker_of.set_defaults(func=_run_worker)

    listing = commands.add_parser("dataflows", help="list the service's dataflows: name, id, state, version")
    listing.add_argument("--state", choices=_STATES, help="only those in this state (default: all but deleted)")
    listing.add_argument("--name", help="only those registered with this name")
    _service_options(listing)
    listing.set_defaults(func=_client("dataflows", _dataflows))

    delete = commands.add_parser("delete", help="delete a dataflow (by id, or by name if only one has it)")
    delete.add_argument("dataflow", metavar="ID_OR_NAME")
    _service_options(delete)
    delete.set_defaults(func=_client("delete", _delete))

    example = commands.add_parser("example", help="run an example dataflow on worker processes against the service")
    example.add_argument("name", choices=["wordcount", "components", "digitroot"])
    _service_options(example, "program")
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
    example.set_defaults(func=_client("example", _example, "program"))

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


