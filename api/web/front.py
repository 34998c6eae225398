"""The front of a sharded service: what answers for every shard at once, off the hot path.

It serves registration (sent to the least loaded shard that answers), the lists (every shard's,
merged), ``/metrics`` (every shard's series with a ``shard`` label, :mod:`api.shards.merge`),
``/healthz`` (``ok`` when every shard is), ``/v1/processes`` and the dashboard's page. It holds no
dataflow and no log: every answer comes from the shards, so restarting it loses nothing.

A dataflow's own routes never reach it behind the proxy, which sends them to the dataflow's
shard; what does reach it is an id no shard has (404 ``unknown_dataflow``) or, when the front is
the public address itself (no HAProxy installed), a dataflow's request, answered with a
redirect (307) to its shard's endpoint (WebSockets: workers connect to the endpoint).

Load is each shard's count of live dataflows (deleted ones are not counted), read from its
``/healthz`` every second, plus the registrations the front sent it since that read was asked. A registration is
retried on another shard only when the first could not be connected to (nothing was sent): a
request sent and unanswered is not resent, as it may have registered.

>>> from api.shards.layout import Shard
>>> shards = Shards([Shard(0, "http://a", True), Shard(1, "http://b", True)])
>>> shards.load.update({0: 5, 1: 2}); [s.index for s in shards.by_load()]
[1, 0]
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, Response

from api.config import Settings
from api.shards.ids import shard_of
from api.shards.layout import Shard
from api.shards.merge import merge_health, merge_metrics
from api.web import dashboard
from api.web.app import answer_errors
from api.web.sql import add_front_sql

logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request to a shard, every second
POLL_SECONDS = 1.0
"""How often the front reads each shard's load (its ``/healthz``)."""
_FORWARDED = ("authorization", "content-type", "accept")
"""The request headers passed on to a shard."""


class Shards:
    """The shards the front answers for, their last known load and whether they answered."""

    def __init__(self, shards: list[Shard]) -> None:
        self.shards = shards
        self.by_index = {s.index: s for s in shards}
        self.load: dict[int, int] = {s.index: 0 for s in shards}
        self.up: dict[int, bool] = {s.index: True for s in shards}
        self.sent: dict[int, int] = {s.index: 0 for s in shards}
        """Registrations each shard accepted through the front (a running total)."""

    def by_load(self) -> list[Shard]:
        """The shards that answered last, least loaded first (ties: lowest index)."""
        return sorted((s for s in self.shards if self.up[s.index]), key=lambda s: (self.load[s.index], s.index))


def _headers(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k in _FORWARDED}


