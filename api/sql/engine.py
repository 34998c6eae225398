"""One SQL query in DuckDB, in-process, over the views it is handed, within limits.

A query is one ``SELECT`` (a ``WITH`` ... ``SELECT`` too): anything else is refused before it
runs (400 ``read_only``). It runs on a fresh in-memory connection that sees nothing but the
views registered for it: Python's variables are not scanned (``python_enable_replacements``
off), and once the views are registered the connection is closed to the outside
(``enable_external_access = false``: no file, no extension, no ``ATTACH``, no ``COPY``) and its
configuration locked, so the query text cannot undo any of it. It runs on one DuckDB thread and
within a memory limit, so the service's event loop keeps the other core.

Limits (the answers the route gives, :class:`QueryError`):

* time: a timer calls DuckDB's ``interrupt()`` after ``seconds``; the query stops within
  milliseconds and the answer is 408 ``query_timeout``;
* memory: DuckDB's ``memory_limit``; a query needing more is 413 ``query_too_large``;
* rows: at most ``rows`` rows are fetched (the query streams: one more row is read, to know
  there were more, and the rest is never computed); the answer says ``truncated``.

A query DuckDB refuses (syntax, an unknown table or column, a type error, a missing
parameter) is 400 ``invalid_query`` with DuckDB's own message.

>>> import pyarrow as pa
>>> answer = run("SELECT x * 2 AS y FROM t WHERE x > $low ORDER BY y", {"low": 1},
...              {"t": pa.table({"x": [1, 2, 3]})}, Limits(rows=1))
>>> answer.rows, answer.truncated, [c["name"] for c in answer.columns]
([[4]], True, ['y'])
>>> sorted(tables_named('WITH q AS (SELECT * FROM "LIVE_LAG") SELECT * FROM q JOIN nodes USING (node)',
...                     ["live_lag", "nodes", "edges"]))
['live_lag', 'nodes']
>>> run("DROP TABLE t", None, {}, Limits())
Traceback (most recent call last):
  ...
api.sql.engine.QueryError: 400 read_only: only one SELECT statement is allowed (this is a DROP)
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

Params = Mapping[str, str | int | float | bool | None]
"""Named parameters of a query (``$name`` in its text)."""


@dataclass(frozen=True)
class Limits:
    """What one query may use."""

    seconds: float = 10.0
    """Wall-clock seconds, from the start of DuckDB's work to the last row fetched."""
    rows: int = 10_000
    """Rows answered; beyond, the answer is ``truncated``."""
    memory_mb: int = 512
    """DuckDB's ``memory_limit`` for the query (no spilling to disk: it has no file access)."""
    threads: int = 1
    """DuckDB's threads for the query."""


class QueryError(Exception):
    """A query refused or stopped: the HTTP status and the ``{"error", "detail"}`` body."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status, self.error, self.detail = status, error, detail

    def __reduce__(self) -> tuple[type[QueryError], tuple[int, str, str]]:  # raised in a SQL process
        return QueryError, (self.status, self.error, self.detail)

    @property
    def body(self) -> dict[str, Any]:
        """The JSON body of the answer."""
        return {"error": self.error, "detail": self.detail}


@dataclass
class Answer:
    """A query's result: column names and DuckDB types, rows as JSON values."""

    columns: list[dict[str, str]]
    rows: list[list[Any]]
    truncated: bool
    seconds: float
    """DuckDB's time for the query, including fetching the rows."""
    limit: int = field(default=0)
    """The row limit it ran under."""

    def json(self) -> dict[str, Any]:
        """The body of ``POST /v1/sql``'s answer."""
        return {"columns": self.columns, "rows": self.rows, "row_count": len(self.rows),
                "truncated": self.truncated, "row_limit": self.limit, "seconds": round(self.seconds, 4)}


def _first_line(error: BaseException) -> str:
    """DuckDB's message up to its first blank line: what went wrong and where (the caret lines
    point at it), without its advice (some of it, ``SET ...``, a locked connection refuses)."""
    return str(error).strip().split("\n\n", 1)[0]


