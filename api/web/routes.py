"""The v1 REST routes: register a dataflow graph, report progress batches, query and stream
frontiers, explain a frontier.

Guarantees: every route is thin (it calls the service, :mod:`api.host.ingest` or the dataflow's
:class:`~api.streams.publish.Publication`), reads only published (durable) state, and answers every
client mistake with a 4xx and a JSON body ``{"error", "detail"}``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from time import time as time_now
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from sse_starlette import EventSourceResponse

from api.durability.wal import LogFailed
from api.host.ingest import bad_body, gone, submit
from api.host.tenant import Tenant
from api.live.scopes import Hosting, parse_scope
from api.ops.explain import explain, explain_nested
from api.ops.lag import blamer, lag_report
from api.schema.bodies import collector_paused, detail_json, parse_registration_sliced
from api.schema.models import (
    DataflowDetail,
    DataflowSummary,
    ErrorBody,
    ExplainResponse,
    FrontierResponse,
    LagResponse,
    PointstampRow,
    ProgressResponse,
    RegisterResponse,
    ScopeInfo,
    SummaryRow,
    location_json,
)
from api.schema.parsing import InvalidRequest, MalformedJSON
from api.streams import subscribers
from api.streams.rewind import TooFarBack, frontier_as_of
from api.web.deps import (
    AdminDep,
    DataflowDep,
    LimitsDep,
    PrincipalDep,
    ServiceDep,
    registration_slot,
    require_json,
    selection,
    subscriber_slot,
)
from api.web.limits import Slot
from tracker.graph import Graph, Location
from tracker.scope import ScopedLocation
from tracker.structure import summaries_by_origin
from tracker.timestamp import MAX_TIME

router = APIRouter(prefix="/v1")

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "malformed JSON"},
    401: {"model": ErrorBody, "description": "missing or unknown token"},
    403: {"model": ErrorBody, "description": "the token belongs to another dataflow"},
    404: {"model": ErrorBody, "description": "unknown dataflow"},
    413: {"model": ErrorBody, "description": "body too large"},
    422: {"model": ErrorBody, "description": "invalid request"},
}
_LIMITED: dict[int | str, dict[str, Any]] = {429: {
    "model": ErrorBody, "description": "a limit is reached (see `error`); retry after `Retry-After` seconds",
    "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds to wait"}}}}
PSI_LOCATIONS = 2_000  # the whole of Psi is quadratic (streamed): beyond this, ask for one origin at a time
NodeQ = Annotated[int | None, Query(ge=0, le=2**31 - 1)]
KindQ = Annotated[Literal["source", "target"] | None, Query()]
ScopeQ = Annotated[str | None, Query(max_length=200, description="a scope path of a dataflow with nested scopes, "
                                     "comma-separated scope-node ids from the root, e.g. 3,1 (empty: the root)")]


@router.post("/dataflows", status_code=201, response_model=RegisterResponse,
             responses={**_ERRORS, **_LIMITED, 415: {"model": ErrorBody, "description": "the body is declared as "
                                                                                     "something else than JSON"}},
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": {"$ref": "#/components/schemas/RegisterRequest"}}}}},
             summary="Register a dataflow graph")
async def register(request: Request, service: ServiceDep, caller: AdminDep, limits: LimitsDep) -> JSONResponse:
    """Validate the graph (422 naming the problem or the offending cycle), store it durably and
    return its id and token. The Spark cycle check and summaries run in the background; see
    ``status.spark_check``.

    The body (schema ``RegisterRequest``) is parsed by
    :func:`api.schema.bodies.parse_registration_sliced` (as :func:`api.schema.parsing.parse_registration`,
    in slices, off the loop), strictly, as the progress bodies are: JSON that is not one document
    is 400. Admission comes first (429 ``rate_limited`` or ``too_many_dataflows``), so that a
    flood costs no parsing."""
    slot = registration_slot(limits, service, caller)
    try:
        require_json(request.headers.get("content-type"))
        with collector_paused():
            try:
                # Off the loop and in slices: a 50,000-node body took 2.2 s of validation in one call.
                body = await asyncio.to_thread(parse_registration_sliced, await request.body())
            except (MalformedJSON, InvalidRequest) as error:
                raise bad_body(error) from None
            dataflow, token = await service.register(body)
    finally:
        slot.release()
    return JSONResponse({"id": dataflow.id, "token": token}, status_code=201)


@router.get("/dataflows", response_model=list[DataflowSummary], responses=_ERRORS, summary="List dataflows")
async def list_dataflows(
    service: ServiceDep, caller: PrincipalDep,
    state: Annotated[Literal["running", "complete", "stalled", "violation", "deleted"] | None, Query(
        description="only dataflows in this state (default: every state but deleted)")] = None,
    name: Annotated[str | None, Query(max_length=200, description="only dataflows registered with this name")] = None,
) -> list[dict[str, Any]]:
    """Every dataflow the token may see (the admin: all; a dataflow token: its own), oldest
    first, filtered by ``state`` and ``name``; deleted ones only with ``state=deleted``."""
    found = []
    for dataflow in service.dataflows.values():
        if not (dataflow.ready and caller.may_access(dataflow.id)) or (name is not None and dataflow.name != name):
            continue
        now = dataflow.lifecycle()["state"]
        if now == state or (state is None and now != "deleted"):
            found.append(dataflow.summary(now))
    return sorted(found, key=lambda d: d["created_at"])


@router.delete("/dataflows/{id}", status_code=204, response_class=Response,
               responses={**_ERRORS, 410: {"model": ErrorBody, "description": "already deleted"},
                          503: {"model": ErrorBody, "description": "the write-ahead log failed"}},
               summary="Delete a dataflow")
async def delete_dataflow(dataflow: DataflowDep, service: ServiceDep, _caller: AdminDep) -> Response:
    """Stop the dataflow for good (admin token only): from then on its progress is refused with
    410 (POST and WebSocket), its SSE streams end with a ``deleted`` event, its WebSockets close
    with code 4410; it keeps answering reads, with ``status.state`` ``deleted``, also after a
    restart. Its Delta rows stay, with ``dataflows.deleted_at`` set. 410 if already deleted."""
    if dataflow.deleted_at is not None:
        raise gone(dataflow)
    try:
        await service.delete(dataflow)
    except LogFailed:
        raise HTTPException(503, {"error": "log_failed", "detail": "the write-ahead log failed; restart the service"}
                            ) from None
    return Response(status_code=204)


@router.get("/dataflows/{id}", response_model=DataflowDetail, responses=_ERRORS, summary="A dataflow")
async def get_dataflow(dataflow: DataflowDep) -> Response:
    """The graph, arity, version and status (Spark check, last audit, Delta lag, workers)."""
    registration = dataflow.registration
    detail = {**dataflow.summary(), "nodes": registration.nodes, "edges": registration.edges,
              "status": dataflow.status()}
    return _chunked(await asyncio.to_thread(detail_json, detail))


@router.post("/dataflows/{id}/progress", response_model=ProgressResponse, summary="Report a progress batch",
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": {"$ref": "#/components/schemas/ProgressRequest"}}}}},
             responses={**_ERRORS, 409: {"model": ErrorBody, "description": "sequence gap; see `expected`"},
                        410: {"model": ErrorBody, "description": "the dataflow was deleted"},
                        415: {"model": ErrorBody, "description": "the body is declared as something else than JSON"},
                        503: {"model": ErrorBody, "description": "the write-ahead log failed: not acknowledged"}})
async def progress(request: Request, dataflow: DataflowDep, service: ServiceDep) -> JSONResponse:
    """Apply an atomic batch keyed by ``(worker, seq)``; answered once it is durable.

    The body (schema ``ProgressRequest``) is parsed by :mod:`api.schema.parsing`, which checks the
    same schema and the graph in one cheap pass."""
    require_json(request.headers.get("content-type"))
    ack = await submit(dataflow, await request.body(), service.wal, service.metrics)  # Refused: see api.web.app
    return JSONResponse({"applied": ack.applied, "duplicate": ack.duplicate, "version": ack.version})


@router.get("/dataflows/{id}/frontier", response_model=FrontierResponse,
            responses={**_ERRORS, 410: {"model": ErrorBody, "description": "`version` is too many frontier changes "
                                                                          "back; `oldest` says how far back it goes"}},
            summary="Frontiers, now or as of a past version")
async def frontier(dataflow: DataflowDep, node: NodeQ = None, port: NodeQ = None, kind: KindQ = None,
                   version: Annotated[int | None, Query(ge=0)] = None, scope: ScopeQ = None) -> Response:
    """Every location's frontier (optionally filtered; ``scope`` not given: any scope), as of
    ``version`` if given. Times are in each location's scope."""
    where = _filter(dataflow, scope, node, port, kind)
    publication = dataflow.publication
    filtered = any(value is not None for value in (scope, node, port, kind))
    if publication.engine_rows and (version is None or (version == publication.frontier_version and not filtered)):
        # The engine writes the rows: picking them is a pass over the graph (off the loop),
        # writing them one call holding no Python object per row.
        write = publication.frontier_writer()
        indices = await asyncio.to_thread(publication.row_indices, where) if filtered else publication.row_indices()
        return _chunked(await asyncio.to_thread(write, indices))
    try:
        at, view = (dataflow.publication.frontier_at() if version is None
                    else await frontier_as_of(dataflow.publication, version))
    except TooFarBack as error:
        raise HTTPException(410, {"error": "version_too_old", "detail": str(error), "oldest": error.oldest}) from None
    except LookupError as error:
        raise HTTPException(404, {"error": "unknown_version", "detail": str(error)}) from None

    return JSONResponse({"version": at, "locations": dataflow.publication.frontier_rows(view, where)})


