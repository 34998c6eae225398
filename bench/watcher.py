"""The subscriber of the service benchmark, in its own process (``python -m bench.watcher URL TOKEN``).

It connects to a dataflow's WebSocket, prints the snapshot's version, then one line
``<version> <perf_counter>`` per ``changes`` event as soon as it arrives. Running it apart from
the sender keeps the sender's client work (an HTTP response being parsed, say) from delaying
the subscriber's clock, as with real workers; ``time.perf_counter`` is ``CLOCK_MONOTONIC`` on
Linux, one clock for every process, so the two processes' readings can be subtracted.

The version is read from the start of each event, without parsing the rest:

>>> _VERSION.search('{"type":"changes","version":42,"changes":[]}').group(1)
'42'
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
            if isinstance(message, bytes):  # the service sends text frames only
                continue
            found = _VERSION.search(message[:80])  # no need to parse hundreds of changes to time them
            if found and message.startswith('{"type":"changes"'):
                sys.stdout.write(f"{found.group(1)} {at}\n")
                sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(watch(sys.argv[1], sys.argv[2]))
