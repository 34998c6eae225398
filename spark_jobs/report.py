"""``tracker report``: dashboard figures of one dataflow, read from the Delta tables alone.

Works with the service stopped and without a JVM: the tables are read with delta-rs (through
:class:`~spark_jobs.storage.Warehouse`) into Polars. The figures are the ones docs/tables.md
shows as Spark SQL and Polars queries:

* the current frontier of every location, grouped by operator (``frontiers`` + ``nodes``);
* how long each epoch took to clear each operator: the time the epoch first appeared in the
  operator's input frontier (the union of its input ports' frontiers) until the time no element
  of that epoch was left there (``frontier_changes``); the epoch is a time's first coordinate;
* stuck locations: non-empty frontiers ordered by their oldest time, then by how long they have
  not changed (last ``frontier_changes`` row, or registration if they never changed);
* blockers: the live pointstamps (``pointstamps``), oldest time first, each with its
  operator's name, the worker that last reported it and how long it has been live;
* progress throughput: batches and updates per second (``progress``).

Every scope is covered: in a dataflow with nested scopes, each location is named by its scope
path (``scope``: the scope-node ids from the root) and its operator's name within that scope, so
a stuck location or a blocker deep in a loop is named where it is, not as its scope node in the
root. A flat dataflow's report has no ``scope`` column (it would be ``[]`` everywhere).
``--plot`` draws epochs cleared and lag over time (:mod:`spark_jobs.plot`).

The service does not write the frontier changes of version 0 (the initial pointstamps), so an
element that leaves a frontier without having been seen to enter it was there since the
dataflow's registration: its appearance is the ``dataflows.created_at`` time.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from spark_jobs.report_frames import (
    blockers,
    current_frontiers,
    epoch_clear_times,
    scoped,
    stuck_locations,
    throughput,
    time_text,
)
from spark_jobs.storage import UnknownDataflowError, Warehouse, warehouse_problem


@dataclass
class Report:
    """Every figure of one dataflow's report, as Polars frames (one per section)."""

    dataflow_id: str
    name: str
    timestamp_arity: int
    created_at: datetime
    as_of: datetime
    frontiers: pl.DataFrame
    epochs: pl.DataFrame
    stuck: pl.DataFrame
    throughput: pl.DataFrame
    blockers: pl.DataFrame
    nested: bool = False
    """The dataflow has nested scopes: every section then has a ``scope`` column."""
    changes: pl.DataFrame | None = None
    """The ``frontier_changes`` rows read (for :mod:`spark_jobs.plot`)."""

    def shown(self, frame: pl.DataFrame) -> pl.DataFrame:
        """A section as printed: without ``scope`` for a flat dataflow."""
        return frame if self.nested or "scope" not in frame.columns else frame.drop("scope")

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-ready dicts (datetimes as ISO strings)."""

        def rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
            return [
                {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}
                for row in frame.to_dicts()
            ]

        return {
            "dataflow_id": self.dataflow_id,
            "name": self.name,
            "timestamp_arity": self.timestamp_arity,
            "created_at": self.created_at.isoformat(),
            "as_of": self.as_of.isoformat(),
            "frontiers": rows(self.shown(self.frontiers)),
            "epochs": rows(self.shown(self.epochs)),
            "stuck": rows(self.shown(self.stuck)),
            "blockers": rows(self.shown(self.blockers)),
            "throughput": rows(self.throughput),
        }


class NotThenError(LookupError):
    """``--as-of`` is earlier than what the tables already hold, so durations measured then
    would be negative."""


def _frame(warehouse: Warehouse, table: str, dataflow_id: str) -> pl.DataFrame:
    frame = pl.from_arrow(warehouse.read(table, dataflow_id))
    assert isinstance(frame, pl.DataFrame)
    return scoped(frame)


def build_report(warehouse: str | Path, dataflow_id: str, as_of: datetime | None = None, limit: int = 10) -> Report:
    """Read the tables of ``dataflow_id`` and compute every figure (no Spark, no service).

    The tables are read as they are now; ``as_of`` is the time durations are measured at
    ("unchanged for"), and must not precede anything the tables hold (:class:`NotThenError`).
    For the state at an earlier time, read the tables at an earlier Delta version."""
    wh = Warehouse(warehouse)
    row = wh.dataflow_row(dataflow_id)
    created = row["created_at"]
    nodes = _frame(wh, "nodes", dataflow_id)
    frontiers = _frame(wh, "frontiers", dataflow_id)
    changes = _frame(wh, "frontier_changes", dataflow_id)
    progress = _frame(wh, "progress", dataflow_id)
    pointstamps = _frame(wh, "pointstamps", dataflow_id)
    if as_of is not None:
        latest = max([created, *changes["at"].to_list(), *progress["received_at"].to_list()])
        if as_of < latest:
            raise NotThenError(f"--as-of {as_of.isoformat()} is before what the tables already hold (the last "
                               f"entry is from {latest.isoformat()}); the report reads the tables as they are now")
    now = as_of or datetime.now(UTC)
    return Report(
        dataflow_id=dataflow_id,
        name=row["name"],
        timestamp_arity=row["timestamp_arity"],
        created_at=created,
        as_of=now,
        frontiers=current_frontiers(frontiers, nodes).drop("times"),
        epochs=epoch_clear_times(changes, nodes, created),
        stuck=stuck_locations(frontiers, changes, created, now, limit, nodes),
        throughput=throughput(progress),
        blockers=blockers(pointstamps, nodes, now, limit),
        nested=any(nodes["scope"].list.len() > 0) if not nodes.is_empty() else False,
        changes=changes,
    )


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return time_text(value)
    return str(value)


def _scope_text(frame: pl.DataFrame) -> pl.DataFrame:
    """``scope`` as text, ``[1, 2]`` (a time prints as ``(1, 2)``)."""
    if "scope" not in frame.columns:
        return frame
    return frame.with_columns(pl.Series("scope", ["[" + ", ".join(map(str, s)) + "]" for s in frame["scope"].to_list()],
                                        dtype=pl.String))


def text_table(frame: pl.DataFrame, empty: str = "(none)") -> str:
    """A plain aligned text table of ``frame`` (header, rule, rows).

    >>> print(text_table(pl.DataFrame({"node": [1, 12], "name": ["a", "bc"]})))
    node  name
    ----  ----
       1  a
      12  bc
    """
    if frame.is_empty():
        return empty
    frame = _scope_text(frame)
    headers = frame.columns
    body = [[_cell(v) for v in row] for row in frame.iter_rows()]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
    numeric = [frame.schema[h].is_numeric() for h in headers]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric, strict=True))

    out = [line(headers).rstrip(), "  ".join("-" * w for w in widths)]
    out.extend(line(r).rstrip() for r in body)
    return "\n".join(out)


def render(report: Report) -> str:
    """The report as readable text, one titled table per figure."""
    batches = int(report.throughput["batches"].sum()) if not report.throughput.is_empty() else 0
    updates = int(report.throughput["updates"].sum()) if not report.throughput.is_empty() else 0
    seconds = report.throughput.height
    peak = int(report.throughput["batches"].max()) if seconds else 0  # type: ignore[arg-type]
    sections = [
        f"Dataflow {report.dataflow_id} ({report.name}), timestamp arity {report.timestamp_arity}, "
        f"registered {_cell(report.created_at)}, report as of {_cell(report.as_of)} UTC",
        "",
        "== Current frontier per operator ==",
        text_table(report.shown(report.frontiers), "(every frontier is empty: the dataflow has completed)"),
        "",
        "== Epoch clear time per operator (input frontier; seconds from first appearance to leaving) ==",
        text_table(report.shown(report.epochs), "(no frontier changes recorded yet)"),
        "",
        "== Stuck locations (oldest frontier time first, then longest unchanged) ==",
        text_table(report.shown(report.stuck), "(none: every frontier is empty)"),
        "",
        "== Blockers: live pointstamps (oldest time first, then longest live) ==",
        text_table(report.shown(report.blockers), "(none: no live pointstamp)"),
        "",
        "== Progress throughput ==",
        f"{batches} batches, {updates} updates over {seconds} active second(s); peak {peak} batches/s",
        text_table(report.throughput.tail(10), "(no progress batches recorded)"),
    ]
    return "\n".join(sections)


def resolve(warehouse: Warehouse, name_or_id: str) -> str:
    """The id of the dataflow with this id, else of the one with this name (a deleted one only
    if no other has it).

    Raises:
        UnknownDataflowError: none has it, or several (not deleted) do: the message lists their ids.
    """
    named = warehouse.dataflow_ids_named(name_or_id)
    if name_or_id in warehouse.dataflow_ids() or not named:
        return name_or_id  # an id, or nothing: build_report says it is unknown
    live = [dataflow_id for dataflow_id, deleted_at in named if deleted_at is None] or [i for i, _ in named]
    if len(live) > 1:
        raise UnknownDataflowError(f"{len(live)} dataflows are named {name_or_id!r}; give one id: {', '.join(live)}")
    return live[0]


def run_report(args: argparse.Namespace) -> int:
    """``tracker report``: print the report (text or ``--json``); 2, with a message and no
    traceback, for an unknown dataflow, a missing warehouse or a bad option."""
    def fail(message: str) -> int:
        print(f"tracker report: error: {message}", file=sys.stderr)
        return 2

    try:
        as_of = datetime.fromisoformat(args.as_of) if args.as_of else None
    except ValueError:
        return fail(f"--as-of {args.as_of!r} is not an ISO time (e.g. 2026-11-22T10:00:00Z)")
    if as_of is not None and as_of.tzinfo is None:
        as_of = as_of.replace(tzinfo=UTC)
    if args.limit < 1:
        return fail(f"--limit must be at least 1, got {args.limit}")
    plot_path = Path(args.plot) if getattr(args, "plot", None) else None
    if plot_path is not None and plot_path.suffix.lower() not in (".svg", ".png"):
        return fail(f"--plot {args.plot!r}: name an .svg or a .png file")
    if plot_path is not None and not plot_path.parent.is_dir():
        return fail(f"--plot {args.plot!r}: the directory {str(plot_path.parent)!r} does not exist")
    warehouse = str(args.warehouse)
    problem = warehouse_problem(warehouse)  # never create one just to report on it
    if problem:
        return fail(f"warehouse {warehouse!r} {problem}")
    try:
        dataflow_id = resolve(Warehouse(warehouse), args.dataflow)
        report = build_report(warehouse, dataflow_id, as_of=as_of, limit=args.limit)
    except (UnknownDataflowError, NotThenError) as error:
        return fail(str(error))
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print(render(report))
    if plot_path is not None:
        from spark_jobs.plot import plot

        plot(report, plot_path)
        print(f"tracker report: wrote the plot of epochs cleared and lag over time to {plot_path}", file=sys.stderr)
    return 0
