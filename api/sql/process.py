"""The SQL processes: DuckDB runs each query in a process of its own, below the hot path.

Why processes, not threads: a query's own Python (registering its views, turning its rows to
JSON) holds the GIL, and DuckDB's work takes a core; in a thread of the hot path both come out
of what the event loop serves every tenant with. Lowering such a thread's priority does not
help: the loop, waiting for the GIL, then waits for a thread the kernel is not running. A
process has its interpreter to itself, runs ``TRACKER_SQL_NICE`` (19) below the service, and
whatever happens to it (DuckDB crashing, the kernel's OOM killer) ends that process only: the
query in it answers 503 ``sql_unavailable`` and the next query starts a new one.

The processes start with the first query (a second or so: they import DuckDB and delta-rs),
and stay; at most ``TRACKER_SQL_QUERIES`` (2) queries run at once, one beyond is refused at
once (429 ``too_many_queries``). Each dies with the hot path (``PR_SET_PDEATHSIG``, which
follows the thread that started the process: one of the event loop's worker threads, which
last as long as the loop).

A SQL process is lowered to its priority by the service as soon as it exists: its start (an
interpreter importing this one's main module, DuckDB and delta-rs, ~1 s of a core) ran at the
service's priority until its initializer, and was the event loop's longest wait under runaway
queries.

How the live views reach a SQL process: each is written as an Arrow IPC file into an
in-memory file of the hot path's (``memfd_create``: gone with its last descriptor, so nothing is
left behind however the service ends), by Arrow's writer without the GIL, and the SQL process
maps it (``/proc/<service pid>/fd/<n>``): no copy of the rows is made while holding the GIL.
Through a pipe (bytes, pickled) each view was copied twice under it: ~5 ms each for 100,000
rows of ``live_lag``.

May import: api.sql.engine, api.sql.history (this module is what a SQL process imports).

>>> job = Job("SELECT count(*) AS n FROM t", None, "/nonexistent", (), None, Limits())
>>> import json, pyarrow as pa
>>> with LiveFiles({"t": pa.table({"x": [1, 2]})}) as live:
...     json.loads(answer_in_process(job, live.paths))["rows"]
[[2]]
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow as pa

from api.sql.engine import Limits, Params, QueryError, run
from api.sql.history import HISTORY, history_view


@dataclass(frozen=True)
class Job:
    """What a SQL process needs to answer a query besides its live views."""

    query: str
    params: Params | None
    warehouse: str
    history: tuple[str, ...]
    """The history views the query names (opened in the SQL process)."""
    dataflow_id: str | None
    """Only this dataflow's rows of the history views, or every row."""
    limits: Limits


def answer_in_process(job: Job, live: dict[str, str]) -> bytes:
    """The JSON body of the query's answer (what runs in a SQL process), over the live views
    in the Arrow IPC files at ``live``'s paths (:class:`LiveFiles`).

    Raises:
        QueryError: as :func:`api.sql.engine.run`.
    """
    views: dict[str, Any] = {name: pa.ipc.open_file(pa.memory_map(path)).read_all() for name, path in live.items()}
    for name in sorted(set(job.history) & HISTORY):
        views[name] = history_view(job.warehouse, name, job.dataflow_id)
    return msgspec.json.encode(run(job.query, job.params, views, job.limits).json())


def _started(priority: int) -> None:
    """A SQL process's start: below the service (``priority``: its niceness, set by the
    service already, unless that failed), and gone with it."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, priority)
    with contextlib.suppress(OSError, AttributeError):  # Linux: killed when the hot path dies, however it dies
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before prctl: nothing to serve
        os._exit(0)


def arrow_bytes(table: pa.Table) -> bytes:
    """A table as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def arrow_table(data: bytes) -> pa.Table:
    """An Arrow IPC stream's table (:func:`arrow_bytes`'s inverse).

    >>> arrow_table(arrow_bytes(pa.table({"x": [1]}))).to_pylist()
    [{'x': 1}]
    """
    with pa.ipc.open_stream(data) as reader:
        return reader.read_all()


class LiveFiles:
    """A query's live views, each in an in-memory file (Arrow IPC), open until :meth:`close`:
    what a SQL process reads at :attr:`paths`. Written by Arrow without the GIL (in the
    caller's thread: make them off the event loop)."""

    def __init__(self, tables: dict[str, pa.Table]) -> None:
        self.descriptors: dict[str, int] = {}
        try:
            for name, table in tables.items():
                descriptor = self.descriptors[name] = os.memfd_create(f"tracker-sql-{name}", os.MFD_CLOEXEC)
                with pa.OSFile(f"/proc/self/fd/{descriptor}", "wb") as sink, \
                        pa.ipc.new_file(sink, table.schema) as writer:
                    writer.write_table(table)
        except BaseException:
            self.close()
            raise
        pid = os.getpid()
        self.paths = {name: f"/proc/{pid}/fd/{descriptor}" for name, descriptor in self.descriptors.items()}
        """Each view's file, as another process of the same user opens it."""

    def close(self) -> None:
        """Free the files (a SQL process that mapped one keeps its mapping)."""
        for descriptor in self.descriptors.values():
            with contextlib.suppress(OSError):
                os.close(descriptor)
        self.descriptors = {}

    def __enter__(self) -> LiveFiles:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


