"""The subscriber of the service benchmark, in its own process (``python -m bench.watcher URL TOKEN [--sse]``).

It subscribes to a dataflow's frontier changes, on its WebSocket (``URL`` = ``ws://.../ws``)
or, with ``--sse``, on its SSE stream (``URL`` = ``http://.../frontier/stream``, read with httpx
as a client application would), prints the snapshot's version, then one line
``<version> <perf_counter>`` per ``changes`` event as soon as it arrives. Running it apart from
the sender keeps the sender's client work (an HTTP response being parsed, say) from delaying
the subscriber's clock, as with real workers; ``time.perf_counter`` is ``CLOCK_MONOTONIC`` on
Linux, one clock for every process, so the two processes' readings can be subtracted.

The version is read from the start of each event, without parsing the rest:

>>> _VERSION.search('{"type":"changes","version":42,"changes":[]}').group(1)
'42'

An SSE event is complete at its blank line; its ``event`` and ``id`` fields come first:

>>> events = _SseEvents()
>>> [events.feed(line) for line in ["event: changes", "id: 7", 'data: {"version":7}', ""]]
[None, None, None, ('changes', '7')]
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time

import httpx
from websockets.asyncio.client import connect

_VERSION = re.compile(r'"version":(\d+)')


async def watch(url: str, token: str) -> None:
    """Print versions and arrival times of a WebSocket's events until the connection closes."""
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None,
                       compression=None) as ws:
        print(json.loads(await ws.recv())["version"], flush=True)
        async for message in ws:
            at = time.perf_counter()
            if isinstance(message, bytes):  # the service sends text frames only
                continue
            found = _VERSION.search(message[:80])  # no need to parse hundreds of changes to time them
            if found and message.startswith('{"type":"changes"'):
                sys.stdout.write(f"{found.group(1)} {at}\n")
                sys.stdout.flush()


class _SseEvents:
    """Splits an SSE stream's lines into events: :meth:`feed` returns ``(event, id)`` at the blank
    line ending one, else ``None``."""

    def __init__(self) -> None:
        self.event = "message"
        self.id = ""

    def feed(self, line: str) -> tuple[str, str] | None:
        if not line:
            done, self.event = (self.event, self.id), "message"
            return done
        field, _, value = line.partition(":")
        if field == "event":
            self.event = value.strip()
        elif field == "id":
            self.id = value.strip()
        return None


async def watch_sse(url: str, token: str) -> None:
    """Print versions and arrival times of an SSE stream's events until it ends."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    events = _SseEvents()
    async with httpx.AsyncClient(timeout=None) as client, client.stream("GET", url, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            at = time.perf_counter()
            done = events.feed(line)
            if done is None:
                continue
            event, version = done
            if event == "snapshot":
                sys.stdout.write(f"{version}\n")
            elif event == "changes":
                sys.stdout.write(f"{version} {at}\n")
            else:
                continue
            sys.stdout.flush()


if __name__ == "__main__":
    if "--sse" in sys.argv[3:]:
        asyncio.run(watch_sse(sys.argv[1], sys.argv[2]))
    else:
        asyncio.run(watch(sys.argv[1], sys.argv[2]))
