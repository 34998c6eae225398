"""Structured logging for every process of the service: one JSON object per line on stderr.

Shared by the hot-path process (:mod:`api.run.server`, which adds token redaction and uvicorn's
loggers) and the Spark process (:mod:`api.spark.process`).

>>> import logging
>>> record = logging.LogRecord("tracker.x", logging.INFO, "", 0, "hello", None, None)
>>> record.dataflow = "d1"
>>> JsonFormatter().format(record).split(", ", 3)[1:]
['"level": "info"', '"logger": "tracker.x"', '"msg": "hello", "dataflow": "d1"}']
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every ``extra`` field, passed
    through ``redact`` (the hot path's removes token values)."""

    def __init__(self, redact: Callable[[str], str] = lambda text: text) -> None:
        super().__init__()
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return self.redact(json.dumps(entry, default=str))


def configure_logging(level: str, formatter: logging.Formatter | None = None,
                      keep: Callable[[logging.LogRecord], bool] | None = None) -> None:
    """JSON lines on stderr for every logger (``keep``: a filter), py4j's and pyspark's at WARNING."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter or JsonFormatter())
    if keep is not None:
        handler.addFilter(keep)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
