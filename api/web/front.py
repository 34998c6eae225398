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
``/healthz`` every second (a shard that does not answer within :data:`SHARD_SECONDS`, or refuses
the connection, is down until it answers again), plus the registrations the front sent it since
that read was asked.

A registration goes to the least loaded shard that is up, with an idempotency key (the client's
``Idempotency-Key``, else one the front makes) and a deadline :data:`ATTEMPT_SECONDS` ahead; if
that shard cannot be reached or does not answer within the deadline and :data:`GRACE_SECONDS`,
the next one gets it with the same key: a shard refuses a registration it would log after its
deadline and withdraws one that became durable after it (:mod:`api.host.keys`), so the one the
front answers with is the one kept. A client's retry with its key first looks for the key on
every shard, and goes back to the shard that has it (which answers as the first time). Lists,
health and metrics wait at most :data:`SHARD_SECONDS` for each shard and name those that did
not answer. A refusal is the most telling one the shards gave: a token one shard knows but may
not use there (403) over the others' 401.

>>> from api.shards.layout import Shard
>>> shards = Shards([Shard(0, "http://a", True), Shard(1, "http://b", True)])
>>> shards.load.update({0: 5, 1: 2}); [s.index for s in shards.by_load()]
[1, 0]
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, Response

from api.config import Settings
from api.host.keys import DEADLINE_HEADER, KEY_HEADER
from api.shards.ids import shard_of
from api.shards.layout import Shard
from api.shards.merge import merge_health, merge_metrics
from api.web import dashboard
from api.web.app import answer_errors
from api.web.sql import add_front_sql

logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request to a shard, every second
POLL_SECONDS = 1.0
"""How often the front reads each shard's load (its ``/healthz``)."""
SHARD_SECONDS = 2.0
"""The longest the front waits for one shard's answer to a list, health or metrics request."""
CONNECT_SECONDS = 0.5
"""The longest a connection to a shard may take (on one network, it takes a millisecond)."""
ATTEMPT_SECONDS = 1.0
"""A registration's deadline at one shard, counted from when it is sent."""
GRACE_SECONDS = 0.5
"""How long after the deadline the front still waits for the shard's answer (the answer of a
registration logged just before its deadline is on its way); the hosts' clocks must agree
within it."""
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
    """One shard's answer, or ``None`` if it could not be reached or did not answer within
    :data:`SHARD_SECONDS`."""
    try:
        return await client.request(method, shard.endpoint + path, **{"timeout": SHARD_SECONDS, **kwargs})
    except httpx.HTTPError:
        return None


def _refusal(answers: list[httpx.Response]) -> httpx.Response:
    """The refusal to pass on: a 403 (a shard knows the token, which may not do this) over a
    401 (the other shards do not know it), else the first.

    >>> _refusal([httpx.Response(401), httpx.Response(403)]).status_code
    403
    """
    return next((a for a in answers if a.status_code == 403), answers[0])