def _chunked(chunks: list[bytes]) -> StreamingResponse:
    """A JSON answer sent a chunk at a time: one write of many megabytes (or joining them first)
    held the event loop tens of milliseconds."""
    async def each() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return StreamingResponse(each(), media_type="application/json")


def _scope(dataflow: Tenant, scope: str | None) -> tuple[int, ...] | None:
    """The ``?scope=`` of a request, checked against the dataflow (422 ``unknown_scope``)."""
    try:
        return parse_scope(scope, [()]) if dataflow.hosting is None else dataflow.hosting.scope_of(scope)
    except LookupError as error:
        raise HTTPException(422, {"error": "unknown_scope", "detail": str(error)}) from None


def _filter(dataflow: Tenant, scope: str | None, node: int | None, port: int | None, kind: str | None
            ) -> Callable[[Location], bool]:
    path = _scope(dataflow, scope)
    hosting = dataflow.hosting
    if hosting is None:
        return lambda loc: _matches(loc, node, port, kind)
    return lambda loc: hosting.matches(loc, path, node, port, kind)


@router.get("/dataflows/{id}/pointstamps", responses=_ERRORS, summary="Non-zero occurrence counts",
            response_model=list[PointstampRow])
async def pointstamps(dataflow: DataflowDep) -> JSONResponse:
    """``[{"location", "time", "count"}]`` as of the durable version."""
    counts = dataflow.counts()
    hosting = dataflow.hosting
    if hosting is not None:  # scope by scope, then as a flat dataflow's
        scoped = sorted(((hosting.scoped(loc), t), c) for (loc, t), c in counts.items())
        ordered = sorted(scoped, key=lambda kv: (len(kv[0][0].scope), kv[0][0].scope, kv[0][0].node, kv[0][0].kind,
                                                 kv[0][0].port, kv[0][1]))
        return JSONResponse([{"location": hosting.location_json(hosting.flat(loc)), "time": list(t), "count": c}
                             for (loc, t), c in ordered])
    rows = sorted(counts.items(), key=lambda kv: (kv[0][0].node, kv[0][0].kind, kv[0][0].port, kv[0][1]))
    return JSONResponse([{"location": location_json(loc), "time": list(t), "count": c} for (loc, t), c in rows])


