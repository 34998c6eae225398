"""The v1 routes of a dataflow's frontiers: now or as of a past version, why a notification is
not safe yet (``explain``), how long each has waited (``lag``), and their changes as a stream
(SSE; the WebSocket is :mod:`api.web.ws`).

Guarantees: every answer reads one published (durable) version; heavy work runs off the loop on
copies; every client mistake is a 4xx with a JSON body ``{"error", "detail"}``."""

from __future__ import annotations

import asyncio
from time import time as time_now
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException, Query
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from api.host.ingest import gone
from api.host.tenant import Tenant
from api.live.scopes import Hosting
from api.ops.estimate import estimate
from api.ops.explain import explain, explain_nested
from api.ops.lag import blamer, lag_report
from api.schema.bodies import collector_paused
from api.schema.models import (
    ErrorBody,
    ExplainResponse,
    FrontierResponse,
    LagResponse,
    ProgressEstimate,
)
from api.streams import subscribers
from api.streams.rewind import TooFarBack, frontier_as_of
from api.web.deps import (
    DataflowDep,
    LimitsDep,
    ServiceDep,
    selection,
    subscriber_slot,
)
from api.web.limits import Slot
from api.web.params import (
    ERRORS,
    LIMITED,
    KindQ,
    NodeQ,
    ScopeQ,
    chunked,
    json_chunks,
    location_filter,
    scope_path,
)
from tracker.graph import Location
from tracker.scope import ScopedLocation
from tracker.timestamp import MAX_TIME

router = APIRouter(prefix="/v1")


@router.get("/dataflows/{id}/frontier", response_model=FrontierResponse,
            responses={**ERRORS, 410: {"model": ErrorBody, "description": "`version` is too many frontier changes "
                                                                          "back; `oldest` says how far back it goes"}},
            summary="Frontiers, now or as of a past version")
async def frontier(dataflow: DataflowDep, node: NodeQ = None, port: NodeQ = None, kind: KindQ = None,
                   version: Annotated[int | None, Query(ge=0)] = None, scope: ScopeQ = None) -> Response:
    """Every location's frontier (optionally filtered; ``scope`` not given: any scope), as of
    ``version`` if given. Times are in each location's scope."""
    where = location_filter(dataflow, scope, node, port, kind)
    publication = dataflow.publication
    filtered = any(value is not None for value in (scope, node, port, kind))
    if publication.engine_rows and (version is None or (version == publication.frontier_version and not filtered)):
        # The engine writes the rows: picking them is a pass over the graph (off the loop),
        # writing them one call holding no Python object per row.
        write = publication.frontier_writer()
        indices = await asyncio.to_thread(publication.row_indices, where) if filtered else publication.row_indices()
        return chunked(await asyncio.to_thread(write, indices))
    try:
        at, view = (dataflow.publication.frontier_at() if version is None
                    else await frontier_as_of(dataflow.publication, version))
    except TooFarBack as error:
        raise HTTPException(410, {"error": "version_too_old", "detail": str(error), "oldest": error.oldest}) from None
    except LookupError as error:
        raise HTTPException(404, {"error": "unknown_version", "detail": str(error)}) from None

    return JSONResponse({"version": at, "locations": dataflow.publication.frontier_rows(view, where)})


@router.get("/dataflows/{id}/frontier/explain", response_model=ExplainResponse, responses=ERRORS,
            summary="Why a notification is (not) safe yet")
async def frontier_explain(
    dataflow: DataflowDep,
    node: Annotated[int, Query(ge=0, le=2**31 - 1)], port: Annotated[int, Query(ge=0, le=2**31 - 1)],
    kind: Annotated[Literal["source", "target"], Query()],
    time: Annotated[str, Query(max_length=1000, description="comma-separated coordinates, e.g. 2,7")],
    scope: ScopeQ = None,
) -> Response:
    """The active pointstamps that hold ``(location, time)`` back, each with its summary and
    one path, and a sentence saying what it means. In a nested dataflow the path may cross scope
    boundaries (its steps say ``via`` ingress or egress); ``time`` is in the location's scope."""
    path = scope_path(dataflow, scope) or ()
    if dataflow.hosting is not None:
        return await _explain_nested(dataflow, dataflow.hosting, ScopedLocation(path, node, port, kind), time)
    location = Location(node, port, kind)
    if not dataflow.graph.has_location(location):
        raise HTTPException(422, {"error": "unknown_location", "detail": f"{location} is not a port of this dataflow"})
    parts = _time(time, dataflow.graph.arity)
    version, frontier = dataflow.publication.frontier_of(location)
    counts = dataflow.counts()
    # A search per blocking origin: off the loop, on a consistent copy of the state.
    blame = blamer(dataflow, time_now())

    def search() -> list[bytes]:
        with collector_paused():  # a search's ~3 objects per location drew collector passes of ~40 ms
            return json_chunks(explain(dataflow.graph, counts, frontier, version, location, tuple(parts), blame))

    return chunked(await asyncio.to_thread(search))