async def _ask(client: httpx.AsyncClient, shard: Shard, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
    """One shard's answer, or ``None`` if it could not be reached or did not answer in time."""
    try:
        return await client.request(method, shard.endpoint + path, **kwargs)
    except httpx.HTTPError:
        return None


def _unavailable(shard: Shard) -> JSONResponse:
    return JSONResponse({"error": "shard_unavailable", "shard": shard.index,
                         "detail": f"shard {shard.index} ({shard.endpoint}) does not answer"}, status_code=503)


def create_front(shards: list[Shard], *, proxied: bool,
                 supervised: Callable[[], Coroutine[Any, Any, None]] | None = None,
                 settings: Settings | None = None) -> FastAPI:
    """The front's app over ``shards``; ``proxied``: HAProxy sends the dataflows' routes to the
    shards (else the front redirects them); ``supervised``: the supervisor's heartbeat;
    ``settings``: the service's (the warehouse and the SQL limits of ``POST /v1/sql``)."""
    known = Shards(shards)
    client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=1.0),
                               limits=httpx.Limits(max_keepalive_connections=64))

    async def health(shard: Shard) -> httpx.Response | bool:
        """The shard's ``/healthz``, or whether it could be reached at all (a slow answer on a busy
        machine is no reason to send registrations elsewhere; a refused connection is)."""
        try:
            return await client.get(shard.endpoint + "/healthz", timeout=5.0)
        except httpx.TimeoutException:
            return True
        except httpx.HTTPError:
            return False

    async def poll() -> None:
        while True:
            sent = dict(known.sent)  # those after this are not in the answers yet
            answers = await asyncio.gather(*(health(s) for s in shards))
            for shard, answer in zip(shards, answers, strict=True):
                if isinstance(answer, bool):
                    known.up[shard.index] = answer
                    continue
                known.up[shard.index] = answer.status_code == 200
                if answer.status_code == 200:
                    known.load[shard.index] = (int(answer.json().get("live_dataflows", 0))
                                               + known.sent[shard.index] - sent[shard.index])
            await asyncio.sleep(POLL_SECONDS)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(poll())]
        if supervised is not None:
            tasks.append(asyncio.create_task(supervised()))
        yield
        for task in tasks:
            task.cancel()
        await client.aclose()

    app = FastAPI(title="Timely progress tracker (front)", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.shards = known
    answer_errors(app)

    async def everywhere(request: Request, path: str) -> list[tuple[Shard, httpx.Response | None]]:
        answers = await asyncio.gather(*(_ask(client, s, request.method, path, headers=_headers(request),
                                              params=request.query_params) for s in shards))
        return list(zip(shards, answers, strict=True))

    @app.post("/v1/dataflows", status_code=201)
    async def register(request: Request) -> Response:
        """Registration, on the least loaded shard (its answer as it is, ``endpoint`` included)."""
        body = await request.body()
        for shard in known.by_load() or shards:
            try:
                answer = await client.post(shard.endpoint + "/v1/dataflows", content=body, headers=_headers(request))
            except httpx.ConnectError:
                known.up[shard.index] = False
                continue  # nothing was sent: another shard may take it
            except httpx.HTTPError:
                return _unavailable(shard)  # sent, unanswered: it may have registered, so not resent
            if answer.status_code == 201:
                known.load[shard.index] += 1
                known.sent[shard.index] += 1
            return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))
        return JSONResponse({"error": "shard_unavailable", "detail": "no shard answers"}, status_code=503)

    @app.get("/v1/dataflows")
    async def dataflows(request: Request) -> Response:
        """Every shard's list, merged oldest first. A token no shard knows: the shards' 401; a
        shard that does not answer is named in ``X-Tracker-Shards-Unavailable`` (the list lacks
        its dataflows)."""
        answers = await everywhere(request, "/v1/dataflows")
        listed = [row for _, a in answers if a is not None and a.status_code == 200 for row in a.json()]
        refusals = [a for _, a in answers if a is not None and a.status_code != 200]
        if refusals and not any(a is not None and a.status_code == 200 for _, a in answers):
            first = refusals[0]
            return Response(first.content, first.status_code, media_type=first.headers.get("content-type"))
        missing = [str(s.index) for s, a in answers if a is None]
        return JSONResponse(sorted(listed, key=lambda d: d["created_at"] or ""),
                            headers={"X-Tracker-Shards-Unavailable": ",".join(missing)} if missing else None)

    @app.get("/v1/processes")
    async def processes(request: Request) -> Response:
        """Every shard's processes (admin), each tagged with its shard."""
        answers = await everywhere(request, "/v1/processes")
        found: list[dict[str, Any]] = []
        for shard, answer in answers:
            if answer is not None and answer.status_code != 200:
                return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))
            found += [{**p, "shard": shard.index} for p in (answer.json() if answer is not None else [])]
        return JSONResponse(found)

    @app.get("/healthz")
    async def healthz(request: Request) -> dict[str, Any]:
        """``ok`` when every shard is, ``degraded`` otherwise, with each shard's own answer (the
        details a shard gives the admin token only, when the request bears it)."""
        answers = await asyncio.gather(*(_ask(client, s, "GET", "/healthz", headers=_headers(request), timeout=2.0)
                                         for s in shards))
        return merge_health({s.index: (a.status_code, a.json()) if a is not None else None
                             for s, a in zip(shards, answers, strict=True)},
                            {s.index: s.endpoint for s in shards})

    @app.get("/metrics")
    async def metrics() -> Response:
        """Every shard's series, labelled ``shard``, and ``tracker_shard_up``."""
        answers = await asyncio.gather(*(_ask(client, s, "GET", "/metrics", timeout=5.0) for s in shards))
        texts = {s.index: a.text if a is not None and a.status_code == 200 else None
                 for s, a in zip(shards, answers, strict=True)}
        return Response(merge_metrics(texts), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> Response:
        """The shards' API description (every shard serves the same routes)."""
        for shard in known.by_load() or shards:
            if (answer := await _ask(client, shard, "GET", "/openapi.json")) is not None:
                return Response(answer.content, answer.status_code, media_type="application/json")
        return JSONResponse({"error": "shard_unavailable", "detail": "no shard answers"}, status_code=503)

    def owner(dataflow_id: str) -> Shard | None:
        index = shard_of(dataflow_id)
        return known.by_index.get(index) if index is not None else None

    def unknown(dataflow_id: str) -> JSONResponse:
        return JSONResponse({"error": "unknown_dataflow", "detail": f"no dataflow with id {dataflow_id!r}"},
                            status_code=404)

    @app.api_route("/v1/dataflows/{id}{rest:path}", methods=["GET", "POST", "DELETE"], include_in_schema=False)
    @app.api_route("/dashboard/api/dataflows/{id}{rest:path}", methods=["GET"], include_in_schema=False)
    async def dataflow(request: Request, id: str) -> Response:
        """A dataflow's route at the front: its shard's endpoint (no proxy), else an unknown id."""
        shard = owner(id)
        if shard is None or proxied:
            return unknown(id)
        target = shard.endpoint + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(target, status_code=307)

    @app.websocket("/v1/dataflows/{id}/ws")
    async def socket(websocket: WebSocket, id: str) -> None:
        """Refused (403 at the handshake): a WebSocket reaches its shard through the proxy or at
        the dataflow's ``endpoint``."""
        shard = owner(id)
        with contextlib.suppress(Exception):
            await websocket.close(code=1008, reason=f"connect at the dataflow's endpoint ({shard.endpoint})" if shard
                                  else "unknown_dataflow")

    add_front_sql(app, shards, client, settings or Settings())
    app.include_router(dashboard.pages)
    return app
