"""The built-in web dashboard: the page, its static assets, and one history route it reads.

The page (``/dashboard``; ``/`` redirects there) holds no data and is served without a token.
It asks for a token once, keeps it in the browser's ``localStorage`` and calls the ``/v1`` API
with ``Authorization: Bearer``; the live frontier comes from the SSE stream read with
``fetch()`` (``EventSource`` cannot send that header). The front-end libraries (Cytoscape.js
for the graph, uPlot for the plots) are vendored under ``api/web/static/vendor`` with their
licences, so the page works offline (docs/dashboard.md describes the page).

The history route returns what happened before the page was opened, from the Delta tables:
``frontier_changes`` for the frontier plot (with the frontier just before the first change it
returns, folded from the older rows, so the page never depends on the service's in-memory
history, which a restart trims) and ``progress`` for the throughput plot. It uses the same
dependency as the ``/v1`` routes, so the same tokens and the same 401/403/404 apply.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from api.schema.models import LocationModel
from api.streams.publish import Publication
from api.web.deps import DataflowDep, ServiceDep
from tracker.graph import Location

STATIC = Path(__file__).resolve().parent / "static"
"""Where the page, its script, its style sheet and the vendored libraries live."""

router = APIRouter()


class HistoryChange(BaseModel):
    """One row of ``frontier_changes``: ``time`` entered (+1) or left (-1) the frontier at ``at``."""

    version: int
    location: LocationModel
    time: list[int]
    diff: int
    at: float


class HistoryRate(BaseModel):
    """Progress batches and updates received during one second (``progress.received_at``)."""

    second: float
    batches: int
    updates: int


class HistoryFrontier(BaseModel):
    """One location's frontier in :class:`HistoryResponse`'s ``base``."""

    location: LocationModel
    frontier: list[list[int]]


class HistoryBase(BaseModel):
    """Every location's frontier as of ``version``, the one before the first returned change."""

    version: int
    locations: list[HistoryFrontier]


class HistoryResponse(BaseModel):
    """What the Delta tables hold of a dataflow's past, for the dashboard's plots."""

    frontier_changes: list[HistoryChange]
    base: HistoryBase | None = Field(description="the frontier the changes start from (null without changes)")
    throughput: list[HistoryRate]
    delta: bool
router.mount("/static", StaticFiles(directory=STATIC), name="static")


@router.get("/", include_in_schema=False)
async def root() -> RedirectResponse:
    """The service's home is the dashboard."""
    return RedirectResponse("/dashboard", status_code=307)


@router.get("/dashboard", include_in_schema=False)
async def dashboard() -> FileResponse:
    """The dashboard page (no data in it: it fetches everything with the user's token)."""
    # no-cache: the page is tiny, and a stale copy after an upgrade would load mismatched scripts.
    return FileResponse(STATIC / "dashboard.html", media_type="text/html", headers={"Cache-Control": "no-cache"})


def _history(root: Path, dataflow_id: str, limit: int) -> dict[str, Any]:
    """The last ``limit`` frontier changes (whole versions: a version the limit cuts is left
    out) and the per-second throughput, from Delta; locations as stored (a nested dataflow's
    stand-ins).

    Read with polars' lazy Delta scan: only this dataflow's partition and the needed columns are
    read, and the top ``limit`` versions are kept while scanning (the table grows by hundreds of
    rows per version, so reading it whole would take seconds and gigabytes after a while).
    """
    import polars as pl
    from deltalake import DeltaTable

    from spark_jobs.report import throughput
    from spark_jobs.storage import Warehouse

    wh = Warehouse(root)

    def scan(table: str, columns: list[str]) -> pl.LazyFrame | None:
        path = wh.path(table)
        if not DeltaTable.is_deltatable(path):
            return None
        return pl.scan_delta(path).filter(pl.col("dataflow_id") == dataflow_id).select(columns)

    changes_scan = scan("frontier_changes", ["version", "scope", "node", "port", "kind", "time", "diff", "at"])
    progress_scan = scan("progress", ["version", "received_at", "delta"])
    # One row more than the limit: if it is there, the oldest version kept may be cut short.
    changes = [] if changes_scan is None else list(changes_scan.top_k(limit + 1, by="version").sort(
        "version", maintain_order=True).collect().iter_rows(named=True))
    if len(changes) > limit:
        oldest = changes[0]["version"]
        changes = [r for r in changes if r["version"] != oldest]
    rate = throughput(pl.DataFrame() if progress_scan is None else progress_scan.collect())
    return {
        "frontier_changes": [
            {"version": r["version"], "location": _location(r), "time": r["time"], "diff": r["diff"],
             "at": r["at"].timestamp()}
            for r in changes
        ],
        "throughput": [{"second": r["second"].timestamp(), "batches": r["batches"], "updates": r["updates"]}
                       for r in rate.iter_rows(named=True)],
    }


