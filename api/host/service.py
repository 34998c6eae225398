"""The service object: the registry of dataflows, registration, recovery, and the parts that
serve them (the write-ahead log, the Delta sync, Spark).

Guarantees: every acknowledged registration and batch is a record in the write-ahead log
(:mod:`api.durability.wal`: group commit, one ``fdatasync`` shared by concurrent requests) before it is
answered. Recovery rebuilds each dataflow from its registration, then the compacted
``pointstamps`` snapshot, then the Delta ``progress`` batches after it, then the log records
beyond what ``progress`` holds, so every acknowledged batch is applied exactly once; the
batches the log holds but ``progress`` does not are queued for the next flush, so that
``progress`` too gets every batch exactly once.

Long because: registration, deletion and recovery each change the registry, the token index,
the log's header and its size together; split apart, those invariants would be read in pieces.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import NamedTuple, NoReturn

from api.background.spark import SparkLink
from api.background.state import Hosted
from api.config import ENGINE_NAMES, Settings
from api.delta.columns import RawBatch
from api.delta.graphs import GraphWriter
from api.delta.store import Store, Survey
from api.delta.sync import Syncer
from api.delta.tidy import Tidier
from api.durability.records import Check, Checkpoint, Delete, Record, Register
from api.durability.recovery import Damaged, Evidence, gather, missing_detail, span, unregistered
from api.durability.wal import LogFailed, WriteAheadLog, framed
from api.host.build import Builder
from api.host.ingest import Refused
from api.host.keys import Keys, dataflow_token, load_secret
from api.host.priority import background_pool
from api.host.tenant import Tenant
from api.host.tokens import Principal, matches, program_dataflow_token, token_hash
from api.live.scopes import Hosting
from api.live.state import Counts
from api.metrics import Metrics
from api.schema.models import RegisterRequest
from api.schema.registration import RegistrationError, build_graph, is_nested
from api.schema.spec import Spec, registration_record, spec_fields
from api.shards.ids import new_id
from api.shards.layout import adopt_legacy_log, wal_directory
from tracker.graph import GraphError, Location, Update
from tracker.scope import ScopedLocation
from tracker.structure import release
from tracker.timestamp import Timestamp

log = logging.getLogger("tracker.service")


class Registered(NamedTuple):
    """What :meth:`Service.register` answers: the dataflow, its token, and whether this is the
    answer given before to a registration with the same idempotency key."""

    tenant: Tenant
    token: str
    replayed: bool

FREEZE_LOCATIONS = 10_000
"""A registered graph with at least this many locations is moved out of the collector's reach."""


