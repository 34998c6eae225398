"""The programs' statistics to Delta: ``operator_stats`` and ``channel_stats``, appended with the
syncer's normal flush (:class:`api.delta.sync.Syncer`), one row per operator and channel a
report names.

Guarantees: rows are appended on the Delta thread, never on the event loop, one commit per table
per flush; the rows waiting are bounded (:data:`MAX_PENDING_ROWS`: while Delta fails, the
oldest are dropped and counted in ``dropped``, as statistics are not progress and are not in the
write-ahead log); a failed commit puts its rows back, so a row is appended at most once unless
a commit's outcome is lost (then possibly twice: the tables are statistics, not the record of
progress).

>>> from api.schema.activity import ActivityReport
>>> rows = ActivityRows()
>>> rows.add("d", 1e9, ActivityReport.model_validate({"worker": "w0", "seconds": 1.0, "operators": [
...     {"node": 2, "busy_ns": 7}], "channels": [{"source": [1, 0], "target": [2, 0], "messages": 1, "records": 3}]}))
>>> len(rows.operators), rows.channels[0]["records"], rows.channels[0]["src_node"]
(1, 3, 1)
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from datetime import UTC, datetime
from typing import Any

from api.delta.store import Store
from api.schema.activity import ActivityReport

MAX_PENDING_ROWS = 200_000
"""Rows (of both tables) waiting for the next flush at most."""


class ActivityRows:
    """The statistics rows not yet in Delta."""

    def __init__(self) -> None:
        self.operators: list[dict[str, Any]] = []
        self.channels: list[dict[str, Any]] = []
        self.dropped = 0
        """Rows dropped because too many waited (Delta failing)."""

    def add(self, dataflow_id: str, at: float, report: ActivityReport) -> None:
        """Queue the rows of a report accepted at ``at`` (POSIX seconds)."""
        when = datetime.fromtimestamp(at, UTC)
        head = {"dataflow_id": dataflow_id, "worker": report.worker, "at": when, "seconds": report.seconds}
        self.operators += [{**head, "scope": op.scope, "node": op.node, "busy_ns": op.busy_ns,
                            "schedules": op.schedules} for op in report.operators]
        self.channels += [{**head, "scope": ch.scope, "src_node": ch.source[0], "src_port": ch.source[1],
                           "dst_node": ch.target[0], "dst_port": ch.target[1], "messages": ch.messages,
                           "records": ch.records} for ch in report.channels]
        over = len(self.operators) + len(self.channels) - MAX_PENDING_ROWS
        if over > 0:
            cut = min(over, len(self.operators))
            del self.operators[:cut]
            del self.channels[:over - cut]
            self.dropped += over

    async def flush(self, store: Store | None, pool: Executor) -> None:
        """Append what waits (on the Delta thread); a failed commit's rows wait again, and it raises."""
        if store is None:
            self.operators, self.channels = [], []
            return
        loop = asyncio.get_running_loop()
        for table, attribute in (("operator_stats", "operators"), ("channel_stats", "channels")):
            rows: list[dict[str, Any]] = getattr(self, attribute)
            if not rows:
                continue
            setattr(self, attribute, [])
            try:
                await loop.run_in_executor(pool, store.warehouse.append, table, rows)
            except BaseException:
                setattr(self, attribute, rows + getattr(self, attribute))
                raise
