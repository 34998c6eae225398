"""``POST /v1/sql``: SQL over the live state and the Delta tables (:mod:`api.sql`), in a hot-path
process and at the front of a sharded service.

In a hot-path process the route answers from the process's own dataflows. A service of several
shards answers at its front, which gathers every shard's live views as Arrow (``GET
/v1/sql/live/{view}`` on each shard, with the caller's token) and runs the query itself over
them and the Delta tables (which the shards share): the admin's answer covers every shard or
is 503 ``shard_unavailable`` naming those that did not answer, never a part of the dataflows;
a dataflow token is known to its own shard only, which alone answers it, with that dataflow's
rows. Sent to a shard's own address, the admin's query is 421 ``misdirected`` (that shard holds
only its own dataflows); a dataflow token's is answered there too.

Guarantees: the route is thin (parse, who may see what, one call into :mod:`api.sql`); every
refusal is ``{"error", "detail"}``: 400 a query DuckDB or the read-only rule refuses, 408 the
time limit, 413 the memory limit, 429 every SQL process busy.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import Response

from api.config import Settings
from api.schema.models import ErrorBody
from api.schema.sql import SqlRequest, SqlResponse
from api.shards.layout import Shard
from api.sql.engine import QueryError
from api.sql.history import HISTORY
from api.sql.live import LIVE
from api.sql.process import Job, SqlProcesses, arrow_table
from api.sql.queries import (
    Scope,
    answer,
    hinted,
    limits_of,
    live_stream,
    merged,
    named_views,
)
from api.web.deps import PrincipalDep, ServiceDep
from api.web.params import ERRORS, LIMITED

router = APIRouter(prefix="/v1")
ARROW = "application/vnd.apache.arrow.stream"
PRINCIPAL = "X-Tracker-Principal"
"""A shard's answer of a live view says whose rows it holds: ``admin``, or ``dataflow:<id>``."""

_ANSWERS: dict[int | str, dict[str, Any]] = {
    **ERRORS, **LIMITED,
    400: {"model": ErrorBody, "description": "`invalid_query` (DuckDB's message) or `read_only` (not one SELECT)"},
    408: {"model": ErrorBody, "description": "`query_timeout`: the query ran past the time limit and was stopped"},
    413: {"model": ErrorBody, "description": "`query_too_large`: the query needs more memory than its limit "
                                             "(or the body is too large)"},
    421: {"model": ErrorBody, "description": "`misdirected`: the admin's query sent to one shard of several"},
    503: {"model": ErrorBody, "description": "`shard_unavailable`: a shard did not answer (front of several); "
                                             "`sql_unavailable`: the SQL process running the query died, or gave "
                                             "no answer 10 s past the time limit (it is replaced)"},
}


def sql_processes(app: FastAPI, settings: Settings) -> SqlProcesses:
    """The application's SQL processes (made at the first query; closed with the application)."""
    processes = getattr(app.state, "sql_processes", None)
    if processes is None:
        processes = app.state.sql_processes = SqlProcesses(settings.sql_queries, settings.sql_nice)
    return processes


def _refused(error: QueryError) -> HTTPException:
    headers = {"Retry-After": "1"} if error.status == 429 else None
    return HTTPException(error.status, error.body, headers=headers)


@router.post("/sql", response_model=SqlResponse, responses=_ANSWERS, summary="SQL over the live state and history")
async def sql(body: SqlRequest, request: Request, service: ServiceDep, caller: PrincipalDep) -> Response:
    """One read-only SQL query (DuckDB) over the live views (``live_dataflows``,
    ``live_frontiers``, ``live_pointstamps``, ``live_lag``: now, not seconds behind) and the
    Delta tables under their own names. The admin sees every dataflow; a dataflow token, its
    own only. Limits: ``TRACKER_SQL_SECONDS`` (408), ``TRACKER_SQL_MEMORY_MB`` (413),
    ``TRACKER_SQL_ROWS`` (the answer says ``truncated``), ``TRACKER_SQL_QUERIES`` at once (429)."""
    settings = service.settings
    if settings.sharded and caller.admin:
        raise HTTPException(421, {"error": "misdirected", "detail": (
            "this is one shard of several and holds only its own dataflows: send the admin's SQL to the "
            "service's address (its front)")})
    try:
        return Response(await answer(service, sql_processes(request.app, settings), caller, body.query, body.params,
                                     body.max_rows), media_type="application/json")
    except QueryError as error:
        raise _refused(error) from None


