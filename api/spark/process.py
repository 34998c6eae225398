"""The Spark process: ``python -m api.spark.process``, started (and restarted) by ``tracker
serve``'s supervisor, never by hand.

It listens on the Unix socket the supervisor names (``TRACKER_SPARK_ADDRESS``), starts the
Spark session in the background at a lower CPU priority (``--spark-nice``) and on
``--spark-cores`` cores (``local[N]``, unless ``--master`` names another master), and serves any
number of hot-path processes: each tells it the graphs it must know (replayed on every
connect), then asks for registration checks, audits and ``--engine spark`` micro-batches; the
answers go back on the same connection. A connection that closes takes its state with it (the
hot-path process replays it on its next connect). Spark's ``Psi`` goes to the ``summaries``
table from here.

Guarantees: the hot path never waits for this process (it only ever sends); SIGINT or SIGTERM
cancels every Spark job and exits within about a second, the JVM with it
(:mod:`spark_jobs.session` ties it to this process); it dies with its supervisor. One
dataflow's trouble stays with it: a graph this process cannot rebuild, or work that fails,
is answered with an error for that dataflow (its check ``error`` with the reason, its audit not
run again, its micro-batch failed) and the connection stays open, so nothing is resent in a
loop. It tells every connection its :class:`~api.channel.messages.Status` every
:data:`STATUS_SECONDS` (the hot path takes silence as a stopped process). Its session is rebuilt
by starting afresh: when the JVM dies, or the session cannot start, it says why
(``down <reason>``, or ``fatal <reason>`` for a set-up error) and exits, and the supervisor
starts it again with a capped backoff; no answer is sent for work the dead JVM failed, so the
hot path sends that work again to the new process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from datetime import UTC, datetime
from typing import Any

from api.channel.link import Peer
from api.channel.messages import (
    Applied,
    Audit,
    Audited,
    Check,
    Checked,
    Forget,
    Hello,
    Know,
    MicroBatch,
    Running,
    Status,
    ToSpark,
    change_row,
    decode_to_spark,
    from_change_row,
)
from api.channel.supervised import CANNOT_BOOT, Supervised
from api.config import Settings
from api.delta.store import Store
from api.logs import configure_logging
from api.spark.audit import Counts, Frontier, audit
from api.spark.checks import Checker
from api.spark.known import Known
from api.spark.microbatch import microbatch
from api.spark.session import Spark
from api.spark.turns import SparkQueue
from tracker.graph import Location
from tracker.scope import ScopedLocation

log = logging.getLogger("tracker.sparkprocess")
ADDRESS_ENV = "TRACKER_SPARK_ADDRESS"
STATUS_SECONDS = 1.0
"""How often every connection is told this process's status (a heartbeat the hot path watches)."""
JVM_CHECK_SECONDS = 0.5
"""How often the JVM is looked at."""
REBUILD = 4
"""The exit code that asks the supervisor for a fresh process (the JVM died, or the session
could not start): restarted with its backoff, never taken for a boot failure."""


