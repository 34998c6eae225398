"""``tracker serve``'s parts: structured logging, the warehouse and the admin token
(:func:`prepare`, in the supervisor), the listening sockets (:func:`listen`, in the supervisor),
and uvicorn running the app in a hot-path process (:func:`serve_hot`).

Guarantees: one ``tracker serve`` at a time serves a warehouse (a lock held by the supervisor),
and one process at a time serves each shard (a lock per shard, inherited by its hot-path
process); a warehouse that cannot be used, or a port another process listens on, stops the
start with one line and exit code 2, not a traceback (the ports are taken before anything else
starts: no recovery, no Spark).
"""

from __future__ import annotations

import errno
import logging
import socket
import sys
from typing import Any

import uvicorn

from api.channel.supervised import CANNOT_BOOT, Supervised
from api.config import Settings
from api.host.tokens import load_admin_token
from api.logs import JsonFormatter as BaseFormatter
from api.logs import configure_logging as json_lines
from api.shards.layout import url_of
from api.web.app import create_app
from api.web.protocol import guarded_http
from api.web.security import HEADERS, redact
from api.web.wsprotocol import AnsweringWebSockets


class JsonFormatter(BaseFormatter):
    """:class:`api.logs.JsonFormatter` with token values redacted (:func:`api.web.security.redact`:
    uvicorn logs each WebSocket handshake with its query string, which holds a browser's ``?token=``)."""

    def __init__(self) -> None:
        super().__init__(redact)


def _not_a_denied_handshake(record: logging.LogRecord) -> bool:
    """uvicorn logs an error after every WebSocket handshake refused with an HTTP answer (a
    401 for a bad token, say), although the client got that answer: the route logs the refusal
    itself (:mod:`api.web.ws`), and it always either accepts or refuses, so this message means nothing else."""
    return not (record.name == "uvicorn.error" and record.msg == "ASGI callable returned without completing handshake.")


def configure_logging(level: str) -> None:
    """JSON lines on stderr for the service's and uvicorn's loggers."""
    json_lines(level, JsonFormatter(), _not_a_denied_handshake)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # one line per request would dominate the hot path


class StartupError(Exception):
    """The service cannot start for a reason the user can fix; the message says which."""


def prepare(settings: Settings, warehouse_lock: bool = True) -> tuple[Any, str]:
    """Logging set up, the warehouse made and (``warehouse_lock``) taken (its lock: held by
    whoever keeps the returned object, and by the processes that inherit its descriptor; a
    shard's lock is :mod:`api.run.topology`'s) and its layout checked; the lock (or ``None``) and
    the admin token. Raises :class:`StartupError` (a clear message) if the warehouse cannot be used."""
    from spark_jobs.ownership import WarehouseBusy, WarehouseLock, restrict

    configure_logging(settings.log_level)
    restrict(None, settings.file_mode)  # before the warehouse is made: it is private from its first file
    try:
        settings.warehouse.mkdir(parents=True, exist_ok=True)
        restrict(settings.warehouse, settings.file_mode)
    except (FileExistsError, NotADirectoryError):
        raise StartupError(f"the warehouse {settings.warehouse} exists and is not a directory") from None
    except OSError as error:
        raise StartupError(f"cannot create the warehouse {settings.warehouse}: {error.strerror}") from None
    lock = None
    try:
        if warehouse_lock:
            lock = WarehouseLock.acquire(settings.warehouse, f"tracker serve on port {settings.port}")
    except WarehouseBusy as busy:
        raise StartupError(f"{busy}; one `tracker serve` at a time may serve a warehouse, stop it first") from None
    if settings.delta:
        from spark_jobs.storage import LegacyWarehouseError, Warehouse

        try:
            Warehouse(settings.warehouse).check_layout()
        except LegacyWarehouseError as error:
            raise StartupError(str(error)) from None
    return lock, load_admin_token(settings.warehouse, settings.admin_token)


def build(settings: Settings) -> Any:
    """The app for ``settings`` in this one process, as shard 0 of one (no supervisor, no Spark
    process: Spark's work waits), after :func:`prepare`."""
    from spark_jobs.ownership import WarehouseBusy, WarehouseLock

    lock, token = prepare(settings)
    try:
        shard = WarehouseLock.acquire(settings.warehouse, f"uvicorn on port {settings.port}", shard=0)
    except WarehouseBusy as busy:
        raise StartupError(f"shard 0: {busy}") from None
    settings.endpoint = settings.endpoint or url_of(settings.host, settings.port)
    app = create_app(settings, token)
    app.state.warehouse_lock = (lock, shard)  # held for the app's lifetime; the kernel drops them at exit
    return app


