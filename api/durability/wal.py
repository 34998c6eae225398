"""The write-ahead log: what makes an acknowledgement durable, with group commit.

Guarantees: a record's future resolves only after the ``fdatasync`` covering it returned, and
its ``on_durable`` callback runs before that, in log order; after a failed write or sync,
nothing more is acknowledged (:class:`LogFailed`) until the service restarts and recovers. The
loss of the sync process fails the log too, its owner told first
(:attr:`WriteAheadLog.on_sync_process_lost`: a supervised hot path exits there, to be restarted).
Records are typed (:mod:`api.durability.records`) and framed into numbered segments (:mod:`api.durability.segments`).

Group commit: :meth:`WriteAheadLog.enqueue` appends a record to an in-memory group and returns
a future. If no sync is running, the group is committed in one of two ways:

* **Under load** (the previous commit finished less than one sync's duration ago), the group is
  written at once with a single ``write`` (into the page cache: microseconds) and the sync
  process (:mod:`api.durability.syncer`) is asked for the ``fdatasync``, so the event loop keeps reading
  and applying batches *while* the disk syncs, on the other core and without contending for
  the GIL. Requests arriving meanwhile form the next group, so the cost of one sync is shared
  by every batch that arrived during it.
* **When the log was quiet** (no commit for longer than a recent ``fdatasync`` took, so no group
  would form anyway) and syncs are not stalled (under :data:`INLINE_SYNC_MAX`), the event loop's
  next turn writes the group and calls ``fdatasync`` itself, unless the group's callbacks are
  long (:meth:`WriteAheadLog.prefer_sync_process`). The caller applies its batch first (the
  rest of its synchronous turn), and the sync then costs exactly one ``fdatasync``: no pipe to
  the syncer, no process wake-up on either side, which on two busy cores were most of a lone
  batch's wait for durability. The loop is blocked for that one sync, which is short by the
  condition.

Either way the loop then runs each record's ``on_durable`` callback in log order and resolves
the futures.

:meth:`WriteAheadLog.rotate` starts a new segment whose first records are supplied by the
caller when the segment is started (the registrations of live dataflows and their workers'
positions as of that moment, when everything in the older segments is durable), so that older
segments can be deleted once the Delta ``progress`` table holds their batches.

:meth:`WriteAheadLog.recover` reads every segment through :func:`api.durability.segments.scan`: only a torn
tail of the newest segment (an incomplete final record, never acknowledged) is cut off; damaged
records are reported with their attribution and their bytes stay where they are (a segment
holding one is never deleted); bytes whose owner cannot be known stop the start-up
(:class:`UnreadableLog`, naming the segment and offset).

Long because: group commit is one state machine (the open group, the sync in flight, a
scheduled inline commit, a pending rotation) whose transitions must be read together.

>>> import asyncio, tempfile
>>> from api.durability.records import Check
>>> async def main(directory: Path) -> list[Record]:
...     wal = WriteAheadLog(directory)
...     wal.open()
...     await wal.enqueue(Check(df="d1", result="agreed", detail=None))
...     wal.close()
...     return [record for _, record in WriteAheadLog(directory).recover().records]
>>> with tempfile.TemporaryDirectory() as directory:
...     asyncio.run(main(Path(directory)))
[Check(df='d1', result='agreed', detail=None)]
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from api.durability.marks import DELETED, IDLE_SYNC_SECONDS, REGISTERED, Marks, read_block
from api.durability.records import Batch, Delete, Record, Register, encode
from api.durability.recovery import settle_tail
from api.durability.segments import (
    LogContents,
    create_segment,
    frame,
    read_log,
    segment_name,
    segments,
    sync_directory,
)
from api.durability.syncer import ANSWER, REQUEST

log = logging.getLogger("tracker.wal")

INLINE_SYNC_MAX = 0.010
"""Seconds: while recent syncs take longer than this (a slow or stalled disk), even a quiet log
syncs in the sync process, so that the event loop (other dataflows' streams and queries) never
stalls on the disk for long. Generous on purpose: on two busy cores (load ~20) the process
hand-off cost a lone batch more than a 2-6 ms sync (end-to-end p50 3.5-3.7 ms with the
hand-off, 1.9 ms without, the two interleaved against the same load)."""
INLINE_BYTES_MAX = 256 * 1024
"""A group larger than this is synced by the sync process even on a quiet log (a 6 MB
registration's ``fdatasync`` took the loop ~20 ms), and written by a worker thread."""


class LogFailed(RuntimeError):
    """The log could not make a record durable (a failed write or ``fdatasync``, or the sync
    process died): nothing more is acknowledged until the service restarts and recovers."""

    def __init__(self) -> None:
        super().__init__("the write-ahead log failed; the service must restart")


@dataclass
class _Entry:
    data: bytes
    """The record as framed for the segment (empty for a barrier)."""
    future: asyncio.Future[None] | None
    on_durable: Callable[[], None] | None
    mark: tuple[str, int, int] | None = None
    """The high-water mark its acknowledgement raises: ``(dataflow, version, state)``."""


def _mark(record: Record) -> tuple[str, int, int] | None:
    """What acknowledging ``record`` tells the marks (:mod:`api.durability.marks`)."""
    if isinstance(record, Batch):
        return record.df, record.v, REGISTERED
    if isinstance(record, Register):
        return record.df, 0, REGISTERED
    if isinstance(record, Delete):
        return record.df, 0, DELETED
    return None  # checks and checkpoints: nobody waits for them, losing one costs nothing


def framed(record: Record) -> bytes:
    """``record`` encoded and framed as :meth:`WriteAheadLog.enqueue` writes it: a caller with
    a large record (a registration of 50,000 nodes: ~35 ms) makes it in a thread and passes it."""
    return frame(encode(record))


class WriteAheadLog:
    """An append-only, segmented, group-committed log in ``directory``."""

    def __init__(self, directory: Path, *, on_sync: Callable[[int, float], None] | None = None,
                 header: Callable[[], list[Record | bytes]] | None = None) -> None:
        """``header()`` gives the records a segment the log starts by itself begins with (when
        the marks outgrow a segment's block, or the newest segment was cut)."""
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        self._mark_fd: int | None = None  # the same segment, not appending: the marks are rewritten in place
        self._segment = 0
        self._group: list[_Entry] = []
        # The group being synced (none for a rotation or a sync of the marks alone), when it
        # started, and how many mark writes had been made by then (the sync makes them durable).
        self._inflight: tuple[list[_Entry], float, int] | None = None
        self._inline = False  # a quiet log's group commit is scheduled on the loop's next turn
        self._heavy = False  # the next group's durable callbacks are long (see prefer_sync_process)
        self._sync_seconds = 0.0  # a recent fdatasync's duration (the disk's), decaying: what "quiet" is measured by
        self._last_done = 0.0  # when the last group commit finished (perf_counter)
        self._syncer: subprocess.Popen[bytes] | None = None
        self._watched: asyncio.AbstractEventLoop | None = None
        self._on_sync = on_sync
        self._rotate_to: Callable[[], list[Record | bytes]] | None = None
        self._rotated: asyncio.Future[int] | None = None
        self._header = header or list
        self._marks = Marks.fresh({})
        self._mark_writes = 0  # mark writes made so far (into the page cache)
        self._marks_synced = 0  # of those, how many a finished sync covered
        self._idle_sync: asyncio.TimerHandle | None = None
        self._unslotted: set[str] = set()  # dataflows waiting for a new segment's block to have a slot
        self._recovered: LogContents | None = None
        self.header_end = 0
        """Where the current segment's header (its mark block and first records) ends."""
        self.failed: BaseException | None = None
        self.on_sync_process_lost: Callable[[], None] | None = None
        """Called once the sync process is found gone, before anything waiting is failed: a
        process fault, unlike a failed write or sync, so its owner may restart rather than wait
        for someone to (the hot path under ``tracker serve`` exits)."""
        self.kept: set[int] = set()
        """Segments holding damaged records: never deleted (their bytes are evidence)."""
        self.hold = False
        """Set while some dataflow is refused: no segment is deleted, whatever Delta holds."""
        self.inline_commits = 0
        """How many group commits a quiet log synced on the event loop (the others: the sync process)."""

    # -- recovery -------------------------------------------------------------------------

    def segments(self) -> list[tuple[int, Path]]:
        """Existing segments, oldest first."""
        return segments(self.directory)

    def path(self, number: int) -> Path:
        """Where segment ``number`` lives."""
        return self.directory / segment_name(number)

    def recover(self) -> LogContents:
        """Read every segment, oldest first (:func:`~api.durability.segments.read_log`: a torn
        tail is cut off the newest one only; damaged records and their segments are kept, never
        cut, and never deleted later).

        Raises:
            UnreadableLog: a segment holds bytes that cannot be attributed (left in place).
        """
        self._start_syncer()  # a Python process's start, overlapping the reading and the rebuild
        contents = self._recovered = read_log(self.directory)
        settle_tail(contents)
        self.kept |= {number for number, _ in contents.damaged}
        return contents

    def _start_syncer(self) -> None:
        """Start the sync process (:mod:`api.durability.syncer`) unless it runs; it exits when its
        stdin closes, whenever this log is closed or dropped."""
        if self._syncer is None:
            self._syncer = subprocess.Popen([sys.executable, "-m", "api.durability.syncer", str(self.directory)],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def open(self) -> None:
        """Open the newest segment for appending, or start a new one (the first, or after a
        newest one that was cut: its bytes stay, the new one starts with ``header()`` and every
        mark), and start the syncer."""
        found = self.segments()
        recovered, self._recovered = self._recovered, None
        if found and not (recovered is not None and recovered.fresh_segment):
            self._segment, path = found[-1]
            if recovered is not None and recovered.block is not None:
                self._marks, self.header_end = recovered.block, recovered.header_end
            else:  # opened without recover() (tests)
                block = read_block(path.read_bytes())
                self._marks, self.header_end = block.live, block.header_end
        else:
            self._segment = found[-1][0] + 1 if found else 1
            self._marks = Marks.fresh(recovered.marks if recovered is not None else {})
            self.header_end, _ = create_segment(self.directory, self._segment, self._marks.copy(),
                                                self._header() if found else [])
        self._fd, self._mark_fd = self._open_segment(self._segment)
        self._start_syncer()
        # One sync before serving: a syncer that cannot start or sync fails the start-up, not
        # the first acknowledgement.
        self._request(self._segment)
        assert self._syncer is not None and self._syncer.stdout is not None
        answer = os.read(self._syncer.stdout.fileno(), ANSWER.size)
        if len(answer) != ANSWER.size or ANSWER.unpack(answer)[0] != 0:
            raise OSError(f"the write-ahead log's sync process failed to start or sync (answer {answer!r})")
        self._last_done = time.perf_counter()

    def _open_segment(self, number: int) -> tuple[int, int]:
        """Descriptors of an existing segment: one appending, one for its marks."""
        path = self.path(number)
        return os.open(path, os.O_WRONLY | os.O_APPEND), os.open(path, os.O_WRONLY)

    @property
    def segment(self) -> int:
        """The number of the segment being appended to."""
        return self._segment

    def delete_segments_before(self, number: int) -> int:
        """Remove every segment older than ``number``; returns how many were removed."""
        if self.hold:
            return 0
        removed = 0
        for seg, path in self.segments():
            if seg < number and seg != self._segment and seg not in self.kept:
                path.unlink(missing_ok=True)
                removed += 1
        if removed:
            sync_directory(self.directory)
        return removed

    # -- appending ------------------------------------------------------------------------

    def enqueue(self, record: Record, on_durable: Callable[[], None] | None = None, *,
                as_framed: bytes | None = None) -> asyncio.Future[None]:
        """Add ``record`` to the next group (``as_framed``: its :func:`framed` bytes, made by the
        caller).

        Returns:
            A future that resolves once the record is on disk, after ``on_durable`` ran
            (callbacks run in log order).

        Raises:
            LogFailed: the log failed earlier; nothing more is accepted.
        """
        if self.failed is not None:
            raise LogFailed() from self.failed
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        mark = _mark(record)
        if mark is not None and not self._marks.take(mark[0]):
            # The block is full: the record goes to a new segment, whose block has room.
            self._unslotted.add(mark[0])
            self.rotate(self._header).add_done_callback(lambda done: done.cancelled() or done.exception())
        self._group.append(_Entry(framed(record) if as_framed is None else as_framed, future, on_durable, mark))
        self._kick()
        return future

    def prefer_sync_process(self) -> None:
        """The records enqueued so far, not yet committed, have long ``on_durable`` callbacks
        (a version of 32,000 frontier changes to publish): their group is synced by the sync
        process even if the log is quiet, so that the event loop, free during the sync, does
        not hold other dataflows for the sync and those callbacks in one turn."""
        if self._inline:  # else the group is already with the sync process (or already synced)
            self._heavy = True

    def barrier(self) -> asyncio.Future[None]:
        """A future that resolves once everything enqueued so far is durable."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self._group and self._inflight is None:
            future.set_result(None)
            return future
        self._group.append(_Entry(b"", future, None))
        self._kick()
        return future

    def rotate(self, header: Callable[[], list[Record | bytes]]) -> asyncio.Future[int]:
        """Start a new segment beginning with the records ``header()`` returns, called when the
        segment is started: every record enqueued before it is durable then, and none after it
        is, so the header describes exactly what the older segments hold. Resolves to the new
        segment number once the header is durable; records enqueued later go to the new segment.
        A rotation already asked for and not started yet is shared (its header is used)."""
        if self._rotated is not None:
            return self._rotated
        rotated: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._rotated = rotated
        self._rotate_to = header
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
                self._start_rotation()
                return
            if not self._group:
                return
            if (started - self._last_done > self._sync_seconds and self._sync_seconds < INLINE_SYNC_MAX
                    and sum(len(e.data) for e in self._group) <= INLINE_BYTES_MAX):
                # Quiet: nothing would share this sync, so sync on the loop's next turn (after
                # the caller applied its batch) rather than pay two process wake-ups.
                self._inline = True
                asyncio.get_running_loop().call_soon(self._commit_inline)
                return
            group, self._group, self._heavy = self._group, [], False
            data = b"".join(e.data for e in group)
            self._inflight = (group, started, self._mark_writes)
            if not data:  # barriers only: everything before them is durable already
                asyncio.get_running_loop().call_soon(self._synced, 0)
                return
            self._to_syncer(data)
        except OSError as error:
            self._fail(error)

    def _start_rotation(self) -> None:
        """Take the header now (every record before it durable, none after it) and write the
        new segment in a worker thread: encoding and writing a big header (the registrations of
        every dataflow) held the event loop for hundreds of milliseconds."""
        header, self._rotate_to = self._rotate_to, None
        rotated, self._rotated = self._rotated, None
        assert header is not None and rotated is not None
        records = header()
        # Records enqueued from now on go to the new segment: their slots are taken in its block.
        self._marks = Marks.fresh(self._marks.marks, (*self._marks.names(), *self._unslotted))
        self._unslotted = set()
        number = self._segment + 1
        self._inflight = ([], time.perf_counter(), self._mark_writes)

        def created(done: asyncio.Future[tuple[int, int]]) -> None:
            if self._inflight is None or self.failed is not None:  # closed or failed meanwhile
                return
            try:
                self.header_end, _ = done.result()
                fds = self._open_segment(number)
            except OSError as error:
                self._fail(error)
                if not rotated.done():
                    rotated.set_exception(LogFailed())
                return
            for old in (self._fd, self._mark_fd):
                if old is not None:
                    os.close(old)
            (self._fd, self._mark_fd), self._segment = fds, number
            self._inflight = None
            self._marks_synced = self._mark_writes  # the new block holds every mark, durably
            self._last_done = time.perf_counter()
            if not rotated.done():
                rotated.set_result(number)
            self._kick()

        asyncio.get_running_loop().run_in_executor(
            None, create_segment, self.directory, number, self._marks.copy(), records).add_done_callback(created)

    def _to_syncer(self, data: bytes) -> None:
        """Write the group in flight (``data``) and ask the sync process to sync it; a big one is
        written by a worker thread."""
        assert self._fd is not None, "open() the log first"
        try:
            if len(data) > INLINE_BYTES_MAX:
                self._write_then_request(self._fd, data, self._segment)
                return
            self._write(self._fd, data)
            self._request(self._segment)
        except OSError as error:
            self._fail(error)

    def _write_then_request(self, fd: int, data: bytes, segment: int) -> None:
        """Write a big group (a big graph's registration) in a worker thread, then ask for its
        sync: ``os.write`` lets go of the GIL, so the loop goes on meanwhile (a 5 MB write took
        it ~4 ms). Nothing else is written meanwhile: the group is in flight."""
        loop = asyncio.get_running_loop()

        def written(done: asyncio.Future[None]) -> None:
            error = done.exception()
            if self._syncer is None or self._inflight is None:  # closed or failed meanwhile
                return
            if error is not None:
                self._fail(error)
                return
            try:
                self._request(segment)
            except OSError as failure:
                self._fail(failure)

        loop.run_in_executor(None, self._write, fd, data).add_done_callback(written)

    def _commit_inline(self) -> None:
        """Write and ``fdatasync`` the group on the event loop (a quiet log's commit)."""
        self._inline = False
        if self._inflight is not None or self.failed is not None or not self._group or self._rotate_to is not None:
            self._kick()  # a rotation asked for meanwhile goes first: this group follows its header
            return
        if self._syncer is None or self._fd is None:  # closed meanwhile: its futures stay pending
            return
        if self._syncer.poll() is not None:  # its loss stops acknowledgements, whichever path syncs
            self._unwatch()
            self._sync_process_lost()
            return
        group, self._group = self._group, []
        heavy, self._heavy = self._heavy, False
        started = time.perf_counter()
        self._inflight = (group, started, self._mark_writes)
        data = b"".join(e.data for e in group)
        if heavy and data:  # the loop has a long publish ahead: not a sync on top of it
            self._to_syncer(data)
            return
        self.inline_commits += 1
        disk_seconds = None
        try:
            if data:
                self._write(self._fd, data)
                began = time.perf_counter()
                os.fdatasync(self._fd)
                disk_seconds = time.perf_counter() - began
        except OSError as error:
            self._fail(error)
            return
        self._synced(0, disk_seconds)

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
        os.write(self._syncer.stdin.fileno(), REQUEST.pack(segment))

    def _on_answer(self) -> None:
        assert self._syncer is not None and self._syncer.stdout is not None
        answer = os.read(self._syncer.stdout.fileno(), ANSWER.size)
        if len(answer) != ANSWER.size:  # the syncer is gone: nothing can be acknowledged any more
            self._unwatch()
            self._sync_process_lost()
            return
        errno, micros = ANSWER.unpack(answer)
        self._synced(errno, micros / 1e6)

    def _synced(self, errno: int, disk_seconds: float | None = None) -> None:
        """A group's sync returned (``disk_seconds``: how long ``fdatasync`` itself took)."""
        assert self._inflight is not None
        group, started, marks_written = self._inflight
        self._inflight = None
        if errno:  # a failed fsync is fatal for the log: nothing more is acknowledged
            self._fail(OSError(errno, os.strerror(errno)))
            return
        self._marks_synced = max(self._marks_synced, marks_written)
        # The marks go to the page cache before anything is acknowledged (a crash of the process
        # keeps them) and become durable with the next sync of this segment.
        if not self._write_marks(group):
            return
        records = sum(1 for e in group if e.data)
        took = time.perf_counter() - started
        if disk_seconds is not None:
            # Remember a slow disk at once, forget it gradually: one fast sync must not make a
            # loaded log look quiet. The disk's time, not the round trip: on two busy cores the
            # sync process's wake-ups made a 0.7 ms sync look like 4 ms, so that the next lone
            # batch went to that process too (the isolation benchmark's probe: p90 4.0 ms by
            # the sync process, 1.1 ms inline).
            self._sync_seconds = max(disk_seconds, 0.875 * self._sync_seconds)
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
        if group:  # a sync of the marks alone says nothing of how busy the log is
            self._last_done = time.perf_counter()
        self._kick()
        if (self._mark_writes > self._marks_synced and self._idle_sync is None and self._inflight is None
                and not self._inline):
            self._idle_sync = asyncio.get_running_loop().call_later(IDLE_SYNC_SECONDS, self._sync_marks)

    def _write_marks(self, group: list[_Entry]) -> bool:
        """Raise the marks of a durable group and write the changed slots in place; ``False``
        if the write failed (the log failed: nothing of the group is acknowledged)."""
        for entry in group:
            if entry.mark is not None:
                self._marks.acknowledge(*entry.mark)
        runs = self._marks.dirty_runs()
        if not runs:
            return True
        try:
            assert self._mark_fd is not None
            for offset, data in runs:
                os.pwrite(self._mark_fd, data, offset)
        except OSError as error:
            self._fail(error)
            return False
        self._mark_writes += 1
        return True

    def _sync_marks(self) -> None:
        """Make the marks durable once no group followed them for :data:`IDLE_SYNC_SECONDS` (a
        sync of the segment alone, so rare that a batch seldom waits behind it)."""
        self._idle_sync = None
        if (self._mark_writes <= self._marks_synced or self._inflight is not None or self._inline or self._group
                or self.failed is not None or self._syncer is None or self._rotate_to is not None):
            return  # synced meanwhile, or a sync coming will cover them (and look again)
        quiet_for = time.perf_counter() - self._last_done
        if quiet_for < IDLE_SYNC_SECONDS:  # groups went on: the next one syncs them, or wait for quiet
            self._idle_sync = asyncio.get_running_loop().call_later(IDLE_SYNC_SECONDS - quiet_for, self._sync_marks)
            return
        self._inflight = ([], time.perf_counter(), self._mark_writes)
        try:
            self._request(self._segment)
        except OSError as error:
            self._fail(error)

    def _sync_process_lost(self) -> None:
        if self.on_sync_process_lost is not None:
            self.on_sync_process_lost()
        self._fail(OSError("the write-ahead log's sync process exited"))

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
        """Close the current segment and stop the syncer (pending groups must have been awaited);
        the marks are made durable first."""
        if self._idle_sync is not None:
            self._idle_sync.cancel()
            self._idle_sync = None
        if self._mark_fd is not None:
            with contextlib.suppress(OSError):  # a failed log is not made worse by closing it
                if self._mark_writes > self._marks_synced and self.failed is None:
                    os.fdatasync(self._mark_fd)
            os.close(self._mark_fd)
            self._mark_fd = None
        if self._syncer is not None:
            self._unwatch()
            assert self._syncer.stdin is not None
            self._syncer.stdin.close()
            self._syncer.wait(10)
            self._syncer = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