def create_front(shards: list[Shard], *, proxied: bool,
                 supervised: Callable[[], Coroutine[Any, Any, None]] | None = None,
                 settings: Settings | None = None) -> FastAPI:
    """The front's app over ``shards``; ``proxied``: HAProxy sends the dataflows' routes to the
    shards (else the front redirects them); ``supervised``: the supervisor's heartbeat;
    ``settings``: the service's (the warehouse and the SQL limits of ``POST /v1/sql``)."""
    known = Shards(shards)
    client = httpx.AsyncClient(timeout=httpx.Timeout(SHARD_SECONDS, connect=CONNECT_SECONDS),
                               limits=httpx.Limits(max_keepalive_connections=64))

    async def health(shard: Shard) -> httpx.Response | bool:
        """The shard's ``/healthz``, or ``False``: it could not be reached, or did not answer
        within :data:`SHARD_SECONDS` (a stopped process, a host dropping packets)."""
        try:
            return await client.get(shard.endpoint + "/healthz")
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

    async def everywhere(request: Request, path: str, params: Any = None) -> list[tuple[Shard, httpx.Response | None]]:
        answers = await asyncio.gather(*(_ask(client, s, "GET" if params is not None else request.method, path,
                                              headers=_headers(request),
                                              params=request.query_params if params is None else params)
                                         for s in shards))
        return list(zip(shards, answers, strict=True))

    @app.post("/v1/dataflows", status_code=201)
    async def register(request: Request) -> Response:
        """Registration, on the least loaded shard that takes it within its deadline (its
        answer as it is, ``endpoint`` included); see the module's docstring."""
        body = await request.body()
        key = request.headers.get(KEY_HEADER)
        order = known.by_load() or shards
        if key is not None:  # a client's retry: back to the shard that has the key, if one does
            found = await everywhere(request, "/v1/dataflows", params={"idempotency_key": key})
            holder = next((s for s, a in found if a is not None and a.status_code == 200 and a.json()), None)
            order = [holder] if holder is not None else order
        key = key or uuid.uuid4().hex
        tried: list[str] = []
        for shard in order:
            deadline = time.time() + ATTEMPT_SECONDS
            try:
                answer = await client.post(
                    shard.endpoint + "/v1/dataflows", content=body,
                    headers={**_headers(request), KEY_HEADER: key, DEADLINE_HEADER: f"{deadline:.6f}"},
                    timeout=httpx.Timeout(ATTEMPT_SECONDS + GRACE_SECONDS, connect=CONNECT_SECONDS))
            except httpx.HTTPError:  # not reached, or not within its deadline: it keeps nothing
                known.up[shard.index] = False
                tried.append(str(shard.index))
                continue
            if answer.status_code == 503 and b"deadline_passed" in answer.content:
                tried.append(str(shard.index))
                continue
            if answer.status_code == 201 and answer.headers.get("idempotent-replayed") != "true":
                known.load[shard.index] += 1
                known.sent[shard.index] += 1
            return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"),
                            headers={k: v for k, v in answer.headers.items() if k == "idempotent-replayed"})
        return JSONResponse({"error": "shard_unavailable", "shards": [int(i) for i in tried], "detail": (
            f"no shard took the registration within its deadline (tried {', '.join(tried) or 'none'})")},
            status_code=503)

    @app.get("/v1/dataflows")
    async def dataflows(request: Request) -> Response:
        """Every shard's list, merged oldest first. A token no shard knows: the shards' 401; a
        shard that does not answer is named in ``X-Tracker-Shards-Unavailable`` (the list lacks
        its dataflows)."""
        answers = await everywhere(request, "/v1/dataflows")
        listed = [row for _, a in answers if a is not None and a.status_code == 200 for row in a.json()]
        refusals = [a for _, a in answers if a is not None and a.status_code != 200]
        if refusals and not any(a is not None and a.status_code == 200 for _, a in answers):
            first = _refusal(refusals)
            return Response(first.content, first.status_code, media_type=first.headers.get("content-type"))
        missing = [str(s.index) for s, a in answers if a is None]
        return JSONResponse(sorted(listed, key=lambda d: d["created_at"] or ""),
                            headers={"X-Tracker-Shards-Unavailable": ",".join(missing)} if missing else None)

    @app.get("/v1/processes")
    async def processes(request: Request) -> Response:
        """Every shard's processes (admin), each tagged with its shard."""
        answers = await everywhere(request, "/v1/processes")
        refusals = [a for _, a in answers if a is not None and a.status_code != 200]
        if refusals:
            first = _refusal(refusals)
            return Response(first.content, first.status_code, media_type=first.headers.get("content-type"))
        found = [{**p, "shard": shard.index} for shard, answer in answers for p in (answer.json() if answer else [])]
        missing = [str(s.index) for s, a in answers if a is None]
        return JSONResponse(found, headers={"X-Tracker-Shards-Unavailable": ",".join(missing)} if missing else None)

    @app.get("/healthz")
    async def healthz(request: Request) -> dict[str, Any]:
        """``ok`` when every shard is, ``degraded`` otherwise, with each shard's own answer (the
        details a shard gives the admin token only, when the request bears it)."""
        answers = await asyncio.gather(*(_ask(client, s, "GET", "/healthz", headers=_headers(request))
                                         for s in shards))
        for shard, answer in zip(shards, answers, strict=True):  # what it just saw, as the poll would
            known.up[shard.index] = answer is not None and answer.status_code == 200
        return merge_health({s.index: (a.status_code, a.json()) if a is not None else None
                             for s, a in zip(shards, answers, strict=True)},
                            {s.index: s.endpoint for s in shards})

    @app.get("/metrics")
    async def metrics() -> Response:
        """Every shard's series, labelled ``shard``, and ``tracker_shard_up``."""
        answers = await asyncio.gather(*(_ask(client, s, "GET", "/metrics") for s in shards))
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
