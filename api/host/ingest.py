"""Ingest of one progress batch: the use case behind ``POST .../progress`` and the WebSocket.

The path of a batch: parse (:mod:`api.schema.parsing`) -> order and apply (:mod:`api.live.state`) -> log
(:mod:`api.durability.wal`) -> once durable, publish (:mod:`api.streams.publish`) and queue for Delta
(:mod:`api.delta.sync`) or for Spark (:mod:`api.background.spark`).

Guarantees: a batch is answered only once it is durable, and only a durable batch is
published; ordering, logging and applying happen with no ``await`` in between, so on the
single-threaded event loop a batch is atomic and the batches of one dataflow are totally
ordered without a lock (a costly dataflow's batches are ordered so too, and propagated in that
order by its own thread: :mod:`api.live.lane`); a duplicate is acknowledged once everything before it is durable, so
its acknowledgement also means durable; a refused batch changes nothing and raises
:class:`Refused` with the HTTP status and JSON body both transports answer.

>>> import asyncio, tempfile
>>> from pathlib import Path
>>> from api.config import Settings
>>> from api.schema.models import RegisterRequest
>>> from api.host.service import Service
>>> graph = {"name": "pair", "nodes": [{"id": 0, "inputs": 0, "outputs": 1}, {"id": 1, "inputs": 1, "outputs": 0}],
...          "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}}]}
>>> body = b'{"worker":"w","seq":0,"updates":[{"location":{"node":0,"port":0,"kind":"source"},"time":[0],"delta":-1}]}'
>>> async def main() -> tuple[Ack, int]:
...     service = Service(Settings(warehouse=Path(tempfile.mkdtemp()), delta=False, spark=False), "admin")
...     service.recover()  # nothing to recover; opens the log
...     tenant, _token, _ = await service.register(RegisterRequest.model_validate(graph))
...     ack = await submit(tenant, body, service.wal, service.metrics)
...     service.wal.close()
...     return ack, sum(len(times) for times in tenant.publication.published.values())
>>> asyncio.run(main())  # the input retired its only pointstamp: every frontier is empty
(Ack(applied=True, duplicate=False, version=1, worker='w', seq=0), 0)
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from api.delta.columns import RawBatch
from api.durability.records import Batch
from api.durability.wal import LogFailed, WriteAheadLog
from api.host.tenant import Tenant
from api.live.lifecycle import iso
from api.live.state import Pending, Propagated, SequenceGap
from api.metrics import Metrics
from api.schema.parsing import Indexed, InvalidRequest, MalformedJSON, parse_indexed, parse_progress
from tracker.graph import GraphError, Update
from tracker.reachability import FrontierChange

if TYPE_CHECKING:
    from progress_engine import ChangeBatch, Frontiers

log = logging.getLogger("tracker.ingest")

PREPARE_JSON_MIN = 4096
"""A version with at least this many frontier changes has its ``changes`` payload encoded by a
thread of the compiled engine from the moment it is applied (starting a thread costs tens of
microseconds; encoding 4,096 changes ~0.15 ms)."""
PREPARE_IN_LANE_MIN = 16_384
"""A version propagated in its lane with at least this many frontier changes is encoded, and
the engine's frontiers copied, on the lane's thread without the GIL
(:meth:`~api.streams.publish.Publication.publish`'s ``prepared``; the text only if someone
subscribes): folding 400,000 changes of a 1,001-wide antichain moved along 200 operators into
the published copy, and waiting for their text, held the event loop 100-200 ms."""


class Refused(Exception):
    """A request (a batch, a registration) that was not acknowledged: ``status`` and ``body``
    are the answer."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("detail") or body.get("error"))
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Ack:
    """A durable acknowledgement."""

    applied: bool
    duplicate: bool
    version: int
    worker: str
    seq: int


def bad_body(error: MalformedJSON | InvalidRequest) -> Refused:
    """400 for a body that is not one JSON document, 422 for one without the documented shape."""
    if isinstance(error, MalformedJSON):
        return Refused(400, {"error": "malformed_json", "detail": str(error)})
    return Refused(422, {"error": "invalid_request", "detail": error.detail()})


def gone(tenant: Tenant) -> Refused:
    """410: the dataflow was deleted; nothing of it changes any more."""
    return Refused(410, {"error": "dataflow_deleted", "detail": f"dataflow {tenant.id} ({tenant.name!r}) was deleted "
                         f"at {iso(tenant.deleted_at)}; it accepts no progress and streams nothing"})


def _log_failed(error: LogFailed) -> Refused:
    """503: the batch was not acknowledged (and is not durable); the service must restart."""
    return Refused(503, {"error": "log_failed", "detail": str(error)})


@dataclass(frozen=True)
class Accepted:
    """A batch ordered, logged and applied (or recognised as a duplicate) whose acknowledgement
    waits for ``durable``: :func:`settle` it."""

    ack: Ack
    durable: asyncio.Future[None]
    updates: int
    started: float


