"""Capacity planning on paper: a load (dataflows, workers, batches, updates, operators) turned
into shards, hosts, memory, disk and Spark, from per-unit costs the benchmarks measured.

Every per-unit figure is a :class:`Measured` constant naming the benchmark command that measured
it; ``docs/operations.md`` ("Capacity planning") lists the same figures, and
``tests/test_plan.py`` holds the two (and the figures ``docs/performance.md`` and
``docs/durability.md`` report) equal. The policy choices (how busy a shard's event loop or a host
may be planned) are plain constants.

Guarantees: :func:`plan` is pure arithmetic on Python numbers (no overflow at any size it
accepts: a billion dataflows of a million workers still plan), every quantity it returns is in
the unit its name says, and its ``binding`` names the constraint that set the host count.

>>> p = plan(Load(dataflows=4, workers_per_dataflow=2, batches_per_second=10, updates_per_batch=128,
...               operators=101, spark=False))
>>> p.shards, p.hosts, p.binding
(1, 1, ['cores'])
>>> p.locations_per_dataflow, p.changes_per_batch
(202, 202)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from api.config import Settings
from api.shards.ids import MAX_SHARD

DEFAULTS = Settings()
"""The service's defaults (flush and compaction periods, history, limits) the plan assumes."""


@dataclass(frozen=True)
class Measured:
    """A per-unit cost, as a benchmark measured it on the project's 2-core machine."""

    value: float
    unit: str
    """Its unit and what it is per (``ms/batch``, ``B/update``, ``MiB``)."""
    what: str
    bench: str
    """The command that measured it (its part, where the benchmark has several)."""

    def __str__(self) -> str:
        return f"{self.value:,g} {self.unit}"


COSTS = "python -m bench shards --parts costs"
MANY = "python -m bench shards --parts many"

LOOP_MS_PER_BATCH = Measured(0.0876, "ms/batch", "a shard's event loop, per batch", COSTS)
LOOP_US_PER_UPDATE = Measured(1.239, "us/update", "a shard's event loop, per update", COSTS)
LOOP_US_PER_CHANGE = Measured(0.329, "us/change", "a shard's event loop, per frontier change", COSTS)
LOOP_US_PER_SUBSCRIBER = Measured(10.73, "us/subscriber/batch", "a shard's event loop, per batch and stream "
                                  "subscriber", COSTS)
CPU_MS_PER_BATCH = Measured(0.0423, "ms/batch", "a shard's processes' CPU, per batch", COSTS)
CPU_US_PER_UPDATE = Measured(3.8, "us/update", "a shard's processes' CPU, per update", COSTS)
CPU_US_PER_CHANGE = Measured(1.044, "us/change", "a shard's processes' CPU, per frontier change", COSTS)
CPU_US_PER_SUBSCRIBER = Measured(4.59, "us/subscriber/batch", "a shard's processes' CPU, per batch and stream "
                                 "subscriber", COSTS)
LOG_BYTES_PER_BATCH = Measured(307.1, "B/batch", "the write-ahead log, per batch", COSTS)
LOG_BYTES_PER_UPDATE = Measured(83.81, "B/update", "the write-ahead log, per update", COSTS)
PROGRESS_BYTES_PER_ROW = Measured(0.92, "B/update", "Delta progress, per update row in large files", COSTS)
CHANGES_BYTES_PER_ROW = Measured(0.37, "B/change", "Delta frontier_changes, per change row in large files", COSTS)
FILE_BYTES = Measured(4125, "B/file", "a Delta file of one row, with its commit entry", COSTS)
SNAPSHOT_BYTES_PER_LOCATION = Measured(28.8, "B/location", "a compaction's pointstamps and frontiers files, per "
                                       "location", COSTS)
BASE_RSS_MIB = Measured(344, "MiB/shard", "a shard's resident memory, less its dataflows' (a line through its "
                        "memory at 1,250 and 2,500 rings)", MANY)
