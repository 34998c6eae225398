"""Service settings: command-line arguments first, then environment variables, then defaults.

Guarantees: a bad environment value is refused at start-up with a message naming the variable.

>>> Settings().flush_seconds, Settings().engine
(1.0, 'native')
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

ENGINES = ("native", "reference", "spark")
"""``native``: the compiled engine (``progress_engine``); ``reference``: the Python
:class:`tracker.reachability.Tracker`; ``spark``: counts only, frontiers from Spark."""
ENGINE_NAMES = {"native": "native (compiled)", "reference": "reference (Python)", "spark": "spark"}
"""What ``/healthz``, ``/metrics`` and the start-up log call each engine."""

SEND_BUFFER = 128 * 1024
"""Each connection's kernel send buffer (bytes; Linux doubles it for bookkeeping). Without a
bound the kernel grows it to megabytes for a client that does not read, so 1,000 idle
subscribers each took thousands of writes (a system call apiece) before their sockets pushed
back and their streams fell behind (resync); with it they push back after ~100 KB. The
benchmark's idle-WebSocket abuse: the probe's p50/p99 went from 2.7-7.1 / 8.3-9.8 ms to
1.1-1.5 / 5.0-5.2 ms. Loopback and LAN throughput are unaffected; a link whose bandwidth-delay
product exceeds it (e.g. 100 Mbit/s at 20 ms) is slowed for big answers: raise it, or 0."""

LIMITS = ("register_rate", "register_burst", "max_dataflows", "max_subscribers", "max_subscribers_per_dataflow",
          "max_header_bytes", "header_timeout", "send_buffer")
"""The settings of the service's limits, each a ``tracker serve`` option (``--max-dataflows``) and
an environment variable (``TRACKER_MAX_DATAFLOWS``)."""
SHARDING = ("shards", "shard_hosts", "shard_port", "advertise_host", "proxy")
"""The settings of the service's shards, each a ``tracker serve`` option (``--shard-hosts``) and
an environment variable (``TRACKER_SHARD_HOSTS``)."""


def native_problem() -> str | None:
    """Why ``--engine native`` cannot run here (the compiled module is missing), or ``None``."""
    try:
        import progress_engine  # noqa: F401
    except ImportError as error:
        return (f"--engine native needs the compiled engine progress_engine ({error}); run the set-up "
                "(bin/serve does it: pip install ./engine) or use --engine reference")
    return None


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    try:
        number = float(value) if value else default
    except ValueError:
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{name} must be a finite number of at least 0, got {value!r}")
    return number


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        number = int(value) if value else default
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {value!r}") from None
    if number < 0:
        raise ValueError(f"{name} must be at least 0, got {value!r}")
    return number


@dataclass
class Settings:
    """Everything the service can be told. Environment names are given per field."""

    host: str = "127.0.0.1"
    port: int = 8000
    warehouse: Path = Path("./warehouse")  # TRACKER_WAREHOUSE
    engine: str = "native"  # TRACKER_ENGINE: native (compiled) | reference (Python) | spark
    master: str | None = None  # SPARK_MASTER
    admin_token: str | None = None  # TRACKER_ADMIN_TOKEN
    program_token: str | None = None  # TRACKER_PROGRAM_TOKEN (else <warehouse>/program-token, generated)
    spark: bool = True  # TRACKER_SPARK=0 disables Spark (registration check, audits)
    spark_check: bool = True  # TRACKER_SPARK_CHECK=0 skips the Spark registration check
    spark_timeout: float = 300.0  # TRACKER_SPARK_TIMEOUT: seconds one Spark check or audit may run (0: no limit)
    spark_max_locations: int = 2000  # TRACKER_SPARK_MAX_LOCATIONS: larger graphs are not sent to Spark (0: no limit)
    spark_cores: int = 0  # TRACKER_SPARK_CORES: local[N] of the Spark process (0: the machine's cores less one, >= 1)
    spark_nice: int = 10  # TRACKER_SPARK_NICE: the Spark process's niceness increment (0: the service's priority)
    delta_nice: int = 19  # TRACKER_DELTA_NICE: the Delta thread's niceness increment (0: the event loop's priority)
    spark_address: str | None = None  # the Spark process's Unix socket (set by the supervisor, not by users)
    delta: bool = True  # TRACKER_DELTA=0 keeps everything in the write-ahead log only
    file_mode: str = "owner"  # TRACKER_FILE_MODE: owner (the warehouse and log private) | group (group-readable)
    flush_seconds: float = 1.0  # TRACKER_FLUSH_SECONDS: WAL -> Delta progress
    compact_seconds: float = 5.0  # TRACKER_COMPACT_SECONDS: pointstamps/frontiers/frontier_changes
    audit_seconds: float = 60.0  # TRACKER_AUDIT_SECONDS: Spark audit period (0 disables)
    tidy_seconds: float = 60.0  # TRACKER_TIDY_SECONDS: Delta OPTIMIZE + VACUUM period, in small steps (0 disables)
    vacuum_hours: float = 24.0  # TRACKER_VACUUM_HOURS: how long files of old table versions are kept (time travel)
    segment_bytes: int = 64 * 1024 * 1024  # TRACKER_WAL_SEGMENT_BYTES: WAL rotation size
    subscriber_queue: int = 1024  # TRACKER_SUBSCRIBER_QUEUE: events buffered per subscriber
    subscriber_bytes: int = 4 * 1024 * 1024  # TRACKER_SUBSCRIBER_BYTES: bytes of events buffered per subscriber
    history: int = 100_000  # TRACKER_HISTORY: versions of frontier changes kept in memory
    max_body: int = 1024 * 1024  # TRACKER_MAX_BODY: request and WebSocket message limit, bytes
    log_level: str = "info"  # TRACKER_LOG_LEVEL
    ws_deflate: bool = False  # TRACKER_WS_DEFLATE=1 enables permessage-deflate on WebSockets
    metrics_per_dataflow: bool = False  # TRACKER_METRICS_PER_DATAFLOW=1: /metrics series labelled by dataflow id
    stall_seconds: float = 60.0  # TRACKER_STALL_SECONDS: live pointstamps, no frontier change this long: stalled
    lane_ms: float = 1.0  # TRACKER_LANE_MS: a batch propagating longer sends its dataflow's next ones to its own thread
    lane_backlog: int = 256  # TRACKER_LANE_BACKLOG: a dataflow's batches waiting for its thread; beyond: 429
    # Limits (docs/running.md, "Limits and protections"); 0 means none.
    register_rate: float = 10.0  # TRACKER_REGISTER_RATE: registrations per second per token (refill)
    register_burst: int = 100  # TRACKER_REGISTER_BURST: registrations per token at once
    max_dataflows: int = 1000  # TRACKER_MAX_DATAFLOWS: live dataflows
    max_subscribers: int = 1000  # TRACKER_MAX_SUBSCRIBERS: stream subscribers (SSE + WebSocket) in all
    max_subscribers_per_dataflow: int = 100  # TRACKER_MAX_SUBSCRIBERS_PER_DATAFLOW
    max_header_bytes: int = 64 * 1024  # TRACKER_MAX_HEADER_BYTES: request line + headers (431 beyond)
    header_timeout: float = 10.0  # TRACKER_HEADER_TIMEOUT: seconds to receive a request's head
    send_buffer: int = SEND_BUFFER  # TRACKER_SEND_BUFFER: each connection's kernel send buffer (0: autotuned)
    # Shards (docs/running.md, "Shards").
    shards: int | None = None  # TRACKER_SHARDS: shards run here (None: one per two cores, at least one)
    shard_hosts: str = ""  # TRACKER_SHARD_HOSTS: shards on other hosts, "K=http://HOST:PORT,..."
    shard_port: int | None = None  # TRACKER_SHARD_PORT: the first local shard's port (None: --port + 101; 0: any)
    advertise_host: str | None = None  # TRACKER_ADVERTISE_HOST: the host name in the shards' endpoints
    proxy: str = "auto"  # TRACKER_PROXY: auto (run HAProxy if installed) | none (an external proxy routes)
    shard: int = 0  # this hot-path process's shard (set by the supervisor, not by users)
    endpoint: str | None = None  # this shard's base URL as workers reach it (set by the supervisor)
    sharded: bool = False  # whether the service has more than one shard (set by the supervisor)
    # SQL (docs/tables.md, "SQL").
    sql_seconds: float = 10.0  # TRACKER_SQL_SECONDS: a query running longer is stopped (408)
    sql_rows: int = 10_000  # TRACKER_SQL_ROWS: rows answered at most (beyond: truncated)
    sql_memory_mb: int = 512  # TRACKER_SQL_MEMORY_MB: DuckDB's memory limit per query (413 beyond)
    sql_queries: int = 2  # TRACKER_SQL_QUERIES: queries run at once (429 beyond)
    sql_nice: int = 19  # TRACKER_SQL_NICE: the SQL processes' niceness increment (0: the service's priority)

    @classmethod
    def from_env(cls, args: argparse.Namespace | None = None) -> Settings:
        """Settings from ``tracker serve`` arguments (if any) and the environment."""
        env = os.environ
        settings = cls(
            host=env.get("TRACKER_HOST", "127.0.0.1"),
            port=_env_int("TRACKER_PORT", 8000),  # overridden by --port, which checks the range
            warehouse=Path(env.get("TRACKER_WAREHOUSE", "./warehouse")),
            engine=env.get("TRACKER_ENGINE", "native"),
            master=env.get("SPARK_MASTER"),
            admin_token=env.get("TRACKER_ADMIN_TOKEN") or None,
            program_token=env.get("TRACKER_PROGRAM_TOKEN") or None,
            spark=env.get("TRACKER_SPARK", "1").lower() not in ("0", "false", "no", "off"),
            spark_check=env.get("TRACKER_SPARK_CHECK", "1").lower() not in ("0", "false", "no", "off"),
            spark_timeout=_env_float("TRACKER_SPARK_TIMEOUT", 300.0),
            spark_max_locations=_env_int("TRACKER_SPARK_MAX_LOCATIONS", 2000),
            spark_cores=_env_int("TRACKER_SPARK_CORES", 0),
            spark_nice=_env_int("TRACKER_SPARK_NICE", 10),
            delta_nice=_env_int("TRACKER_DELTA_NICE", 19),
            delta=env.get("TRACKER_DELTA", "1").lower() not in ("0", "false", "no", "off"),
            file_mode=env.get("TRACKER_FILE_MODE", "owner"),
            flush_seconds=_env_float("TRACKER_FLUSH_SECONDS", 1.0),
            compact_seconds=_env_float("TRACKER_COMPACT_SECONDS", 5.0),
            audit_seconds=_env_float("TRACKER_AUDIT_SECONDS", 60.0),
            tidy_seconds=_env_float("TRACKER_TIDY_SECONDS", 60.0),
            vacuum_hours=_env_float("TRACKER_VACUUM_HOURS", 24.0),
            segment_bytes=_env_int("TRACKER_WAL_SEGMENT_BYTES", 64 * 1024 * 1024),
            subscriber_queue=_env_int("TRACKER_SUBSCRIBER_QUEUE", 1024),
            subscriber_bytes=_env_int("TRACKER_SUBSCRIBER_BYTES", 4 * 1024 * 1024),
            history=_env_int("TRACKER_HISTORY", 100_000),
            max_body=_env_int("TRACKER_MAX_BODY", 1024 * 1024),
            log_level=env.get("TRACKER_LOG_LEVEL", "info"),
            ws_deflate=env.get("TRACKER_WS_DEFLATE", "0").lower() in ("1", "true", "yes", "on"),
            metrics_per_dataflow=env.get("TRACKER_METRICS_PER_DATAFLOW", "0").lower() in ("1", "true", "yes", "on"),
            stall_seconds=_env_float("TRACKER_STALL_SECONDS", 60.0),
            lane_ms=_env_float("TRACKER_LANE_MS", 1.0),
            lane_backlog=_env_int("TRACKER_LANE_BACKLOG", 256),
            register_rate=_env_float("TRACKER_REGISTER_RATE", 10.0),
            register_burst=_env_int("TRACKER_REGISTER_BURST", 100),
            max_dataflows=_env_int("TRACKER_MAX_DATAFLOWS", 1000),
            max_subscribers=_env_int("TRACKER_MAX_SUBSCRIBERS", 1000),
            max_subscribers_per_dataflow=_env_int("TRACKER_MAX_SUBSCRIBERS_PER_DATAFLOW", 100),
            max_header_bytes=_env_int("TRACKER_MAX_HEADER_BYTES", 64 * 1024),
            header_timeout=_env_float("TRACKER_HEADER_TIMEOUT", 10.0),
            send_buffer=_env_int("TRACKER_SEND_BUFFER", SEND_BUFFER),
            shards=_env_int("TRACKER_SHARDS", 0) if env.get("TRACKER_SHARDS") else None,
            shard_hosts=env.get("TRACKER_SHARD_HOSTS", ""),
            shard_port=_env_int("TRACKER_SHARD_PORT", 0) if env.get("TRACKER_SHARD_PORT") else None,
            advertise_host=env.get("TRACKER_ADVERTISE_HOST") or None,
            proxy=env.get("TRACKER_PROXY", "auto"),
            sql_seconds=_env_float("TRACKER_SQL_SECONDS", 10.0),
            sql_rows=_env_int("TRACKER_SQL_ROWS", 10_000),
            sql_memory_mb=_env_int("TRACKER_SQL_MEMORY_MB", 512),
            sql_queries=_env_int("TRACKER_SQL_QUERIES", 2),
            sql_nice=_env_int("TRACKER_SQL_NICE", 19),
        )
        if args is not None:
            settings.host = args.host
            settings.port = args.port
            settings.warehouse = Path(args.warehouse)
            settings.engine = args.engine
            settings.master = args.master or settings.master
            if getattr(args, "spark_timeout", None) is not None:
                settings.spark_timeout = args.spark_timeout
            if getattr(args, "spark_max_locations", None) is not None:
                settings.spark_max_locations = args.spark_max_locations
            for name in ("spark_cores", "spark_nice"):
                if getattr(args, name, None) is not None:
                    setattr(settings, name, getattr(args, name))
            settings.metrics_per_dataflow |= bool(getattr(args, "metrics_per_dataflow", False))
            for name in (*LIMITS, *SHARDING):  # `tracker serve` options; a namespace built elsewhere may lack them
                if getattr(args, name, None) is not None:
                    setattr(settings, name, getattr(args, name))
        if settings.max_header_bytes and settings.max_header_bytes < 1024:
            raise ValueError("--max-header-bytes / TRACKER_MAX_HEADER_BYTES must be 0 (no limit) or at least 1024")
        if settings.send_buffer and settings.send_buffer < 4096:
            raise ValueError("--send-buffer / TRACKER_SEND_BUFFER must be 0 (the kernel's autotuning) or at least 4096")
        if settings.master:
            from spark_jobs.session import master_problem

            if problem := master_problem(settings.master):
                raise ValueError(f"--master / SPARK_MASTER: {problem}")
        if settings.engine not in ENGINES:
            raise ValueError(f"--engine must be native, reference or spark, got {settings.engine!r}")
        if settings.engine == "native" and (problem := native_problem()) is not None:
            raise ValueError(problem)
        if settings.proxy not in ("auto", "none"):
            raise ValueError(f"--proxy / TRACKER_PROXY must be auto or none, got {settings.proxy!r}")
        if settings.shard_port is not None and settings.shard_port > 65535:
            raise ValueError("--shard-port / TRACKER_SHARD_PORT must be a TCP port (0: any free port)")
        if settings.spark_nice > 19:
            raise ValueError("--spark-nice / TRACKER_SPARK_NICE must be from 0 to 19")
        if not 0 <= settings.delta_nice <= 19:
            raise ValueError("TRACKER_DELTA_NICE must be from 0 to 19")
        if not 0 <= settings.sql_nice <= 19:
            raise ValueError("TRACKER_SQL_NICE must be from 0 to 19")
        if settings.lane_backlog < 1:
            raise ValueError("TRACKER_LANE_BACKLOG must be at least 1")
        if settings.file_mode not in ("owner", "group"):
            raise ValueError(f"TRACKER_FILE_MODE must be owner or group, got {settings.file_mode!r}")
        if min(settings.sql_rows, settings.sql_queries) < 1 or settings.sql_seconds <= 0 or settings.sql_memory_mb < 16:
            raise ValueError("TRACKER_SQL_SECONDS must be above 0, TRACKER_SQL_ROWS and TRACKER_SQL_QUERIES at least "
                             "1, TRACKER_SQL_MEMORY_MB at least 16")
        if settings.engine == "spark":
            settings.spark = True
        return settings

    def spark_cores_used(self) -> int:
        """The Spark process's ``local[N]``: :attr:`spark_cores`, or the machine's cores less one
        (at least one), so the hot path keeps a core.

        >>> Settings(spark_cores=3).spark_cores_used()
        3
        """
        return self.spark_cores or max(1, (os.cpu_count() or 1) - 1)

    def to_json(self) -> str:
        """These settings as JSON, for a child process (:meth:`from_json` reads them back).

        >>> Settings.from_json(Settings(port=8001).to_json()) == Settings(port=8001)
        True
        """
        return json.dumps({**asdict(self), "warehouse": str(self.warehouse)})

    @classmethod
    def from_json(cls, text: str) -> Settings:
        """Settings as :meth:`to_json` wrote them (already validated by the supervisor)."""
        values = json.loads(text)
        return cls(**{**values, "warehouse": Path(values["warehouse"])})
