"""The Spark process's session and the thread its jobs run on.

Guarantees: Spark never runs on the event loop or on the request path; every Spark job runs on
the one ``spark`` thread (:class:`SparkThread`), so a slow job delays only other Spark jobs, and
the session's start (5-30 s) delays nothing but them. :meth:`Spark.run` bounds a job's time:
past its limit the job's Spark job group is cancelled and the caller gets :class:`TimedOut`.
The spark thread is a daemon and the session is stopped without waiting for it
(:meth:`Spark.stop`), so no Spark job keeps the process from exiting; the JVM exits with the
process however it ends (:mod:`spark_jobs.session` ties it to its parent). The service works
without Spark and says so (:meth:`Spark.health`).

>>> spark = Spark(None, enabled=False)
>>> spark.health()
'disabled'
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("tracker.spark")
R = TypeVar("R")


class TimedOut(Exception):
    """A Spark job ran over its time limit and was cancelled."""


class Cancelled(Exception):
    """Raised on the spark thread, between rounds of an iteration, once its job was cancelled."""


class SparkThread:
    """One daemon thread running jobs in order; :meth:`call` awaits one from the event loop.

    Unlike a ``ThreadPoolExecutor`` (whose threads the interpreter joins at exit) a job still
    running when the service stops does not hold the process, and a result arriving after the
    event loop closed is dropped instead of raising ``RuntimeError: Event loop is closed``.
    """

    def __init__(self, name: str = "spark") -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()

    async def call(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` on the thread, after the jobs before it; its result or its exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()

        def job() -> None:
            try:
                outcome: tuple[bool, Any] = (True, fn(*args))
            except BaseException as error:  # handed to the awaiting coroutine
                outcome = (False, error)
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, *outcome)

        self._jobs.put(job)
        return await future


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class Spark:
    """The shared Spark session, started in the background, and the thread its jobs run on.

    ``timeout`` bounds each check and audit (seconds; 0 = no limit) and ``max_locations`` is the
    size over which a graph is not sent to Spark at all (0 = no limit).
    """

    def __init__(self, master: str | None, *, enabled: bool, timeout: float = 0.0, max_locations: int = 0) -> None:
        self.master = master
        self.enabled = enabled
        self.timeout = timeout
        self.max_locations = max_locations
        self.thread = SparkThread()
        self.session: Any = None  # a pyspark SparkSession once started
        self.graph_engine = ""
        """The graph engine the session runs (:func:`spark_jobs.session.graph_engine`), once started."""
        self.error: str | None = None
        self.stopping = False
        self.started = asyncio.Event()
        """Set once :meth:`open` finished, whether the session started or not."""
        self._cancelled = threading.Event()  # the running job's: set once it is being cancelled
        self._groups = itertools.count()

    async def open(self) -> None:
        """Start the session on the spark thread (:meth:`start`), then set :attr:`started`."""
        try:
            await self.thread.call(self.start)
        finally:
            self.started.set()

    def start(self) -> None:
        """Start the session (5-30 s); runs on :attr:`thread` at start-up."""
        if self.stopping:
            return
        from spark_jobs.graphx import HelperMissing, engine_choice

        try:
            from spark_jobs.session import get_spark, graph_engine

            try:
                engine_choice()
            except ValueError as error:  # an unknown TRACKER_GRAPH_ENGINE
                raise HelperMissing(str(error)) from None
            started = time.perf_counter()
            session = get_spark(self.master)
            if self.stopping:  # stopped while starting: nobody will stop it later
                session.stop()
                return
            try:
                engine = graph_engine(session)
            except HelperMissing:
                session.stop()
                raise
            self.session, self.graph_engine = session, engine
            log.info("spark session ready", extra={"seconds": round(time.perf_counter() - started, 2),
                                                   "graph_engine": engine})
        except HelperMissing as error:  # a set-up error: one line, never a fallback
            self.error = f"set-up error: {error}"
            log.error("spark session not started", extra={"error": self.error})
        except Exception as error:  # the service works without Spark; say so in the status
            self.error = f"{type(error).__name__}: {error}"
            log.exception("spark session failed to start")

    def health(self) -> str:
        """``ready``, the start-up error, ``starting`` or ``disabled`` (for ``/healthz``)."""
        if self.session is not None:
            return "ready"
        return self.error or ("starting" if self.enabled else "disabled")

    def check_cancelled(self, *_: object) -> None:
        """Raise :class:`Cancelled` if the running job is being cancelled (a ``Progress``
        callback: iterations stop between rounds, where no Spark job is left to cancel)."""
        if self._cancelled.is_set():
            raise Cancelled()

    async def run(self, label: str, fn: Callable[..., R], *args: Any, limit: float | None = None) -> R:
        """``fn(*args)`` as one Spark job group on the spark thread, cancelled after ``limit``
        seconds (default :attr:`timeout`; 0 or ``None`` with no default: unbounded).

        The limit counts from the moment the job starts on the thread.

        Raises:
            TimedOut: the limit passed; the job group was cancelled and the thread is free again
                (or, if Spark is slow to let go of it, the next job waits for it).
        """
        await self.started.wait()
        if self.session is None or self.stopping:
            raise RuntimeError(self.error or "no Spark session")
        limit = self.timeout if limit is None else limit
        group = f"tracker-{next(self._groups)}"
        cancelled, finished = threading.Event(), threading.Event()

        loop = asyncio.get_running_loop()
        began = loop.create_future()

        def job() -> R:
            self._cancelled = cancelled
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, began, True, None)
            if cancelled.is_set():  # given up on before it started
                raise Cancelled()
            context = self.session.sparkContext
            context.setJobGroup(group, label, interruptOnCancel=True)
            try:
                return fn(*args)
            finally:
                finished.set()
                with contextlib.suppress(Exception):  # the session may have been stopped meanwhile
                    context.setJobGroup(f"{group}-done", "idle")

        task = asyncio.ensure_future(self.thread.call(job))
        task.add_done_callback(_retrieved)  # its outcome may arrive after the caller gave up on it
        try:
            # The limit counts from the job's start: one that Spark was slow to let go of
            # (cancellation is cooperative) delays the next, but does not eat its time.
            await began
            return await asyncio.wait_for(asyncio.shield(task), limit or None)
        except TimeoutError:
            cancelled.set()
            self._cancel(group, finished)
            asked = time.perf_counter()
            # Wait (briefly) for the thread to come back, so the next job really starts next.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), 5.0)
            log.info("spark job cancelled", extra={"job": label, "released": task.done(),
                                                   "seconds": round(time.perf_counter() - asked, 2)})
            raise TimedOut(f"{label} ran over {limit:g} s and was cancelled") from None
        except asyncio.CancelledError:
            cancelled.set()
            self._cancel(group, finished)
            raise

    def _cancel(self, group: str, finished: threading.Event) -> None:
        """Cancel ``group``'s Spark jobs until its job returns, on a thread of its own.

        ``cancelJobGroup`` cancels the jobs running at that moment only; the job's driver code
        (building frames, planning) goes on to start the next one, which the next call cancels.
        A cancelled Spark job raises in the job's thread, which ends it.
        """
        def cancel() -> None:
            while not finished.is_set() and not self.stopping:
                try:
                    self.session.sparkContext.cancelJobGroup(group)
                except Exception:  # the session is stopping or gone
                    return
                finished.wait(0.25)

        threading.Thread(target=cancel, name=f"spark-cancel-{group}", daemon=True).start()

    async def stop(self, wait: float = 1.0) -> None:
        """Cancel every Spark job and stop the session on a thread of its own, waiting at most
        ``wait`` seconds: a job that ignores cancellation does not hold the caller (the JVM
        then exits with the process)."""
        self.stopping = True
        self._cancelled.set()
        session = self.session
        if session is None:
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def stopped() -> None:
            if not done.done():
                done.set_result(None)

        def stop() -> None:
            try:
                session.sparkContext.cancelAllJobs()
                session.stop()
            except Exception:  # the JVM may be gone already
                log.debug("spark session stop failed", exc_info=True)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopped)

        threading.Thread(target=stop, name="spark-stop", daemon=True).start()
        try:
            await asyncio.wait_for(done, wait)
        except TimeoutError:
            log.info("spark session still stopping; leaving it to exit with the process")
