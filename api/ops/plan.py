"""``tracker plan``: capacity planning on paper. It turns a load into shards, hosts, memory, disk
and Spark with :func:`api.ops.capacity.plan`, and prints a readable table (or ``--json``), each
figure beside the per-unit cost it comes from and the benchmark that measured it.

Guarantees: it reads nothing and starts nothing (no service, no Spark); bad input is one line on
stderr and exit code 2.

>>> import argparse
>>> commands = argparse.ArgumentParser(prog="tracker").add_subparsers()
>>> add_plan_command(commands)
>>> args = commands.choices["plan"].parse_args(["--dataflows", "4", "--workers-per-dataflow", "2",
...     "--batches-per-second", "10", "--updates-per-batch", "128", "--operators", "101", "--spark", "off"])
>>> load(args).updates_per_batch, load(args).spark
(128, False)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, NoReturn

from api.ops.capacity import (
    CPU_MS_PER_BATCH,
    CPU_US_PER_CHANGE,
    CPU_US_PER_SUBSCRIBER,
    CPU_US_PER_UPDATE,
    DEFAULTS,
    FIGURES,
    HISTORY_BYTES_PER_CHANGE,
    LOG_BYTES_PER_BATCH,
    LOG_BYTES_PER_UPDATE,
    LOOP_BUDGET,
    LOOP_MS_PER_BATCH,
    LOOP_US_PER_CHANGE,
    LOOP_US_PER_SUBSCRIBER,
    LOOP_US_PER_UPDATE,
    MEMORY_KIB_PER_LOCATION,
    Load,
    Measured,
    Plan,
    plan,
)

BILLION = 10**9
"""The largest count any option takes."""
_OPTIONS: list[tuple[str, str, str, float, float, str]] = [
    # (flag, kind, metavar, lowest, highest, help)
    ("--dataflows", "int", "N", 1, BILLION, "dataflows hosted at once"),
    ("--workers-per-dataflow", "int", "W", 1, BILLION, "workers of each dataflow"),
    ("--batches-per-second", "float", "B", 0, 1e6, "progress batches each worker sends per second (per worker, not "
     "per dataflow)"),
    ("--updates-per-batch", "int", "U", 1, 10**7, "updates in each batch"),
    ("--operators", "int", "O", 1, 10**7, "operators of each dataflow (every scope's, scope nodes included)"),
    ("--locations", "int", "L", 1, 10**8, "locations (ports) of each dataflow (default 2 per operator)"),
    ("--changes-per-batch", "int", "K", 0, 10**9, "frontier changes a batch makes (default one per location: "
     "every frontier moves; a running service says it: tracker_frontier_changes_total over tracker_batches_total)"),
    ("--subscribers-per-dataflow", "int", "S", 0, BILLION, "stream subscribers of each dataflow (default one per "
     "worker: the SDK's workers subscribe)"),
    ("--retention-days", "float", "DAYS", 0, 36_500, "days the Delta history (progress, frontier_changes) is kept "
     "(default 7)"),
    ("--cores-per-host", "int", "C", 1, 100_000, "cores of each host (default 2, the machine the figures were "
     "measured on)"),
    ("--memory-per-host", "float", "GIB", 0.25, 10**7, "memory of each host in GiB (default 24)"),
    ("--history", "int", "VERSIONS", 1, BILLION, f"TRACKER_HISTORY, versions of frontier changes each dataflow "
     f"keeps in memory (default {DEFAULTS.history:,})"),
    ("--audit-seconds", "float", "SECONDS", 1, 10**8, f"TRACKER_AUDIT_SECONDS, the Spark audit period (default "
     f"{DEFAULTS.audit_seconds:g})"),
]
ABOVE_LOWEST = ("--batches-per-second",)
"""Options whose lowest value is excluded."""
REQUIRED = ("--dataflows", "--workers-per-dataflow", "--batches-per-second", "--updates-per-batch", "--operators")


def fail(message: str) -> NoReturn:
    print(f"tracker plan: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def add_plan_command(commands: Any) -> None:
    """Add ``tracker plan`` to ``commands`` (an argparse subparsers object)."""
    parser = commands.add_parser(
        "plan", help="capacity planning: shards, hosts, memory, disk and Spark for a load",
        description="Shards, hosts, memory, disk and Spark for a load, from the per-unit costs the benchmarks "
        "measured (docs/operations.md, \"Capacity planning\").")
    for flag, _kind, metavar, _low, _high, text in _OPTIONS:
        parser.add_argument(flag, metavar=metavar, help=text + (" (required)" if flag in REQUIRED else ""))
    parser.add_argument("--spark", default="on", metavar="on|off",
                        help="whether Spark checks and audits (default on, as tracker serve)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.error = fail  # argparse's refusals in one line too
    parser.set_defaults(func=run_plan)


def _value(args: argparse.Namespace, flag: str) -> float | None:
    """The option's value, checked; ``None`` when not given."""
    _, kind, _, low, high, _ = next(o for o in _OPTIONS if o[0] == flag)
    text = getattr(args, flag[2:].replace("-", "_"))
    if text is None:
        if flag in REQUIRED:
            fail(f"{flag} is required")
        return None
    try:
        number = float(text) if kind == "float" else int(text)
    except ValueError:
        fail(f"{flag} must be a {'number' if kind == 'float' else 'whole number'}, got {text!r}")
    if not math.isfinite(number) or not low <= number <= high or (flag in ABOVE_LOWEST and number == low):
        lowest = f"above {low:g} and at most" if flag in ABOVE_LOWEST else f"from {low:g} to"
        fail(f"{flag} must be {lowest} {high:,g}, got {text!r}")
    return number