def listen(host: str, port: int, send_buffer: int = 0) -> socket.socket:
    """A socket bound to ``host:port`` (uvicorn listens on it), whose accepted connections get
    a kernel send buffer of ``send_buffer`` bytes (0: the kernel's autotuning; see
    :data:`api.config.SEND_BUFFER`). Raises :class:`StartupError` if the port is busy or the
    address unusable.

    >>> sock = listen("127.0.0.1", 0)
    >>> try:
    ...     listen("127.0.0.1", sock.getsockname()[1])
    ... except StartupError as error:
    ...     print(str(error).split(":")[0])
    cannot listen on 127.0.0.1
    >>> sock.close()
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port in TIME_WAIT is free
    if send_buffer:  # accepted sockets inherit it (Linux copies the listener's buffer sizes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # a bound socket alone does not make another SO_REUSEADDR bind fail
    except OSError as error:
        sock.close()
        reason = "the port is busy (another process listens on it)" if error.errno == errno.EADDRINUSE else (
            error.strerror or str(error))
        raise StartupError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.set_inheritable(True)
    return sock


def app_from_env() -> Any:
    """Factory for ``uvicorn --factory api.run.server:app_from_env`` (settings from the environment).
    The head limits are uvicorn's protocol, not the app's: add ``--http api.web.protocol:GuardedHttp``
    (64 KiB, 10 s) to keep them, and ``--ws api.web.wsprotocol:AnsweringWebSockets`` for the WebSocket
    protocol ``tracker serve`` runs; ``tracker serve`` does both, with the configured values."""
    return build(Settings.from_env())


def serve_hot(settings: Settings, listener: socket.socket, supervised: Supervised) -> int:
    """Run one hot-path process on ``listener`` until stopped (by its supervisor, or SIGINT);
    the exit code (:data:`~api.channel.supervised.CANNOT_BOOT` if it never served)."""
    last_error = _LastError()
    logging.getLogger().addHandler(last_error)
    token = load_admin_token(settings.warehouse, settings.admin_token)
    settings.endpoint = settings.endpoint or url_of(settings.host, listener.getsockname()[1])
    app = create_app(settings, token, supervised.beat)
    # A much shorter GIL switch interval than CPython's 5 ms: when a Delta thread holds the GIL
    # (building a commit), the event loop gets it back within 0.1 ms. Measured on the service
    # benchmark: p99 about 1.4 ms against up to 3.7 ms at 5 ms, p50 and throughput unchanged.
    sys.setswitchinterval(0.0001)
    config = uvicorn.Config(app, log_config=None, access_log=False,
                            ws_max_size=settings.max_body, ws_per_message_deflate=settings.ws_deflate,
                            lifespan="on", timeout_graceful_shutdown=5, headers=HEADERS,
                            http=guarded_http(settings.max_header_bytes, settings.header_timeout),
                            ws=AnsweringWebSockets)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:  # uvicorn raises the SIGINT it stopped for again, once stopped
        return 130
    except SystemExit:  # uvicorn's own exit when the app's start-up (recovery) failed
        if server.started:
            raise
    if not server.started:
        supervised.fatal(last_error.reason or "the hot-path process failed to start (see the log above)")
        return CANNOT_BOOT
    return 0


class _LastError(logging.Handler):
    r"""Remembers the last exception logged (uvicorn logs a failed start-up's), for the one line
    the supervisor prints.

    >>> handler = _LastError()
    >>> handler.emit(logging.LogRecord("uvicorn.error", 40, "", 0, "Traceback (most recent call last):\n"
    ...                                "  ...\napi.durability.segments.UnreadableLog: damaged", None, None))
    >>> handler.reason
    'UnreadableLog: damaged'
    """

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.reason: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.reason = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        elif (text := record.getMessage()).startswith("Traceback"):  # uvicorn logs a failed lifespan's as text
            name, _, detail = text.strip().splitlines()[-1].partition(": ")
            self.reason = f"{name.rpartition('.')[2]}: {detail}" if detail else name