class SparkProcess:
    """The Spark session and the connections of the hot-path processes it serves."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.master = settings.master or f"local[{settings.spark_cores_used()}]"
        self.spark = Spark(self.master, enabled=True, timeout=settings.spark_timeout,
                           max_locations=settings.spark_max_locations)
        self.turns = SparkQueue()
        store = None
        if settings.delta:
            try:
                store = Store(settings.warehouse)
            except Exception:
                log.exception("Delta storage unavailable; Spark's Psi is not stored")
        self.checker = Checker(self.spark, self.turns, store, self._running, self._checked)
        self.peers: set[Peer] = set()
        self.jvm_gone: str | None = None
        """Why the JVM is gone (it died under the session), once seen: nothing more is answered."""
        self._tasks: set[asyncio.Task[Any]] = set()

    def status(self) -> Status:
        """This process as the hot path shows it (``GET /v1/processes``, ``/healthz``)."""
        jvm = _jvm() if self.spark.session is not None else None  # pyspark is imported by then
        return Status(pid=os.getpid(), state=self.spark.health(), jvm=None if jvm is None else jvm.pid,
                      pyspark="pyspark" in sys.modules, master=self.master, nice=os.nice(0),
                      graph_engine=self.spark.graph_engine)

    def check_jvm(self) -> str | None:
        """Why the session's JVM is gone, or ``None`` while it runs (or no session started)."""
        if self.jvm_gone is None and self.spark.session is not None and not self.spark.stopping:
            jvm = _jvm()
            code = None if jvm is None else jvm.poll()
            if code is not None:
                self.jvm_gone = f"the Spark JVM (pid {jvm.pid}) died (exit code {code}); the session is rebuilt"
        return self.jvm_gone

    async def tell_status(self) -> None:
        """Every :data:`STATUS_SECONDS`, every connection's status (a heartbeat), forever."""
        while True:
            status = self.status()
            for peer in list(self.peers):
                peer.send(status)
            await asyncio.sleep(STATUS_SECONDS)

    async def open(self) -> None:
        """Start the session; tell every connection when it is ready (or failed)."""
        await self.spark.open()
        for peer in list(self.peers):
            peer.send(self.status())

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _running(self, batch: list[Known]) -> None:
        for peer in {k.peer for k in batch if k.peer is not None}:
            peer.send(Running(dfs=[k.id for k in batch if k.peer is peer]))

    def _checked(self, dataflow: Known, result: str, detail: str) -> None:
        if dataflow.peer is not None and not (result == "error" and self.check_jvm()):  # sent again to the next
            dataflow.peer.send(Checked(df=dataflow.id, result=result, detail=detail))

    async def serve(self, peer: Peer) -> None:
        """One hot-path process's connection, until it closes."""
        self.peers.add(peer)
        known: dict[str, Known] = {}
        broken: dict[str, str] = {}  # dataflows whose graph could not be rebuilt -> why
        peer.send(self.status())
        try:
            async for message in peer.messages(decode_to_spark):
                try:
                    self._handle(peer, known, broken, message)
                except Exception as error:  # one dataflow's message: answered with an error for it alone
                    log.exception("a message could not be handled", extra={"kind": type(message).__name__})
                    df = getattr(message, "df", None)
                    if df is None or not self._refuse(peer, message, f"{type(error).__name__}: {error}"):
                        return  # not a dataflow's work (the channel is out of step): the peer replays
        finally:
            self.peers.discard(peer)
            for dataflow in known.values():
                self.checker.forget(dataflow)
                dataflow.peer = None  # its results have nowhere to go
            peer.close()

    def _handle(self, peer: Peer, known: dict[str, Known], broken: dict[str, str], message: ToSpark) -> None:
        if isinstance(message, Hello):
            log.info("hot-path process connected", extra={"pid": message.pid, "role": message.role})
        elif isinstance(message, Know):
            if message.df not in known:
                broken.pop(message.df, None)
                try:
                    known[message.df] = Known.of(message.df, message.spec, peer)
                except Exception as error:  # kept to answer its work with the reason, not to drop the channel
                    log.exception("a dataflow's graph could not be rebuilt", extra={"dataflow": message.df})
                    broken[message.df] = f"{type(error).__name__}: {error}"
        elif isinstance(message, Forget):
            broken.pop(message.df, None)
            gone = known.pop(message.df, None)
            if gone is not None:
                self.checker.forget(gone)
                gone.peer = None
        elif message.df in broken:
            self._refuse(peer, message, f"the Spark process cannot rebuild this graph ({broken[message.df]})")
        elif isinstance(message, Check):
            self.checker.request(known[message.df])
        elif isinstance(message, Audit):
            self._spawn(self._audit(known[message.df], message))
        elif isinstance(message, MicroBatch):
            self._spawn(self._microbatch(known[message.df], message))

    @staticmethod
    def _refuse(peer: Peer, message: ToSpark, reason: str) -> bool:
        """Answer a dataflow's work with ``reason`` as its error; whether ``message`` was such work."""
        if isinstance(message, Check):
            peer.send(Checked(df=message.df, result="error", detail=reason))
        elif isinstance(message, Audit):
            peer.send(Audited(df=message.df, version=message.version, stop=True, audit={
                "version": message.version, "ok": None, "error": f"{reason}; not audited again until a restart",
                "at": datetime.now(UTC).isoformat()}))
        elif isinstance(message, MicroBatch):
            peer.send(Applied(df=message.df, version=message.version, changes=[], reset=message.reset, error=reason))
        else:
            return False
        return True

    async def _audit(self, dataflow: Known, message: Audit) -> None:
        counts, live = audit_inputs(message)
        result, stop = await audit(self.spark, self.turns, dataflow, message.version, counts, live)
        if dataflow.peer is not None and not (result.get("error") and self.check_jvm()):
            dataflow.peer.send(Audited(df=dataflow.id, version=message.version, audit=result, stop=stop))

    async def _microbatch(self, dataflow: Known, message: MicroBatch) -> None:
        try:
            changes = await microbatch(self.spark, self.turns, dataflow,
                                       [from_change_row(r) for r in message.updates], message.reset)
        except Exception as error:
            log.exception("spark micro-batch failed", extra={"dataflow": dataflow.id})
            answer = Applied(df=dataflow.id, version=message.version, changes=[], reset=message.reset,
                             error=f"{type(error).__name__}: {error}")
        else:
            answer = Applied(df=dataflow.id, version=message.version, reset=message.reset,
                             changes=[change_row(c.location, c.time, c.diff) for c in changes])
        if dataflow.peer is not None and not (answer.error and self.check_jvm()):
            dataflow.peer.send(answer)

    async def stop(self) -> None:
        """Cancel every job and stop the session (waiting at most half a second for it)."""
        self.checker.cancel()
        for task in list(self._tasks):
            task.cancel()
        for peer in list(self.peers):
            peer.close()
        await self.spark.stop(wait=0.5)