def statement_kind(query: str) -> str:
    """The kind of the query's only statement (``SELECT``...); 400 for none, several or a syntax error."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as error:
        raise QueryError(400, "invalid_query", _first_line(error)) from None
    if len(statements) != 1:
        raise QueryError(400, "invalid_query", f"send exactly one SQL statement (got {len(statements)})")
    return str(statements[0].type).rpartition(".")[2]


def tables_named(query: str, known: Iterable[str]) -> set[str]:
    """The names in ``known`` the query's text mentions (any case, quoted or not): a superset of
    the views it reads (a column or a string of the same name counts too), found without binding
    it (DuckDB's own ``get_table_names`` binds, which a query with parameters fails)."""
    words = {word.lower() for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", query)}
    return words & {name.lower() for name in known}


def check(query: str, known: Iterable[str] = ()) -> set[str]:
    """The names of ``known`` a read-only query mentions; 400 ``read_only`` unless it is one ``SELECT``."""
    kind = statement_kind(query)
    if kind != "SELECT":
        raise QueryError(400, "read_only", f"only one SELECT statement is allowed (this is a {kind})")
    return tables_named(query, known)


def _connect(limits: Limits) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(":memory:", config={
        "threads": max(1, limits.threads),
        "memory_limit": f"{max(16, limits.memory_mb)}MB",
        "python_enable_replacements": False,  # else a table name could scan any Python variable in scope
        "autoinstall_known_extensions": False,  # no download, ever
        "autoload_known_extensions": False,
    })


def run(query: str, params: Params | None, views: Mapping[str, Any], limits: Limits) -> Answer:
    """Run ``query`` over ``views`` (name -> Arrow table, dataset or record batch reader) within
    ``limits``; call it off the event loop (DuckDB releases the GIL while it works).

    Raises:
        QueryError: refused (400), too long (408), too large (413).
    """
    check(query)
    connection = _connect(limits)
    timer = threading.Timer(limits.seconds, connection.interrupt)
    timer.daemon = True
    started = time.perf_counter()
    try:
        connection.execute("SET TimeZone = 'UTC'")  # date_trunc and friends in UTC, as the tables are
        for name, source in views.items():
            connection.register(name, source)
        connection.execute("SET enable_external_access = false")
        connection.execute("SET lock_configuration = true")
        timer.start()
        try:
            relation = connection.sql(query, params=dict(params) if params else None)
            if relation is None:  # not a query after all: nothing to answer
                raise QueryError(400, "read_only", "the statement returned no rows")
            columns = [{"name": name, "type": str(kind)} for name, kind in zip(relation.columns, relation.types,
                                                                              strict=True)]
            reader = relation.to_arrow_reader(min(limits.rows + 1, 65_536))
            batches: list[pa.RecordBatch] = []
            fetched = 0
            for batch in reader:
                batches.append(batch)
                fetched += batch.num_rows
                if fetched > limits.rows:
                    break
            reader.close()
        except duckdb.InterruptException:
            raise QueryError(408, "query_timeout", f"the query ran longer than the limit of {limits.seconds:g} s "
                                                   "and was stopped") from None
        except duckdb.OutOfMemoryException as error:
            raise QueryError(413, "query_too_large", f"the query needs more memory than its limit of "
                                                     f"{limits.memory_mb} MB: {_first_line(error)}") from None
        except duckdb.Error as error:
            if not timer.is_alive() and time.perf_counter() - started >= limits.seconds:
                raise QueryError(408, "query_timeout", f"the query ran longer than the limit of {limits.seconds:g} s "
                                                       "and was stopped") from None
            raise QueryError(400, "invalid_query", _first_line(error)) from None
    finally:
        timer.cancel()
        connection.close()
    seconds = time.perf_counter() - started
    table = pa.Table.from_batches(batches, schema=reader.schema) if batches else reader.schema.empty_table()
    truncated = table.num_rows > limits.rows
    rows = [[_json(value) for value in row.values()] for row in table.slice(0, limits.rows).to_pylist()]
    return Answer(columns, rows, truncated, seconds, limits.rows)


def _json(value: Any) -> Any:
    """A value of an Arrow row as JSON: times as ISO 8601, intervals and durations in seconds,
    an interval in seconds (a month as 30 days), decimals as numbers, bytes in base64, non-finite floats as ``null``.

    >>> _json(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)), _json(dt.timedelta(minutes=2)), _json(float("nan"))
    ('2026-01-02T03:04:05+00:00', 120.0, None)
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if hasattr(value, "months") and hasattr(value, "nanoseconds"):  # Arrow's month-day-nano interval
        return value.months * 30 * 86_400 + value.days * 86_400 + value.nanoseconds / 1e9
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    return str(value)