def load(args: argparse.Namespace) -> Load:
    """The :class:`Load` the options describe (each checked: :func:`fail` on a bad one)."""
    values = {flag: _value(args, flag) for flag, *_ in _OPTIONS}
    if args.spark not in ("on", "off"):
        fail(f"--spark must be on or off, got {args.spark!r}")

    def whole(flag: str) -> int | None:
        value = values[flag]
        return None if value is None else int(value)

    optional: dict[str, Any] = {key: values[flag] for key, flag in (
        ("retention_days", "--retention-days"), ("memory_per_host_gib", "--memory-per-host"),
        ("audit_seconds", "--audit-seconds")) if values[flag] is not None}
    optional |= {key: whole(flag) for key, flag in (("cores_per_host", "--cores-per-host"), ("history", "--history"))
                 if values[flag] is not None}
    return Load(dataflows=int(values["--dataflows"] or 0),
                workers_per_dataflow=int(values["--workers-per-dataflow"] or 0),
                batches_per_second=float(values["--batches-per-second"] or 0),
                updates_per_batch=int(values["--updates-per-batch"] or 0), operators=int(values["--operators"] or 0),
                locations=whole("--locations"), changes_per_batch=whole("--changes-per-batch"),
                subscribers_per_dataflow=whole("--subscribers-per-dataflow"), spark=args.spark == "on", **optional)


def size(n: float) -> str:
    """Bytes in binary units.

    >>> size(0), size(1536), size(3 * 2**40), size(5 * 2**70)
    ('0 B', '1.5 KiB', '3.0 TiB', '5,120.0 EiB')
    """
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    step = 0
    while n >= 1024 and step < len(units) - 1:
        n, step = n / 1024, step + 1
    return f"{n:,.0f} {units[step]}" if step == 0 else f"{n:,.1f} {units[step]}"


def _basis(*figures: Measured) -> str:
    """The figures, grouped by the benchmark that measured them."""
    benches: dict[str, list[str]] = {}
    for f in figures:
        benches.setdefault(f.bench, []).append(str(f))
    return "; ".join(f"{' + '.join(values)} ({bench})" for bench, values in benches.items())