@router.get("/dataflows/{id}/scopes", response_model=list[ScopeInfo], responses=_ERRORS,
            summary="Nested scopes and their summaries")
async def scopes(dataflow: DataflowDep) -> JSONResponse:
    """Every nested scope (``[]`` for a flat dataflow): its path, kind, the arity of its times,
    and its summaries as an operator, from each input to each output, in the parent's time."""
    return JSONResponse([] if dataflow.hosting is None else dataflow.hosting.scopes_json())


@router.get("/dataflows/{id}/summaries", response_model=list[SummaryRow], responses=_ERRORS,
            summary="Minimal path summaries Psi")
async def summaries(dataflow: DataflowDep, from_node: NodeQ = None, from_port: NodeQ = None, from_kind: KindQ = None,
                    to_node: NodeQ = None, to_port: NodeQ = None, to_kind: KindQ = None,
                    scope: ScopeQ = None) -> Response:
    """``Psi`` rows, optionally filtered on either end, sorted by origin then destination;
    ``scope``: within that scope of a nested dataflow (default: the root), in its time."""
    path = _scope(dataflow, scope) or ()
    graph = dataflow.graph if dataflow.hosting is None else dataflow.hosting.nested.scopes[path].graph
    if None not in (from_node, from_port, from_kind):
        origin = Location(from_node, from_port, from_kind)  # type: ignore[arg-type]
        if not graph.has_location(origin):
            raise HTTPException(422, {"error": "unknown_location",
                                      "detail": f"{origin} is not a port of this dataflow"})
    elif len(graph.locations()) > PSI_LOCATIONS:
        raise HTTPException(422, {"error": "too_large", "detail": (
            f"Psi of a graph with {len(graph.locations())} locations is quadratic in size; name one "
            f"origin with from_node, from_port and from_kind (the whole of Psi is served up to {PSI_LOCATIONS} "
            "locations)")})
    origins = await asyncio.to_thread(  # a pass over the graph: off the loop
        lambda: sorted((loc for loc in graph.locations() if _matches(loc, from_node, from_port, from_kind)),
                       key=_location_order))
    return StreamingResponse(_psi_json(graph, origins, (to_node, to_port, to_kind), path),
                             media_type="application/json")


