"""FastAPI dependencies: the service, the caller, the dataflow being addressed.

Guarantees: a route that takes :data:`DataflowDep` runs only for a caller whose token may access
that dataflow (401 without a known token; 403 for another dataflow's token, or for the program
token on a dataflow it did not register; 404 for an unknown id); :data:`AdminDep` only for the
admin token and :data:`RegistrarDep` only for the admin or the program token (403 for another
valid token).

They are ``async def`` although nothing in them awaits: FastAPI runs a plain ``def``
dependency in its thread pool, and the three hops (service, caller, dataflow) cost ~0.5 ms per
request, as much as applying a batch that moves 400 frontier entries.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import Depends, Header, HTTPException, Path, Request

from api.host.keys import DEADLINE_HEADER, KEY_HEADER, MAX_KEY
from api.host.service import Service
from api.host.tenant import Tenant
from api.host.tokens import Principal
from api.streams.encoding import Selection
from api.web.auth import bearer, forbidden, unauthorized
from api.web.limits import LimitExceeded, Limits, Slot
from tracker.graph import Location


async def get_service(request: Request) -> Service:
    """The :class:`Service` of this app."""
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


async def principal(
    service: ServiceDep,
    authorization: Annotated[str | None, Header(description="Bearer <admin, program or dataflow token>")] = None,
) -> Principal:
    """Who is calling; 401 for a missing or unknown token."""
    found = service.authenticate(bearer(authorization))
    if found is None:
        raise unauthorized("unknown token")
    return found


PrincipalDep = Annotated[Principal, Depends(principal)]


def require_json(content_type: str | None) -> None:
    """415 for a body declared as something other than JSON (``curl -d`` alone declares a
    form); a body with no ``Content-Type`` is read as JSON. A plain call, not a dependency:
    FastAPI's solving of a header dependency cost tens of microseconds per progress POST."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise HTTPException(415, {"error": "unsupported_media_type", "detail": (
            f"the body must be JSON, sent with 'Content-Type: application/json' or none (got {content_type!r})")})


async def admin(caller: PrincipalDep) -> Principal:
    """Only the admin token; 403 for a program or dataflow token."""
    if not caller.admin:
        raise forbidden(f"only the admin token may do this, not the {caller.role} token")
    return caller


AdminDep = Annotated[Principal, Depends(admin)]


async def registrar(caller: PrincipalDep) -> Principal:
    """The admin or the program token; 403 for a dataflow token."""
    if not caller.may_register:
        raise forbidden("a dataflow's token may not register dataflows: use the program token (or the admin token)")
    return caller


RegistrarDep = Annotated[Principal, Depends(registrar)]


async def get_limits(request: Request) -> Limits:
    """The admission limits of this app (:mod:`api.web.limits`)."""
    return request.app.state.limits


LimitsDep = Annotated[Limits, Depends(get_limits)]


def too_many(refused: LimitExceeded) -> HTTPException:
    """The 429 answer of a refused admission, with ``Retry-After``."""
    return HTTPException(429, refused.body, headers={"Retry-After": str(refused.retry_after)})


def registration_slot(limits: Limits, service: Service, caller: Principal) -> Slot:
    """Admit one registration by ``caller`` (429 ``rate_limited`` or ``too_many_dataflows``;
    deleted dataflows do not count)."""
    live = sum(1 for dataflow in service.dataflows.values() if dataflow.ready and dataflow.deleted_at is None)
    try:
        return limits.registrations.admit(caller.role if caller.may_register else f"dataflow:{caller.dataflow_id}",
                                          live)
    except LimitExceeded as refused:
        raise too_many(refused) from None


