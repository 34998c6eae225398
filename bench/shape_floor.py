"""The same-shape floor of the service benchmark: a trivial FastAPI app (``uvicorn
bench.shape_floor:app``, in its own process) that does with a progress batch only what no
tracker can avoid, on the service's own routes and transports.

* ``POST /v1/dataflows/{id}/progress`` and the WebSocket ``/v1/dataflows/{id}/ws``
  (``?subscribe=false`` for a sender): the batch is taken, appended to one log file and
  ``fdatasync`` ed, then acknowledged;
* each batch is published to every subscriber, on ``GET /v1/dataflows/{id}/frontier/stream``
  (SSE) or the WebSocket, as the very bytes of a service's ``changes`` event: the changes array
  set once with ``POST /template`` (the benchmark captures it from the service), under the
  batch's version.

No parsing, no engine, no state: what the service adds beyond this is its own cost. The log is
``BENCH_FLOOR_LOG`` (on the warehouse's disk).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

app = FastAPI()
_subscribers: set[asyncio.Queue[int]] = set()
_state: dict[str, Any] = {"version": 0, "changes": "[]", "log": None}


def _durably(data: bytes) -> int:
    """Append and ``fdatasync`` ``data``; publish the next version to every subscriber."""
    if _state["log"] is None:
        _state["log"] = os.open(os.environ["BENCH_FLOOR_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(_state["log"], data)
    os.fdatasync(_state["log"])
    _state["version"] += 1
    for queue in _subscribers:
        queue.put_nowait(_state["version"])
    return int(_state["version"])


@app.post("/template")
async def template(request: Request) -> dict[str, int]:
    """Set the changes array every event carries (a service's, captured by the benchmark)."""
    _state["changes"] = (await request.body()).decode()
    return {"bytes": len(_state["changes"])}


@app.post("/v1/dataflows/{dataflow_id}/progress")
async def progress(dataflow_id: str, request: Request) -> dict[str, Any]:
    version = _durably(await request.body())
    return {"applied": True, "duplicate": False, "version": version}


@app.get("/v1/dataflows/{dataflow_id}/frontier/stream")
async def stream(dataflow_id: str) -> StreamingResponse:
    queue: asyncio.Queue[int] = asyncio.Queue()
    _subscribers.add(queue)

    async def events() -> AsyncIterator[bytes]:
        try:
            yield f"id: {_state['version']}\r\nevent: snapshot\r\ndata: {{}}\r\n\r\n".encode()
            while True:
                version = await queue.get()
                data = f'{{"version":{version},"changes":{_state["changes"]}}}'
                yield f"id: {version}\r\nevent: changes\r\ndata: {data}\r\n\r\n".encode()
        finally:
            _subscribers.discard(queue)

    return StreamingResponse(events(), media_type="text/event-stream")


@app.websocket("/v1/dataflows/{dataflow_id}/ws")
async def socket(websocket: WebSocket, dataflow_id: str, subscribe: bool = True) -> None:
    await websocket.accept()
    queue: asyncio.Queue[int] = asyncio.Queue()
    forward = None
    if subscribe:
        _subscribers.add(queue)
        await websocket.send_text(f'{{"type":"snapshot","version":{_state["version"]},"locations":[]}}')

        async def send_events() -> None:
            while True:
                version = await queue.get()
                await websocket.send_text(f'{{"type":"changes","version":{version},"changes":{_state["changes"]}}}')

        forward = asyncio.create_task(send_events())
    try:
        while True:
            text = await websocket.receive_text()
            version = _durably(text.encode())
            await websocket.send_text(f'{{"type":"ack","applied":true,"duplicate":false,"version":{version}}}')
    except WebSocketDisconnect:
        return
    finally:
        _subscribers.discard(queue)
        if forward is not None:
            forward.cancel()
