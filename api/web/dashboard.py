"""The built-in web dashboard: the page, its static assets, and the two routes it reads
besides ``/v1``: the history of its plots and its frames.

The page (``/dashboard``; ``/`` redirects there) holds no data and is served without a token.
It asks for a token once, keeps it in the browser's ``localStorage`` and calls the service with
``Authorization: Bearer``; the live frontier comes from the SSE stream read with ``fetch()``
(``EventSource`` cannot send that header). The front-end libraries (Cytoscape.js for the graph,
uPlot for the plots) are vendored under ``api/web/static/vendor`` with their licences, so the
page works offline (docs/dashboard.md describes the page).

The history route returns what happened before the page was opened, up to the published
version it names, so that the stream resumes right after it (``Last-Event-ID``): no gap, no
duplicate. Its frontier changes are the Delta ``frontier_changes`` rows joined with the
in-memory history's newer versions (with the time each was applied), with the frontier just
before the first of them; its throughput is Delta's ``progress`` per second joined with the
seconds counted in memory since this process hosts the dataflow. The frame route is
:func:`api.ops.frame.frame`: every panel's data at one version. Both use the same dependency as
the ``/v1`` routes, so the same tokens and the same 401/403/404 apply.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from api.host.tenant import Tenant
from api.ops.frame import frame
from api.schema.models import (
    STALL_KIND_DOC,
    DataflowStatus,
    LagResponse,
    LocationModel,
    ProgressEstimate,
    StallKind,
)
from api.streams.encoding import Selection
from api.web.deps import DataflowDep, ServiceDep, selection
from api.web.params import KindQ, NodeQ, ScopeQ, chunked, scope_path
from tracker.graph import Location
from tracker.scope import ScopedLocation
from tracker.timestamp import Timestamp

STATIC = Path(__file__).resolve().parent / "static"
"""Where the page, its scripts, its style sheet and the vendored libraries live."""

router = APIRouter()
"""The dashboard's data routes (per dataflow: on the dataflow's shard)."""
pages = APIRouter()
"""The dashboard's page and static assets (no data: served by a shard or by the front alike)."""


class HistoryChange(BaseModel):
    """One frontier change: ``time`` entered (+1) or left (-1) the frontier at ``at``."""

    version: int
    location: LocationModel
    time: list[int]
    diff: int
    at: float


class HistoryRate(BaseModel):
    """Progress batches and updates received during one second (epoch seconds)."""

    second: float
    batches: int
    updates: int


class HistoryFrontier(BaseModel):
    """One location's frontier in :class:`HistoryResponse`'s ``base``."""

    location: LocationModel
    frontier: list[list[int]]


class HistoryBase(BaseModel):
    """Every (selected) location's frontier as of ``version``, the one before the first change."""

    version: int
    locations: list[HistoryFrontier]


class HistoryResponse(BaseModel):
    """A dataflow's past up to ``version``, for the dashboard's plots."""

    version: int = Field(description="the published version the changes reach: resume the stream after it")
    at: float = Field(description="when this was read (epoch seconds)")
    frontier_changes: list[HistoryChange]
    base: HistoryBase | None = Field(description="the frontier the changes start from (null: nothing is known "
                                                 "yet, start from the stream's snapshot)")
    throughput: list[HistoryRate]
    delta: bool


class HeldBlocker(BaseModel):
    """A blocker as ``explain`` gives it, without its path: ``via`` lists the scope crossings on it."""

    location: LocationModel
    time: list[int]
    count: int
    summary: list[int] | None
    arrives_as: list[int]
    operator: str
    port: str
    worker: str | None
    age_seconds: float | None
    age_at_least: bool = False
    stall_kind: StallKind = Field(description=STALL_KIND_DOC)
    via: list[Literal["ingress", "egress"]] = Field(description="the scope boundaries its path crosses, in order")


class ExplainedBlocker(HeldBlocker):
    """A blocker of the explained location, with ``explain``'s text (cut at 1,000 characters)."""

    text: str


class FrameOperator(BaseModel):
    """An operator (a scope node stands for its boundary)."""

    scope: list[int] | None = None
    node: int


class FrameExplanation(BaseModel):
    """``explain``'s answer for the asked location, its blockers without their paths."""

    version: int
    location: LocationModel
    time: list[int]
    safe_to_notify: bool
    frontier: list[list[int]]
    blocker_count: int
    blockers: list[ExplainedBlocker]
    explanation: str
    operators: list[FrameOperator] = Field(description="every operator on the blockers' paths")


class HeldRow(BaseModel):
    """A waiting location and the pointstamps that hold it at its earliest frontier time."""

    location: LocationModel
    operator: str
    port: str
    frontier: list[list[int]]
    time: list[int] = Field(description="its earliest frontier time, the one explained")
    blocker_count: int
    blockers: list[HeldBlocker] = Field(description="the first 10")


