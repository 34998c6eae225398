"""The FastAPI application: lifespan (recovery, background tasks), error handling, body limit.

Guarantees: requests are served only after recovery; on shutdown the Delta sync finishes its
commit in progress and flushes the rest before the log closes (the log still holds everything
if that fails).

>>> import tempfile
>>> from pathlib import Path
>>> app = create_app(Settings(warehouse=Path(tempfile.mkdtemp()), delta=False, spark=False), "admin")
>>> [path for path in app.openapi()["paths"] if path.startswith("/v1/dataflows/{id}/frontier")]
['/v1/dataflows/{id}/frontier', '/v1/dataflows/{id}/frontier/explain', '/v1/dataflows/{id}/frontier/stream']

Every client mistake is a 4xx with a JSON body ``{"error": ..., "detail": ...}``: malformed JSON
400, oversized body 413, a body that does not fit the schema 422 (naming the field), a graph or
update the tracker refuses 422 (naming the culprit). Only a bug in the service answers 500.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.config import ENGINE_NAMES, Settings
from api.delta.store import Store
from api.durability.wal import LogFailed
from api.host.ingest import Refused
from api.host.service import RegistrationError, Service
from api.host.tokens import load_program_token
from api.ops.scrape import service_scrape
from api.schema.models import ErrorBody, ProgressRequest, RegisterRequest
from api.web import dashboard
from api.web.activity import router as activity_routes
from api.web.auth import bearer_or_none
from api.web.dataflows import router as dataflows_routes
from api.web.deps import admin
from api.web.frontiers import router as frontier_routes
from api.web.limits import Limits, Registrations, Subscriptions
from api.web.sql import router as sql_routes
from api.web.ws import router as sockets

log = logging.getLogger("tracker.app")
FULL_COLLECTION_EVERY = 100
"""Generation-1 collections between two full (generation-2) garbage collections (CPython's
default is 10); set when the service has recovered."""
_DOCUMENTED_ERRORS = {"400": "malformed JSON", "401": "missing or unknown token",
                      "403": "the token may not access this", "404": "unknown dataflow or version",
                      "413": "body too large", "422": "invalid request"}
_NAMES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
          409: "conflict", 413: "body_too_large", 422: "invalid_request", 429: "rate_limited"}


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, whether or not they declare a length."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.limit
                except ValueError:
                    too_big = False
                if too_big:
                    await self._refuse(send)
                    return
                # The HTTP server enforces the declared length, so the body cannot exceed it.
                await self.app(scope, receive, send)
                return
        # No declared length (chunked): read the body first, up to the limit, then replay it.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    async def _refuse(self, send: Send) -> None:
        detail = f"request bodies are limited to {self.limit} bytes"
        response = JSONResponse({"error": "body_too_large", "detail": detail},
                                status_code=413)
        await response({"type": "http"}, _no_receive, send)


def _replay(messages: list[Message], then: Receive) -> Receive:
    """``messages`` first, then the real ``receive`` (which reports the client disconnecting)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        return await then()

    return receive


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def _readable(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"loc": ".".join(str(p) for p in e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")}
            for e in errors]


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus the schemas of bodies parsed by hand (``ProgressRequest``,
    ``RegisterRequest``)."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (ProgressRequest, RegisterRequest):
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
        components["ErrorBody"] = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
        error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
        # Every client mistake on an authenticated route answers ErrorBody (see the handlers
        # above), including FastAPI's own 422, whose default schema would be wrong here. Auth is
        # a security scheme (Swagger UI's "Authorize" button), not a header parameter each.
        for path, operations in schema.get("paths", {}).items():
            if not (path.startswith("/v1") or path.startswith("/dashboard/api")):
                continue
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                for code, text in _DOCUMENTED_ERRORS.items():
                    if code == "422" or code not in responses:
                        responses[code] = {"description": responses.get(code, {}).get("description", text), **error}
                params = [p for p in operation.get("parameters", []) if p.get("name", "").lower() != "authorization"]
                operation["parameters"] = params
                if not params:
                    del operation["parameters"]
                operation["security"] = [{"bearer": []}]
        schema["components"]["securitySchemes"] = {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "The admin token (TRACKER_ADMIN_TOKEN), the program token (TRACKER_PROGRAM_TOKEN: "
                           "registers dataflows, then reads and writes those it registered) or a dataflow's token "
                           "from its registration"}}
        app.openapi_schema = schema
    return app.openapi_schema


_WEBSOCKET_DOC = """

**WebSocket** (not expressible in OpenAPI): `GET /v1/dataflows/{id}/ws` upgrades to a WebSocket
(`Authorization: Bearer`, or `?token=` from a browser; `?subscribe=false` for acks only). The
client sends progress batches, the `POST .../progress` body as a text frame (or a binary frame
of the same UTF-8 JSON); the server sends `{"type": "snapshot", "version", "locations"}` first,
then `{"type": "changes", "version", "changes"}` and one `{"type": "ack", "worker", "seq",
"applied", "duplicate", "version"}` or `{"type": "error", "status", "error", "detail"}` per batch,
in the order sent, and `{"type": "resync", ...}` followed by a fresh snapshot if the client fell
behind. A refused handshake answers the same 401/403/404 as the REST routes; a subscribing
socket beyond the subscriber limits is accepted and closed with 1013 (try again later) and a reason."""