@router.get("/sql/live/{view}", include_in_schema=False)
async def live_view(view: str, service: ServiceDep, caller: PrincipalDep) -> Response:
    """One live view of this process as an Arrow IPC stream, confined to the caller (the front
    of a sharded service gathers them)."""
    try:
        encode = live_stream(service, caller, view)
    except QueryError as error:
        raise _refused(error) from None
    return Response(await asyncio.to_thread(encode), media_type=ARROW, headers={
        PRINCIPAL: "admin" if caller.admin else f"dataflow:{caller.dataflow_id}"})


def add_front_sql(app: FastAPI, shards: list[Shard], client: httpx.AsyncClient, settings: Settings) -> None:
    """``POST /v1/sql`` at the front of a sharded service (see the module doc)."""

    async def gather(request: Request, names: set[str]) -> tuple[Scope, dict[str, Any]]:
        """Every shard's live views ``names`` for the caller, and what the caller may see."""
        headers = {k: v for k, v in request.headers.items() if k == "authorization"}
        views = sorted(names & set(LIVE)) or ["live_dataflows"]  # asked anyway: the shards say whose token it is

        async def one(shard: Shard) -> list[httpx.Response] | None:
            try:
                return list(await asyncio.gather(*(
                    client.get(f"{shard.endpoint}/v1/sql/live/{view}", headers=headers, timeout=settings.sql_seconds)
                    for view in views)))
            except httpx.HTTPError:
                return None

        answers = dict(zip([s.index for s in shards], await asyncio.gather(*(one(s) for s in shards)), strict=True))
        served = {index: found for index, found in answers.items()
                  if found is not None and all(a.status_code == 200 for a in found)}
        principals = {found[0].headers.get(PRINCIPAL, "") for found in served.values()}
        if not served:
            silent = sorted(index for index, found in answers.items() if found is None or any(
                a.status_code not in (200, 401) for a in found))
            if silent:
                raise _unavailable(silent)
            raise HTTPException(401, {"error": "unauthorized", "detail": "unknown token"})
        if "admin" in principals:
            missing = sorted(set(answers) - set(served))
            if missing:
                raise _unavailable(missing)
            scope = Scope(None)
        else:
            scope = Scope(next(iter(principals)).removeprefix("dataflow:"))
        tables = {view: [arrow_table(found[i].content) for found in served.values()]
                  for i, view in enumerate(views) if view in names}
        return scope, merged(tables)

    @app.post("/v1/sql", include_in_schema=False)
    async def front_sql(body: SqlRequest, request: Request) -> Response:
        """The query over every shard's live views and the Delta tables."""
        try:
            names = await asyncio.to_thread(named_views, body.query)
        except QueryError as error:
            raise _refused(error) from None
        scope, live = await gather(request, names)

        job = Job(body.query, body.params, str(settings.warehouse), tuple(sorted(names & HISTORY)),
                  scope.dataflow_id, limits_of(settings, body.max_rows))
        try:
            return Response(await sql_processes(app, settings).run(lambda: live, job), media_type="application/json")
        except QueryError as error:
            raise _refused(hinted(error)) from None


def _unavailable(indices: list[int]) -> HTTPException:
    return HTTPException(503, {"error": "shard_unavailable", "shards": indices, "detail": (
        f"shard{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))} did not answer: the live views would "
        "lack their dataflows, so the query was not run; try again")})