def _matches(loc: Location, node: int | None, port: int | None, kind: str | None) -> bool:
    return (node is None or loc.node == node) and (port is None or loc.port == port) and (
        kind is None or loc.kind == kind)


def _location_order(loc: Location) -> tuple[int, str, int]:
    return loc.node, loc.kind, loc.port


async def _psi_json(graph: Graph, origins: list[Location], dest: tuple[Any, Any, Any], path: tuple[int, ...] = ()
                    ) -> AsyncIterator[bytes]:
    """The ``summaries`` answer, streamed: searched, sorted and encoded a few origins at a time
    in a worker thread. The whole of ``Psi`` is quadratic (a million rows for 1,000 locations),
    and done at once its sort and encoding were single C calls holding the GIL for seconds,
    stalling every other dataflow's traffic."""
    searches = summaries_by_origin(graph, origins)
    location_json = _located(path)

    def pieces() -> Iterator[str]:
        for origin, reached in searches:
            source = location_json(origin)
            # One sort (or dump) of an origin reaching 100,000 locations held the GIL ~0.3 s: a
            # wide origin's rows follow the graph's order instead, and are dumped in slices.
            targets = ([b for b in graph.outputs_first() if b in reached] if len(reached) > 4096
                       else sorted(reached, key=_location_order))
            for start in range(0, len(targets), 512):
                rows = [{"from": source, "to": location_json(b),
                         "summaries": [list(s) for s in reached[b].elements()]}
                        for b in targets[start:start + 512] if _matches(b, *dest)]
                for b in targets[start:start + 512]:  # let go as we go: one release of it all took ~30 ms
                    del reached[b]
                if rows:
                    yield json.dumps(rows, separators=(",", ":"))[1:-1]

    rows = pieces()

    def chunk() -> str | None:
        parts: list[str] = []
        size = 0
        for piece in rows:
            parts.append(piece)
            size += len(piece)
            if size > 65536:
                break
        return ",".join(parts) if parts else None

    # The collector stays off until the answer is sent (or abandoned): a search's ~3 objects per
    # location drew collector passes of ~40 ms, and with a pause per chunk the first pass after
    # it still walked the 100,000 entries of a wide origin (45 ms); by the end they are released.
    with collector_paused():
        yield b"["
        first = True
        while (encoded := await asyncio.to_thread(chunk)) is not None:
            yield (encoded if first else "," + encoded).encode()
            first = False
        yield b"]"


@router.get("/dataflows/{id}/frontier/explain", response_model=ExplainResponse, responses=_ERRORS,
            summary="Why a notification is (not) safe yet")
async def frontier_explain(
    dataflow: DataflowDep,
    node: Annotated[int, Query(ge=0, le=2**31 - 1)], port: Annotated[int, Query(ge=0, le=2**31 - 1)],
    kind: Annotated[Literal["source", "target"], Query()],
    time: Annotated[str, Query(max_length=1000, description="comma-separated coordinates, e.g. 2,7")],
    scope: ScopeQ = None,
) -> JSONResponse:
    """The active pointstamps that hold ``(location, time)`` back, each with its summary and
    one path, and a sentence saying what it means. In a nested dataflow the path may cross scope
    boundaries (its steps say ``via`` ingress or egress); ``time`` is in the location's scope."""
    path = _scope(dataflow, scope) or ()
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

    def search() -> dict[str, Any]:
        with collector_paused():  # a search's ~3 objects per location drew collector passes of ~40 ms
            return explain(dataflow.graph, counts, frontier, version, location, tuple(parts), blame)

    return JSONResponse(await asyncio.to_thread(search))


@router.get("/dataflows/{id}/lag", response_model=LagResponse, responses=_ERRORS,
            summary="How long each frontier has waited, and its oldest pointstamp")
async def lag(dataflow: DataflowDep) -> Response:
    """Every location (scope-qualified) with its operator's name, its frontier, the wall-clock
    seconds since that frontier last changed (``null`` once empty), and its oldest live
    pointstamp with the worker that last reported it and its age."""
    return _chunked(await asyncio.to_thread(lag_report(dataflow, time_now())))


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
            responses={**_ERRORS, **_LIMITED, 410: {"model": ErrorBody, "description": "the dataflow was deleted"},
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


async def _explain_nested(dataflow: Tenant, hosting: Hosting, location: ScopedLocation, text: str) -> JSONResponse:
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
    return JSONResponse(await asyncio.to_thread(lambda: explain_nested(
        hosting.steps, counts, frontier, version, location, when,
        lambda origin, at: flat_blame(hosting.flat(origin), at))))


def _located(path: tuple[int, ...]) -> Callable[[Location], dict[str, Any]]:
    """JSON of the locations of scope ``path`` (``scope`` only when not the root)."""
    if not path:
        return location_json
    return lambda loc: {"scope": list(path), **location_json(loc)}