async def submit(tenant: Tenant, data: bytes, wal: WriteAheadLog, metrics: Metrics) -> Ack:
    """Parse, apply and wait for the durability of one batch: :func:`accept`, then :func:`settle`.

    Args:
        tenant: the dataflow addressed.
        data: the request body (or WebSocket message) as received.
        wal: the service's write-ahead log.
        metrics: counted into.

    Returns:
        The acknowledgement, once the batch (or, for a duplicate, everything before it) is durable.

    Raises:
        Refused: 400 or 422 for a bad body or update, 409 for a sequence gap, 410 for a deleted
            dataflow, 503 when the log failed.
    """
    return await settle(accept(tenant, data, wal, metrics), metrics)


def accept(tenant: Tenant, data: bytes, wal: WriteAheadLog, metrics: Metrics) -> Accepted:
    """The synchronous part of :func:`submit`: parse, order, log and apply one batch, with no
    ``await``, so a caller (the WebSocket) can accept the next batch at once and settle this one
    later; batches are ordered in the order accepted.

    Raises:
        Refused: as :func:`submit` (then nothing changed).
    """
    started = time.perf_counter()
    if tenant.deleted_at is not None:
        raise gone(tenant)
    if (queued := tenant.live.busy()) >= tenant.live.lane_backlog:
        raise Refused(429, {"error": "dataflow_busy", "queued": queued, "detail": (
            f"{queued} batches of this dataflow wait for its lane (TRACKER_LANE_BACKLOG): send this one again later; "
            "nothing of it was applied")})
    try:
        # The compiled engine takes flat integer lists: no Python object per update.
        updates: list[Update] | Indexed
        if tenant.hosting is not None:
            worker, seq, updates = tenant.hosting.parse(data)
        else:
            worker, seq, updates = (parse_progress if tenant.live.native is None else parse_indexed)(data, tenant.graph)
        version, applied, durable = _order(tenant, worker, seq, updates, wal, metrics, data)
    except (MalformedJSON, InvalidRequest) as error:
        metrics.rejected.inc()
        raise bad_body(error) from None
    except GraphError as error:
        metrics.rejected.inc()
        raise Refused(422, {"error": "invalid_update", "detail": str(error)}) from None
    except SequenceGap as gap:
        metrics.gaps.inc()
        raise Refused(409, {"error": "sequence_gap", "expected": gap.expected, "worker": worker, "seq": seq,
                            "detail": f"worker {worker!r} sent seq {seq}; expected {gap.expected}"}) from None
    except LogFailed as error:
        raise _log_failed(error) from None
    return Accepted(Ack(applied, not applied, version, worker, seq), durable, len(updates), started)


async def settle(accepted: Accepted, metrics: Metrics) -> Ack:
    """Wait until an accepted batch is durable and count it.

    Raises:
        Refused: 503 when the log failed before the batch was durable.
    """
    try:
        await accepted.durable
    except LogFailed as error:
        raise _log_failed(error) from None
    if accepted.ack.applied:
        metrics.applied.inc()
        metrics.updates.inc(accepted.updates)
        metrics.apply_latency.observe(time.perf_counter() - accepted.started)
    else:
        metrics.duplicates.inc()
    return accepted.ack


def _order(tenant: Tenant, worker: str, seq: int, updates: list[Update] | Indexed, wal: WriteAheadLog, metrics: Metrics,
           raw: bytes) -> tuple[int, bool, asyncio.Future[None]]:
    """The synchronous hot path: order, log, apply; ``(version, applied, durable future)``."""
    if wal.failed is not None:  # refuse before touching any state
        raise LogFailed()
    live = tenant.live
    version = live.admit(worker, seq)
    if version is None:
        barrier = wal.barrier()
        if live.in_lane and live.last_in_lane is not None:  # what it duplicates may be propagating still
            barrier = _both(barrier, live.last_in_lane)
        return live.duplicate_version(worker, seq), False, barrier
    pending = Pending(version, worker, seq, updates, time.time())
    if live.uses_lane(tenant.cost.of(updates) if tenant.cost is not None else 0.0):
        return version, True, _order_in_lane(tenant, pending, wal, metrics, raw)
    # Log first, apply second: the sync process syncs while this thread applies (the batch is
    # validated, so applying cannot fail); the publish callback runs after both.
    box: list[list[FrontierChange] | ChangeBatch] = []
    durable = wal.enqueue(Batch(tenant.id, version, pending.received, raw),
                          lambda: made_durable(tenant, pending, box[0], raw, metrics))
    regressed, in_lane = live.regression_count, live.in_lane
    changes = live.apply(pending)
    if live.in_lane and not in_lane:
        log.info("a batch took over 1 ms to propagate: this dataflow's next batches propagate in a thread of "
                 "its own", extra={"dataflow": tenant.id, "version": version})
    if live.regression_count and not regressed:  # the first: the status keeps naming them, the log says it once
        log.warning("a batch moved a frontier backwards (a protocol violation): the dataflow is in violation",
                    extra={"dataflow": tenant.id, "version": version, "worker": worker, "seq": seq})
    if not isinstance(changes, list) and len(changes) >= PREPARE_JSON_MIN and tenant.engine_mode != "spark":
        # Encoded by a thread of the engine's while the log syncs and other dataflows are
        # served: encoding 32,000 changes on publishing held the event loop ~1.7 ms.
        changes.prepare_json()
        wal.prefer_sync_process()
    box.append(changes)
    return version, True, durable


