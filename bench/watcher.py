"""The subscriber of the service benchmark, in its own process (``python -m bench.watcher URL TOKEN``).

It connects to a dataflow's WebSocket, prints the snapshot's version, then one line
``<version> <perf_counter>`` per ``changes`` event as soon as it arrives. Running it apart from
the sender keeps the sender's client work (an HTTP response being parsed, say) from delaying
the subscriber's clock, as with real workers; ``time.perf_counter`` is ``CLOCK_MONOTONIC`` on
Linux, one clock for every process, so the two processes' readings can be subtracted.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time

from websockets.asyncio.client import connect

_VERSION = re.compile(r'"version":(\d+)')


async def watch(url: str, token: str) -> None:
    """Print versions and arrival times until the connection closes."""
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None,
                       compression=None) as ws:
        print(json.loads(await ws.recv())["version"], flush=True)
        async for message in ws:
            at = time.perf_counter()
            assert isinstance(message, str), "the service sends text frames"
            found = _VERSION.search(message[:80])  # no need to parse hundreds of changes to time them
            if found and message.startswith('{"type":"changes"'):
                sys.stdout.write(f"{found.group(1)} {at}\n")
                sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(watch(sys.argv[1], sys.argv[2]))