def audit_inputs(message: Audit) -> tuple[Counts, Frontier]:
    """An audit's counts and live frontier, keyed by :class:`~tracker.graph.Location` (a flat
    dataflow) or by :class:`~tracker.scope.ScopedLocation` (the message names scopes).

    >>> audit_inputs(Audit(df="d", version=1, counts=[(0, 0, "source", (2,), 1)], live=[(1, 0, "target", [(2,)])],
    ...                    scopes=[[3]], live_scopes=[[]]))
    ({(ScopedLocation(scope=(3,), node=0, port=0, kind='source'), (2,)): 1}, \
{ScopedLocation(scope=(), node=1, port=0, kind='target'): [(2,)]})
    """
    counts: Counts = {}
    for i, (node, port, kind, time, n) in enumerate(message.counts):
        where = Location(node, port, kind) if message.scopes is None else ScopedLocation(  # type: ignore[arg-type]
            tuple(message.scopes[i]), node, port, kind)  # type: ignore[arg-type]
        counts[(where, tuple(time))] = n
    live: Frontier = {}
    for i, (node, port, kind, ts) in enumerate(message.live):
        where = Location(node, port, kind) if message.live_scopes is None else ScopedLocation(  # type: ignore[arg-type]
            tuple(message.live_scopes[i]), node, port, kind)  # type: ignore[arg-type]
        live[where] = [tuple(t) for t in ts]
    return counts, live


def _jvm() -> Any:
    """The ``Popen`` of the session's JVM, or ``None`` (no session started here). Only once the
    session started: importing pyspark here while the spark thread imports it breaks both."""
    with contextlib.suppress(Exception):
        from pyspark import SparkContext

        return SparkContext._gateway.proc  # type: ignore[union-attr]
    return None


async def _watch(process: SparkProcess, supervised: Supervised, stop: asyncio.Event) -> None:
    """Once the session's start ended: a set-up error (``fatal``) or a failed start (``down``)
    ends this process, and so, later, does the JVM's death (``down``); ``stop`` is set and the
    exit code to use is returned through :attr:`SparkProcess.jvm_gone`."""
    await process.spark.started.wait()
    if process.spark.session is None and not process.spark.stopping:
        reason = process.spark.error or "the Spark session did not start"
        (supervised.fatal if reason.startswith("set-up error") else supervised.down)(reason)
        process.jvm_gone = reason
        stop.set()
        return
    while not stop.is_set():
        gone = process.check_jvm()
        if gone is not None:
            log.error("the Spark JVM died; starting afresh", extra={"reason": gone})
            supervised.down(gone)
            stop.set()
            return
        await asyncio.sleep(JVM_CHECK_SECONDS)


async def _main(settings: Settings, address: str, supervised: Supervised) -> int:
    process = SparkProcess(settings)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)  # left by a process of ours that was killed
    server = await asyncio.start_unix_server(lambda r, w: process.serve(Peer(r, w)), address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(supervised.beat()), asyncio.create_task(process.open()),
             asyncio.create_task(process.tell_status()), asyncio.create_task(_watch(process, supervised, stop))]
    log.info("spark process listening", extra={"address": address, "master": process.master,
                                               "nice": os.nice(0)})
    await stop.wait()
    for peer in list(process.peers):  # the reason, before the connection drops
        peer.send(process.status())
    for task in tasks:
        task.cancel()
    server.close()
    await process.stop()
    if process.jvm_gone is None:
        return 0
    return CANNOT_BOOT if process.spark.error and process.spark.error.startswith("set-up error") else REBUILD


def main() -> int:
    """Run the Spark process with the settings and address its supervisor passed."""
    supervised = Supervised.from_env()
    supervised.watch_parent()
    settings = Settings.from_json(os.environ.pop("TRACKER_SETTINGS"))
    configure_logging(settings.log_level)
    if settings.spark_nice:
        os.nice(settings.spark_nice)
    try:
        code = asyncio.run(_main(settings, os.environ.pop(ADDRESS_ENV), supervised))
    except OSError as error:
        supervised.fatal(f"the Spark process cannot listen: {error}")
        return CANNOT_BOOT
    logging.shutdown()
    os._exit(code)  # py4j's and Spark's threads are not waited for: the JVM's watchdog ends it


if __name__ == "__main__":
    sys.exit(main())
