"""The v1 routes of a dataflow as a resource: register it, list, read and delete it, report its
progress, and read its counts, scopes and path summaries.

Guarantees: every route is thin (it calls the service or :mod:`api.host.ingest`), reads only
published (durable) state, and answers every client mistake with a 4xx and a JSON body
``{"error", "detail"}``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from api.background.spark import Unavailable
from api.durability.wal import LogFailed
from api.host.ingest import bad_body, gone, submit
from api.schema.bodies import collector_paused, detail_json, graph_json, parse_registration_sliced
from api.schema.models import (
    DataflowDetail,
    ErrorBody,
    ListedDataflow,
    PointstampRow,
    ProgressResponse,
    RegisterResponse,
    ScopeInfo,
    SummaryRow,
    location_json,
)
from api.schema.parsing import InvalidRequest, MalformedJSON
from api.schema.spec import initial_json
from api.web.deps import (
    AdminDep,
    DataflowDep,
    LimitsDep,
    PrincipalDep,
    RegistrarDep,
    ServiceDep,
    registration_headers,
    registration_slot,
    require_json,
)
from api.web.params import (
    ERRORS,
    LIMITED,
    KindQ,
    NodeQ,
    ScopeQ,
    chunked,
    location_order,
    matches,
    scope_path,
)
from tracker.graph import Graph, Location
from tracker.structure import summaries_by_origin

router = APIRouter(prefix="/v1")
PSI_LOCATIONS = 2_000  # the whole of Psi is quadratic (streamed): beyond this, ask for one origin at a time


@router.post("/dataflows", status_code=201, response_model=RegisterResponse,
             responses={**ERRORS, **LIMITED, 415: {"model": ErrorBody, "description": "the body is declared as "
                                                                                     "something else than JSON"}},
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": {"$ref": "#/components/schemas/RegisterRequest"}}}}},
             summary="Register a dataflow graph")
async def register(request: Request, service: ServiceDep, caller: RegistrarDep, limits: LimitsDep) -> JSONResponse:
    """Validate the graph (422 naming the problem or the offending cycle), store it durably and
    return its id and token (admin or program token; 403 for a dataflow's). The Spark cycle check
    and summaries run in the background; see ``status.spark_check``.

    The body (schema ``RegisterRequest``) is parsed by
    :func:`api.schema.bodies.parse_registration_sliced` (as :func:`api.schema.parsing.parse_registration`,
    in slices, off the loop), strictly, as the progress bodies are: JSON that is not one document
    is 400. Admission comes first (429 ``rate_limited`` or ``too_many_dataflows``), so that a
    flood costs no parsing. An ``Idempotency-Key`` header makes the registration idempotent: sent
    again with the same key and graph, it is answered as the first time (201, the same id and
    token, with ``Idempotent-Replayed: true``); with another graph, 409 ``idempotency_key_reused``."""
    key, deadline = registration_headers(request)
    slot = registration_slot(limits, service, caller)
    try:
        require_json(request.headers.get("content-type"))
        with collector_paused():
            try:
                # Off the loop and in slices: a 50,000-node body took 2.2 s of validation in one call.
                body = await asyncio.to_thread(parse_registration_sliced, await request.body())
            except (MalformedJSON, InvalidRequest) as error:
                raise bad_body(error) from None
            registered = await service.register(body, caller, key, deadline)
    finally:
        slot.release()
    return JSONResponse({"id": registered.tenant.id, "token": registered.token, "endpoint": service.settings.endpoint},
                        status_code=201, headers={"Idempotent-Replayed": "true"} if registered.replayed else None)


@router.get("/dataflows", response_model=list[ListedDataflow], responses=ERRORS, summary="List dataflows")
async def list_dataflows(
    service: ServiceDep, caller: PrincipalDep,
    state: Annotated[Literal["running", "complete", "stalled", "violation", "deleted", "damaged"] | None, Query(
        description="only dataflows in this state (default: every state but deleted)")] = None,
    name: Annotated[str | None, Query(max_length=200, description="only dataflows registered with this name")] = None,
    idempotency_key: Annotated[str | None, Query(max_length=200, description=(
        "only the dataflow registered with this Idempotency-Key"))] = None,
) -> list[dict[str, Any]]:
    """Every dataflow the token may see (the admin: all; the program token: those it registered;
    a dataflow token: its own), oldest first, filtered by ``state``, ``name`` and
    ``idempotency_key``; deleted ones only with ``state=deleted``. A dataflow recovery refused is
    listed with state ``damaged`` and the reason (``detail``)."""
    found = []
    for dataflow in service.dataflows.values():
        if (name is not None and dataflow.name != name) or (
                idempotency_key is not None and dataflow.registration.key != idempotency_key):
            continue
        if not (dataflow.ready and caller.may_access(dataflow.id, dataflow.token_hash)):
            continue
        now = dataflow.lifecycle()["state"]
        if now == state or (state is None and now != "deleted"):
            found.append(dataflow.summary(now))
    if state in (None, "damaged") and idempotency_key is None:
        found += [damaged.summary() for damaged in service.damaged.values()
                  if caller.may_access(damaged.id) and (name is None or damaged.name == name)]
    return sorted(found, key=lambda d: d["created_at"] or "")


@router.delete("/dataflows/{id}", status_code=204, response_class=Response,
               responses={**ERRORS, 410: {"model": ErrorBody, "description": "already deleted"},
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


@router.post("/dataflows/{id}/audit", status_code=202, summary="Audit a dataflow now (admin)",
             responses={**ERRORS, 409: {"model": ErrorBody, "description": "Spark is off, the dataflow is not "
                                                                         "audited, or an audit of it is in flight"},
                        503: {"model": ErrorBody, "description": "the Spark process is not ready"}})
async def audit_dataflow(dataflow: DataflowDep, service: ServiceDep, _caller: AdminDep) -> dict[str, Any]:
    """Queue an audit of the dataflow's published frontier by Spark, now, besides the periodic
    ones (``TRACKER_AUDIT_SECONDS``); 202 with the version audited. The result lands in
    ``status.audit`` when Spark is done. 409 ``spark_off``, ``not_audited`` or ``audit_in_flight``;
    503 ``spark_unavailable`` while the Spark process is down or its session is starting."""
    try:
        version = service.background.audit(dataflow)
    except Unavailable as why:
        status, error = {"off": (409, "spark_off"), "not_audited": (409, "not_audited"),
                         "busy": (409, "audit_in_flight")}.get(why.reason, (503, "spark_unavailable"))
        raise HTTPException(status, {"error": error, "detail": why.detail}) from None
    return {"queued": "audit", "dataflow": dataflow.id, "version": version}


@router.get("/dataflows/{id}", response_model=DataflowDetail, responses=ERRORS, summary="A dataflow")
async def get_dataflow(dataflow: DataflowDep, service: ServiceDep) -> Response:
    """The graph, arity, version, its shard's ``endpoint`` and status (Spark check, last audit,
    Delta lag, workers)."""
    registration = dataflow.registration
    detail = {**dataflow.summary(), "initial": initial_json(registration), "last_epoch": registration.last_epoch,
              "endpoint": service.settings.endpoint, "status": dataflow.status()}
    if dataflow.graph_json is None:
        dataflow.graph_json = await asyncio.to_thread(graph_json, registration.nodes, registration.edges)
    return chunked(detail_json(detail, dataflow.graph_json))


@router.post("/dataflows/{id}/progress", response_model=ProgressResponse, summary="Report a progress batch",
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": {"$ref": "#/components/schemas/ProgressRequest"}}}}},
             responses={**ERRORS, 409: {"model": ErrorBody, "description": "sequence gap; see `expected`"},
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


@router.get("/dataflows/{id}/pointstamps", responses=ERRORS, summary="Non-zero occurrence counts",
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


@router.get("/dataflows/{id}/scopes", response_model=list[ScopeInfo], responses=ERRORS,
            summary="Nested scopes and their summaries")
async def scopes(dataflow: DataflowDep) -> JSONResponse:
    """Every nested scope (``[]`` for a flat dataflow): its path, kind, the arity of its times,
    and its summaries as an operator, from each input to each output, in the parent's time."""
    return JSONResponse([] if dataflow.hosting is None else dataflow.hosting.scopes_json())