@router.get("/dataflows/{id}/lag", response_model=LagResponse, responses=ERRORS,
            summary="How long each frontier has waited, and its oldest pointstamp")
async def lag(dataflow: DataflowDep) -> Response:
    """Every location (scope-qualified) with its operator's name, its frontier, the wall-clock
    seconds since that frontier last changed (``null`` once empty), and its oldest live
    pointstamp with the worker that last reported it and its age."""
    return chunked(await asyncio.to_thread(lag_report(dataflow, time_now())))


@router.get("/dataflows/{id}/progress-estimate", response_model=ProgressEstimate, responses=ERRORS,
            summary="How fast each operator advances, and when it should be done")
async def progress_estimate(dataflow: DataflowDep) -> JSONResponse:
    """Per operator with inputs: its earliest open epoch, the epochs per second it cleared over
    the last 10 s (null when too short or unsteady to say, with the reason), and, where the last
    epoch is known (declared ``last_epoch``, or every input closed), the expected seconds until
    it is done."""
    return JSONResponse(await asyncio.to_thread(estimate(dataflow, time_now())))


class _Held(EventSourceResponse):
    """An SSE response holding a subscriber slot until it ends, however it ends (Starlette
    always runs the response it is given, even for a client already gone, whereas the event
    generator's ``finally`` does not run if it never started)."""

    def __init__(self, content: Any, slot: Slot, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.slot = slot

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


_EVENTS = {"content": {"text/event-stream": {"schema": {"type": "string"}}},
           "description": "SSE: `snapshot` (or the missed `changes` after `Last-Event-ID`), then `changes`; "
                          "`resync` + `snapshot` if the subscriber fell behind"}


@router.get("/dataflows/{id}/frontier/stream", response_class=EventSourceResponse,
            responses={**ERRORS, **LIMITED, 410: {"model": ErrorBody, "description": "the dataflow was deleted"},
                       200: _EVENTS}, summary="Frontier changes as Server-Sent Events")
async def frontier_stream(
    dataflow: DataflowDep, service: ServiceDep, limits: LimitsDep,
    last_event_id: Annotated[str | None, Header(
        alias="Last-Event-ID",
        description="the last version received: resume after it with no gap and no duplicate (a fresh "
                    "snapshot if the retained history no longer reaches back that far)")] = None,
    locations: Annotated[str | None, Query(
        max_length=100_000, description="only these locations: node:port:kind items separated by commas "
                                        "(1:0:target,2:0:target), or a JSON list of {node, port, kind}")] = None,
) -> EventSourceResponse:
    """SSE stream; ``id`` = version; send ``Last-Event-ID`` to resume without gap or duplicate.
    A ``deleted`` event ends it when the dataflow is deleted (410 for a deleted one); 429
    ``too_many_subscribers`` beyond the subscriber limits."""
    if dataflow.publication.ended:
        raise gone(dataflow)
    metrics = service.metrics
    gauge = metrics.subscribers.labels("sse")
    wanted = selection(dataflow, locations)
    slot = subscriber_slot(limits, dataflow)
    events = subscribers.sse_events(dataflow.publication, last_event_id, service.settings.subscriber_queue,
                                metrics.resyncs.inc, gauge.inc, wanted, max_bytes=service.settings.subscriber_bytes)
    return _Held(events, slot, ping=15, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _time(text: str, arity: int) -> tuple[int, ...]:
    """The ``time`` query of ``explain``, with ``arity`` coordinates (422 ``invalid_time``)."""
    # ASCII digits only: int() would also take "٣" or "1_000".
    texts = [x.strip() for x in text.split(",")]
    if not all(x.isascii() and x.isdigit() for x in texts):
        raise HTTPException(422, {"error": "invalid_time",
                                  "detail": f"time must be comma-separated non-negative integers, got {text!r}"})
    parts = tuple(int(x) for x in texts)
    if len(parts) != arity or max(parts) > MAX_TIME:
        raise HTTPException(422, {"error": "invalid_time", "detail": f"time must have {arity} "
                                  f"coordinates, each from 0 to {MAX_TIME}"})
    return parts


async def _explain_nested(dataflow: Tenant, hosting: Hosting, location: ScopedLocation, text: str) -> Response:
    try:
        here = hosting.flat(location)
    except KeyError:
        raise HTTPException(422, {"error": "unknown_location",
                                  "detail": f"{location} is not a port of this dataflow"}) from None
    when = _time(text, hosting.nested.arity_of(location.scope))
    version, view = dataflow.publication.frontier_at()
    counts = {(hosting.scoped(loc), t): c for (loc, t), c in dataflow.counts().items()}
    frontier = sorted(view.get(here, ()))
    flat_blame = blamer(dataflow, time_now())
    return chunked(await asyncio.to_thread(lambda: json_chunks(explain_nested(
        hosting.steps, counts, frontier, version, location, when,
        lambda origin, at: flat_blame(hosting.flat(origin), at)))))
