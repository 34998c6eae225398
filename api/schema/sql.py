"""The bodies of ``POST /v1/sql``: the query with its parameters, and its answer.

>>> SqlRequest.model_validate({"query": "SELECT 1", "params": {"id": "x"}}).params
{'id': 'x'}
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

MAX_QUERY = 100_000
"""Characters of a query at most."""


class SqlRequest(BaseModel):
    """One read-only SQL query (DuckDB's dialect) over the live and history views."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_QUERY,
                       description="one SELECT (or WITH ... SELECT) over the views of docs/tables.md, \"SQL\"")
    params: dict[str, StrictStr | StrictInt | StrictFloat | StrictBool | None] = Field(
        default_factory=dict, max_length=100, description="named parameters: `$name` in the query")
    max_rows: StrictInt | None = Field(default=None, ge=1, description="rows answered at most (at most the "
                                                                        "service's limit, TRACKER_SQL_ROWS)")


class SqlColumn(BaseModel):
    """A column of the answer: its name and DuckDB type (``BIGINT[]``, ``TIMESTAMP WITH TIME ZONE``...)."""

    name: str
    type: str


class SqlResponse(BaseModel):
    """The rows of a query, as JSON: times as ISO 8601, intervals in seconds."""

    columns: list[SqlColumn]
    rows: list[list[Any]]
    row_count: int
    truncated: bool = Field(description="more rows than `row_limit` were found; `rows` holds the first ones")
    row_limit: int
    seconds: float = Field(description="DuckDB's time for the query, rows fetched included")