class FrameResponse(BaseModel):
    """Everything the dashboard's panels show of a dataflow, at one published version."""

    version: int
    at: float = Field(description="when this was read (epoch seconds)")
    status: DataflowStatus
    held: list[HeldRow] = Field(description="the 30 locations that have waited longest, with their blockers")
    explained: FrameExplanation | None = Field(description="the asked location's explanation at its earliest "
                                                          "frontier time (null: not asked, or its frontier is empty)")
    estimate: ProgressEstimate
    throughput: list[HistoryRate] = Field(description="durable batches per second, after `throughput_after`")
    lag: LagResponse


pages.mount("/static", StaticFiles(directory=STATIC), name="static")


@pages.get("/", include_in_schema=False)
async def root() -> RedirectResponse:
    """The service's home is the dashboard."""
    return RedirectResponse("/dashboard", status_code=307)


@pages.get("/dashboard", include_in_schema=False)
async def dashboard() -> FileResponse:
    """The dashboard page (no data in it: it fetches everything with the user's token)."""
    # no-cache: the page is tiny, and a stale copy after an upgrade would load mismatched scripts.
    return FileResponse(STATIC / "dashboard.html", media_type="text/html", headers={"Cache-Control": "no-cache"})


def _delta_history(root: Path, dataflow_id: str, limit: int, where: list[dict[str, Any]] | None
                   ) -> dict[str, Any]:
    """The last ``limit`` frontier changes (at the locations ``where``, if given; whole versions:
    a version the limit cuts is left out) and the per-second throughput, from Delta.

    Read with polars' lazy Delta scan: only this dataflow's partition and the needed columns are
    read, and the top ``limit`` versions are kept while scanning (the table grows by hundreds of
    rows per version, so reading it whole would take seconds and gigabytes after a while).
    """
    import polars as pl
    from deltalake import DeltaTable

    from spark_jobs.report_frames import throughput
    from spark_jobs.storage import Warehouse

    wh = Warehouse(root)

    def scan(table: str, columns: list[str]) -> pl.LazyFrame | None:
        path = wh.path(table)
        if not DeltaTable.is_deltatable(path):
            return None
        return pl.scan_delta(path).filter(pl.col("dataflow_id") == dataflow_id).select(columns)

    changes_scan = scan("frontier_changes", ["version", "scope", "node", "port", "kind", "time", "diff", "at"])
    if changes_scan is not None and where is not None:
        changes_scan = changes_scan.filter(pl.any_horizontal([
            (pl.col("scope").list.len() == len(w.get("scope", ()))) & (pl.col("node") == w["node"])
            & (pl.col("port") == w["port"]) & (pl.col("kind") == w["kind"]) for w in where]))
    progress_scan = scan("progress", ["version", "received_at", "delta"])
    # One row more than the limit: if it is there, the oldest version kept may be cut short.
    changes = [] if changes_scan is None else list(changes_scan.top_k(limit + 1, by="version").sort(
        "version", maintain_order=True).collect().iter_rows(named=True))
    rate = throughput(pl.DataFrame() if progress_scan is None else progress_scan.collect())
    return {
        "frontier_changes": _whole([{"version": r["version"], "location": _location(r), "time": r["time"],
                                     "diff": r["diff"], "at": r["at"].timestamp()} for r in changes], limit),
        "throughput": [{"second": r["second"].timestamp(), "batches": r["batches"], "updates": r["updates"]}
                       for r in rate.iter_rows(named=True)],
    }


