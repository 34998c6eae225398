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
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every ``extra`` field, each
    text passed through ``redact`` (the hot path's removes token values) and stripped of terminal
    colours (uvicorn's ``color_message`` is dropped) before it is encoded, so the line stays JSON.

    >>> line = JsonFormatter().format(logging.makeLogRecord({"msg": "\x1b[1mbold\x1b[0m",
    ...                                                      "color_message": "x"}))
    >>> json.loads(line)["msg"], "color_message" in json.loads(line)
    ('bold', False)
    """

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
            if key not in _STANDARD and not key.startswith("_") and key != "color_message":
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(self._clean(entry), default=lambda other: self._clean(str(other)))

    def _clean(self, value: Any) -> Any:
        """``value`` with every text in it redacted and stripped of terminal escapes."""
        if isinstance(value, str):
            return self.redact(_COLOURS.sub("", value))
        if isinstance(value, dict):
            return {key: self._clean(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self._clean(item) for item in value]
        return value


_COLOURS = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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
