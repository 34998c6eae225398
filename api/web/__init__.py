"""The HTTP surface: the FastAPI app, the v1 routes, the WebSocket, dependencies for auth and
lookups, admission limits, security headers, uvicorn's protocols with their limits, the
dashboard, SQL (:mod:`api.web.sql`), and the front of a sharded service (:mod:`api.web.front`).
The only package that imports FastAPI or Starlette.

Guarantees: every route is thin (typed bodies, dependencies, one call into host); every client
mistake is a 4xx with a JSON body ``{"error", "detail"}``.

May import: api.config, api.metrics, api.schema, api.live, api.durability, api.streams,
api.delta, api.background, api.host, api.ops, api.sql, api.shards, tracker, spark_jobs, fastapi, starlette,
sse_starlette, pydantic, uvicorn.
"""