HISTORY_BYTES_PER_CHANGE = Measured(98.6, "B/change", "memory per frontier change a dataflow's history keeps", COSTS)
MEMORY_KIB_PER_LOCATION = Measured(1.569, "KiB/location", "memory per hosted location (the same line's slope, "
                                   "rings of 202 locations)", MANY)
REGISTRATIONS_PER_SECOND = Measured(140, "/s", "registrations through one front (4 shards)", MANY)
LOG_HEADER_BYTES_PER_LOCATION = Measured(110, "B/location", "a registration in every log segment's header, per "
                                         "location", "python -m bench isolation")
SPARK_CHECK_SECONDS = Measured(2.9, "s/check", "a Spark registration check (a 100-operator ring; registrations "
                               "waiting together share one)", "python -m bench spark --parts jobs")
SPARK_AUDIT_SECONDS = Measured(1.40, "s/audit", "a Spark audit's propagation (1,026 locations, GraphX helper)",
                               "python -m bench spark --parts engines")
SPARK_BUSY_CORES = Measured(0.76, "cores", "the Spark process and its JVM auditing back to back",
                            "python -m bench service")

FIGURES = {name: value for name, value in dict(globals()).items() if isinstance(value, Measured)}
"""Every measured figure the plan uses, by its constant's name."""

LOOP_BUDGET = 0.7
"""How busy a shard's event loop is planned at most: the rest absorbs bursts, a neighbour's
restart, the collector's passes."""
HOST_CPU_BUDGET = 0.7
"""The share of a host's cores the plan fills."""
HOST_MEMORY_BUDGET = 0.8
"""The share of a host's memory the plan fills."""
CORES_PER_SHARD = 2
"""The service's default layout (docs/running.md, "Shards"): one shard per two cores, its event
loop on one, its log's sync process, its Delta thread, the host's Spark process and front on the
other."""
LOCATIONS_PER_OPERATOR = 2
"""Locations per operator when not given: one input and one output (the benchmarks' rings)."""
LOG_SEGMENTS_HELD = 2
"""Log segments a shard holds: the one being written and the last one, until Delta has it."""
SHARDS_PER_FRONT = MAX_SHARD + 1
"""Shards one front and its proxy route: dataflow ids name shards 0 to 999."""
DAY = 86_400.0


@dataclass(frozen=True)
class Load:
    """What the service must carry. ``batches_per_second`` is per worker: each worker of each
    dataflow sends that many progress batches a second, each of ``updates_per_batch`` updates."""

    dataflows: int
    workers_per_dataflow: int
    batches_per_second: float
    updates_per_batch: int
    operators: int
    locations: int | None = None
    """Locations per dataflow (default :data:`LOCATIONS_PER_OPERATOR` per operator)."""
    changes_per_batch: int | None = None
    """Frontier changes a batch makes (default one per location: every frontier moves, as an
    epoch's end moves it through the whole graph)."""
    subscribers_per_dataflow: int | None = None
    """Stream subscribers per dataflow (default one per worker: the SDK's workers subscribe)."""
    retention_days: float = 7.0
    """How long the Delta history (``progress``, ``frontier_changes``) is kept."""
    spark: bool = True
    cores_per_host: int = 2
    memory_per_host_gib: float = 24.0
    history: int = DEFAULTS.history
    audit_seconds: float = DEFAULTS.audit_seconds


@dataclass
class Plan:
    """The plan for a :class:`Load`: shards, hosts and what binds, then each resource."""

    load: Load
    locations_per_dataflow: int
    changes_per_batch: int
    subscribers_per_dataflow: int
    batches_per_second: float
    updates_per_second: float
    loop_ms_per_batch: float
    cpu_ms_per_batch: float
    loop_cores: float
    hot_path_cores: float
    shards: int
    hosts: int
    hosts_needed: dict[str, float]
    """Hosts each constraint needs, before rounding up (-1: none is enough)."""
    binding: list[str]
    dataflows_per_shard: int
    memory_per_dataflow_mib: float
    history_mib_per_dataflow: float
    memory_per_shard_mib: float
    memory_total_gib: float
    log_bytes_per_day: float
    log_bytes_held: float
    delta_bytes_per_day: float
    delta_bytes_held: float
    snapshot_bytes_held: float
    spark_processes: float
    spark_cores: float
    spark_check_seconds: float
    fronts: int
    register_seconds: float
    settings: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """Every figure, the load it is for, and the measured figures it used (with their benchmarks)."""
        found = asdict(self)
        found["figures"] = {name: asdict(m) for name, m in FIGURES.items()}
        return found