def _order_in_lane(tenant: Tenant, pending: Pending, wal: WriteAheadLog, metrics: Metrics, raw: bytes
                   ) -> asyncio.Future[None]:
    """Log a costly dataflow's batch and have its lane propagate it; a future that resolves
    once it is durable and published (:func:`made_durable` runs once both the log record is
    durable and the batch propagated, which keeps version order: both come in that order)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    box: list[list[FrontierChange] | ChangeBatch] = []
    durable = [False]
    prepared: list[tuple[str | None, Frontiers]] = []

    def publish() -> None:
        made_durable(tenant, pending, box[0], raw, metrics, prepared[0] if prepared else None)
        if not done.done():
            done.set_result(None)

    def logged() -> None:
        durable[0] = True
        if box:
            publish()

    def log_failed(future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None and not done.done():
            done.set_exception(future.exception())  # type: ignore[arg-type]

    def applied(future: asyncio.Future[Propagated]) -> None:
        if future.exception() is not None:  # a validated batch cannot fail: a bug, said loudly
            log.error("a batch failed to propagate in its lane", exc_info=future.exception(),
                      extra={"dataflow": tenant.id, "version": pending.version})
            if not done.done():
                done.set_exception(RuntimeError("propagation failed"))
            return
        result = future.result()
        changes = result[0]
        if tenant.live.lane_applied(pending, result):
            log.warning("a batch moved a frontier backwards (a protocol violation): the dataflow is in violation",
                        extra={"dataflow": tenant.id, "version": pending.version, "worker": pending.worker,
                               "seq": pending.seq})
        box.append(changes)
        if durable[0]:
            publish()

    def encode(result: Propagated) -> None:  # on the lane's thread, the engine at this version
        changes, native = result[0], tenant.live.native
        if isinstance(changes, list) or len(changes) < PREPARE_JSON_MIN or tenant.engine_mode == "spark":
            return
        publication = tenant.publication
        if len(changes) < PREPARE_IN_LANE_MIN or native is None or not publication.engine_rows:
            changes.prepare_json()
            return
        # Made without the GIL; the text only for subscribers (else when someone reads it): a
        # 61 MB text cost ~100 ms of a core to make and held the GIL ~5 ms to free.
        subscribed = bool(publication.subscribers)
        prepared.append((changes.to_json(compact=True) if subscribed else None, native.frontier_copy()))

    wal.enqueue(Batch(tenant.id, pending.version, pending.received, raw), logged).add_done_callback(log_failed)
    wal.prefer_sync_process()  # its publishing is long: the event loop stays free during the sync
    asyncio.wrap_future(tenant.live.apply_in_lane(pending, encode), loop=loop).add_done_callback(applied)
    tenant.live.last_in_lane = done
    return done


def _both(first: asyncio.Future[None], second: asyncio.Future[None]) -> asyncio.Future[None]:
    """A future that resolves once both have (with the first exception met)."""
    return asyncio.ensure_future(_await_both(first, second))


async def _await_both(first: asyncio.Future[None], second: asyncio.Future[None]) -> None:
    await asyncio.shield(second)
    await first


def made_durable(tenant: Tenant, pending: Pending, changes: list[FrontierChange] | ChangeBatch, raw: bytes,
                 metrics: Metrics | None, prepared: tuple[str | None, Frontiers] | None = None) -> None:
    """A batch's log record is durable: advance the durable version, queue the batch for
    Delta and publish its changes (or, with the Spark engine, queue it for Spark); ``prepared``
    as :meth:`~api.streams.publish.Publication.publish` takes it."""
    tenant.live.made_durable(pending.version)
    updates = pending.updates
    # The body as received: the Delta flush has Arrow decode it (see api.delta.columns); a nested
    # dataflow's updates as parsed, on the stand-ins its Delta rows keep (see api.live.scopes).
    rows: list[Update] | RawBatch
    if tenant.hosting is not None:
        assert isinstance(updates, list)  # a nested dataflow's engine takes parsed updates
        rows = updates
    else:
        rows = RawBatch(raw, len(updates)) if updates else []
    tenant.lag.batch_durable(pending.version, pending.worker, pending.seq, rows, pending.received)
    tenant.ages.batch_durable(pending.received, pending.worker, updates)
    tenant.throughput.add(pending.received, len(updates))
    if tenant.engine_mode == "spark":
        tenant.spark.queue.append((pending.version, list(updates)))
        return
    tenant.publication.publish(pending.version, changes, prepared=prepared)
    if metrics is not None:
        metrics.frontier_changes.inc(len(changes))