@router.get("/dataflows/{id}/summaries", response_model=list[SummaryRow], responses=ERRORS,
            summary="Minimal path summaries Psi")
async def summaries(dataflow: DataflowDep, from_node: NodeQ = None, from_port: NodeQ = None, from_kind: KindQ = None,
                    to_node: NodeQ = None, to_port: NodeQ = None, to_kind: KindQ = None,
                    scope: ScopeQ = None) -> Response:
    """``Psi`` rows, optionally filtered on either end, sorted by origin then destination;
    ``scope``: within that scope of a nested dataflow (default: the root), in its time."""
    path = scope_path(dataflow, scope) or ()
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
        lambda: sorted((loc for loc in graph.locations() if matches(loc, from_node, from_port, from_kind)),
                       key=location_order))
    return StreamingResponse(_psi_json(graph, origins, (to_node, to_port, to_kind), path),
                             media_type="application/json")


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
                       else sorted(reached, key=location_order))
            for start in range(0, len(targets), 512):
                rows = [{"from": source, "to": location_json(b),
                         "summaries": [list(s) for s in reached[b].elements()]}
                        for b in targets[start:start + 512] if matches(b, *dest)]
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


def _located(path: tuple[int, ...]) -> Callable[[Location], dict[str, Any]]:
    """JSON of the locations of scope ``path`` (``scope`` only when not the root)."""
    if not path:
        return location_json
    return lambda loc: {"scope": list(path), **location_json(loc)}
