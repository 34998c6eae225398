"""The ``tracker`` command line: a dispatcher over the commands each installed package offers.

The packages register their commands under the entry-point group ``tracker.commands`` (see
``pyproject.toml``): ``api.run.commands`` (``serve``), ``spark_jobs.commands`` (``jobs``,
``report``) and ``tracker.worker.commands`` (``example``, ``worker``). So this module imports
nothing from the layers above it, and each command imports its implementation lazily, inside
the command: ``tracker --help`` is instant, and a worker-only install (no FastAPI, no Spark)
still lists every command and says which extra a missing one needs.

Guarantee: ``tracker COMMAND`` exits with the command's code; a reader leaving early
(``tracker report ... | head``) is not an error.

>>> args = build_parser().parse_args(["example", "wordcount", "--workers", "3"])
>>> args.command, args.workers, args.func.__module__
('example', 3, 'tracker.worker.commands')
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

GROUP = "tracker.commands"
"""The entry-point group: each entry names a function ``add_commands(subparsers) -> None``."""

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every installed command (also used by the docs and the tests).

    Raises:
        RuntimeError: no package registered a command (the project is not installed).
    """
    parser = argparse.ArgumentParser(prog="tracker", description="Progress tracking for timely dataflow, as a service.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    providers = sorted(entry_points(group=GROUP), key=lambda entry: entry.name)
    if not providers:
        raise RuntimeError(f"no `{GROUP}` entry points: install the project (pip install -e .)")
    for provider in providers:
        provider.load()(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tracker`` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.func
    try:
        return int(handler(args) or 0)
    except BrokenPipeError:  # `tracker report ... | head`: the reader left, which is no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        return 0


def needs_extra(command: str, extra: str, error: ImportError) -> int:
    """Say in one line that ``command`` needs the optional dependency group ``extra``; exit code 2.

    >>> needs_extra("serve", "service", ImportError("No module named 'fastapi'", name="fastapi"))
    2
    """
    print(f"tracker {command}: error: needs the [{extra}] extra ({error.name or error} is not installed): "
          f"pip install 'timely-progress-service[{extra}]'", file=sys.stderr)
    return 2


_EXIT_AT_ONCE = frozenset({"report", "jobs"})
"""Commands whose process ends with ``os._exit`` once its output is flushed. The native thread
pools of polars, pyarrow and delta-rs occasionally abort the interpreter's teardown after their
reads ("terminate called without an active exception", exit status -6 instead of the command's
own), a known destructor-ordering problem between them. ``jobs`` also starts its JVM on a thread
while it checks the warehouse: a job refused by a check returned while that start was under way,
and the teardown raced it (the same abort). Nothing is left undone: every Delta commit is made
before :func:`main` returns, and the JVM, a child tied to this process, ends with it."""


def entry() -> None:
    """The ``tracker`` console script: :func:`main`'s exit code, as the process's."""
    code = main()
    if len(sys.argv) > 1 and sys.argv[1] in _EXIT_AT_ONCE:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