def _history_changes(load: Load, changes_per_batch: int) -> int:
    """Frontier changes a busy dataflow's history holds once it has run long enough: the last
    ``history`` versions, and at most ten times ``history`` changes (``api.streams.publish``)."""
    if changes_per_batch == 0:
        return 0
    return min(load.history * changes_per_batch, 10 * load.history)


def per_batch_ms(load: Load, changes: int, subscribers: int) -> tuple[float, float]:
    """A batch's cost on its shard's event loop and in all its shard's processes, in ms: a
    batch of the load's size making ``changes`` frontier changes, with ``subscribers``.

    >>> [round(x, 3) for x in per_batch_ms(Load(1, 1, 1, 128, 101), 202, 0)]
    [0.313, 0.74]
    """
    u = load.updates_per_batch
    loop = (LOOP_MS_PER_BATCH.value + (u * LOOP_US_PER_UPDATE.value + changes * LOOP_US_PER_CHANGE.value
                                       + subscribers * LOOP_US_PER_SUBSCRIBER.value) / 1e3)
    cpu = (CPU_MS_PER_BATCH.value + (u * CPU_US_PER_UPDATE.value + changes * CPU_US_PER_CHANGE.value
                                     + subscribers * CPU_US_PER_SUBSCRIBER.value) / 1e3)
    return loop, cpu


