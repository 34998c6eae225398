"""The write-ahead log: what makes an acknowledgement durable, with group commit.

Records are length-prefixed JSON with a CRC32: ``<u32 length><u32 crc32><payload>``. A torn or
corrupt record ends the log (everything after it was never acknowledged, because a record is
acknowledged only after the ``fdatasync`` that covers it returned), so recovery truncates there.

Group commit: :meth:`WriteAheadLog.enqueue` appends a record to an in-memory group and returns
a future. If no sync is running, the group is handed at once to the log's own thread, which
writes it with a single ``write`` and a single ``fdatasync`` (the event loop never blocks on the
disk, and the caller can apply the batch to the tracker *while* the disk syncs); when it
returns, the loop runs each record's ``on_durable`` callback in log order and resolves the
futures. Requests arriving during an ``fdatasync`` form the next group, so under load the cost
of one sync is shared by every batch that arrived meanwhile, and with no load a batch waits for
exactly one sync.

The log is split into numbered segments (``wal-000001.log``, ...). :meth:`rotate` starts a new
segment whose first records are supplied by the caller (the registrations of live dataflows),
so that older segments can be deleted once the Delta ``progress`` table holds their batches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("tracker.wal")

_HEADER = struct.Struct("<II")
_MAX_RECORD = 256 * 1024 * 1024


def encode(record: dict[str, Any], raw: bytes | None = None) -> bytes:
    """One framed record: its JSON, then (optionally) a newline and ``raw`` bytes verbatim.

    Compact JSON never contains a raw newline, so the first one separates the two; logging the
    request body as received avoids re-encoding every update on the hot path.
    """
    return frame(_payload(record, raw))


def _payload(record: dict[str, Any], raw: bytes | None) -> bytes:
    payload = json.dumps(record, separators=(",", ":")).encode()
    return payload + b"\n" + raw if raw is not None else payload


def frame(payload: bytes) -> bytes:
    """Length and CRC32 in front of ``payload``."""
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def read_segment(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Every intact record of a segment, and the byte offset where the intact prefix ends."""
    data = path.read_bytes()
    records: list[dict[str, Any]] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        end = start + length
        if length > _MAX_RECORD or end > len(data):
            break
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            break
        head, newline, raw = payload.partition(b"\n")
        try:
            record = json.loads(head)
        except ValueError:
            break
        if newline:
            record["_raw"] = raw
        records.append(record)
        offset = end
    return records, offset


@dataclass
class _Entry:
    data: bytes
    future: asyncio.Future[None] | None
    on_durable: Callable[[], None] | None


@dataclass
class SyncStats:
    """Counters the metrics module exposes."""

    syncs: int = 0
    records: int = 0
    last_group: int = 0
    seconds: list[float] = field(default_factory=list)