def registration_headers(request: Request) -> tuple[str | None, float | None]:
    """A registration's ``Idempotency-Key`` and the front's ``X-Tracker-Deadline``
    (:mod:`api.host.keys`); 400 ``invalid_request`` for a key that is empty, longer than 200
    characters or not printable ASCII, or a deadline that is no number."""
    key = request.headers.get(KEY_HEADER)
    if key is not None and not (0 < len(key) <= MAX_KEY and key.isascii() and key.isprintable()):
        raise HTTPException(400, {"error": "invalid_request", "detail": (
            f"Idempotency-Key must be 1 to {MAX_KEY} printable ASCII characters")})
    deadline = request.headers.get(DEADLINE_HEADER)
    try:
        return key, None if deadline is None else float(deadline)
    except ValueError:
        raise HTTPException(400, {"error": "invalid_request",
                                  "detail": "X-Tracker-Deadline must be POSIX seconds"}) from None


def subscriber_slot(limits: Limits, dataflow: Tenant) -> Slot:
    """Admit one stream subscriber of ``dataflow`` (429 ``too_many_subscribers``)."""
    try:
        return limits.subscriptions.admit(dataflow.id)
    except LimitExceeded as refused:
        raise too_many(refused) from None


def lookup(service: Service, caller: Principal, dataflow_id: str) -> Tenant:
    """The dataflow if ``caller`` may access it: 403 for another dataflow's token, and for the
    program token on a dataflow it did not register (whether or not the id exists, so tokens do
    not reveal other ids), 503 ``dataflow_damaged`` for one recovery refused, 404 for the admin
    and a bad id."""
    known = service.dataflows.get(dataflow_id) or service.damaged.get(dataflow_id)
    if not caller.may_access(dataflow_id, None if known is None else known.token_hash):
        raise forbidden("the program token did not register this dataflow" if caller.program is not None
                        else "this token belongs to another dataflow")
    damaged = service.damaged.get(dataflow_id)
    if damaged is not None:
        raise HTTPException(503, {"error": "dataflow_damaged", "detail": damaged.detail})
    dataflow = service.dataflows.get(dataflow_id)
    if dataflow is None or not dataflow.ready:
        raise HTTPException(404, {"error": "unknown_dataflow", "detail": f"no dataflow with id {dataflow_id!r}"})
    return dataflow


async def dataflow_dep(
    service: ServiceDep,
    caller: PrincipalDep,
    dataflow_id: Annotated[str, Path(alias="id", description="dataflow id")],
) -> Tenant:
    """The addressed dataflow (see :func:`lookup`)."""
    return lookup(service, caller, dataflow_id)


DataflowDep = Annotated[Tenant, Depends(dataflow_dep)]


def selection(dataflow: Tenant, text: str | None) -> Selection | None:
    """The ``?locations=`` of a stream: ``node:port:kind`` items separated by commas
    (``1:0:target,2:0:target``), or a JSON list of ``{"node", "port", "kind"}`` objects; ``None``
    (every location) when absent. 422 ``invalid_request`` for another spelling or an empty
    list, ``unknown_location`` for a port the dataflow does not have."""
    if text is None:
        return None
    try:
        if text.lstrip().startswith("["):
            items = json.loads(text)
            if not isinstance(items, list):
                raise ValueError("not a list")
            wanted = [Location(int(i["node"]), int(i["port"]), _kind(i["kind"])) for i in items]
        else:
            wanted = []
            for item in text.split(","):
                node, port, kind = item.strip().split(":")
                if not (node.isascii() and node.isdigit() and port.isascii() and port.isdigit()):
                    raise ValueError(item)
                wanted.append(Location(int(node), int(port), _kind(kind)))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise HTTPException(422, {"error": "invalid_request", "detail": (
            "locations must be node:port:kind items separated by commas (1:0:target,2:0:target) or a JSON list "
            f'of {{"node", "port", "kind"}} objects, kind being "source" or "target", got {text[:200]!r}')}) from None
    if not wanted:
        raise HTTPException(422, {"error": "invalid_request", "detail": "locations names no location"})
    for location in wanted:
        if not dataflow.graph.has_location(location):
            raise HTTPException(422, {"error": "unknown_location",
                                      "detail": f"{location} is not a port of this dataflow"})
    return dataflow.publication.select(wanted)


def _kind(kind: object) -> Literal["source", "target"]:
    if kind == "source" or kind == "target":
        return kind
    raise ValueError(kind)