def _whole(rows: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` of ``rows`` (in version order), without a version cut short."""
    if len(rows) <= limit:
        return rows
    kept = rows[-limit:]
    cut = kept[0]["version"]
    return kept if rows[-limit - 1]["version"] != cut else [r for r in kept if r["version"] != cut]


def _location(row: dict[str, Any]) -> dict[str, Any]:
    """A row's location as the service's JSON: ``scope`` only inside a nested scope (its times
    are then that scope's, inner times)."""
    location = {"node": row["node"], "port": row["port"], "kind": row["kind"]}
    return {"scope": row["scope"], **location} if row["scope"] else location


def _join(dataflow: Tenant, delta: dict[str, Any], wanted: Selection | None, limit: int
          ) -> Callable[[], dict[str, Any]]:
    """On the event loop: the published version, its frontier (at the wanted locations), the
    Delta rows joined with the in-memory history's newer versions, and the throughput joined
    with the in-memory seconds; returns a builder of the answer (call it in a worker thread)."""
    publication = dataflow.publication
    version, frontier = publication.frontier_reader()
    rows = delta["frontier_changes"]
    memory = None if not rows else publication.stamped_changes_since(rows[-1]["version"], wanted)
    if memory is None:  # no Delta rows, or the memory no longer reaches back to them: memory alone
        rows = []
        memory = publication.stamped_changes_since(publication.history_floor, wanted) or []
    where = None if wanted is None else wanted.locations.__contains__
    locations = (wanted.locations if wanted is not None else
                 dataflow.hosting.locations if dataflow.hosting is not None else dataflow.graph.locations())
    ring = dataflow.throughput
    rates = ([r for r in delta["throughput"] if r["second"] < ring.since]
             + [{"second": s, "batches": b, "updates": u} for s, b, u in ring.rows()])
    now = time.time()

    def build() -> dict[str, Any]:
        changes = _whole(rows + [{"version": v, "location": c["location"], "time": c["time"], "diff": c["diff"],
                                  "at": at} for v, at, text in memory for c in json.loads(text)], limit)
        if version < 0:  # --engine spark before its first micro-batch: no frontier yet
            return {"version": version, "at": now, "frontier_changes": [], "base": None, "throughput": rates}
        view: dict[Location, set[Timestamp]] = {loc: set(frontier(loc)) for loc in locations}
        for change in reversed(changes):  # undone newest first: the frontier before the first of them
            times = view.setdefault(publication.location(change["location"]), set())
            if change["diff"] > 0:
                times.discard(tuple(change["time"]))
            else:
                times.add(tuple(change["time"]))
        base = {"version": changes[0]["version"] - 1 if changes else version,
                "locations": publication.frontier_rows(view, where)}
        return {"version": version, "at": now, "frontier_changes": changes, "base": base, "throughput": rates}

    return build


@router.get("/dashboard/api/dataflows/{id}/history", summary="Frontier-change and throughput history",
            tags=["dashboard"], response_model=HistoryResponse)
async def history(dataflow: DataflowDep, service: ServiceDep,
                  limit: Annotated[int, Query(ge=1, le=100_000)] = 20_000,
                  locations: Annotated[str | None, Query(
                      # A few operators' inputs: well under the request head's limit even percent-encoded.
                      max_length=4_000, description="only these locations, as for the stream: node:port:kind "
                                                    "items separated by commas")] = None) -> JSONResponse:
    """``{"version", "at", "frontier_changes": [{"version", "location", "time", "diff", "at"}], "base":
    {"version", "locations"}, "throughput": [{"second", "batches", "updates"}], "delta"}`` (times in
    epoch seconds): the last ``limit`` frontier changes up to the published ``version`` (Delta's,
    then the in-memory history's), ``base`` being every (selected) frontier just before the first
    of them; and the durable batches per second. Resume the stream after ``version``."""
    wanted = selection(dataflow, locations)
    store = service.store
    where = None if wanted is None else [{"node": loc.node, "port": loc.port, "kind": loc.kind}
                                         for loc in wanted.locations]
    delta = ({"frontier_changes": [], "throughput": []} if store is None else
             await asyncio.to_thread(_delta_history, Path(store.warehouse.root), dataflow.id, limit, where))
    build = _join(dataflow, delta, wanted, limit)
    body = await asyncio.to_thread(build)
    return JSONResponse({**body, "delta": store is not None})


@router.get("/dashboard/api/dataflows/{id}/frame", summary="Everything the dashboard shows, at one version",
            tags=["dashboard"], response_model=FrameResponse)
async def frame_route(dataflow: DataflowDep,
                      throughput_after: Annotated[float | None, Query(
                          ge=0, le=1e11, description="only the seconds of throughput after this one (epoch "
                                                     "seconds)")] = None,
                      node: NodeQ = None, port: NodeQ = None, kind: KindQ = None, scope: ScopeQ = None) -> Response:
    """The dataflow's status, every location's frontier and lag, what holds the 30 longest
    waiting locations back, the progress estimates and the recent throughput, all read at one
    published ``version`` (see ``api.ops.frame``); with ``node``, ``port`` and ``kind`` (and
    ``scope`` inside a nested scope), that location's full explanation too."""
    asked = None
    if (node, port, kind) != (None, None, None):
        if node is None or port is None or kind is None:
            raise HTTPException(422, {"error": "invalid_request",
                                      "detail": "node, port and kind name a location together: give all three"})
        asked = located(dataflow, scope_path(dataflow, scope) or (), node, port, kind)
    return chunked(await asyncio.to_thread(frame(dataflow, time.time(), throughput_after, asked)))


def located(dataflow: Tenant, path: tuple[int, ...], node: int, port: int, kind: Literal["source", "target"]
            ) -> Location:
    """The location (a nested dataflow's stand-in) of ``(path, node, port, kind)``; 422
    ``unknown_location`` if the dataflow has none."""
    wanted = ScopedLocation(path, node, port, kind)
    try:
        if dataflow.hosting is not None:
            return dataflow.hosting.flat(wanted)
        location = Location(node, port, kind)
        if not path and dataflow.graph.has_location(location):
            return location
    except KeyError:
        pass
    raise HTTPException(422, {"error": "unknown_location", "detail": f"{wanted} is not a port of this dataflow"})
