"""Answering ``POST /v1/sql`` in a hot-path process: who may see what, the live views copied on
the event loop, their rows built in a worker thread, the query run in a SQL process.

A query goes through three steps: it is parsed on the loop (one ``SELECT``, the views it names:
microseconds); the live views it names are copied on the loop (:func:`api.sql.live.read_live`);
then their rows are built in a worker thread, and the query runs in a SQL process
(:mod:`api.sql.process`: DuckDB below the service's priority, with an interpreter of its own,
opening the history views it names). At most ``TRACKER_SQL_QUERIES`` (2) queries at once; one
beyond is refused at once (429 ``too_many_queries``) rather than queued behind a long one.

Confinement: the admin sees every dataflow of this process and every row of the Delta tables;
a dataflow token sees its own dataflow only, in every view, live and history alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa

from api.config import Settings
from api.host.service import Service
from api.host.tokens import Principal
from api.sql.engine import Limits, Params, QueryError, check
from api.sql.history import HISTORY
from api.sql.live import LIVE, read_live
from api.sql.process import Job, SqlProcesses, arrow_bytes

VIEWS = frozenset(LIVE) | HISTORY
"""Every view a query may name."""


def limits_of(settings: Settings, max_rows: int | None = None) -> Limits:
    """The limits of one query: the service's, with fewer rows if the caller asks for fewer."""
    rows = settings.sql_rows if max_rows is None else min(max_rows, settings.sql_rows)
    return Limits(seconds=settings.sql_seconds, rows=rows, memory_mb=settings.sql_memory_mb)


@dataclass(frozen=True)
class Scope:
    """What a caller's query may see: every dataflow (``dataflow_id`` ``None``) or one."""

    dataflow_id: str | None

    @classmethod
    def of(cls, caller: Principal) -> Scope:
        """The admin's scope is everything; a dataflow token's, its dataflow."""
        return cls(None if caller.admin else caller.dataflow_id)


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


async def answer(service: Service, processes: SqlProcesses, caller: Principal, query: str, params: Params | None,
                 max_rows: int | None) -> bytes:
    """The answer to one query by ``caller`` in this hot-path process (see the module doc)."""
    # Off the loop: DuckDB's parser is quick, but its first use in a process makes its default
    # connection (~30 ms).
    names = await asyncio.to_thread(named_views, query)
    scope = Scope.of(caller)
    settings = service.settings
    build = read_live(service.dataflows.values(), service.damaged.values(), names, only=scope.dataflow_id,
                      shard=settings.shard)

    job = Job(query, params, str(settings.warehouse), tuple(sorted(names & HISTORY)), scope.dataflow_id,
              limits_of(settings, max_rows))
    try:
        return await processes.run(build, job)
    except QueryError as error:
        raise hinted(error) from None


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


def merged(tables: Mapping[str, list[pa.Table]]) -> dict[str, pa.Table]:
    """Each live view's tables (one per shard) as one table."""
    return {name: pa.concat_tables(parts) if parts else LIVE[name].empty_table() for name, parts in tables.items()}
