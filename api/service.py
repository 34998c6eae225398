"""The service object: registered dataflows, registration, recovery, and the durable log.

Durability (see docs/service.md): every acknowledged registration and batch is a record in the
write-ahead log (:mod:`api.wal`, group commit, one ``fdatasync`` shared by concurrent requests).
A background task copies durable batches to the Delta ``progress`` table about every second
and compacts ``pointstamps``, ``frontiers`` and ``frontier_changes`` (:mod:`api.background`).
Recovery rebuilds each dataflow from its registration, then the Delta ``progress`` table, then
the log records with a version beyond the table's, so every acknowledged batch is applied
exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from api.auth import Principal, matches, new_token, token_hash
from api.columns import RawBatch
from api.config import Settings
from api.dataflows import Dataflow, decode_updates, encode_updates
from api.metrics import Metrics
from api.models import RegisterRequest, location_json
from api.parsing import parse_progress
from api.wal import LogFailed, WriteAheadLog
from tracker.graph import Connection, Edge, Graph, GraphError, Location, Node, Update
from tracker.reachability import Tracker
from tracker.structure import find_cycles, summary_search_pairs, widest_summaries
from tracker.timestamp import PathSummary

log = logging.getLogger("tracker.service")
MAX_SUMMARY_ANTICHAIN = 64
"""At most this many incomparable minimal summaries between two locations (only arity 2 and
more can have several): each is one more frontier element per pointstamp, and graphs whose
antichains grow combinatorially would stall the event loop on a single small batch. Wide
antichains along many locations are refused earlier, by their cost
(:func:`tracker.structure.widest_summaries`)."""
SUMMARY_CHECK_BUDGET = 1_000_000
"""The antichain check searches from each branching location (two or more outgoing transitions)
to everything it reaches, about 2.3 us per (origin, location) pair in the worst case (a braid of
diamonds): graphs with up to this many ``branching x locations`` pairs are checked (at most
~2.5 s, off the event loop). Chains, trees and graphs whose summaries all point one way (loops
counting iterations) cost next to nothing, whatever their size; only a larger graph that is
both densely branching and mixes summary directions goes unchecked."""


class RegistrationError(Exception):
    """A graph the service refuses; ``body`` is the 422 answer."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body.get("detail") or body.get("error"))
        self.body = body


def registration_record(req: RegisterRequest) -> dict[str, Any]:
    """The JSON form of a registration kept in the log (the request, normalised)."""
    return {
        "name": req.name,
        "arity": req.timestamp_arity,
        "nodes": [n.model_dump(exclude_none=True) for n in req.nodes],
        "edges": [e.model_dump() for e in req.edges],
        "initial": None if not req.initial else [
            [u.location.node, u.location.port, u.location.kind, u.time, u.delta] for u in req.initial
        ],
    }


def build_graph(record: dict[str, Any], *, new: bool = True) -> tuple[Graph, list[Update]]:
    """Validate a registration: the graph, its cycles, its initial pointstamps.

    Raises :class:`RegistrationError` with the exact 422 body. Pure CPU: run it off the loop.
    ``new=False`` (recovery) skips the summary-antichain check: a dataflow accepted before it
    existed stays registered.
    """
    arity = record["arity"]
    nodes = [
        Node(n["id"], n["inputs"], n["outputs"], n.get("name", ""),
             None if n.get("connections") is None else tuple(
                 Connection(c["input"], c["output"], tuple(PathSummary(tuple(s)) for s in c["summaries"]))
                 for c in n["connections"]))
        for n in record["nodes"]
    ]
    edges = [Edge(Location.source(e["source"]["node"], e["source"]["port"]),
                  Location.target(e["target"]["node"], e["target"]["port"])) for e in record["edges"]]
    try:
        graph = Graph.build(arity, nodes, edges)
    except GraphError as error:
        raise RegistrationError({"error": "invalid_graph", "detail": str(error)}) from None
    if not graph.locations():
        raise RegistrationError({"error": "invalid_graph", "detail": "the graph has no operator ports"})
    cycles = find_cycles(graph)
    if cycles:
        raise RegistrationError({
            "error": "non_incrementing_cycle",
            "detail": "every cycle must strictly advance timestamps; these transitions lie on a cycle of edges "
                      "and zero-summary connections: " + ", ".join(map(str, cycles)),
            "cycle": [{"from": location_json(t.src), "to": location_json(t.dst), "summary": list(t.summary)}
                      for t in cycles],
        })
    if new and summary_search_pairs(graph) <= SUMMARY_CHECK_BUDGET:
        overflow = widest_summaries(graph, MAX_SUMMARY_ANTICHAIN)
        if overflow is not None and overflow.size > MAX_SUMMARY_ANTICHAIN:
            raise RegistrationError({"error": "invalid_graph", "detail": (
                f"more than {MAX_SUMMARY_ANTICHAIN} incomparable minimal path summaries lead from {overflow.origin} "
                f"to {overflow.dest}: one time at {overflow.origin} would put that many times in the frontier "
                f"at {overflow.dest}, and tracking it would stall the service; merge the parallel summaries "
                "(connections with several summaries, or paths with different ones) into fewer")})
        if overflow is not None:
            raise RegistrationError({"error": "invalid_graph", "detail": (
                f"too many incomparable minimal path summaries fan out from {overflow.origin} (already "
                f"{overflow.size} to {overflow.dest}): the antichains multiply along the way, and one time at "
                f"{overflow.origin} would cost the tracker about {overflow.cost // 2000} ms or more per batch, "
                "stalling the service; merge the parallel summaries (connections with several summaries, or "
                "paths with different ones) into fewer")})
    if record.get("initial"):
        try:
            initial = graph.check_updates((Location(n, p, k), t, d) for n, p, k, t, d in record["initial"])
        except GraphError as error:
            raise RegistrationError({"error": "invalid_graph", "detail": f"initial pointstamps: {error}"}) from None
    else:
        initial = graph.default_initial()
    return graph, initial


