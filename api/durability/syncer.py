"""The write-ahead log's sync process: ``fdatasync`` on request, outside the service's GIL.

Guarantee: an answer of 0 for a segment means every byte written to it before the request is
durable.

Why a process and not a thread: a Python thread needs the GIL to start each sync and again to
report it, so under the event loop's load it waited for the loop to let go (the switch
interval) and the loop then waited to get the GIL back, a few hundred microseconds per
acknowledgement. This process shares no GIL; ``fdatasync`` syncs the file, not the descriptor,
so syncing the segment the service wrote to through its own descriptor is enough.

Protocol on stdin/stdout: the service writes a segment number (``u32``, little endian) after
writing that segment's records; the syncer answers with an errno (``u32``, 0 = durable) and
how long its ``fdatasync`` took (``u32`` microseconds: the disk's time, without the two
process wake-ups the service's round trip also holds). It
exits when stdin closes, that is when the service stops or dies, and only then: it ignores the
SIGINT and SIGTERM a terminal or a supervisor sends the whole process group (Ctrl-C on
``tracker serve``), which would otherwise kill it while the service still logs its last records.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
import time

REQUEST = struct.Struct("<I")
"""A segment number, from the service."""
ANSWER = struct.Struct("<II")
"""An errno (0: durable) and the ``fdatasync``'s microseconds, to the service."""


def _segment_name(number: int) -> str:
    """:func:`api.durability.segments.segment_name`, without importing it: that module's imports
    (the records, pydantic models) took this process ~0.6 s to start, which the service's start
    waits for.

    >>> from api.durability.segments import segment_name
    >>> _segment_name(7) == segment_name(7)
    True
    """
    return f"wal-{number:06d}.log"


def _read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def serve(directory: str, requests: int = 0, answers: int = 1) -> None:
    """Answer sync requests until ``requests`` reaches end of file."""
    fds: dict[int, int] = {}
    while True:
        message = _read_exactly(requests, REQUEST.size)
        if not message:
            return
        (segment,) = REQUEST.unpack(message)
        began = time.perf_counter()
        try:
            fd = fds.get(segment)
            if fd is None:
                for old in [s for s in fds if s < segment]:  # the service has moved on
                    os.close(fds.pop(old))
                fd = fds[segment] = os.open(os.path.join(directory, _segment_name(segment)), os.O_WRONLY)
            os.fdatasync(fd)
            errno = 0
        except OSError as error:
            errno = error.errno or 5  # EIO when the error carries none
        took = min(int((time.perf_counter() - began) * 1e6), 2**32 - 1)
        os.write(answers, ANSWER.pack(errno, took))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(sys.argv[1])
