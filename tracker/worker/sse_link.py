"""The SSE + POST fallback of :class:`~tracker.worker.link.ServiceLink`, for networks without WebSockets.

Batches go out as ``POST /v1/dataflows/{id}/progress``, one at a time (the next is sent only
once the previous one is answered, which keeps them in FIFO order); a failed or unanswered
request is retried with the *same* ``seq`` until the service answers, so each batch is applied
exactly once (a duplicate is acknowledged without being applied). Frontiers come from
``GET .../frontier/stream``: the first connection gets a ``snapshot``; a reconnection sends
``Last-Event-ID`` and gets the missed ``changes`` (or a fresh ``snapshot`` when the service's
history no longer reaches back). Same guarantees as the WebSocket link, one more round trip
per batch. A worker uses it in place of a :class:`~tracker.worker.link.ServiceLink`
(``tracker example --link sse``); nothing is sent before :meth:`SseLink.run`:

>>> link = SseLink("http://127.0.0.1:8000", "df-1", "dataflow-token", "w0")
>>> link.base, link.idle()
('http://127.0.0.1:8000/v1/dataflows/df-1', True)

Then, inside a running event loop: ``await Worker(flow, 0, 1, link, transport).run(driver)``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from tracker.worker.link import Link, LinkFailure


class SseLink(Link):
    """A :class:`~tracker.worker.link.Link` over ``POST .../progress`` and the SSE frontier stream."""

    def __init__(self, url: str, dataflow: str, token: str, worker: str) -> None:
        super().__init__(worker)
        self.base = f"{url.rstrip('/')}/v1/dataflows/{dataflow}"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.refusal_window = 30.0  # seconds of 401/403/404 answers before giving up
        self._last_id: str | None = None

    async def run(self) -> None:
        async with httpx.AsyncClient(headers=self.headers, timeout=httpx.Timeout(10.0, read=None)) as client:
            stream = asyncio.create_task(self._stream(client))
            try:
                await self._post_loop(client, stream)
            finally:
                stream.cancel()
                await asyncio.gather(stream, return_exceptions=True)

    async def _post_loop(self, client: httpx.AsyncClient, stream: asyncio.Task[None]) -> None:
        backoff = 0.05
        while not self._closing:
            if stream.done():
                stream.result()  # a fatal refusal of the stream
            if not self.unacked:
                if not self.pending:
                    self._more.clear()
                    await self._more.wait()
                    continue
                if self._next_batch() is None:
                    continue
            seq, text = self.unacked[0]
            try:
                answer = await client.post(f"{self.base}/progress", content=text,
                                           headers={"Content-Type": "application/json"}, timeout=10.0)
            except httpx.HTTPError:
                self.stats["retries"] += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.05
            if answer.status_code == 200:
                self.stats["duplicates"] += bool(answer.json().get("duplicate"))
                self._acked(seq)
                self.wake()
            elif answer.status_code == 409 and answer.json().get("expected", -1) > seq:
                self._acked(answer.json()["expected"] - 1)  # the service already has it
            elif answer.status_code >= 500 or answer.status_code in (404, 503):
                self.stats["retries"] += 1  # a restarting service: same seq again
                await asyncio.sleep(0.1)
            else:
                raise LinkFailure(f"service refused batch {seq} of {self.worker}: "
                                  f"{answer.status_code} {answer.text}")

    async def _stream(self, client: httpx.AsyncClient) -> None:
        refused_since: float | None = None
        while not self._closing:
            headers = {"Last-Event-ID": self._last_id} if self._last_id is not None else {}
            try:
                async with aconnect_sse(client, "GET", f"{self.base}/frontier/stream", headers=headers) as source:
                    status = source.response.status_code
                    if status in (401, 403, 404):
                        now = asyncio.get_running_loop().time()
                        refused_since = now if refused_since is None else refused_since
                        if now - refused_since > self.refusal_window:
                            raise LinkFailure(f"service refused the frontier stream: {status}")
                    elif status == 200:
                        refused_since = None
                        self.stats["connections"] += 1
                        async for event in source.aiter_sse():
                            self._event(event.event, json.loads(event.data) if event.data else {})
                            if event.id:
                                self._last_id = event.id
            except (httpx.HTTPError, json.JSONDecodeError):
                pass
            if not self._closing:
                self.stats["reconnects"] += 1
                await asyncio.sleep(0.1)

    def _event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "snapshot":
            self.view.snapshot(data["version"], data["locations"])
        elif kind == "changes":
            self.view.apply(data["version"], data["changes"])
        self.wake()
