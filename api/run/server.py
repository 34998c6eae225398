"""``tracker serve``: structured logging, the admin token, and uvicorn running the app.

Guarantees: one process at a time serves a warehouse (a lock held for the app's lifetime); a
warehouse that cannot be used, or a port another process listens on, stops the start with one
line and exit code 2, not a traceback (the port is taken before anything else starts: no
recovery, no Spark). SIGINT and SIGTERM stop the service within a couple of seconds whatever
Spark is doing (:mod:`api.web.app`); an interrupted service exits with 130, like a shell would report.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import re
import socket
import sys
from datetime import UTC, datetime
from typing import Any

import uvicorn

from api.config import ENGINE_NAMES, Settings
from api.host.tokens import load_admin_token
from api.web.app import create_app
from api.web.protocol import guarded_http
from api.web.security import HEADERS, redact
from api.web.wsprotocol import FramedWebSockets

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every ``extra`` field, with
    secrets redacted (:func:`api.web.security.redact`: uvicorn logs each WebSocket handshake
    with its query string, which holds a browser's ``?token=``) and terminal colours removed
    (uvicorn adds a ``color_message``), in each text before it is encoded, so the line stays JSON.

    >>> line = JsonFormatter().format(logging.makeLogRecord({"msg": '"GET /ws?token=s3cret"',
    ...                                                      "color_message": "\x1b[1mbold\x1b[0m"}))
    >>> json.loads(line)["msg"], "color_message" in json.loads(line)
    ('"GET /ws?token=[redacted]"', False)
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key != "color_message":
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(_clean(entry), default=lambda other: _clean(str(other)))


_COLOURS = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _clean(value: Any) -> Any:
    """``value`` with every text in it redacted and stripped of terminal escapes."""
    if isinstance(value, str):
        return redact(_COLOURS.sub("", value))
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value


def _not_a_denied_handshake(record: logging.LogRecord) -> bool:
    """uvicorn logs an error after every WebSocket handshake refused with an HTTP answer (a
    401 for a bad token, say), although the client got that answer: the route logs the refusal
    itself (:mod:`api.web.ws`), and it always either accepts or refuses, so this message means nothing else."""
    return not (record.name == "uvicorn.error" and record.msg == "ASGI callable returned without completing handshake.")


def configure_logging(level: str) -> None:
    """JSON lines on stderr for the service's and uvicorn's loggers."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_not_a_denied_handshake)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # one line per request would dominate the hot path
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class StartupError(Exception):
    """The service cannot start for a reason the user can fix; the message says which."""


def build(settings: Settings) -> Any:
    """The app for ``settings``, after logging, the warehouse's lock and the admin token are set
    up. Raises :class:`StartupError` (a clear message) if the warehouse cannot be used."""
    from spark_jobs.ownership import WarehouseBusy, WarehouseLock

    configure_logging(settings.log_level)
    try:
        settings.warehouse.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise StartupError(f"the warehouse {settings.warehouse} exists and is not a directory") from None
    except OSError as error:
        raise StartupError(f"cannot create the warehouse {settings.warehouse}: {error.strerror}") from None
    try:
        lock = WarehouseLock.acquire(settings.warehouse, f"tracker serve on port {settings.port}")
    except WarehouseBusy as busy:
        raise StartupError(f"{busy}; one process at a time may write a warehouse, stop it first") from None
    if settings.delta:
        from spark_jobs.storage import LegacyWarehouseError, Warehouse

        try:
            Warehouse(settings.warehouse).check_layout()
        except LegacyWarehouseError as error:
            raise StartupError(str(error)) from None
    token = load_admin_token(settings.warehouse, settings.admin_token)
    app = create_app(settings, token)
    app.state.warehouse_lock = lock  # held for the app's lifetime; the kernel drops it at exit
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
    (64 KiB, 10 s) to keep them, and ``--ws api.web.wsprotocol:FramedWebSockets`` for the direct
    text frames; ``tracker serve`` does both, with the configured values."""
    return build(Settings.from_env())


def serve(args: argparse.Namespace) -> int:
    """Run the service until interrupted; the exit code."""
    try:
        settings = Settings.from_env(args)
    except ValueError as error:  # a bad environment value: say which, no traceback
        print(f"tracker serve: error: {error}", file=sys.stderr)
        return 2
    try:
        listener = listen(settings.host, settings.port, settings.send_buffer)
        app = build(settings)
    except StartupError as error:
        print(f"tracker serve: error: {error}", file=sys.stderr)
        return 2
    logging.getLogger("tracker.server").info(
        "starting", extra={"host": settings.host, "port": settings.port, "warehouse": str(settings.warehouse),
                           "engine": ENGINE_NAMES[settings.engine], "spark": settings.spark})
    # A much shorter GIL switch interval than CPython's 5 ms: when a Delta thread holds the GIL
    # (building a commit), the event loop gets it back within 0.1 ms. Measured on the service
    # benchmark: p99 about 1.4 ms against up to 3.7 ms at 5 ms, p50 and throughput unchanged.
    sys.setswitchinterval(0.0001)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, access_log=False,
                            ws_max_size=settings.max_body, ws_per_message_deflate=settings.ws_deflate,
                            lifespan="on", timeout_graceful_shutdown=5, headers=HEADERS,
                            http=guarded_http(settings.max_header_bytes, settings.header_timeout),
                            ws=FramedWebSockets)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:  # uvicorn raises the SIGINT it stopped for again, once stopped
        return 130
    return 0 if server.started else 1