def answer_errors(app: FastAPI) -> None:
    """Every client mistake answered as ``{"error", "detail"}`` (FastAPI's own 422 and 400
    included), and a bug in the service as 500 ``internal_error`` (logged with its traceback)."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = list(error.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse({"error": "malformed_json", "detail": _readable(errors)}, status_code=400)
        return JSONResponse({"error": "invalid_request", "detail": _readable(errors)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        body = error.detail if isinstance(error.detail, dict) else {
            "error": _NAMES.get(error.status_code, "error"), "detail": error.detail}
        if error.status_code == 400 and body.get("error") == "bad_request":  # FastAPI could not decode the body
            body = {"error": "malformed_json", "detail": "the body is not valid JSON in UTF-8"}
        return JSONResponse(body, status_code=error.status_code, headers=getattr(error, "headers", None))

    @app.exception_handler(Exception)
    async def crashed(request: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error", extra={"path": request.url.path})
        return JSONResponse({"error": "internal_error", "detail": "see the service log"}, status_code=500)


def _admin(service: Service, authorization: str | None) -> bool:
    """Whether an ``Authorization`` header (maybe absent) bears the admin token."""
    token = bearer_or_none(authorization)
    caller = service.authenticate(token) if token is not None else None
    return caller is not None and caller.admin


SYNC_PROCESS_LOST = 75
"""The hot path's exit code when its log's sync process is gone (``EX_TEMPFAIL``: start it again)."""


def _exit_to_be_restarted() -> None:
    """The log's sync process is gone (killed): exit at once, answering nothing more, so that the
    supervisor starts this process again and it recovers from the log as after a crash; workers
    resend what was not acknowledged. Otherwise every batch would be refused (503 ``log_failed``)
    until someone restarted the service."""
    log.critical("the write-ahead log's sync process is gone; exiting to be restarted")
    os._exit(SYNC_PROCESS_LOST)


def create_app(settings: Settings, admin_token: str,
               supervised: Callable[[], Coroutine[Any, Any, None]] | None = None) -> FastAPI:
    """The application for ``settings`` (``uvicorn`` serves it; tests start it the same way);
    ``supervised``: run once recovered, until shutdown (the supervisor's heartbeat)."""
    store = None
    if settings.delta:
        try:
            store = Store(settings.warehouse)
        except Exception:
            log.exception("Delta storage unavailable; running on the write-ahead log alone")
    service = Service(settings, admin_token, store,
                      program_token=load_program_token(settings.warehouse, settings.program_token))
    service.metrics.scrape_source = lambda: service_scrape(service.dataflows.values(), service.background.health())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started = time.perf_counter()
        service.loop = asyncio.get_running_loop()
        await asyncio.to_thread(service.recover)
        # Everything recovered (graphs, trackers, histories) is long-lived: keep it out of the
        # collector's full passes, which otherwise lengthen the latency tail.
        gc.collect()
        gc.freeze()
        # Full passes 10x rarer than CPython's default: each walks every young-enough object
        # (5-30 ms under the benchmark's abuses), and what they reclaim is only cyclic garbage,
        # which the service makes little of. Isolation benchmark's far rewinds: 14 full passes
        # in 6 s -> 2, the probe's p99 4.0 -> 2.9 ms.
        gc.set_threshold(*gc.get_threshold()[:2], FULL_COLLECTION_EVERY)
        log.info("recovered", extra={"dataflows": len(service.dataflows),
                                     "seconds": round(time.perf_counter() - started, 3)})
        tasks = []
        if supervised is not None:
            tasks.append(asyncio.create_task(supervised()))
            service.wal.on_sync_process_lost = _exit_to_be_restarted
        service.background.start()
        service.after_recovery()
        stop = asyncio.Event()
        flusher = asyncio.create_task(service.syncer.run(
            stop, flush_seconds=settings.flush_seconds, compact_seconds=settings.compact_seconds,
            tidy_seconds=settings.tidy_seconds))
        yield
        # Spark is another process's: nothing to wait for here, only no new work to send.
        service.stopping = True
        service.background.stop()
        for task in tasks:
            task.cancel()
        stop.set()  # the flusher finishes its commit in progress, flushes the rest and returns
        try:
            await asyncio.wait_for(flusher, 30)
        except Exception:
            log.exception("final Delta flush failed; the log still holds every batch")
        service.wal.close()
        service.delta_pool.shutdown(wait=False, cancel_futures=True)
        processes = getattr(app.state, "sql_processes", None)
        if processes is not None:
            processes.close()

    app = FastAPI(
        title="Timely progress tracker",
        version="1.0.0",
        description="Progress tracking for timely dataflow as a service: register a graph, report atomic "
                    "progress batches, query and stream exact frontiers. See docs/reference.md." + _WEBSOCKET_DOC,
        lifespan=lifespan,
        docs_url=None,  # served below from vendored assets: FastAPI's default page loads them from a CDN
        redoc_url=None,
    )
    app.state.service = service
    app.state.limits = Limits(
        Registrations(settings.register_rate, settings.register_burst, settings.max_dataflows),
        Subscriptions(settings.max_subscribers_per_dataflow, settings.max_subscribers))

    answer_errors(app)

    @app.exception_handler(Refused)
    async def refused_body(request: Request, error: Refused) -> JSONResponse:
        return JSONResponse(error.body, status_code=error.status)

    @app.exception_handler(RegistrationError)
    async def refused(request: Request, error: RegistrationError) -> JSONResponse:
        return JSONResponse(error.body, status_code=422)

    @app.exception_handler(LogFailed)
    async def log_down(request: Request, error: LogFailed) -> JSONResponse:
        return JSONResponse({"error": "log_failed", "detail": str(error)}, status_code=503)

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, error: ClientDisconnect) -> Response:
        # Nobody reads the answer; a client leaving mid-body is not the service's error.
        log.info("client went away before its request body arrived", extra={"path": request.url.path})
        return Response(status_code=400)

    @app.get("/healthz", summary="Liveness", responses={503: {"description": "the write-ahead log failed"}})
    async def healthz(request: Request) -> Any:
        """Open (no token): the service is up and serving. 503 ``failed`` once the log failed
        (nothing is acknowledged until a restart); 200 ``degraded`` while it serves but some
        dataflow was refused at recovery (``damaged_count``), recovery found Delta tables damaged
        (``delta_damaged``: their names) or the Delta writes fail (``delta_failing``); 200 ``ok``
        otherwise. Which dataflows were refused and why (``damaged``: ids, names, log positions),
        what is wrong with the tables and the Delta error are for the admin token only."""
        if service.wal.failed is not None:
            return JSONResponse({"status": "failed", "detail": "the write-ahead log failed; restart"},
                                status_code=503)
        admin = _admin(service, request.headers.get("authorization"))
        syncer = service.syncer
        problems: dict[str, Any] = {}
        if service.damaged:
            problems["damaged_count"] = len(service.damaged)
            if admin:
                problems["damaged"] = [{"id": d.id, "name": d.name, "detail": d.detail}
                                       for d in sorted(service.damaged.values(), key=lambda d: d.id)]
        if service.delta_damaged:
            problems["delta_damaged"] = sorted(service.delta_damaged)
            if admin:
                problems["delta_damaged_detail"] = service.delta_damaged
        if syncer.failing_since is not None:
            problems["delta_failing"] = {"since": round(syncer.failing_since, 3), "lag_versions": syncer.measure_lag(),
                                         **({"error": syncer.last_error} if admin else {})}
        return {"status": "degraded" if problems else "ok", **problems, "dataflows": len(service.dataflows),
                "live_dataflows": sum(d.deleted_at is None for d in service.dataflows.values()),
                "engine": ENGINE_NAMES[settings.engine], "spark": service.background.health(),
                **service.background.why(),
                **({"graph_engine": service.background.graph_engine(),
                    "spark_pending": service.background.pending()} if settings.spark else {}),
                "delta": service.store is not None, "uptime_seconds": round(time.time() - service.started, 1)}

    @app.get("/v1/processes", summary="The service's processes (admin)",
             dependencies=[Depends(admin)])
    async def processes() -> list[dict[str, Any]]:
        """Each process of the service with its role and pid: the supervisor (``tracker serve``),
        this hot-path process (whether pyspark or py4j is among its loaded modules, read now:
        never, by design) and the Spark process (its state, niceness, master and JVM pid), if one
        is connected."""
        found: list[dict[str, Any]] = []
        if supervised is not None:
            found.append({"role": "supervisor", "pid": os.getppid()})
        found.append({"role": "hot", "pid": os.getpid(), "shard": settings.shard, "endpoint": settings.endpoint,
                      "pyspark": "pyspark" in sys.modules, "py4j": "py4j" in sys.modules, "jvm": None})
        if (spark := service.background.process()) is not None:
            found.append(spark)
        return found

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    async def metrics() -> Response:
        """Prometheus text exposition (open, like ``/healthz``)."""
        # The dataflows' state is read here, on the loop (copies); the rows and text are made off it.
        scrape = service_scrape(service.dataflows.values(), service.background.health())
        body = await asyncio.to_thread(service.metrics.render, scrape)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        """Swagger UI over ``/openapi.json``, its script and style vendored (works offline), started
        by ``/static/docs.js``: FastAPI's own page starts it with an inline script, which the
        Content-Security-Policy (:mod:`api.web.security`) refuses."""
        return FileResponse(dashboard.STATIC / "docs.html", media_type="text/html")

    app.include_router(dataflows_routes)
    app.include_router(frontier_routes)
    app.include_router(activity_routes)
    app.include_router(sockets)
    app.include_router(sql_routes)
    app.include_router(dashboard.router)
    app.include_router(dashboard.pages)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_middleware(BodyLimit, limit=settings.max_body)
    return app