class WriteAheadLog:
    """An append-only, segmented, group-committed log in ``directory``."""

    def __init__(self, directory: Path, *, on_sync: Callable[[int, float], None] | None = None) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        self._segment = 0
        self._group: list[_Entry] = []
        self._busy = False
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="wal")
        self._on_sync = on_sync
        self._rotate_to: list[bytes] | None = None
        self._rotated: asyncio.Future[int] | None = None
        self.failed: BaseException | None = None

    # -- recovery -------------------------------------------------------------------------

    def segments(self) -> list[tuple[int, Path]]:
        """Existing segments, oldest first."""
        found = []
        for path in self.directory.glob("wal-*.log"):
            try:
                found.append((int(path.stem.split("-")[1]), path))
            except (IndexError, ValueError):
                continue
        return sorted(found)

    def recover(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Yield ``(segment, record)`` for every intact record, oldest first, and cut a torn
        tail off the newest segment so new records follow intact ones."""
        segments = self.segments()
        for index, (number, path) in enumerate(segments):
            records, end = read_segment(path)
            if end != path.stat().st_size:
                if index == len(segments) - 1:
                    log.warning("wal: cutting a torn tail", extra={"segment": number, "at": end})
                    with open(path, "r+b") as handle:
                        handle.truncate(end)
                        os.fsync(handle.fileno())
                else:
                    log.error("wal: corrupt record inside an older segment", extra={"segment": number, "at": end})
            for record in records:
                yield number, record

    def open(self) -> None:
        """Open the newest segment for appending (or create the first one)."""
        segments = self.segments()
        self._segment = segments[-1][0] if segments else 1
        self._fd = self._open_segment(self._segment)

    def _open_segment(self, number: int) -> int:
        path = self.directory / f"wal-{number:06d}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._sync_directory()
        return fd

    def _sync_directory(self) -> None:
        # A new file's directory entry must be durable too, or the whole segment can vanish.
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    @property
    def segment(self) -> int:
        """The number of the segment being appended to."""
        return self._segment

    def delete_segments_before(self, number: int) -> int:
        """Remove every segment older than ``number``; returns how many were removed."""
        removed = 0
        for seg, path in self.segments():
            if seg < number and seg != self._segment:
                path.unlink(missing_ok=True)
                removed += 1
        if removed:
            self._sync_directory()
        return removed

    # -- appending ------------------------------------------------------------------------

    def enqueue(self, record: dict[str, Any], on_durable: Callable[[], None] | None = None,
                raw: bytes | None = None) -> asyncio.Future[None]:
        """Add ``record`` (and ``raw`` bytes, see :func:`encode`) to the next group; the future
        resolves once it is on disk, after ``on_durable`` ran (callbacks run in log order)."""
        if self.failed is not None:
            raise RuntimeError("the write-ahead log failed; the service must restart") from self.failed
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Framed (CRC32) on the log thread: zlib releases the GIL on large inputs, and getting it
        # back on the event loop thread could cost a whole switch interval.
        self._group.append(_Entry(_payload(record, raw), future, on_durable))
        self._kick()
        return future

    def barrier(self) -> asyncio.Future[None]:
        """A future that resolves once everything enqueued so far is durable."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self._group and not self._busy:
            future.set_result(None)
            return future
        self._group.append(_Entry(b"", future, None))
        self._kick()
        return future

    async def append(self, record: dict[str, Any]) -> None:
        """Enqueue and wait until durable."""
        await self.enqueue(record)

    def rotate(self, header: list[dict[str, Any]]) -> asyncio.Future[int]:
        """Start a new segment beginning with ``header``; resolves to the new segment number
        once the header is durable. Records enqueued later go to the new segment."""
        rotated: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._rotated = rotated
        self._rotate_to = [encode(r) for r in header]
        self._kick()
        return rotated

    def _kick(self) -> None:
        """Hand the next piece of work to the log thread unless it is busy (then its
        completion callback will)."""
        if self._busy:
            return
        loop = asyncio.get_running_loop()
        if self._rotate_to is not None:
            header, self._rotate_to = self._rotate_to, None
            rotated, self._rotated = self._rotated, None
            self._busy = True
            work = self._thread.submit(self._start_segment, header)
            work.add_done_callback(lambda done: loop.call_soon_threadsafe(self._rotation_done, done, rotated))
            return
        if not self._group:
            return
        group, self._group = self._group, []
        payloads = [e.data for e in group if e.data]
        self._busy = True
        started = time.perf_counter()
        work = self._thread.submit(self._frame_write_and_sync, payloads)
        work.add_done_callback(lambda done: loop.call_soon_threadsafe(self._group_done, done, group, started))

    def _rotation_done(self, done: Any, rotated: asyncio.Future[int] | None) -> None:
        self._busy = False
        error = done.exception()
        if rotated is not None and not rotated.done():
            if error is not None:
                rotated.set_exception(error)
            else:
                rotated.set_result(done.result())
        self._kick()

    def _group_done(self, done: Any, group: list[_Entry], started: float) -> None:
        self._busy = False
        error = done.exception()
        if error is not None:  # a failed fsync is fatal for the log: nothing more is acknowledged
            self.failed = error
            log.critical("wal: write or fdatasync failed; refusing further writes", exc_info=error)
            for entry in group + self._group:
                if entry.future is not None and not entry.future.done():
                    entry.future.set_exception(RuntimeError("write-ahead log failure"))
            self._group = []
            return
        records = sum(1 for e in group if e.data)
        if self._on_sync is not None and records:
            self._on_sync(records, time.perf_counter() - started)
        for entry in group:
            if entry.on_durable is not None:
                try:
                    entry.on_durable()
                except Exception:  # a subscriber bug must not stop acknowledgements
                    log.exception("wal: on_durable callback failed")
            if entry.future is not None and not entry.future.done():
                entry.future.set_result(None)
        self._kick()

    def _frame_write_and_sync(self, payloads: list[bytes]) -> None:
        if payloads:
            self._write_and_sync(b"".join(frame(p) for p in payloads))

    def _write_and_sync(self, data: bytes) -> None:
        assert self._fd is not None, "open() the log first"
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fdatasync(self._fd)

    def _start_segment(self, header: list[bytes]) -> int:
        number = self._segment + 1
        fd = self._open_segment(number)
        data = b"".join(header)
        if data:
            os.write(fd, data)
        os.fdatasync(fd)
        old, self._fd, self._segment = self._fd, fd, number
        if old is not None:
            os.close(old)
        return number

    def close(self) -> None:
        """Close the current segment (pending groups must have been awaited)."""
        self._thread.shutdown(wait=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
