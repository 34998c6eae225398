"""The write-ahead log: what makes an acknowledgement durable, with group commit.

Guarantees: a record's future resolves only after the ``fdatasync`` covering it returned, and
its ``on_durable`` callback runs before that, in log order; after a failed write or sync,
nothing more is acknowledged (:class:`LogFailed`) until the service restarts and recovers.
Records are typed (:mod:`api.records`) and framed into numbered segments (:mod:`api.segments`).

Group commit: :meth:`WriteAheadLog.enqueue` appends a record to an in-memory group and returns
a future. If no sync is running, the group is committed in one of two ways:

* **Under load** (the previous commit finished less than one sync's duration ago), the group is
  written at once with a single ``write`` (into the page cache: microseconds) and the sync
  process (:mod:`api.syncer`) is asked for the ``fdatasync``, so the event loop keeps reading
  and applying batches *while* the disk syncs, on the other core and without contending for
  the GIL. Requests arriving meanwhile form the next group, so the cost of one sync is shared
  by every batch that arrived during it.
* **When the log was quiet** (no commit for longer than a recent sync took, so no group would
  form anyway) and syncs are not stalled (under :data:`INLINE_SYNC_MAX`), the event loop's next turn
  writes the group and calls ``fdatasync`` itself. The caller applies its batch first (the
  rest of its synchronous turn), and the sync then costs exactly one ``fdatasync``: no pipe to
  the syncer, no process wake-up on either side, which on two busy cores were most of a lone
  batch's wait for durability. The loop is blocked for that one sync, which is short by the
  condition.

Either way the loop then runs each record's ``on_durable`` callback in log order and resolves
the futures.

:meth:`WriteAheadLog.rotate` starts a new segment whose first records are supplied by the
caller (the registrations of live dataflows), so that older segments can be deleted once the
Delta ``progress`` table holds their batches. A torn tail of the newest segment is cut off by
:meth:`WriteAheadLog.recover`.

>>> import asyncio, tempfile
>>> from api.records import Check
>>> async def main(directory: Path) -> list[Record]:
...     wal = WriteAheadLog(directory)
...     wal.open()
...     await wal.enqueue(Check(df="d1", result="agreed", detail=None))
...     wal.close()
...     return [record for _, record in WriteAheadLog(directory).recover()]
>>> with tempfile.TemporaryDirectory() as directory:
...     asyncio.run(main(Path(directory)))
[Check(df='d1', result='agreed', detail=None)]
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from api.records import Record, decode, encode
from api.segments import HEADER_SIZE, frame, segment_name, segments, unframe

log = logging.getLogger("tracker.wal")

_SYNC = struct.Struct("<I")  # a segment number to the syncer, an errno back
INLINE_SYNC_MAX = 0.010
"""Seconds: while recent syncs take longer than this (a slow or stalled disk), even a quiet log
syncs in the sync process, so that the event loop (other dataflows' streams and queries) never
stalls on the disk for long. Generous on purpose: on two busy cores (load ~20) the process
hand-off cost a lone batch more than a 2-6 ms sync (end-to-end p50 3.5-3.7 ms with the
hand-off, 1.9 ms without, the two interleaved against the same load)."""


def read_segment(path: Path) -> tuple[list[Record], int]:
    """Every intact record of a segment, and the byte offset where the intact prefix ends
    (a payload that is not a record ends it too)."""
    payloads, end = unframe(path.read_bytes())
    records: list[Record] = []
    offset = 0
    for payload in payloads:
        try:
            records.append(decode(payload))
        except ValueError:
            return records, offset
        offset += HEADER_SIZE + len(payload)
    return records, end


class LogFailed(RuntimeError):
    """The log could not make a record durable (a failed write or ``fdatasync``, or the sync
    process died): nothing more is acknowledged until the service restarts and recovers."""

    def __init__(self) -> None:
        super().__init__("the write-ahead log failed; the service must restart")


@dataclass
class _Entry:
    data: bytes
    future: asyncio.Future[None] | None
    on_durable: Callable[[], None] | None


class WriteAheadLog:
    """An append-only, segmented, group-committed log in ``directory``."""

    def __init__(self, directory: Path, *, on_sync: Callable[[int, float], None] | None = None) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        self._segment = 0
        self._group: list[_Entry] = []
        self._inflight: tuple[list[_Entry], float, tuple[int, int, asyncio.Future[int]] | None] | None = None
        self._inline = False  # a quiet log's group commit is scheduled on the loop's next turn
        self._sync_seconds = 0.0  # a recent sync's duration, decaying: what "quiet" is measured by
        self._last_done = 0.0  # when the last group commit finished (perf_counter)
        self._syncer: subprocess.Popen[bytes] | None = None
        self._watched: asyncio.AbstractEventLoop | None = None
        self._on_sync = on_sync
        self._rotate_to: list[bytes] | None = None
        self._rotated: asyncio.Future[int] | None = None
        self.failed: BaseException | None = None
        self.inline_commits = 0
        """How many group commits a quiet log synced on the event loop (the others: the sync process)."""

    # -- recovery -------------------------------------------------------------------------

    def segments(self) -> list[tuple[int, Path]]:
        """Existing segments, oldest first."""
        return segments(self.directory)

    def path(self, number: int) -> Path:
        """Where segment ``number`` lives."""
        return self.directory / segment_name(number)

    def recover(self) -> Iterator[tuple[int, Record]]:
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
        """Open the newest segment for appending (or create the first one), start the syncer."""
        segments = self.segments()
        self._segment = segments[-1][0] if segments else 1
        self._fd = self._open_segment(self._segment)
        self._syncer = subprocess.Popen([sys.executable, "-m", "api.syncer", str(self.directory)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        # One sync before serving: a syncer that cannot start or sync fails the start-up, not
        # the first acknowledgement.
        self._request(self._segment)
        assert self._syncer.stdout is not None
        answer = os.read(self._syncer.stdout.fileno(), _SYNC.size)
        if len(answer) != _SYNC.size or _SYNC.unpack(answer)[0] != 0:
            raise OSError(f"the write-ahead log's sync process failed to start or sync (answer {answer!r})")
        self._last_done = time.perf_counter()

    def _open_segment(self, number: int) -> int:
        fd = os.open(self.path(number), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
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

    def enqueue(self, record: Record, on_durable: Callable[[], None] | None = None) -> asyncio.Future[None]:
        """Add ``record`` to the next group.

        Returns:
            A future that resolves once the record is on disk, after ``on_durable`` ran
            (callbacks run in log order).

        Raises:
            LogFailed: the log failed earlier; nothing more is accepted.
        """
        if self.failed is not None:
            raise LogFailed() from self.failed
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._group.append(_Entry(encode(record), future, on_durable))
        self._kick()
        return future

    def barrier(self) -> asyncio.Future[None]:
        """A future that resolves once everything enqueued so far is durable."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self._group and self._inflight is None:
            future.set_result(None)
            return future
        self._group.append(_Entry(b"", future, None))
        self._kick()
        return future

    def rotate(self, header: list[Record]) -> asyncio.Future[int]:
        """Start a new segment beginning with ``header``; resolves to the new segment number
        once the header is durable. Records enqueued later go to the new segment."""
        rotated: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._rotated = rotated
        self._rotate_to = [frame(encode(r)) for r in header]
        self._kick()
        return rotated

    def _kick(self) -> None:
        """Commit the next group (or write the rotation's header and ask the syncer to sync
        it), unless a commit is running or scheduled (then its completion will)."""
        if self._inflight is not None or self._inline or self.failed is not None:
            return
        self._watch()
        started = time.perf_counter()
        try:
            if self._rotate_to is not None:
                header, self._rotate_to = self._rotate_to, None
                rotated, self._rotated = self._rotated, None
                number = self._segment + 1
                fd = self._open_segment(number)
                self._write(fd, b"".join(header))
                assert rotated is not None
                self._inflight = ([], started, (number, fd, rotated))
                self._request(number)
                return
            if not self._group:
                return
            if started - self._last_done > self._sync_seconds and self._sync_seconds < INLINE_SYNC_MAX:
                # Quiet: nothing would share this sync, so sync on the loop's next turn (after
                # the caller applied its batch) rather than pay two process wake-ups.
                self._inline = True
                asyncio.get_running_loop().call_soon(self._commit_inline)
                return
            group, self._group = self._group, []
            data = b"".join(frame(e.data) for e in group if e.data)
            self._inflight = (group, started, None)
            if not data:  # barriers only: everything before them is durable already
                asyncio.get_running_loop().call_soon(self._synced, 0)
                return
            assert self._fd is not None, "open() the log first"
            self._write(self._fd, data)
            self._request(self._segment)
        except OSError as error:
            self._fail(error)

    def _commit_inline(self) -> None:
        """Write and ``fdatasync`` the group on the event loop (a quiet log's commit)."""
        self._inline = False
        if self._inflight is not None or self.failed is not None or not self._group:
            self._kick()
            return
        if self._syncer is None or self._fd is None:  # closed meanwhile: its futures stay pending
            return
        if self._syncer.poll() is not None:  # its loss stops acknowledgements, whichever path syncs
            self._unwatch()
            self._fail(OSError("the write-ahead log's sync process exited"))
            return
        group, self._group = self._group, []
        started = time.perf_counter()
        self._inflight = (group, started, None)
        self.inline_commits += 1
        data = b"".join(frame(e.data) for e in group if e.data)
        try:
            if data:
                self._write(self._fd, data)
                os.fdatasync(self._fd)
        except OSError as error:
            self._fail(error)
            return
        self._synced(0)

    def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        if self._watched is not loop:
            assert self._syncer is not None and self._syncer.stdout is not None, "open() the log first"
            loop.add_reader(self._syncer.stdout.fileno(), self._on_answer)
            self._watched = loop

    @staticmethod
    def _write(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def _request(self, segment: int) -> None:
        assert self._syncer is not None and self._syncer.stdin is not None
        os.write(self._syncer.stdin.fileno(), _SYNC.pack(segment))

    def _on_answer(self) -> None:
        assert self._syncer is not None and self._syncer.stdout is not None
        answer = os.read(self._syncer.stdout.fileno(), _SYNC.size)
        if len(answer) != _SYNC.size:  # the syncer is gone: nothing can be acknowledged any more
            self._unwatch()
            self._fail(OSError("the write-ahead log's sync process exited"))
            return
        self._synced(_SYNC.unpack(answer)[0])

    def _synced(self, errno: int) -> None:
        assert self._inflight is not None
        group, started, rotation = self._inflight
        self._inflight = None
        if errno:  # a failed fsync is fatal for the log: nothing more is acknowledged
            self._fail(OSError(errno, os.strerror(errno)))
            if rotation is not None and not rotation[2].done():
                rotation[2].set_exception(LogFailed())
            return
        if rotation is not None:
            number, fd, rotated = rotation
            old, self._fd, self._segment = self._fd, fd, number
            if old is not None:
                os.close(old)
            if not rotated.done():
                rotated.set_result(number)
        records = sum(1 for e in group if e.data)
        took = time.perf_counter() - started
        # Remember a slow sync at once, forget it gradually: one fast sync must not make a
        # loaded log look quiet.
        self._sync_seconds = max(took, 0.875 * self._sync_seconds)
        if self._on_sync is not None and records:
            self._on_sync(records, took)
        for entry in group:
            if entry.on_durable is not None:
                try:
                    entry.on_durable()
                except Exception:  # a subscriber bug must not stop acknowledgements
                    log.exception("wal: on_durable callback failed")
            if entry.future is not None and not entry.future.done():
                entry.future.set_result(None)
        self._last_done = time.perf_counter()
        self._kick()

    def _fail(self, error: BaseException) -> None:
        self.failed = error
        log.critical("wal: write or fdatasync failed; refusing further writes", exc_info=error)
        inflight = self._inflight[0] if self._inflight is not None else []
        self._inflight = None
        for entry in inflight + self._group:
            if entry.future is not None and not entry.future.done():
                entry.future.set_exception(LogFailed())
        self._group = []

    def _unwatch(self) -> None:
        if self._watched is not None and self._syncer is not None and self._syncer.stdout is not None:
            self._watched.remove_reader(self._syncer.stdout.fileno())
            self._watched = None

    def close(self) -> None:
        """Close the current segment and stop the syncer (pending groups must have been awaited)."""
        if self._syncer is not None:
            self._unwatch()
            assert self._syncer.stdin is not None
            self._syncer.stdin.close()
            self._syncer.wait(10)
            self._syncer = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