class Service:
    """All dataflows of one service process, and the machinery around them."""

    def __init__(self, settings: Settings, admin_token: str) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.admin_hash = token_hash(admin_token)
        self.dataflows: dict[str, Dataflow] = {}
        self.token_index: dict[str, str] = {}
        self.wal = WriteAheadLog(settings.warehouse / "_wal", on_sync=self.metrics.on_sync)
        self.store: Any = None
        self.delta_pool = ThreadPoolExecutor(1, thread_name_prefix="delta")
        self.spark_pool = ThreadPoolExecutor(1, thread_name_prefix="spark")
        self.spark: Any = None
        self.spark_error: str | None = None
        self.started = time.time()
        self.rotation: tuple[int, dict[str, int]] | None = None
        self.delta_uncertain = False  # the last progress commit failed: its outcome is unknown
        self.loop: asyncio.AbstractEventLoop | None = None  # the event loop serving requests
        self.checks: dict[str, dict[str, Any]] = {}  # dataflow id -> its logged Spark check result
        self.unstored: list[Dataflow] = []  # recovered without their graph tables: write them
        self.graphs_to_write: list[Dataflow] = []  # see background.write_graphs
        self.vacuumed_fully: set[str] = set()  # tables vacuumed in full mode since the start (background.tidy)
        self.graph_writer: asyncio.Task[None] | None = None
        self.unchecked: list[Dataflow] = []  # recovered with no Spark check result: run it

    # -- auth -----------------------------------------------------------------------------

    def authenticate(self, token: str) -> Principal | None:
        """The principal of a token, or ``None`` if it is nobody's."""
        presented = token_hash(token)
        if matches(presented, self.admin_hash):
            return Principal(admin=True)
        dataflow_id = self.token_index.get(presented)
        if dataflow_id is not None and matches(presented, self.dataflows[dataflow_id].token_hash):
            return Principal(admin=False, dataflow_id=dataflow_id)
        return None

    # -- registration ---------------------------------------------------------------------

    async def register(self, req: RegisterRequest) -> tuple[Dataflow, str]:
        """Validate (off the loop), log durably, and make the dataflow live; returns it and
        its token. Raises :class:`RegistrationError`."""
        record = registration_record(req)
        graph, initial = await asyncio.to_thread(build_graph, record)
        tracker = await asyncio.to_thread(self._tracker_with, graph, initial)
        dataflow_id = uuid.uuid4().hex
        token = new_token()
        created = datetime.now(UTC).isoformat()
        record.update({"t": "register", "df": dataflow_id, "token": token_hash(token), "created_at": created})
        dataflow = self._new_dataflow(record, graph, tracker, initial)
        self.dataflows[dataflow_id] = dataflow  # in the registry (and log headers) before it is durable
        await self.wal.enqueue(record)
        dataflow.ready = True
        self.token_index[dataflow.token_hash] = dataflow_id
        self.metrics.dataflows.set(len(self.dataflows))
        log.info("registered dataflow", extra={"dataflow": dataflow_id, "dataflow_name": req.name,
                                               "locations": len(graph.locations())})
        self.after_registration(dataflow)
        return dataflow, token

    def _new_dataflow(self, record: dict[str, Any], graph: Graph, tracker: Tracker, initial: list[Update]) -> Dataflow:
        dataflow = Dataflow(
            id=record["df"], name=record["name"], graph=graph, registration=record, token_hash=record["token"],
            created_at=record["created_at"], tracker=tracker, history_limit=self.settings.history,
            engine_mode=self.settings.engine,
        )
        dataflow.reset_published()
        dataflow.on_publish = self._on_publish
        dataflow.unflushed.append((0, "_initial", 0, initial, time.time()))
        if not (self.settings.spark and self.settings.spark_check):
            dataflow.spark_check = "skipped"
        return dataflow

    def after_registration(self, dataflow: Dataflow) -> None:
        """Background work that must not delay the answer: graph tables, Spark check."""
        from api import background

        loop = asyncio.get_running_loop()
        self._queue_graphs([dataflow])
        if self.settings.spark and self.settings.spark_check:
            loop.run_in_executor(self.spark_pool, background.spark_check, self, dataflow)

    def after_recovery(self) -> None:
        """Finish what a crash interrupted: graph tables never written, Spark checks never
        concluded (each on its own thread, queued behind the Spark session's start)."""
        from api import background

        loop = asyncio.get_running_loop()
        self._queue_graphs(self.unstored)
        for dataflow in self.unchecked:
            loop.run_in_executor(self.spark_pool, background.spark_check, self, dataflow)
        self.unstored, self.unchecked = [], []

    def _queue_graphs(self, dataflows: list[Dataflow]) -> None:
        """Queue graph tables for the Delta thread (batched: :func:`background.write_graphs`)."""
        from api import background

        if self.store is None or not dataflows:
            return
        self.graphs_to_write.extend(dataflows)
        if self.graph_writer is None or self.graph_writer.done():
            self.graph_writer = asyncio.get_running_loop().create_task(background.write_graphs(self))

    def remember_check(self, dataflow: Dataflow) -> None:
        """Log a concluded Spark check (from any thread), so a restart reports it again
        instead of running it again."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._log_check, dataflow.id, dataflow.spark_check, dataflow.spark_detail)

    def _log_check(self, dataflow_id: str, result: str, detail: str | None) -> None:
        record = {"t": "check", "df": dataflow_id, "result": result, "detail": detail}
        self.checks[dataflow_id] = record
        with contextlib.suppress(LogFailed):  # nobody waits: a check lost in a crash runs again after the restart
            self.wal.enqueue(record).add_done_callback(lambda done: done.exception())

    def _on_publish(self, dataflow: Dataflow, version: int, changes: list[Any]) -> None:
        self.metrics.frontier_changes.inc(len(changes))

    # -- recovery -------------------------------------------------------------------------

    def recover(self) -> None:
        """Rebuild every dataflow: registration, then the compacted ``pointstamps`` (counts as of
        a version, if compaction ever ran), then the Delta ``progress`` batches after that
        version, then the log beyond what ``progress`` holds.

        Starting from the snapshot makes a restart cost the state plus the recent tail, not the
        whole history. Log records the snapshot already covers but ``progress`` does not hold
        yet are not applied again; they are queued for the next flush, so that ``progress``
        still gets every batch exactly once.
        """
        registrations: dict[str, dict[str, Any]] = {}
        batches: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for _segment, record in self.wal.recover():
            if record.get("t") == "register":
                registrations.setdefault(record["df"], record)
            elif record.get("t") == "batch":
                batches[record["df"]].append(record)
            elif record.get("t") == "check":
                self.checks[record["df"]] = record
        with self.store.warehouse.pinned() if self.store is not None else contextlib.nullcontext():
            self._recover_all(registrations, batches)
        self.metrics.dataflows.set(len(self.dataflows))
        self.wal.open()

    def _recover_all(self, registrations: dict[str, dict[str, Any]], batches: dict[str, list[dict[str, Any]]]
                     ) -> None:
        stored = self.store.registered() if self.store is not None else set()
        for dataflow_id, record in registrations.items():
            graph, initial = build_graph(record, new=False)
            snapshot = self.store.snapshot(dataflow_id) if self.store is not None else None
            if snapshot is None:  # never compacted: replay everything from the initial counts
                dataflow = self._new_dataflow(record, graph, self._tracker_with(graph, initial), initial)
                base = 0
            else:  # start from the compacted counts and replay only what follows them
                base, counts = snapshot
                tracker = self._tracker_with(graph, [(loc, t, c) for (loc, t), c in counts.items()])
                dataflow = self._new_dataflow(record, graph, tracker, initial)
                dataflow.version = base
                dataflow.workers = self.store.worker_positions(dataflow_id)
            in_delta = self.store.max_progress_version(dataflow_id) if self.store is not None else -1
            if in_delta >= 0:
                dataflow.unflushed.clear()  # the initial counts (version 0) are in Delta already
            if self.store is not None:
                from_delta = self.store.progress(dataflow_id, after=base)
                for version in sorted(v for v in from_delta if v > base):
                    worker, seq, updates, received = from_delta[version]
                    self._replay(dataflow, version, worker, seq, updates, received)
            dataflow.delta_version = max(in_delta, 0)
            for batch in batches.get(dataflow_id, []):
                if batch["v"] <= in_delta:
                    continue  # already in Delta: applying it again would count it twice
                if "_raw" in batch:  # the request body as received (validated before it was logged)
                    worker, seq, updates = parse_progress(batch["_raw"], graph)
                else:
                    worker, seq, updates = batch["w"], batch["s"], decode_updates(batch["u"])
                if batch["v"] <= dataflow.version:  # in the snapshot but not yet in Delta progress
                    dataflow.workers[worker] = (seq, batch["v"])
                else:
                    self._replay(dataflow, batch["v"], worker, seq, updates, batch["at"])
                payload = RawBatch(batch["_raw"], len(updates)) if "_raw" in batch and updates else updates
                dataflow.unflushed.append((batch["v"], worker, seq, payload, batch["at"]))
            dataflow.durable_version = dataflow.version
            if dataflow.engine_mode == "native":
                dataflow.reset_published()
                dataflow.history_floor = max(dataflow.history_floor, base)  # no history before the snapshot
            if self.store is not None:
                compacted = self.store.max_change_version(dataflow_id)
                dataflow.uncompacted = [u for u in dataflow.uncompacted if u[0] > compacted]
                dataflow.compacted_version = compacted
            else:
                dataflow.uncompacted.clear()
            self._resume_side_work(dataflow, stored)
            if dataflow.engine_mode == "spark":
                dataflow.reset_published()  # Spark recomputes the frontier from the recovered counts
            dataflow.ready = True
            self.dataflows[dataflow_id] = dataflow
            self.token_index[dataflow.token_hash] = dataflow_id
            log.info("recovered dataflow", extra={"dataflow": dataflow_id, "version": dataflow.version,
                                                  "delta_version": dataflow.delta_version,
                                                  "snapshot_version": None if snapshot is None else base})

    def _resume_side_work(self, dataflow: Dataflow, stored: set[str]) -> None:
        """Status of a recovered dataflow's graph tables and Spark check; what is missing is
        queued for :meth:`after_recovery`."""
        dataflow.graph_stored = dataflow.id in stored
        if self.store is not None and not dataflow.graph_stored:
            self.unstored.append(dataflow)
        if dataflow.spark_check == "skipped":
            return
        check = self.checks.get(dataflow.id)
        if check is None:
            self.unchecked.append(dataflow)
        else:
            dataflow.spark_check, dataflow.spark_detail = check["result"], check["detail"]

    @staticmethod
    def _replay(dataflow: Dataflow, version: int, worker: str, seq: int, updates: list[Update], at: float) -> None:
        changes = dataflow.replay(version, worker, seq, updates)
        dataflow.durable_version = version
        if dataflow.engine_mode == "native":
            dataflow.frontier_version = version
            dataflow.record_changes(version, changes, notify=False, at=at)

    def log_header(self) -> list[dict[str, Any]]:
        """The records a new log segment starts with: every live registration, and the Spark
        check results logged so far."""
        return [d.registration for d in self.dataflows.values()] + [
            self.checks[d] for d in self.dataflows if d in self.checks]

    def snapshot_counts(self, dataflow: Dataflow) -> dict[tuple[Location, tuple[int, ...]], int]:
        """Occurrence counts as of the frontier's version: in-flight batches (not durable yet)
        and, with the Spark engine, batches Spark has not folded in yet, subtracted."""
        counts = dataflow.tracker.pointstamps()
        later = [item[3] for item in dataflow.inflight()] + [updates for _, updates in dataflow.spark_queue]
        for updates in later:
            for loc, t, d in updates:
                key = (loc, t)
                counts[key] = counts.get(key, 0) - d
        return {k: c for k, c in counts.items() if c != 0}

    def _tracker_with(self, graph: Graph, initial: list[Update]) -> Any:
        """A tracker of ``graph`` (which :func:`build_graph` checked for cycles) holding ``initial``."""
        if self.settings.engine == "spark":
            from api.engine import CountsOnly

            tracker: Any = CountsOnly(graph)
        else:
            tracker = Tracker(graph, cycles_checked=True)
        tracker.apply(initial, validated=True)
        return tracker


__all__ = ["RegistrationError", "Service", "build_graph", "encode_updates", "registration_record"]
