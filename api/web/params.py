"""What the v1 routes share: the documented error answers, the query parameters naming a
location, the filters they make, and chunked JSON answers.

>>> from tracker.graph import Location
>>> matches(Location.target(3, 0), 3, None, "target"), matches(Location.target(3, 0), 3, None, "source")
(True, False)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

from fastapi import HTTPException, Query
from fastapi.responses import StreamingResponse

from api.host.tenant import Tenant
from api.live.scopes import parse_scope
from api.schema.models import ErrorBody
from tracker.graph import Location

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "malformed JSON"},
    401: {"model": ErrorBody, "description": "missing or unknown token"},
    403: {"model": ErrorBody, "description": "the token belongs to another dataflow"},
    404: {"model": ErrorBody, "description": "unknown dataflow"},
    413: {"model": ErrorBody, "description": "body too large"},
    422: {"model": ErrorBody, "description": "invalid request"},
}
LIMITED: dict[int | str, dict[str, Any]] = {429: {
    "model": ErrorBody, "description": "a limit is reached (see `error`); retry after `Retry-After` seconds",
    "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds to wait"}}}}

NodeQ = Annotated[int | None, Query(ge=0, le=2**31 - 1)]
KindQ = Annotated[Literal["source", "target"] | None, Query()]
ScopeQ = Annotated[str | None, Query(max_length=200, description="a scope path of a dataflow with nested scopes, "
                                     "comma-separated scope-node ids from the root, e.g. 3,1 (empty: the root)")]


JSON_SLICE = 256
"""Elements of a long list encoded per call by :func:`json_chunks`."""


def json_chunks(value: Any) -> list[bytes]:
    """``value`` as compact JSON (as ``JSONResponse`` writes it), in chunks: every list longer
    than :data:`JSON_SLICE` is encoded a slice at a time, so no one call holds the GIL long (an
    explanation along a 50,000-node chain, encoded at once on the event loop, held it ~180 ms).
    Call it in a worker thread, and send the chunks with :func:`chunked`.

    >>> body = {"a": [1, {"b": list(range(600))}], "c": "x"}
    >>> b"".join(json_chunks(body)) == json.dumps(body, separators=(",", ":")).encode()
    True
    """
    parts: list[str] = []

    def encode(item: Any) -> None:
        if isinstance(item, dict):
            parts.append("{")
            for i, (key, inner) in enumerate(item.items()):
                parts.append(("," if i else "") + _dumps(key) + ":")
                encode(inner)
            parts.append("}")
        elif isinstance(item, list | tuple) and len(item) > JSON_SLICE:
            parts.append("[")
            for i in range(0, len(item), JSON_SLICE):
                parts.append(("," if i else "") + _dumps(list(item[i:i + JSON_SLICE]))[1:-1])
            parts.append("]")
        elif isinstance(item, list | tuple) and any(isinstance(x, dict | list | tuple) for x in item):
            parts.append("[")
            for i, inner in enumerate(item):
                parts.append("," if i else "")
                encode(inner)
            parts.append("]")
        else:
            parts.append(_dumps(item))

    encode(value)
    chunks: list[bytes] = []
    pending: list[str] = []
    size = 0
    for part in parts:  # a chunk per ~64 KB: few writes, none large
        pending.append(part)
        size += len(part)
        if size >= 65536:
            chunks.append("".join(pending).encode())
            pending, size = [], 0
    if pending:
        chunks.append("".join(pending).encode())
    return chunks


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def chunked(chunks: list[bytes]) -> StreamingResponse:
    """A JSON answer sent a chunk at a time: one write of many megabytes (or joining them first)
    held the event loop tens of milliseconds."""
    async def each() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return StreamingResponse(each(), media_type="application/json")


def scope_path(dataflow: Tenant, scope: str | None) -> tuple[int, ...] | None:
    """The ``?scope=`` of a request, checked against the dataflow (422 ``unknown_scope``)."""
    try:
        return parse_scope(scope, [()]) if dataflow.hosting is None else dataflow.hosting.scope_of(scope)
    except LookupError as error:
        raise HTTPException(422, {"error": "unknown_scope", "detail": str(error)}) from None


def location_filter(dataflow: Tenant, scope: str | None, node: int | None, port: int | None, kind: str | None
                    ) -> Callable[[Location], bool]:
    """The locations a request's ``scope``, ``node``, ``port`` and ``kind`` name (422 ``unknown_scope``)."""
    path = scope_path(dataflow, scope)
    hosting = dataflow.hosting
    if hosting is None:
        return lambda loc: matches(loc, node, port, kind)
    return lambda loc: hosting.matches(loc, path, node, port, kind)


def matches(loc: Location, node: int | None, port: int | None, kind: str | None) -> bool:
    """Whether ``loc`` is at ``node``, ``port`` and ``kind`` (``None``: any)."""
    return (node is None or loc.node == node) and (port is None or loc.port == port) and (
        kind is None or loc.kind == kind)


def location_order(loc: Location) -> tuple[int, str, int]:
    """The order of answers' rows: by node, then inputs before outputs, then port."""
    return loc.node, loc.kind, loc.port