class Service:
    """All dataflows of one service process, and the machinery around them."""

    def __init__(self, settings: Settings, admin_token: str, store: Store | None = None,
                 program_token: str | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics(ENGINE_NAMES[settings.engine], per_dataflow=settings.metrics_per_dataflow)
        self.admin_hash = token_hash(admin_token)
        self.program_token = program_token
        self.program_hash = None if program_token is None else token_hash(program_token)
        self.dataflows: dict[str, Tenant] = {}
        self.token_index: dict[str, str] = {}
        self.wal = WriteAheadLog(wal_directory(settings.warehouse, settings.shard), on_sync=self.metrics.on_sync,
                                 header=self.log_header)
        self.store = store
        # The lowest priority by default, not +10: each shard's catch-up runs on several delta-rs
        # threads, whose weights add up; at +10 three shards' catch-up still took about as much
        # CPU as a restarted shard's event loop (after a burst of 10,000 registrations over 4
        # shards: 8.6-9.6 s until the restarted shard's dataflows all answered, 7.0-7.3 s at +19).
        self.delta_pool = background_pool("delta", settings.delta_nice)
        self.background = SparkLink(settings, self.metrics, self.dataflows, self._remember_check)
        self.started = time.time()
        self.loop: asyncio.AbstractEventLoop | None = None  # the event loop serving requests
        self.checks: dict[str, Check] = {}  # dataflow id -> its logged Spark check result
        self.damaged: dict[str, Damaged] = {}  # dataflows recovery refused
        self.delta_damaged: dict[str, str] = {}  # Delta tables recovery found damaged -> what is wrong
        self.deletions: dict[str, Delete] = {}  # dataflow id -> its logged deletion
        self.syncer = Syncer(store, self.delta_pool, self.wal, self.metrics, self.dataflows, self.log_header,
                             segment_bytes=settings.segment_bytes,
                             tidier=Tidier(store, self.delta_pool, settings.vacuum_hours,
                                           vacuum=settings.shard == 0, shared=settings.sharded))
        self.graphs = GraphWriter(store, self.delta_pool, self.metrics)
        self.build = Builder(settings, store is not None)
        self.header_bytes = 0
        """Bytes of the registrations every new log segment starts with (those of the dataflows hosted)."""
        self._unstored: list[Tenant] = []  # recovered without their graph tables: write them
        self._unchecked: list[Tenant] = []  # recovered with no Spark check result: run it
        self.keys = Keys()
        self.secret = load_secret(settings.warehouse)
        self.clock = time.time
        """What registration deadlines are compared with (POSIX seconds)."""
        self.stopping = False

    def authenticate(self, token: str) -> Principal | None:
        """The principal of a token, or ``None`` if it is nobody's."""
        presented = token_hash(token)
        if matches(presented, self.admin_hash):
            return Principal(admin=True)
        if self.program_hash is not None and matches(presented, self.program_hash):
            return Principal(admin=False, program=self.program_token)
        dataflow_id = self.token_index.get(presented)
        if dataflow_id is None:
            return None
        known = self.dataflows.get(dataflow_id) or self.damaged.get(dataflow_id)
        if known is not None and known.token_hash is not None and matches(presented, known.token_hash):
            return Principal(admin=False, dataflow_id=dataflow_id)
        return None

    # -- registration ---------------------------------------------------------------------

    async def register(self, req: RegisterRequest, caller: Principal | None = None, key: str | None = None,
                       deadline: float | None = None) -> Registered:
        """Validate (off the loop), log durably, and make the dataflow live. ``req``'s node and
        edge lists are emptied once read. Registered by the program token (``caller``), its token
        is derived from the program token (:func:`~api.host.tokens.program_dataflow_token`), else
        from the warehouse's secret (:func:`~api.host.keys.dataflow_token`). With an idempotency
        ``key`` a registration already made with it is answered again (the same dataflow and
        token); with a ``deadline`` (POSIX seconds) one that would be logged after it is refused,
        or withdrawn once durable (:mod:`api.host.keys`).

        Returns:
            The dataflow, its token (derived from the warehouse's secret; only its hash is
            kept) and whether the answer is a replay of an earlier one.

        Raises:
            RegistrationError: the graph is refused (the 422 body).
            Refused: the key registered another graph (409), or the deadline passed (503).
            LogFailed: the log could not make the registration durable (nothing is registered).
        """
        if self.wal.failed is not None:  # refuse before any work
            raise LogFailed() from self.wal.failed
        spec = await asyncio.to_thread(registration_record, req)  # ~26 us per node
        # The request's models are not needed past here (the spec holds the graph): released a
        # model at a time off the loop, not at once when the route returns.
        await asyncio.to_thread(release, req.nodes, req.edges)
        if key is None:
            return await self._register(spec, caller, None, deadline)
        async with self.keys.claim(key) as known:
            if known is not None:
                return self._again(known, key, spec, caller)
            return await self._register(spec, caller, key, deadline)

    def _again(self, dataflow_id: str, key: str, spec: Spec, caller: Principal | None) -> Registered:
        """The first answer to a registration with ``key``, for the same graph and a caller who
        may have it (the program token: only a dataflow it registered)."""
        tenant = self.dataflows.get(dataflow_id)
        if tenant is None:
            damaged = self.damaged.get(dataflow_id)
            raise Refused(503, {"error": "dataflow_damaged", "detail": damaged.detail if damaged else
                                f"dataflow {dataflow_id} is not hosted here"})
        if spec_fields(tenant.registration) != spec_fields(spec) or not (
                caller is None or caller.may_access(dataflow_id, tenant.token_hash)):
            raise Refused(409, {"error": "idempotency_key_reused", "detail": (
                f"the Idempotency-Key {key!r} registered another dataflow; use a new key for a new registration")})
        tokens = [dataflow_token(self.secret, dataflow_id)]
        if self.program_token is not None:
            tokens.append(program_dataflow_token(self.program_token, dataflow_id))
        token = next((t for t in tokens if matches(token_hash(t), tenant.token_hash or "")), None)
        if token is None:  # registered before tokens were derived: not to be given again
            raise Refused(409, {"error": "idempotency_key_reused", "detail": (
                f"the dataflow the Idempotency-Key {key!r} registered has a token that cannot be given again")})
        return Registered(tenant, token, replayed=True)

    async def _register(self, spec: Spec, caller: Principal | None, key: str | None, deadline: float | None
                        ) -> Registered:
        # Whether it has scopes is a look at every node: off the loop too.
        nested = await asyncio.to_thread(is_nested, spec)
        hosting = None
        if nested:
            hosting, tracker, initial = await asyncio.to_thread(self.build.nested, spec, True)
            graph = hosting.root
        else:
            if spec.initial_scopes:  # a scope path in a dataflow without scopes
                index, scope = next((i, s) for i, s in enumerate(spec.initial_scopes) if s)
                raise RegistrationError({"error": "invalid_graph",
                                         "detail": f"initial pointstamps: update {index}: unknown scope {scope}"})
            # The antichain cost limit follows the engine: ~25 ms per batch of whichever tracks the graph.
            graph, initial = await asyncio.to_thread(build_graph, spec, compiled=self.settings.engine == "native")
            tracker = await asyncio.to_thread(self.build.engine, graph, initial)
        dataflow_id = new_id(self.settings.shard)
        program = None if caller is None else caller.program
        token = dataflow_token(self.secret, dataflow_id) if program is None else program_dataflow_token(program,
                                                                                                       dataflow_id)
        record = Register.of(spec, df=dataflow_id, token=token_hash(token), created_at=datetime.now(UTC).isoformat(),
                             key=key)
        # Its frontier copy and Publication are O(graph): off the loop too (nothing there awaits).
        tenant = await asyncio.to_thread(self.build.tenant, record, graph, tracker, initial, hosting)
        as_framed = await asyncio.to_thread(framed, record)  # O(graph): ~35 ms for 50,000 nodes
        if deadline is not None and self.clock() > deadline:  # its sender has moved on: nothing is logged
            raise Refused(503, {"error": "deadline_passed", "detail": "the registration's deadline passed before it "
                                                                      "was logged; nothing was registered"})
        self._make_room(len(as_framed))
        tenant.framed_registration = as_framed
        self.dataflows[tenant.id] = tenant  # in the registry (and log headers) before it is durable
        try:
            await self.wal.enqueue(record, as_framed=as_framed)
        except LogFailed:
            del self.dataflows[tenant.id]
            self.header_bytes -= len(as_framed)
            raise
        if deadline is not None and self.clock() > deadline:
            await self._withdraw(tenant)
        tenant.ready = True
        self.token_index[tenant.token_hash] = tenant.id
        if key is not None:
            self.keys.add(key, tenant.id)
        self.metrics.dataflows.set(len(self.dataflows))
        if len(graph.locations()) >= FREEZE_LOCATIONS:
            # A big graph is ~10 objects per location that live as long as the service: frozen
            # (O(1)), the collector's full passes no longer walk them; walking those of a few
            # 50,000-node graphs took the loop 100+ ms per pass.
            gc.freeze()
        log.info("registered dataflow", extra={"dataflow": tenant.id, "dataflow_name": spec.name,
                                               "locations": len(graph.locations())})
        self._after_registration(tenant)
        return Registered(tenant, token, replayed=False)

    async def _withdraw(self, tenant: Tenant) -> NoReturn:
        """Undo a registration that became durable after its sender's deadline (the front may
        have sent it to another shard): a logged withdrawal, so a restart does not host it."""
        del self.dataflows[tenant.id]
        self.header_bytes -= len(tenant.framed_registration or b"")
        with contextlib.suppress(LogFailed):
            await self.wal.enqueue(Delete(df=tenant.id, at=time.time(), withdrawn=True))
        log.warning("registration withdrawn: durable after its deadline", extra={"dataflow": tenant.id})
        raise Refused(503, {"error": "deadline_passed", "detail": "the registration became durable after its "
                                                                  "deadline and was withdrawn; nothing is registered"})

    def _make_room(self, size: int) -> None:
        """Count a registration of ``size`` framed bytes into :attr:`header_bytes`, or refuse it
        (507 ``log_header_full``) if every new log segment would then start with more than half
        a segment of registrations: a header as large as a segment rotated the log over and over."""
        limit = self.settings.segment_bytes // 2
        if self.header_bytes + size > limit:
            raise Refused(507, {"error": "log_header_full", "detail": (
                f"the registrations of the {len(self.dataflows)} dataflows hosted take {self.header_bytes} bytes "
                f"of the write-ahead log, and this one {size} more: every log segment starts with all of them, and "
                f"they may take at most half a segment ({limit} bytes; TRACKER_WAL_SEGMENT_BYTES is "
                f"{self.settings.segment_bytes}). Register a smaller graph, or raise TRACKER_WAL_SEGMENT_BYTES and "
                "restart (deleted dataflows stay in the header)")})
        self.header_bytes += size

    async def delete(self, tenant: Tenant) -> None:
        """Delete a dataflow: from now on its progress is refused (410) and its streams end;
        answered once the deletion is durable, so a restart keeps it deleted. Its state stays
        readable and its Delta rows stay, ``dataflows.deleted_at`` set.

        Raises:
            LogFailed: the log could not make the deletion durable.
        """
        record = Delete(df=tenant.id, at=time.time())
        tenant.deleted_at = record.at  # refuses batches at once: none is admitted after this line
        if tenant.live.lane is not None:
            tenant.live.lane.close()
        self.deletions[tenant.id] = record
        tenant.publication.end()
        self.background.forget(tenant)
        await self.wal.enqueue(record)
        log.info("deleted dataflow", extra={"dataflow": tenant.id, "dataflow_name": tenant.name})
        self.graphs.queue_deleted([tenant])

    def _after_registration(self, tenant: Tenant) -> None:
        """Background work that must not delay the answer: graph tables, Spark check."""
        self.graphs.queue([tenant])
        self.background.registered(tenant)
        if self.build.checks_in_spark:
            self._check_in_spark(tenant)

    def after_recovery(self) -> None:
        """Finish what a crash interrupted: graph tables never written, Spark checks never
        concluded (queued behind the Spark session's start, checked together)."""
        self.graphs.queue(list(self._unstored))
        # Idempotent, and covers a crash between the logged deletion and its Delta row.
        self.graphs.queue_deleted([self.dataflows[d] for d in self.deletions if d in self.dataflows])
        for tenant in self._unchecked:
            self._check_in_spark(tenant)
        self._unstored, self._unchecked = [], []

    def _check_in_spark(self, tenant: Tenant) -> None:
        self.background.check(tenant)

    def _remember_check(self, dataflow: Hosted) -> None:
        """Log a concluded Spark check (on the event loop), so a restart reports it again
        instead of running it again."""
        record = Check(df=dataflow.id, result=dataflow.spark.check, detail=dataflow.spark.detail)
        self.checks[record.df] = record
        if self.stopping:  # the log may be closed: the check runs again after the restart
            return
        with contextlib.suppress(LogFailed):  # nobody waits: a check lost in a crash runs again after the restart
            self.wal.enqueue(record).add_done_callback(lambda done: done.cancelled() or done.exception())

    # -- recovery -------------------------------------------------------------------------

    def recover(self) -> None:
        """Rebuild every dataflow, then open the log.

        Each dataflow starts from the compacted ``pointstamps`` snapshot (counts as of a version,
        if compaction ever ran) or its initial counts, applies the batches after it, and takes
        its workers' positions from its latest log checkpoint plus the batches after that
        (:mod:`api.durability.recovery` says which versions it needs). The batches come from the log, and
        from the Delta ``progress`` table only for versions the log does not hold intact. Starting
        from the snapshot makes a restart cost the state plus the recent tail, not the whole
        history; the Delta tables are read in bulk (one read per table, not per dataflow). Log
        records ``progress`` does not hold yet are queued for the next flush, so that
        ``progress`` still gets every batch exactly once.

        A dataflow whose batches cannot all be found (a damaged log record, a lost Delta table)
        is refused alone (:attr:`damaged`); the others start.

        Raises:
            api.durability.segments.UnreadableLog: log bytes that cannot be attributed to a dataflow.
        """
        if self.settings.shard == 0 and (moved := adopt_legacy_log(self.settings.warehouse)):
            log.info("the log from before shards is shard 0's now", extra={"segments": moved})
        contents = self.wal.recover()
        evidence, self.checks, self.deletions = gather(contents)
        store = self.store
        with store.warehouse.pinned() if store is not None else contextlib.nullcontext():
            ids = sorted(evidence)
            survey = store.survey(ids) if store is not None else Survey()
            self.delta_damaged = survey.problems
            stored, snapshots, in_delta, compacted = survey.registered, survey.snapshots, survey.in_delta, \
                survey.compacted
            for dataflow_id in ids:
                if (deleted := self.deletions.get(dataflow_id)) is not None and deleted.withdrawn:
                    del self.deletions[dataflow_id]  # never served: not hosted, not listed
                    continue
                refused = unregistered(dataflow_id, evidence[dataflow_id])
                lost = evidence[dataflow_id].lost_deletion(dataflow_id in self.deletions)
                if refused is None and lost is not None:  # serving it would undo an acknowledged deletion
                    refused = self._refusal(evidence[dataflow_id], lost)
                if refused is None:
                    try:
                        refused = self._recover_one(evidence[dataflow_id], snapshots.get(dataflow_id),
                                                    in_delta.get(dataflow_id, -1), compacted.get(dataflow_id, -1),
                                                    stored, survey.births.get(dataflow_id, {}),
                                                    survey.since.get(dataflow_id))
                    except Exception as error:  # one dataflow's inconsistency must not stop the others
                        log.exception("recovery of a dataflow failed", extra={"dataflow": dataflow_id})
                        refused = self._refusal(evidence[dataflow_id], f"recovery failed: {error}")
                if refused is not None:
                    self._refuse(refused)
        for tenant in self.dataflows.values():  # a rotation's header repeats them as logged
            tenant.framed_registration = contents.registrations.get(tenant.id)
            if tenant.registration.key is not None:
                self.keys.add(tenant.registration.key, tenant.id)
        self.header_bytes = sum(len(d.framed_registration or b"") for d in self.dataflows.values())
        for dataflow_id, deletion in self.deletions.items():  # deleted stays deleted: 410, no stream
            if dataflow_id in self.dataflows:
                self.dataflows[dataflow_id].deleted_at = deletion.at
                self.dataflows[dataflow_id].publication.ended = True
        self.metrics.dataflows.set(len(self.dataflows))
        self.wal.open()

    def _refusal(self, evidence: Evidence, detail: str) -> Damaged:
        record = evidence.registration
        assert record is not None
        return Damaged(record.df, detail, record.token, record.name, record.arity, record.created_at)

    def _refuse(self, damaged: Damaged) -> None:
        log.error("dataflow refused: damaged", extra={"dataflow": damaged.id, "detail": damaged.detail})
        self.damaged[damaged.id] = damaged
        self.dataflows.pop(damaged.id, None)
        if damaged.token_hash is not None:
            self.token_index[damaged.token_hash] = damaged.id
        self.wal.hold = True  # its records must outlive the Delta sync's retirement of segments
        self.metrics.damaged.set(len(self.damaged))

    def _recover_one(self, evidence: Evidence, stored_snapshot: tuple[int, StoredCounts] | None, in_delta: int,
                     compacted: int, stored: set[str], births: StoredBirths,
                     since: Mapping[Location | ScopedLocation, float] | None) -> Damaged | None:
        record = evidence.registration
        assert record is not None
        store = self.store
        dataflow_id = record.df
        base = stored_snapshot[0] if stored_snapshot is not None else 0
        start, end, missing = span(evidence, base, in_delta)
        hosting = None
        if is_nested(record):
            hosting, _, initial = self.build.nested(record, False, empty=True)
            graph = hosting.root
        else:
            graph, initial = build_graph(record, new=False)
        from_delta: dict[int, tuple[str, int, list[Update], float]] = {}
        if missing and store is not None and in_delta >= missing[0]:
            from_delta = store.progress(dataflow_id, after=missing[0] - 1, hosting=hosting)
        missing = [v for v in missing if v not in from_delta]
        if missing:
            return self._refusal(evidence, missing_detail(missing, evidence))
        if evidence.acknowledged is not None and evidence.acknowledged.version > evidence.log_reaches():
            log.warning("acknowledged batches missing from the write-ahead log (cut?) were read from Delta", extra={
                "dataflow": dataflow_id, "acknowledged": evidence.acknowledged.version,
                "log_reaches": evidence.log_reaches()})
        snapshot = None if stored_snapshot is None else (base, _stand_ins(stored_snapshot[1], hosting))
        if snapshot is None:  # never compacted: replay everything from the initial counts
            tracker = self.build.engine(graph, initial, hosting)
        else:  # start from the compacted counts and replay only what follows them
            tracker = self.build.engine(graph, [(loc, t, c) for (loc, t), c in snapshot[1].items()], hosting)
        # Without a snapshot every batch is replayed with its time: the ages are those before the
        # restart. A snapshot keeps its pointstamps' births and its frontiers' last moves; one
        # written before they were kept dates them to the restart (its ages: lower bounds).
        registered = datetime.fromisoformat(record.created_at).timestamp()
        tenant = self.build.tenant(record, graph, tracker, initial, hosting, at_registration=snapshot is None,
                                  created=registered if snapshot is None or since is not None else None)
        tenant.live.version = base
        if snapshot is not None:
            moved = None if since is None else {_stand_in(loc, hosting): at for loc, at in since.items()}
            tenant.ages.seed(snapshot[1], time.time(), {(_stand_in(loc, hosting), t): birth
                                                        for (loc, t), birth in births.items()}, moved)
            if moved:
                tenant.publication.last_change_at = max(moved.values())
        lag, live = tenant.lag, tenant.live
        if in_delta >= 0:
            lag.unflushed.clear()  # the initial counts (version 0) are in Delta already
        checkpoint = evidence.checkpoint
        positions = dict(checkpoint.workers) if checkpoint is not None else {}
        logged = evidence.batches
        # Logged batches at or below `start` matter only if `progress` lacks them (to flush them).
        for version in sorted(v for v in set(logged) | set(range(start + 1, end + 1)) if v > min(start, in_delta)):
            batch = logged.get(version)
            if batch is not None:
                worker, seq, updates = tenant.parse(batch.body)  # validated before it was logged
                at = batch.at
            else:
                worker, seq, updates, at = from_delta[version]
            if version > start and positions.get(worker, (-1, -1))[1] < version:
                positions[worker] = (seq, version)
            if base < version:
                self._replay(tenant, version, worker, seq, updates, at)
            if version > in_delta and batch is not None:  # in the log, not yet in progress
                lag.batch_durable(version, worker, seq, RawBatch(batch.body, len(updates))
                                  if updates and hosting is None else updates, at)
        live.restore_positions(positions)
        live.durable_version = live.version
        lag.delta_version = max(in_delta, 0)
        if tenant.engine_mode != "spark":
            tenant.reset_published()
            tenant.publication.history_floor = max(tenant.publication.history_floor, base)  # none before it
        lag.uncompacted = [u for u in lag.uncompacted if u[0] > compacted]
        lag.compacted_version = compacted
        if store is None:
            lag.uncompacted.clear()
        self._resume_side_work(tenant, stored)
        if tenant.engine_mode == "spark":
            tenant.reset_published()  # Spark recomputes the frontier from the recovered counts
        tenant.ready = True
        self.dataflows[dataflow_id] = tenant
        self.token_index[tenant.token_hash] = dataflow_id
        log.info("recovered dataflow", extra={"dataflow": dataflow_id, "version": live.version,
                                              "delta_version": lag.delta_version,
                                              "snapshot_version": None if snapshot is None else base})
        return None

    def _resume_side_work(self, tenant: Tenant, stored: set[str]) -> None:
        """Status of a recovered dataflow's graph tables and Spark check; what is missing is
        queued for :meth:`after_recovery`."""
        tenant.lag.graph_stored = tenant.id in stored
        if self.store is not None and not tenant.lag.graph_stored:
            self._unstored.append(tenant)
        if tenant.spark.check == "skipped":
            return
        check = self.checks.get(tenant.id)
        if check is None:
            self._unchecked.append(tenant)
        else:
            tenant.spark.check, tenant.spark.detail = check.result, check.detail

    @staticmethod
    def _replay(tenant: Tenant, version: int, worker: str, seq: int, updates: list[Update], at: float) -> None:
        try:
            changes = tenant.live.replay(version, worker, seq, updates)
        except GraphError as error:
            raise GraphError(f"dataflow {tenant.id}: {error}") from None
        tenant.ages.batch_durable(at, worker, updates)
        tenant.live.last_batch_at = at
        if tenant.engine_mode != "spark":
            tenant.publication.publish(version, changes, notify=False, at=at)

    def log_header(self) -> list[Record | bytes]:
        """The records a new log segment starts with (called when it starts, every earlier
        record durable): every registration with its workers' durable positions (a checkpoint),
        the deletions and the Spark check results logged so far. A registration is given as
        the bytes it was logged as (its tenant keeps them), not encoded again."""
        header: list[Record | bytes] = []
        for d in self.dataflows.values():
            header.append(d.framed_registration or d.registration)
            header.append(Checkpoint(df=d.id, v=d.live.durable_version, workers=dict(d.live.durable_workers)))
        header += [self.deletions[d] for d in self.dataflows if d in self.deletions]
        return header + [self.checks[d] for d in self.dataflows if d in self.checks]


# Tests build graphs exactly as the service does through these names.
__all__ = ["RegistrationError", "Service", "build_graph", "registration_record"]


StoredCounts = dict[tuple[Location | ScopedLocation, Timestamp], int]
"""Counts as the ``pointstamps`` table names them: a nested scope's locations with their scope path."""
StoredBirths = Mapping[tuple[Location | ScopedLocation, Timestamp], tuple[float, str | None]]
"""The births kept with them: ``(first seen, last worker)``."""


def _stand_in(location: Location | ScopedLocation, hosting: Hosting | None) -> Location:
    """A stored location on the dataflow's tracker (a nested dataflow's stand-in)."""
    if hosting is None:
        if isinstance(location, ScopedLocation):
            raise ValueError("a table names a nested scope in a flat dataflow")
        return location
    return hosting.flat(location if isinstance(location, ScopedLocation)
                        else ScopedLocation((), location.node, location.port, location.kind))


def _stand_ins(counts: StoredCounts, hosting: Hosting | None) -> Counts:
    """Stored counts on the locations the dataflow's tracker uses (a nested dataflow's stand-ins)."""
    if hosting is None:
        if any(isinstance(loc, ScopedLocation) for loc, _ in counts):
            raise ValueError("the pointstamps table names a nested scope in a flat dataflow")
        return counts  # type: ignore[return-value]  # checked: every key is a root Location
    return {(_stand_in(loc, hosting), t): c for (loc, t), c in counts.items()}
