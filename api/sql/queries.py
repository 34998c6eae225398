"""Answering ``POST /v1/sql`` in a hot-path process: who may see what, the live views copied on
the event loop, the rest in the SQL threads.

A query goes through three steps: it is parsed on the loop (one ``SELECT``, the views it names:
microseconds); the live views it names are copied on the loop (:func:`api.sql.live.read_live`);
then their rows are built and the history views it names are opened in a worker thread (Python,
holding the GIL: at the event loop's priority), and DuckDB runs the query in one of the SQL
threads (:func:`api.sql.engine.run`; GIL released), which run ``TRACKER_SQL_NICE`` (19) below
the event loop: a runaway query takes the cores the loop leaves, never the loop's own. At most
``TRACKER_SQL_QUERIES`` (2) queries at once; one beyond is refused at once (429
``too_many_queries``) rather than queued behind a long one.

Confinement: the admin sees every dataflow of this process and every row of the Delta tables;
a dataflow token sees its own dataflow only, in every view, live and history alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from api.config import Settings
from api.host.priority import background_pool
from api.host.service import Service
from api.host.tokens import Principal
from api.sql.engine import Answer, Limits, Params, QueryError, check, run
from api.sql.history import HISTORY, history_view
from api.sql.live import LIVE, read_live

VIEWS = frozenset(LIVE) | HISTORY
"""Every view a query may name."""
Views = dict[str, Any]
"""The views a query names, by name: Arrow tables (live) and datasets (history)."""


def limits_of(settings: Settings, max_rows: int | None = None) -> Limits:
    """The limits of one query: the service's, with fewer rows if the caller asks for fewer."""
    rows = settings.sql_rows if max_rows is None else min(max_rows, settings.sql_rows)
    return Limits(seconds=settings.sql_seconds, rows=rows, memory_mb=settings.sql_memory_mb)


class Gate:
    """At most ``size`` queries at once, each run on a SQL thread of its own, ``nice`` below the
    event loop (429 beyond)."""

    def __init__(self, size: int, nice: int = 0) -> None:
        self.size = max(1, size)
        self.running = 0
        self.pool = background_pool("sql", nice, self.size)

    async def run(self, prepare: Callable[[], Views], work: Callable[[Views], Answer]) -> Answer:
        """``prepare()`` in a worker thread at the loop's priority, then ``work`` on its result in
        a SQL thread; 429 ``too_many_queries`` when every SQL thread is taken."""
        if self.running >= self.size:
            raise QueryError(429, "too_many_queries", f"{self.running} SQL queries are running, the most this "
                                                      "service runs at once (TRACKER_SQL_QUERIES); try again shortly")
        self.running += 1
        try:
            views = await asyncio.to_thread(prepare)
            return await asyncio.get_running_loop().run_in_executor(self.pool, work, views)
        finally:
            self.running -= 1


@dataclass(frozen=True)
class Scope:
    """What a caller's query may see: every dataflow (``dataflow_id`` ``None``) or one."""

    dataflow_id: str | None

    @classmethod
    def of(cls, caller: Principal) -> Scope:
        """The admin's scope is everything; a dataflow token's, its dataflow."""
        return cls(None if caller.admin else caller.dataflow_id)


def history_views(warehouse: Path | str, names: set[str], scope: Scope) -> dict[str, Any]:
    """The history views ``names`` holds, confined to ``scope`` (opened here: call it off the loop)."""
    return {name: history_view(warehouse, name, scope.dataflow_id) for name in sorted(names & HISTORY)}


def named_views(query: str) -> set[str]:
    """The views a read-only query may read (400 unless it is one ``SELECT``)."""
    return check(query, VIEWS)


def hinted(error: QueryError) -> QueryError:
    """DuckDB's "Table with name ... does not exist" with the views that do (its own suggestion
    is a table of its catalog)."""
    if error.status != 400 or "Table with name" not in error.detail:
        return error
    return QueryError(400, error.error, error.detail.split("\n", 1)[0] + " The views are "
                      f"{', '.join(sorted(LIVE))} (live) and {', '.join(sorted(HISTORY))} (the Delta tables): "
                      "docs/tables.md, \"SQL\".")


async def answer(service: Service, gate: Gate, caller: Principal, query: str, params: Params | None,
                 max_rows: int | None) -> dict[str, Any]:
    """The answer to one query by ``caller`` in this hot-path process (see the module doc)."""
    names = named_views(query)
    scope = Scope.of(caller)
    settings = service.settings
    build = read_live(service.dataflows.values(), service.damaged.values(), names, only=scope.dataflow_id,
                      shard=settings.shard)

    def prepare() -> Views:
        return {**build(), **history_views(settings.warehouse, names, scope)}

    def work(views: Views) -> Answer:
        try:
            return run(query, params, views, limits_of(settings, max_rows))
        except QueryError as error:
            raise hinted(error) from None

    return (await gate.run(prepare, work)).json()


def live_stream(service: Service, caller: Principal, table: str) -> Callable[[], bytes]:
    """One live view of this process, confined to ``caller``, as an Arrow IPC stream (what the
    front of a sharded service gathers from every shard): read now, encoded by what is
    returned (in a worker thread)."""
    if table not in LIVE:
        raise QueryError(404, "unknown_view", f"no live view named {table!r}; the live views are "
                                              f"{', '.join(sorted(LIVE))}")
    build = read_live(service.dataflows.values(), service.damaged.values(), {table},
                      only=Scope.of(caller).dataflow_id, shard=service.settings.shard)
    return lambda: arrow_bytes(build()[table])


def arrow_bytes(table: pa.Table) -> bytes:
    """A table as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def arrow_table(data: bytes) -> pa.Table:
    """An Arrow IPC stream's table (:func:`arrow_bytes`'s inverse).

    >>> arrow_table(arrow_bytes(pa.table({"x": [1]}))).to_pylist()
    [{'x': 1}]
    """
    with pa.ipc.open_stream(data) as reader:
        return reader.read_all()


def merged(tables: Mapping[str, list[pa.Table]]) -> dict[str, pa.Table]:
    """Each live view's tables (one per shard) as one table."""
    return {name: pa.concat_tables(parts) if parts else LIVE[name].empty_table() for name, parts in tables.items()}
