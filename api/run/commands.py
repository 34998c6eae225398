"""``tracker serve``, ``tracker watch``, ``tracker sql`` and ``tracker plan``: the service's commands,
registered under the ``tracker.commands`` entry points.

Only :mod:`argparse` here; the service (FastAPI, uvicorn, Spark) is imported when the command
runs, so listing commands stays instant and works without the ``[service]`` extra.

>>> import argparse
>>> commands = argparse.ArgumentParser(prog="tracker").add_subparsers()
>>> add_commands(commands)
>>> commands.choices["serve"].parse_args(["--port", "8001"]).port
8001
"""

from __future__ import annotations

import argparse
import os


def _serve(args: argparse.Namespace) -> int:
    try:
        from api.run.supervisor import supervise as serve
    except ImportError as error:
        from tracker.cli import needs_extra

        return needs_extra("serve", "service", error)
    return serve(args)


def _shard(args: argparse.Namespace) -> int:
    try:
        from api.run.supervisor import supervise_shard
    except ImportError as error:
        from tracker.cli import needs_extra

        return needs_extra("shard", "service", error)
    return supervise_shard(args)


def _watch(args: argparse.Namespace) -> int:
    from api.ops.watch import watch  # httpx only, a base dependency: works with any extra

    return watch(args)


def _interval(text: str) -> float:
    """A refresh period in seconds, from 0.1 to 3600.

    >>> _interval("2")
    2.0
    """
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be a number of seconds from 0.1 to 3600, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port, 1 to 65535 (argparse applies this to the ``TRACKER_PORT`` default too).

    >>> port("8000")
    8000
    """
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
        raise argparse.ArgumentTypeError(f"must be a TCP port from 1 to 65535 (also TRACKER_PORT), got {text!r}")
    return int(text)


def count(text: str) -> int:
    """A whole number of at least 0 (0: no limit).

    >>> count("100")
    100
    """
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 0, got {text!r}")
    return int(text)


def rate(text: str) -> float:
    """A finite number of at least 0 (0: no limit).

    >>> rate("0.5")
    0.5
    """
    try:
        number = float(text)
    except ValueError:
        number = -1.0
    if not (0 <= number < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of at least 0, got {text!r}")
    return number


_LIMIT_OPTIONS: list[tuple[str, object, str]] = [
    ("--register-rate", rate, "registrations per second per token, refilled continuously (env TRACKER_REGISTER_RATE; "
                              "default 10)"),
    ("--register-burst", count, "registrations per token at once (env TRACKER_REGISTER_BURST; default 100)"),
    ("--max-dataflows", count, "live dataflows (env TRACKER_MAX_DATAFLOWS; default 1000)"),
    ("--max-subscribers", count, "stream subscribers, SSE and WebSocket, in all (env TRACKER_MAX_SUBSCRIBERS; "
                                 "default 1000)"),
    ("--max-subscribers-per-dataflow", count, "stream subscribers of one dataflow (env "
                                              "TRACKER_MAX_SUBSCRIBERS_PER_DATAFLOW; default 100)"),
    ("--max-header-bytes", count, "request line and headers, bytes; 431 beyond (env TRACKER_MAX_HEADER_BYTES; "
                                  "default 65536)"),
    ("--header-timeout", rate, "seconds a client may take to send a request's line and headers "
                               "(env TRACKER_HEADER_TIMEOUT; default 10)"),
    ("--send-buffer", count, "each connection's kernel send buffer, bytes; a client that does not read pushes "
                             "back after this much (env TRACKER_SEND_BUFFER; default 131072; 0: the kernel's "
                             "autotuning)"),
]


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve``, ``shard``, ``watch`` and ``sql`` to the ``tracker`` command's sub-parsers."""
    from tracker.worker.client import add_service_options  # httpx, a base dependency, as tracker sql's

    serve = commands.add_parser("serve", help="run the service: a supervisor of its hot-path processes (FastAPI + "
                                "uvicorn, one per shard), the front and HAProxy when sharded, and its Spark process")
    _service_options(serve)
    sharding = serve.add_argument_group("shards", "see docs/running.md, \"Shards\"")
    sharding.add_argument("--shards", type=count, default=None, metavar="N",
                          help="hot-path processes (shards) run here, each owning its dataflows, its log and its "
                               "port (env TRACKER_SHARDS; default one per two cores, at least 1)")
    sharding.add_argument("--shard-port", type=count, default=None, metavar="PORT",
                          help="the first shard's port when several run, the next ones above it (env "
                               "TRACKER_SHARD_PORT; default --port + 101; 0: any free ports)")
    sharding.add_argument("--shard-hosts", default=None, metavar="K=URL,...",
                          help="shards run elsewhere by `tracker shard K` (env TRACKER_SHARD_HOSTS), e.g. "
                               "2=http://10.0.0.2:8101")
    sharding.add_argument("--advertise-host", default=None, metavar="HOST",
                          help="the host name workers reach the shards at, in each dataflow's endpoint (env "
                               "TRACKER_ADVERTISE_HOST; default --host)")
    sharding.add_argument("--proxy", choices=["auto", "none"], default=None,
                          help="auto: run HAProxy on the public address when installed; none: an external proxy "
                               "routes, and the front takes the public address (env TRACKER_PROXY; default auto)")
    serve.set_defaults(func=_serve)
    shard = commands.add_parser("shard", help="run one shard of a `tracker serve` on another host (its --shard-hosts "
                                "lists this one)")
    shard.add_argument("index", type=count, metavar="K", help="the shard's index (never 0-N-1 of the serve's --shards)")
    _service_options(shard)
    shard.add_argument("--advertise-host", default=None, metavar="HOST",
                       help="the host name workers reach this shard at (env TRACKER_ADVERTISE_HOST; default --host)")
    shard.set_defaults(func=_shard)
    watch = commands.add_parser("watch", help="a live terminal view of a dataflow: frontiers, lag, what holds them")
    watch.add_argument("dataflow", metavar="ID_OR_NAME", help="the dataflow's id (or a prefix of 6+) or its name")
    add_service_options(watch)
    watch.add_argument("--interval", type=_interval, default=1.0, help="seconds between refreshes (default 1)")
    watch.add_argument("--once", action="store_true", help="print one frame and exit")
    watch.set_defaults(func=_watch)
    from api.sql.cli import add_sql_command  # argparse and httpx only, like watch

    add_sql_command(commands)
    from api.ops.plan import add_plan_command  # arithmetic only: no service, no Spark

    add_plan_command(commands)


