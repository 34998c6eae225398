"""The hot path's link to the Spark process: registration checks, audits and ``--engine spark``
micro-batches asked for over the channel, and their answers landing in each dataflow's
:class:`~api.background.state.SparkState`.

Guarantees: no method waits for the Spark process. Work is kept here until answered: checks not
concluded, audits in flight, the micro-batch in flight of each dataflow (one at a time, so its
batches stay in version order); on every (re)connect the link replays first the graphs the work
needs, then the work (:meth:`SparkLink._replay`; an audit in flight is asked again as of the
version published then). The Spark process's state is told the truth within seconds
(:meth:`SparkLink.health`): it says its status every second, so silence for
:data:`SILENT_SECONDS` reads ``unresponsive``; while it is not connected, the supervisor's record
says why and when it starts again (``down``). A micro-batch that failed is sent again with a
backoff of its own dataflow's (:data:`RETRY_SECONDS` doubling to :data:`RETRY_MAX`). After the
Spark process restarts, a ``--engine spark`` dataflow's next
micro-batch is a reset (its whole counts as of its durable version) and only the difference
between the recomputed frontier and the published one is published
(:func:`api.background.work.difference`), so its streams stay exact and never go back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from api.background.state import Hosted
from api.background.work import audit_message, difference, rows
from api.channel.link import Client
from api.channel.messages import (
    Applied,
    Audited,
    Check,
    Checked,
    Forget,
    Hello,
    Know,
    MicroBatch,
    Running,
    Status,
    ToHot,
    ToSpark,
    change_row,
    from_change_row,
)
from api.channel.supervised import read_state, spark_state_file
from api.config import Settings
from api.metrics import Metrics
from api.schema.spec import Spec, spec_fields
from tracker.reachability import FrontierChange

log = logging.getLogger("tracker.background")
RETRY_SECONDS = 1.0
"""A failed micro-batch is sent again (as a reset) after this long, doubling for each failure
in a row up to :data:`RETRY_MAX`."""
RETRY_MAX = 60.0
SILENT_SECONDS = 3.0
"""It tells its status every second: this long without a word, it is ``unresponsive``."""


class Unavailable(Exception):
    """Work that cannot be queued now: ``reason`` is ``off``, ``not_audited``, ``busy`` (the
    caller's fault or choice: 409) or ``unavailable`` (the Spark process: 503)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class SparkLink:
    """The Spark work of every dataflow of ``dataflows``; ``on_concluded`` is told of each check
    concluded otherwise than by an error (it logs the result)."""

    def __init__(self, settings: Settings, metrics: Metrics, dataflows: Mapping[str, Hosted],
                 on_concluded: Callable[[Hosted], None]) -> None:
        self.settings = settings
        self.enabled = settings.spark
        self.metrics = metrics
        self.dataflows = dataflows
        self.on_concluded = on_concluded
        self.client: Client | None = None
        if self.enabled and settings.spark_address:
            self.client = Client(settings.spark_address, self._replay, self._land, self._lost)
        self.status: Status | None = None
        self._checks: dict[str, Hosted] = {}  # not concluded yet
        self._told: set[str] = set()  # dataflows the Spark process knows on this connection
        self._audits: dict[str, int] = {}  # in flight: the version audited
        self._audited: dict[str, int] = {}  # the last version audited
        self._batches: dict[str, tuple[int, int]] = {}  # micro-batch in flight: (version, queue entries)
        self._resets: set[str] = set()  # --engine spark dataflows whose next micro-batch is a reset
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}  # micro-batches failed in a row, per dataflow
        self.heard_at = 0.0
        """When the Spark process last said anything (``time.monotonic()``)."""
        self._tasks: list[asyncio.Task[None]] = []
        self.stopping = False

    # -- life -------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect (and keep reconnecting), audit every ``audit_seconds``, run micro-batches
        (on the running event loop)."""
        if self.client is None:
            return
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.client.run()))
        if self.settings.audit_seconds > 0:
            self._tasks.append(loop.create_task(self._audit_loop(self.settings.audit_seconds)))
        if self.settings.engine == "spark":
            self._tasks.append(loop.create_task(self._microbatch_loop()))

    def stop(self) -> None:
        """Stop sending (at shutdown); what is pending is sent again after a restart."""
        self.stopping = True
        for task in self._tasks:
            task.cancel()

    @property
    def ready(self) -> bool:
        """Connected to a Spark process whose session is up, and heard from lately."""
        return self.health() == "ready"

    def health(self) -> str:
        """The Spark process's state in one word: ``disabled`` (Spark is off), ``ready``,
        ``starting``, ``unresponsive`` (connected, but silent for :data:`SILENT_SECONDS`) or
        ``down`` (not connected, or its session failed); :meth:`why` says why and until when."""
        if not self.enabled:
            return "disabled"
        if self.client is None or not self.client.connected or self.status is None:
            state = self._supervised_state()
            return "starting" if state is not None and state.get("state") == "starting" else "down"
        if time.monotonic() - self.heard_at > SILENT_SECONDS:
            return "unresponsive"
        return self.status.state if self.status.state in ("ready", "starting") else "down"

    def why(self) -> dict[str, Any]:
        """What ``/healthz`` adds to :meth:`health` when the Spark process is not ``ready``:
        ``spark_reason`` (a sentence) and, while it is down, ``spark_retry_in_seconds`` (when the
        supervisor starts it again) and ``spark_restarts``."""
        state = self.health()
        if state in ("disabled", "ready"):
            return {}
        if state == "unresponsive":
            silent = time.monotonic() - self.heard_at
            return {"spark_reason": f"the Spark process has said nothing for {silent:.0f} s (stopped or stuck); "
                                    "its supervisor restarts it after 30 s of silence"}
        if self.client is not None and self.client.connected and self.status is not None:
            return {"spark_reason": "its session is starting" if state == "starting" else self.status.state}
        supervised = self._supervised_state() or {}
        found: dict[str, Any] = {"spark_reason": supervised.get("reason") or (
            "the Spark process is starting" if state == "starting" else "the Spark process is not connected")}
        if supervised.get("state") == "down" and isinstance(supervised.get("retry_at"), int | float):
            found["spark_retry_in_seconds"] = round(max(0.0, supervised["retry_at"] - time.time()), 1)
        if isinstance(supervised.get("restarts"), int):
            found["spark_restarts"] = supervised["restarts"]
        return found

    def _supervised_state(self) -> dict[str, Any] | None:
        return read_state(spark_state_file(self.settings.spark_address)) if self.settings.spark_address else None

    def pending(self) -> dict[str, int]:
        """Work waiting for the Spark process or in its hands (for ``/healthz``)."""
        return {"checks": len(self._checks), "audits": len(self._audits),
                "micro_batches": sum(len(d.spark.queue) for d in self.dataflows.values() if d.engine_mode == "spark")}

    def process(self) -> dict[str, Any] | None:
        """The Spark process as it last described itself, or ``None`` if none is connected."""
        if self.client is None or not self.client.connected or self.status is None:
            return None
        s = self.status
        return {"role": "spark", "pid": s.pid, "state": s.state, "pyspark": s.pyspark, "jvm": s.jvm,
                "master": s.master, "nice": s.nice, "graph_engine": s.graph_engine or None,
                "connects": self.client.connects if self.client else 0}

    def graph_engine(self) -> str | None:
        """The graph engine the Spark process's session runs, in one word (``graphx`` or
        ``dataframe``; ``/healthz``), or ``None`` while no session is up (the Spark state
        says why: starting, unavailable, or its set-up error)."""
        if self.status is None or not self.status.graph_engine:
            return None
        return self.status.graph_engine.split(" ", 1)[0]

    # -- the channel ---------------------------------------------------------------------------

    def _know(self, dataflow: Hosted) -> Know:
        self._told.add(dataflow.id)
        return Know(df=dataflow.id, spec=Spec(**spec_fields(dataflow.registration)))

    def _offer(self, dataflow: Hosted, message: ToSpark) -> bool:
        """Offer ``message`` (after its dataflow's graph if the Spark process lacks it)."""
        if self.client is None:
            return False
        if dataflow.id not in self._told and not self.client.offer(self._know(dataflow)):
            self._told.discard(dataflow.id)
            return False
        return self.client.offer(message)

    def _replay(self) -> list[ToSpark]:
        """What goes first on a new connection: who we are, then each pending check and each
        audit that was in flight, with their graphs."""
        self._told.clear()
        self._batches.clear()
        self._resets = {d.id for d in self.dataflows.values() if d.engine_mode == "spark"}
        self.heard_at = time.monotonic()
        messages: list[ToSpark] = [Hello(pid=os.getpid())]
        for dataflow in self._checks.values():
            dataflow.spark.check = "pending"
            messages += [self._know(dataflow), Check(df=dataflow.id)]
        for df in list(self._audits):  # asked again, as of what is published now
            audited = self.dataflows.get(df)
            version = -1 if audited is None else audited.publication.frontier_version
            if audited is None or audited.deleted_at is not None or version < 0 or audited.live.busy():
                del self._audits[df]
                continue
            if audited.id not in self._told:
                messages.append(self._know(audited))
            messages.append(audit_message(audited, version))
            self._audits[df] = version
        log.info("spark process connected", extra={"checks": len(self._checks), "audits": len(self._audits),
                                                   "resets": len(self._resets)})
        return messages

    def _lost(self) -> None:
        self.status = None
        for dataflow in self._checks.values():
            dataflow.spark.check = "pending"
        self._batches.clear()
        self._told.clear()
        if not self.stopping:
            log.warning("the Spark process is unavailable; its work waits", extra=self.pending())

    def _land(self, message: ToHot) -> None:
        self.heard_at = time.monotonic()
        try:
            if isinstance(message, Status):
                self.status = message
            elif isinstance(message, Running):
                for df in message.dfs:
                    if df in self._checks:
                        self._checks[df].spark.check = "running"
            elif isinstance(message, Checked):
                self._checked(message)
            elif isinstance(message, Audited):
                self._landed_audit(message)
            elif isinstance(message, Applied):
                self._applied(message)
        except Exception:  # one answer's trouble must not end the link
            log.exception("a Spark answer could not be applied", extra={"answer": type(message).__name__})

    # -- checks --------------------------------------------------------------------------------

    def check(self, dataflow: Hosted) -> None:
        """Ask for ``dataflow``'s registration check (sent now or on the next connect), unless
        it is ``skipped`` (too large to send to Spark, or Spark's check is off)."""
        if dataflow.spark.check == "skipped":
            return
        dataflow.spark.check = "pending"
        self._checks[dataflow.id] = dataflow
        self._offer(dataflow, Check(df=dataflow.id))

    def _checked(self, message: Checked) -> None:
        dataflow = self._checks.pop(message.df, None)
        if dataflow is None:
            return
        dataflow.spark.check, dataflow.spark.detail = message.result, message.detail
        self.metrics.spark_checks.labels(message.result).inc()
        if message.result != "error":
            self.on_concluded(dataflow)

    # -- audits --------------------------------------------------------------------------------

    def audit(self, dataflow: Hosted) -> int:
        """Queue an audit of ``dataflow`` as of its published version (read now); that version.

        Raises:
            Unavailable: Spark is off, the dataflow is not audited, an audit of it is in flight,
                or the Spark process is not ready.
        """
        if not self.enabled:
            raise Unavailable("off", "Spark is off (TRACKER_SPARK=0): nothing audits")
        if not dataflow.spark.audited:
            raise Unavailable("not_audited", dataflow.spark.detail or "this dataflow is not audited (see status.audit)")
        if dataflow.id in self._audits:
            raise Unavailable("busy", f"an audit of version {self._audits[dataflow.id]} is in flight")
        if not self.ready:
            raise Unavailable("unavailable", f"the Spark process is not ready ({self.health()})")
        version = dataflow.publication.frontier_version
        if version < 0:
            raise Unavailable("busy", "no frontier computed yet")
        if dataflow.live.busy():  # its counts as of the published version cannot be read without waiting
            raise Unavailable("busy", "its batches are propagating in its lane: audited once it is idle")
        message = audit_message(dataflow, version)
        if not self._offer(dataflow, message):
            raise Unavailable("unavailable", "the channel to the Spark process is full or down")
        self._audits[dataflow.id] = version
        return version

    async def _audit_loop(self, seconds: float) -> None:
        """Every ``seconds``, audit every dataflow whose frontier moved since its last audit."""
        while True:
            await asyncio.sleep(seconds)
            if not self.ready:
                continue
            for dataflow in list(self.dataflows.values()):
                version = dataflow.publication.frontier_version
                if (not dataflow.ready or dataflow.deleted_at is not None or version < 0
                        or self._audited.get(dataflow.id) == version or dataflow.id in self._audits):
                    continue
                with contextlib.suppress(Unavailable):
                    self.audit(dataflow)

    def _landed_audit(self, message: Audited) -> None:
        self._audits.pop(message.df, None)
        dataflow = self.dataflows.get(message.df)
        if dataflow is None:
            return
        self._audited[message.df] = message.version
        dataflow.spark.audit = message.audit
        ok = message.audit.get("ok")
        if message.stop:
            dataflow.spark.audited = False
        if ok is not None:
            self.metrics.audit_result(dataflow.id, ok)
        self.metrics.audits.labels("ok" if ok else "mismatch" if ok is False
                                   else "timed_out" if message.stop else "error").inc()

    # -- micro-batches (--engine spark) ---------------------------------------------------------------

    def forget(self, dataflow: Hosted) -> None:
        """``dataflow`` was deleted: no more micro-batches or audits; the Spark process drops it."""
        self._resets.discard(dataflow.id)
        if self.client is not None and dataflow.id in self._told and self.client.offer(Forget(df=dataflow.id)):
            self._told.discard(dataflow.id)

    def registered(self, dataflow: Hosted) -> None:
        """A new ``--engine spark`` dataflow: its first micro-batch is its whole counts."""
        if dataflow.engine_mode == "spark":
            self._resets.add(dataflow.id)

    async def _microbatch_loop(self, interval: float = 0.05) -> None:
        while True:
            await asyncio.sleep(interval)
            if self.ready:
                self.send_microbatches()

    def send_microbatches(self) -> None:
        """Offer each ``--engine spark`` dataflow's next micro-batch: everything queued, or a
        reset (its whole counts as of its durable version), one in flight per dataflow."""
        now = time.monotonic()
        for dataflow in list(self.dataflows.values()):
            if (dataflow.engine_mode != "spark" or not dataflow.ready or dataflow.deleted_at is not None
                    or dataflow.id in self._batches or self._retry_at.get(dataflow.id, 0.0) > now):
                continue
            queue = dataflow.spark.queue
            if dataflow.id in self._resets:
                version = dataflow.live.durable_version
                message = MicroBatch(df=dataflow.id, version=version, reset=True,
                                     updates=[change_row(loc, t, n) for (loc, t), n in dataflow.live.counts().items()])
            elif queue:
                version = queue[-1][0]
                message = MicroBatch(df=dataflow.id, version=version,
                                     updates=rows(u for _, batch in queue for u in batch))
            else:
                continue
            if self._offer(dataflow, message):
                self._batches[dataflow.id] = (version, len(queue))

    def _applied(self, message: Applied) -> None:
        sent = self._batches.pop(message.df, None)
        dataflow = self.dataflows.get(message.df)
        if sent is None or dataflow is None or sent[0] != message.version:
            return
        version, taken = sent
        if message.error is not None:  # retried (as a reset: all or nothing) a little later
            self.metrics.delta_errors.inc()
            failures = self._failures[dataflow.id] = self._failures.get(dataflow.id, 0) + 1
            wait = min(RETRY_MAX, RETRY_SECONDS * 2 ** (failures - 1))
            log.error("spark micro-batch failed; will retry", extra={
                "dataflow": dataflow.id, "error": message.error, "in_seconds": wait})
            self._resets.add(dataflow.id)
            self._retry_at[dataflow.id] = time.monotonic() + wait
            return
        self._failures.pop(dataflow.id, None)
        del dataflow.spark.queue[:taken]
        changes = [FrontierChange(*from_change_row(row)) for row in message.changes]
        publication = dataflow.publication
        if message.reset:
            self._resets.discard(dataflow.id)
            changes = difference(publication.published, changes)
            if version <= publication.frontier_version:
                if changes:
                    log.error("Spark's recomputed frontier differs from the one published for its version",
                              extra={"dataflow": dataflow.id, "version": version, "changes": len(changes)})
                return
        publication.publish(version, changes)
        self.metrics.frontier_changes.inc(len(changes))
