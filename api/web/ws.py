"""``WS /v1/dataflows/{id}/ws``: a worker sends progress batches and receives acks and changes.

Messages from the client: the ``POST .../progress`` body (a text frame, or a binary frame of
UTF-8 JSON). Messages to the client (JSON text):
``{"type": "snapshot", "version", "locations"}`` first (unless ``?subscribe=false``), then
``{"type": "changes", "version", "changes"}``, ``{"type": "ack", "worker", "seq", "applied",
"duplicate", "version"}`` per batch in the order sent, ``{"type": "error", "status", "error",
"detail", ...}`` for a refused batch, and ``{"type": "resync", ...}`` + a snapshot if the client
fell behind. A subscribing socket beyond the subscriber limits (:mod:`api.web.limits`) is accepted
and closed at once with 1013 and a reason naming the limit. When the dataflow is deleted the
server closes the socket with code 4410 (reason ``dataflow_deleted``); a handshake on a deleted
dataflow is refused with 410. Batches are pipelined: the next one is read while earlier ones
wait for their group commit, and acks still go out in order.

Guarantees: a batch sent here goes through exactly the use case of ``POST .../progress``
(:func:`api.host.ingest.accept` then :func:`api.host.ingest.settle`, as :func:`api.host.ingest.submit`), so it
is answered the same, acks in the order sent; a client that pipelines without reading its acks
is slowed down, not buffered without bound.

Each batch is accepted (parsed, ordered, logged, applied) right in the receiving coroutine, and
one task per connection sends the acks as their batches become durable: no task per batch, and
one event-loop hop from durable to the ack on the wire.

>>> _ack_json(Ack(True, False, 7, "w", 3))
'{"type":"ack","applied":true,"duplicate":false,"version":7,"worker":"w","seq":3}'
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, HTTPException, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

from api.host.ingest import Accepted, Ack, Refused, accept, gone, settle
from api.host.service import Service
from api.host.tenant import Tenant
from api.streams import subscribers
from api.streams.encoding import Selection
from api.web.auth import bearer
from api.web.deps import lookup, selection
from api.web.limits import LimitExceeded, Limits, Slot

router = APIRouter(prefix="/v1")
log = logging.getLogger("tracker.ws")
MAX_PIPELINED = 1024
CLOSE_DELETED = 4410
"""The close code of a WebSocket whose dataflow was deleted (reason ``dataflow_deleted``)."""
TRY_AGAIN_LATER = 1013
"""The close code of a subscription over the subscriber limits (its reason says which)."""


async def _deny(websocket: WebSocket, status: int, body: dict[str, Any]) -> None:
    log.info("websocket refused", extra={"status": status, "error": body.get("error"), "path": websocket.url.path})
    try:
        await websocket.send_denial_response(JSONResponse(body, status_code=status))
    except RuntimeError:  # the server cannot send an HTTP answer to a handshake: close instead
        await websocket.close(code=4000 + status, reason=body.get("error", ""))


@router.websocket("/dataflows/{id}/ws")
async def worker_socket(websocket: WebSocket, id: str) -> None:
    """See the module docstring. Auth: ``Authorization: Bearer`` (or ``?token=`` for browsers)."""
    service: Service = websocket.app.state.service
    # Query parameters are read here rather than declared: FastAPI refuses a bad one on a
    # WebSocket by closing before the handshake, which reaches the client as a bare 403.
    token = websocket.query_params.get("token")
    try:
        raw = token if token is not None else bearer(websocket.headers.get("authorization"))
        caller = service.authenticate(raw)
        if caller is None:
            raise HTTPException(401, {"error": "unauthorized", "detail": "unknown token"})
        dataflow = lookup(service, caller, id)
        if dataflow.deleted_at is not None:
            refused = gone(dataflow)
            raise HTTPException(refused.status, refused.body)
        subscribe = _flag(websocket.query_params.get("subscribe", "true"), "subscribe")
        wanted = selection(dataflow, websocket.query_params.get("locations"))
    except HTTPException as error:
        detail: Any = error.detail  # the JSON body: every HTTPException raised above carries a dict
        await _deny(websocket, error.status_code, detail)
        return
    limits: Limits = websocket.app.state.limits
    try:
        slot = limits.subscriptions.admit(dataflow.id) if subscribe else Slot(None)
    except LimitExceeded as refused:
        # Accepted, then closed with 1013 (try again later): unlike an HTTP refusal of the
        # handshake, a close code and its reason reach a browser's script.
        log.info("websocket refused", extra={"status": 429, "error": refused.body["error"],
                                             "path": websocket.url.path})
        await websocket.accept()
        await websocket.close(code=TRY_AGAIN_LATER, reason=refused.reason)
        return
    try:
        await _serve(websocket, service, dataflow, subscribe, wanted)
    finally:
        slot.release()


async def _serve(websocket: WebSocket, service: Service, dataflow: Tenant, subscribe: bool,
                 wanted: Selection | None) -> None:
    await websocket.accept()
    send_lock = asyncio.Lock()

    async def send(text: str) -> None:
        async with send_lock:
            await websocket.send_text(text)

    # Bounded: a client that pipelines without reading its acks is slowed down, not buffered.
    acks: asyncio.Queue[Accepted | str] = asyncio.Queue(MAX_PIPELINED)
    tasks = [asyncio.create_task(_send_acks(acks, send, service))]

    async def close_deleted() -> None:
        async with send_lock:
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # the client may have left first
                await websocket.close(code=CLOSE_DELETED, reason="dataflow_deleted")

    def deleted() -> None:
        tasks.append(asyncio.create_task(close_deleted()))

    dataflow.publication.on_end.add(deleted)
    if dataflow.publication.ended:  # deleted while the handshake was answered
        deleted()
    subscriber = None
    metrics = service.metrics
    if subscribe:
        subscriber, first = subscribers.attach(dataflow.publication, None, service.settings.subscriber_queue,
                                           metrics.resyncs.inc, wanted, service.settings.subscriber_bytes)
        metrics.subscribers.labels("ws").inc()
        for event, version, data in first:
            await send(subscribers.ws_message(event, version, data))
        tasks.append(asyncio.create_task(_send_changes(dataflow, subscriber, send)))
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            # A batch may come as a text frame or as a binary frame holding the same UTF-8 JSON.
            body = message["bytes"] if message.get("text") is None else message["text"].encode()
            await acks.put(_accept(service, dataflow, body or b""))
    except WebSocketDisconnect:
        pass
    finally:
        dataflow.publication.on_end.discard(deleted)
        for task in tasks:
            task.cancel()
        if subscriber is not None:
            dataflow.publication.subscribers.discard(subscriber)
            metrics.subscribers.labels("ws").dec()


def _flag(value: str, name: str) -> bool:
    """A boolean query parameter, spelled as FastAPI would accept it; 422 otherwise."""
    lowered = value.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise HTTPException(422, {"error": "invalid_request", "detail": f"{name} must be true or false, got {value!r}"})


def _accept(service: Service, dataflow: Tenant, body: bytes) -> Accepted | str:
    """One message, accepted (its ack follows once durable) or the error to send back."""
    try:
        return accept(dataflow, body, service.wal, service.metrics)
    except Refused as refused:
        return _error_json(refused)
    except Exception:  # a service failure: say so instead of going silent
        log.exception("websocket batch failed")
        return _INTERNAL_ERROR


_INTERNAL_ERROR = json.dumps({"type": "error", "status": 500, "error": "internal_error",
                              "detail": "see the service log"})


def _error_json(refused: Refused) -> str:
    return json.dumps({"type": "error", "status": refused.status, **refused.body})


def _ack_json(ack: Ack) -> str:
    """The ack message (the fields of :class:`~api.host.ingest.Ack`, in its order)."""
    return json.dumps({"type": "ack", "applied": ack.applied, "duplicate": ack.duplicate, "version": ack.version,
                       "worker": ack.worker, "seq": ack.seq}, separators=(",", ":"))


async def _send_acks(acks: asyncio.Queue[Accepted | str], send: Callable[[str], Awaitable[None]],
                     service: Service) -> None:
    """Send each message's answer in the order received, an ack once its batch is durable."""
    while True:
        item = await acks.get()
        if not isinstance(item, str):
            if item.durable.done():
                # Made durable before this task ran: the subscribers that commit woke send its
                # changes first (a worker waits on changes, not on acks); they are already queued.
                await asyncio.sleep(0)
            try:
                item = _ack_json(await settle(item, service.metrics))
            except Refused as refused:
                item = _error_json(refused)
            except Exception:
                log.exception("websocket batch failed")
                item = _INTERNAL_ERROR
        await send(item)


async def _send_changes(dataflow: Tenant, subscriber: subscribers.Subscriber, send: Callable[[str], Awaitable[None]]
                        ) -> None:
    try:
        while True:
            for event, version, data in await subscribers.next_events(dataflow.publication, subscriber):
                if event == "deleted":  # the socket is being closed with CLOSE_DELETED
                    return
                if event == "resync":
                    await send(json.dumps({"type": "resync", "version": version, **json.loads(data)}))
                else:
                    await send(subscribers.ws_message(event, version, data))
    except (WebSocketDisconnect, RuntimeError):
        return