def render(p: Plan) -> str:
    """The plan as readable text: the load, the layout and what binds, then one row per resource
    with the per-unit costs it came from."""
    ld = p.load
    rows: list[tuple[str, str, str]] = [
        ("event loops", f"{p.loop_cores:,.2f} cores busy; {p.loop_ms_per_batch:.3f} ms a batch",
         _basis(LOOP_MS_PER_BATCH, LOOP_US_PER_UPDATE, LOOP_US_PER_CHANGE, LOOP_US_PER_SUBSCRIBER)),
        ("hot-path CPU", f"{p.hot_path_cores:,.2f} cores; {p.cpu_ms_per_batch:.3f} ms a batch",
         _basis(CPU_MS_PER_BATCH, CPU_US_PER_UPDATE, CPU_US_PER_CHANGE, CPU_US_PER_SUBSCRIBER)),
        ("memory", f"{size(p.memory_per_shard_mib * 2**20)} a shard, {size(p.memory_total_gib * 2**30)} in all; "
         f"{size(p.memory_per_dataflow_mib * 2**20)} a dataflow ({size(p.history_mib_per_dataflow * 2**20)} of "
         "it history)", _basis(FIGURES["BASE_RSS_MIB"], MEMORY_KIB_PER_LOCATION, HISTORY_BYTES_PER_CHANGE)),
        ("log disk", f"{size(p.log_bytes_per_day)} written a day; at most {size(p.log_bytes_held)} held "
         "(old segments go once Delta has them)", _basis(LOG_BYTES_PER_BATCH, LOG_BYTES_PER_UPDATE)),
        ("Delta disk", f"{size(p.delta_bytes_per_day)} a day; {size(p.delta_bytes_held)} held for "
         f"{ld.retention_days:g} days of history (replaced snapshots {size(p.snapshot_bytes_held)})",
         _basis(*(FIGURES[n] for n in ("PROGRESS_BYTES_PER_ROW", "CHANGES_BYTES_PER_ROW", "FILE_BYTES",
                                       "SNAPSHOT_BYTES_PER_LOCATION")))),
        ("Spark", (f"{p.spark_processes:,.2f} Spark processes busy auditing every {ld.audit_seconds:g} s "
                   f"({p.spark_cores:,.2f} cores); checking every registration: {p.spark_check_seconds:,.0f} s "
                   "a host") if ld.spark else "off",
         _basis(*(FIGURES[n] for n in ("SPARK_AUDIT_SECONDS", "SPARK_CHECK_SECONDS", "SPARK_BUSY_CORES")))
         if ld.spark else ""),
        ("front", f"{p.fronts:,} front(s) and proxies; registering every dataflow through one: "
         f"{p.register_seconds:,.0f} s", _basis(FIGURES["REGISTRATIONS_PER_SECOND"])),
    ]
    needed = ", ".join(f"{k} {v:,.2f}" if v >= 0 else f"{k}: no host is enough" for k, v in p.hosts_needed.items())
    lines = [
        f"Load: {ld.dataflows:,} dataflows x {ld.workers_per_dataflow:,} workers x {ld.batches_per_second:g} batches/s "
        f"= {p.batches_per_second:,.0f} batches/s, {p.updates_per_second:,.0f} updates/s "
        f"({ld.updates_per_batch:,} updates and {p.changes_per_batch:,} frontier changes a batch; "
        f"{p.locations_per_dataflow:,} locations and {p.subscribers_per_dataflow:,} stream subscribers a dataflow)",
        f"Plan: {p.hosts:,} hosts of {ld.cores_per_host} cores and {ld.memory_per_host_gib:g} GiB, {p.shards:,} shards "
        f"({p.dataflows_per_shard:,} dataflows each); binding: {', '.join(p.binding)}",
        f"  hosts needed by: {needed} (event loops at most {LOOP_BUDGET:.0%} busy)",
        "",
    ]
    width = max(len(r[0]) for r in rows)
    for what, value, basis in rows:
        lines.append(f"{what:<{width}}  {value}")
        if basis:
            lines.append(f"{'':<{width}}    from: {basis}")
    if p.settings:
        lines += ["", "Settings to raise (else the service refuses the load): "
                  + ", ".join(f"{k}={v:,}".replace(",", "") for k, v in p.settings.items())]
    lines += [f"Note: {n}" for n in p.notes]
    return "\n".join(lines)


def run_plan(args: argparse.Namespace) -> int:
    """``tracker plan``: print the plan (``--json``: as JSON); 2 with one line for bad input."""
    result = plan(load(args))
    print(json.dumps(result.as_json(), indent=2) if args.json else render(result))
    return 0