def _location(row: dict[str, Any]) -> dict[str, Any]:
    """A row's location as the service's JSON: ``scope`` only inside a nested scope (its times
    are then that scope's, inner times)."""
    location = {"node": row["node"], "port": row["port"], "kind": row["kind"]}
    return {"scope": row["scope"], **location} if row["scope"] else location


def _undo(view: dict[Location, set[tuple[int, ...]]], location: Location, time: tuple[int, ...], diff: int) -> None:
    if diff > 0:
        view.setdefault(location, set()).discard(time)
    else:
        view.setdefault(location, set()).add(time)


def _published(publication: Publication, changes: list[dict[str, Any]]
               ) -> tuple[dict[Location, set[tuple[int, ...]]], list[str]] | None:
    """On the event loop: a copy of the published frontier and the in-memory history's encoded
    versions newer than the last of ``changes`` (Delta rows: every version from the first to
    the last compacted one), or ``None`` if the history does not reach back to that one (it
    does after a restart too: recovery starts it at the compacted snapshot, which Delta holds)."""
    if not changes or publication.frontier_version < 0:
        return None
    compacted = changes[-1]["version"]
    if not publication.history_floor <= compacted <= publication.frontier_version:
        return None
    _, published = publication.frontier_at()
    newer = [encoded for changed, _, encoded in publication.history if changed > compacted]
    return {loc: set(times) for loc, times in published.items()}, newer


def _base(publication: Publication, changes: list[dict[str, Any]],
          state: tuple[dict[Location, set[tuple[int, ...]]], list[str]]) -> dict[str, Any]:
    """Every frontier just before the first of ``changes``: the published frontier (``state``,
    from :func:`_published`) with the newer in-memory versions undone, newest first, then the
    rows themselves (``frontier_changes`` alone would say it only for rows from version 0)."""
    view, newer = state
    encoding = publication.encoding
    for encoded in reversed(newer):
        for change in reversed(json.loads(encoded)):
            where = change["location"]
            location = (Location(where["node"], where["port"], where["kind"]) if encoding is None
                        else encoding.location(where))
            _undo(view, location, tuple(change["time"]), change["diff"])
    for row in reversed(changes):
        where = row["location"]  # a real location, scope included (docs/tables.md)
        location = (Location(where["node"], where["port"], where["kind"]) if encoding is None
                    else encoding.location(where))
        _undo(view, location, tuple(row["time"]), row["diff"])
    return {"version": changes[0]["version"] - 1, "locations": publication.frontier_rows(view)}


@router.get("/dashboard/api/dataflows/{id}/history", summary="Frontier-change and throughput history (Delta)",
            tags=["dashboard"], response_model=HistoryResponse)
async def history(dataflow: DataflowDep, service: ServiceDep,
                  limit: Annotated[int, Query(ge=1, le=100_000)] = 20_000) -> JSONResponse:
    """``{"frontier_changes": [{"version", "location", "time", "diff", "at"}], "base": {"version",
    "locations"}, "throughput": [{"second", "batches", "updates"}]}`` (times in epoch seconds) as
    compacted into Delta, ``base`` being every frontier just before the first change (a location
    not listed: empty); empty lists when the service runs without Delta storage. Live changes
    come from the SSE stream."""
    store = service.store
    if store is None:
        return JSONResponse({"frontier_changes": [], "base": None, "throughput": [], "delta": False})
    body = await asyncio.to_thread(_history, Path(store.warehouse.root), dataflow.id, limit)
    changes = body["frontier_changes"]
    state = _published(dataflow.publication, changes)
    base = None if state is None else await asyncio.to_thread(_base, dataflow.publication, changes, state)
    return JSONResponse({**body, "base": base, "delta": True})