def promised_updates_per_second(load: Load, shards: int, hosts: int | None = None) -> float:
    """The most updates per second the plan lays on ``shards`` shards for batches of the load's
    shape (its rate aside), on ``hosts`` hosts like the load's (default: as many as the layout
    of :data:`CORES_PER_SHARD` needs): every event loop at :data:`LOOP_BUDGET`, the hosts' cores
    at :data:`HOST_CPU_BUDGET`, no Spark.

    >>> shape = Load(4, 2, 1, 128, 101, subscribers_per_dataflow=0)
    >>> promised_updates_per_second(shape, 2, hosts=1) == promised_updates_per_second(shape, 1)
    True
    """
    locations = load.locations or LOCATIONS_PER_OPERATOR * load.operators
    changes = locations if load.changes_per_batch is None else load.changes_per_batch
    subscribers = load.workers_per_dataflow if load.subscribers_per_dataflow is None else load.subscribers_per_dataflow
    loop_ms, cpu_ms = per_batch_ms(load, changes, subscribers)
    if hosts is None:
        hosts = math.ceil(shards / max(1, load.cores_per_host // CORES_PER_SHARD))
    batches = min(shards * LOOP_BUDGET / loop_ms, hosts * load.cores_per_host * HOST_CPU_BUDGET / cpu_ms) * 1e3
    return batches * load.updates_per_batch


def plan(load: Load) -> Plan:
    """The plan: hosts for whichever needs the most of the event loops, the cores, the memory and
    (with Spark on) the audits; then the shards, memory, disk, Spark and fronts of that layout."""
    locations = load.locations or LOCATIONS_PER_OPERATOR * load.operators
    changes = locations if load.changes_per_batch is None else load.changes_per_batch
    subscribers = load.workers_per_dataflow if load.subscribers_per_dataflow is None else load.subscribers_per_dataflow
    per_dataflow_batches = load.workers_per_dataflow * load.batches_per_second
    batches = load.dataflows * per_dataflow_batches
    loop_ms, cpu_ms = per_batch_ms(load, changes, subscribers)
    loop_cores, hot_cores = batches * loop_ms / 1e3, batches * cpu_ms / 1e3
    history_mib = _history_changes(load, changes) * HISTORY_BYTES_PER_CHANGE.value / 2**20
    per_dataflow_mib = locations * MEMORY_KIB_PER_LOCATION.value / 1024 + history_mib
    shards_per_host = max(1, load.cores_per_host // CORES_PER_SHARD)
    spark_ok = load.spark and locations <= DEFAULTS.spark_max_locations
    audit_load = (load.dataflows * SPARK_AUDIT_SECONDS.value / load.audit_seconds
                  if spark_ok and load.audit_seconds > 0 else 0.0)
    # Hosts each constraint needs, as fractions: the largest binds.
    spark_cores = audit_load * SPARK_BUSY_CORES.value
    host_cores = load.cores_per_host * HOST_CPU_BUDGET
    spare_mib = load.memory_per_host_gib * 1024 * HOST_MEMORY_BUDGET - shards_per_host * BASE_RSS_MIB.value
    needed = {
        "event loop": loop_cores / LOOP_BUDGET / shards_per_host,
        "cores": (hot_cores + spark_cores) / host_cores,
        "memory": load.dataflows * per_dataflow_mib / spare_mib if spare_mib > 0 else math.inf,
        "spark audits": audit_load,
    }
    worst = max(needed.values())
    binding = [k for k, v in needed.items() if v == worst]
    notes: list[str] = []
    hot = max(v for k, v in needed.items() if k != "spark audits")
    if worst == math.inf:
        notes.append(f"a host of {load.memory_per_host_gib:g} GiB cannot hold {shards_per_host} shard(s) and a "
                     "dataflow: give each host more memory")
        hosts = shards = 0
    else:
        # Hosts for the hot path run the default layout; a host added only for Spark's audits
        # runs one shard (its Spark process audits that shard's dataflows).
        hot_hosts = max(1, math.ceil(hot))
        hosts = max(hot_hosts, math.ceil(audit_load))
        shards = hot_hosts * shards_per_host + hosts - hot_hosts
    per_shard = math.ceil(load.dataflows / shards) if shards else 0
    memory_per_shard = BASE_RSS_MIB.value + per_shard * per_dataflow_mib
    if per_dataflow_batches * loop_ms / 1e3 > LOOP_BUDGET:
        notes.append(f"one dataflow's batches need {per_dataflow_batches * loop_ms / 1e3:,.2f} of an event loop, "
                     f"more than a shard gives ({LOOP_BUDGET}): a dataflow lives on one shard, so send fewer, "
                     "larger batches (a worker may combine its updates)")
    if per_dataflow_mib + BASE_RSS_MIB.value > load.memory_per_host_gib * 1024 * HOST_MEMORY_BUDGET:
        notes.append(f"one dataflow needs {per_dataflow_mib:,.0f} MiB, more than a host's memory can give a shard")
    if binding == ["spark audits"] and math.ceil(hot) < math.ceil(worst):
        fits = load.dataflows * SPARK_AUDIT_SECONDS.value / max(1, math.ceil(hot))
        notes.append(f"Spark's audits bind: each is a Spark job of about {SPARK_AUDIT_SECONDS.value:g} s and a "
                     f"host's Spark process runs one at a time; TRACKER_AUDIT_SECONDS={math.ceil(fits)} "
                     f"(--audit-seconds) would need {max(1, math.ceil(hot)):,} hosts")
    if history_mib > 0.5 * per_dataflow_mib:
        notes.append(f"each busy dataflow keeps {history_mib:,.0f} MiB of frontier history in memory (the last "
                     f"{load.history:,} versions, for SSE resumes and ?version= reads): a lower TRACKER_HISTORY "
                     "(--history here) shrinks it")
    fronts = math.ceil(shards / SHARDS_PER_FRONT)
    if fronts > 1:
        notes.append(f"{shards:,} shards need {fronts:,} services, each with its own front and proxy: one front "
                     f"routes at most {SHARDS_PER_FRONT:,} shards (dataflow ids name shards 0 to {MAX_SHARD}); "
                     "split the dataflows between them")
    if load.spark and not spark_ok:
        notes.append(f"graphs of {locations:,} locations are over TRACKER_SPARK_MAX_LOCATIONS "
                     f"({DEFAULTS.spark_max_locations:,}): Spark neither checks nor audits them")
    # Disk. A busy dataflow gets a progress file per flush, and a frontier_changes file and new
    # pointstamps and frontiers files per compaction (docs/durability.md,
    # "Delta trails by about a second"); files superseded (by the tidy pass's merges, or replaced)
    # stay for TRACKER_VACUUM_HOURS.
    flushes = load.dataflows * min(1.0, per_dataflow_batches * DEFAULTS.flush_seconds) * DAY / DEFAULTS.flush_seconds
    compactions = (load.dataflows * min(1.0, per_dataflow_batches * DEFAULTS.compact_seconds) * DAY
                   / DEFAULTS.compact_seconds)
    rows = batches * DAY * (load.updates_per_batch * PROGRESS_BYTES_PER_ROW.value
                            + changes * CHANGES_BYTES_PER_ROW.value)
    small_files = (flushes + compactions) * FILE_BYTES.value
    snapshots = compactions * locations * SNAPSHOT_BYTES_PER_LOCATION.value
    window_days = DEFAULTS.vacuum_hours / 24
    header = per_shard * locations * LOG_HEADER_BYTES_PER_LOCATION.value
    segment = max(DEFAULTS.segment_bytes, 2 ** math.ceil(math.log2(max(2 * header, 1))))
    settings = {name: int(need) for name, need, default in (
        ("TRACKER_MAX_DATAFLOWS", per_shard, DEFAULTS.max_dataflows),
        ("TRACKER_MAX_SUBSCRIBERS", per_shard * subscribers, DEFAULTS.max_subscribers),
        ("TRACKER_MAX_SUBSCRIBERS_PER_DATAFLOW", subscribers, DEFAULTS.max_subscribers_per_dataflow),
        ("TRACKER_WAL_SEGMENT_BYTES", segment, DEFAULTS.segment_bytes)) if need > default}
    return Plan(
        load=load, locations_per_dataflow=locations, changes_per_batch=changes, subscribers_per_dataflow=subscribers,
        batches_per_second=batches, updates_per_second=batches * load.updates_per_batch,
        loop_ms_per_batch=loop_ms, cpu_ms_per_batch=cpu_ms, loop_cores=loop_cores, hot_path_cores=hot_cores,
        shards=shards, hosts=hosts, hosts_needed={k: (v if v != math.inf else -1.0) for k, v in needed.items()},
        binding=binding, dataflows_per_shard=per_shard, memory_per_dataflow_mib=per_dataflow_mib,
        history_mib_per_dataflow=history_mib, memory_per_shard_mib=memory_per_shard,
        memory_total_gib=shards * memory_per_shard / 1024,
        log_bytes_per_day=batches * DAY * (LOG_BYTES_PER_BATCH.value + load.updates_per_batch
                                           * LOG_BYTES_PER_UPDATE.value),
        log_bytes_held=shards * LOG_SEGMENTS_HELD * segment,
        delta_bytes_per_day=rows + small_files + snapshots,
        delta_bytes_held=rows * (load.retention_days + window_days) + (small_files + snapshots) * window_days,
        snapshot_bytes_held=snapshots * window_days,
        spark_processes=audit_load, spark_cores=spark_cores,
        spark_check_seconds=(math.ceil(load.dataflows * locations / DEFAULTS.spark_max_locations)
                             * SPARK_CHECK_SECONDS.value / max(hosts, 1)) if spark_ok else 0.0,
        fronts=fronts, register_seconds=load.dataflows / REGISTRATIONS_PER_SECOND.value,
        settings=settings, notes=notes)