def _service_options(serve: argparse.ArgumentParser) -> None:
    """The options ``tracker serve`` and ``tracker shard`` share."""
    serve.add_argument("--host", default=os.environ.get("TRACKER_HOST", "127.0.0.1"),
                       help="interface to listen on (env TRACKER_HOST; default 127.0.0.1)")
    serve.add_argument("--port", type=port, default=os.environ.get("TRACKER_PORT", "8000"),
                       help="TCP port (env TRACKER_PORT; default 8000)")
    serve.add_argument("--warehouse", default=os.environ.get("TRACKER_WAREHOUSE", "./warehouse"),
                       help="directory (or URI) holding the Delta tables (env TRACKER_WAREHOUSE)")
    serve.add_argument("--engine", choices=["native", "reference", "spark"],
                       default=os.environ.get("TRACKER_ENGINE", "native"),
                       help="who maintains frontiers on the hot path (env TRACKER_ENGINE): native = the compiled "
                            "engine (progress_engine; refuses to start without it), reference = the Python "
                            "tracker, spark = Spark micro-batches; default native")
    serve.add_argument("--master", default=os.environ.get("SPARK_MASTER"),
                       help="Spark master URL of the Spark process (env SPARK_MASTER; default local[N], N = "
                            "--spark-cores: the machine's cores less one, so the hot path keeps a core)")
    serve.add_argument("--spark-timeout", type=rate, default=None, metavar="SECONDS",
                       help="cancel a Spark registration check or audit after this long and record it as timed "
                            "out (env TRACKER_SPARK_TIMEOUT; default 300; 0 = no limit)")
    serve.add_argument("--spark-max-locations", type=count, default=None, metavar="N",
                       help="do not send graphs with more locations than this to Spark (status: skipped, too "
                            "large) (env TRACKER_SPARK_MAX_LOCATIONS; default 2000; 0 = no limit)")
    serve.add_argument("--spark-cores", type=count, default=None, metavar="N",
                       help="cores of the Spark process's local[N] session when --master is not given (env "
                            "TRACKER_SPARK_CORES; default the machine's cores less one, at least 1)")
    serve.add_argument("--spark-nice", type=count, default=None, metavar="N",
                       help="niceness added to the Spark process and its JVM, 0-19, so that they yield the CPU "
                            "to the hot path (env TRACKER_SPARK_NICE; default 10)")
    serve.add_argument("--metrics-per-dataflow", action="store_true",
                       help="also export /metrics series labelled with dataflow ids (lag per operator input, "
                            "audit results); off by default because /metrics needs no token "
                            "(env TRACKER_METRICS_PER_DATAFLOW=1)")
    limits = serve.add_argument_group("limits", "0 means no limit; see docs/running.md, \"Limits and protections\"")
    for flag, kind, text in _LIMIT_OPTIONS:
        limits.add_argument(flag, type=kind, default=None, help=text)  # type: ignore[arg-type]