ANSWER_GRACE = 10.0
"""Seconds a SQL process may take beyond its query's time limit before it is taken for stuck
(stopped, or in a call DuckDB cannot interrupt), killed, and the query answered 503: its own
timer stops a query at the limit; the grace covers a process starting (a second or so, more on
a loaded machine)."""


class _Slot:
    """One SQL process: a pool of one, made at its slot's first query and made again after it
    dies, so that one process dying or stuck fails its own query alone."""

    def __init__(self) -> None:
        self.pool: ProcessPoolExecutor | None = None

    def pids(self) -> list[int]:
        processes = getattr(self.pool, "_processes", None) or {}
        return [p.pid for p in processes.values() if p.is_alive() and p.pid is not None]

    def kill(self) -> None:
        """End the process (a stopped one too), whatever it runs; the next query makes another."""
        pids, pool, self.pool = self.pids(), self.pool, None
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class SqlProcesses:
    """At most ``size`` queries at once, each in one of ``size`` SQL processes ``nice`` below
    this one (429 beyond); a process that dies, or does not answer within
    :data:`ANSWER_GRACE` of its query's time limit, fails that query alone (503) and is
    replaced by the next query."""

    def __init__(self, size: int, nice: int = 0) -> None:
        self.size = max(1, size)
        self.priority = min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        """The SQL processes' niceness: ``nice`` below the thread that made this (the loop's)."""
        self._slots = [_Slot() for _ in range(self.size)]
        self._idle = list(self._slots)
        self._lowered: set[int] = set()

    @property
    def running(self) -> int:
        """Queries running now (from their live views to their answer)."""
        return self.size - len(self._idle)

    def pids(self) -> list[int]:
        """The SQL processes running now."""
        return [pid for slot in self._slots for pid in slot.pids()]

    async def run(self, prepare: Callable[[], dict[str, pa.Table]], job: Job) -> bytes:
        """The answer's JSON body: ``prepare()`` (the live views' tables: Python work, in a
        worker thread at the loop's priority), then the query in a SQL process.

        Raises:
            QueryError: 429 ``too_many_queries``; 503 ``sql_unavailable`` if the process died or
                did not answer in time; the query's own (:func:`api.sql.engine.run`).
        """
        if not self._idle:
            raise QueryError(429, "too_many_queries", f"{self.running} SQL queries are running, the most this "
                                                      "service runs at once (TRACKER_SQL_QUERIES); try again shortly")
        slot = self._idle.pop()
        future: Future[bytes] | None = None
        try:
            # In files the SQL process maps (see the module doc), written here: the pool's
            # feeder thread pickles what it sends in one call holding the GIL.
            with await asyncio.to_thread(lambda: LiveFiles(prepare())) as live:
                future = await self._submit(slot, job, live.paths)
                try:
                    return await asyncio.wait_for(asyncio.wrap_future(future), job.limits.seconds + ANSWER_GRACE)
                except BrokenProcessPool:
                    slot.kill()
                    raise QueryError(503, "sql_unavailable", "the SQL process running the query ended (killed, or "
                                                             "out of memory); nothing changed: send the query again"
                                     ) from None
                except TimeoutError:
                    slot.kill()
                    raise QueryError(503, "sql_unavailable", (
                        f"the SQL process running the query did not answer within {ANSWER_GRACE:.0f} s of the time "
                        "limit (stopped, or stuck) and was replaced; nothing changed: send the query again")) from None
        finally:
            if future is None or future.done():
                self._idle.append(slot)
            else:  # the caller went away: the slot is free once its process is
                loop = asyncio.get_running_loop()

                def free(_: Future[bytes]) -> None:
                    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (the service stopping)
                        loop.call_soon_threadsafe(self._idle.append, slot)
                future.add_done_callback(free)

    async def _submit(self, slot: _Slot, job: Job, live: dict[str, str]) -> Future[bytes]:
        """The query submitted to the slot's SQL process; a process that died idle is replaced
        first, since nothing of this query ran in it. From a worker thread: a submission may
        start a SQL process."""
        for attempt in range(2):
            if slot.pool is None:  # made off the loop: it starts multiprocessing's resource tracker (a process)
                slot.pool = await asyncio.to_thread(
                    ProcessPoolExecutor, 1, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_started, initargs=(self.priority,))
            try:
                return await asyncio.to_thread(self._submitted, slot.pool, job, live)
            except BrokenProcessPool:
                slot.kill()
                if attempt:
                    raise QueryError(503, "sql_unavailable", "the SQL processes cannot start; try again") from None
        raise AssertionError("unreachable")

    def _submitted(self, pool: ProcessPoolExecutor, job: Job, live: dict[str, str]) -> Future[bytes]:
        """``job`` submitted to ``pool``; a SQL process it started is lowered to
        :attr:`priority` at once (see the module doc)."""
        future = pool.submit(answer_in_process, job, live)
        running = set(self.pids())
        for pid in running - self._lowered:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, pid, self.priority)
        self._lowered = running
        return future

    def close(self) -> None:
        """Stop the SQL processes (queries running in them are cut short)."""
        for slot in self._slots:
            slot.kill()
